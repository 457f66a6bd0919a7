"""`python -m tuner.bench --config PATH [--flags "..."]`: measure one server, no study.

Without --flags the server that answers at `[target] url` is measured as it runs now; with
--flags the configured command is launched with those flags (replacing the same flags in it),
through the same control, readiness and benchmark code a trial uses, and the target is
restored afterwards.  Prints every figure with its spread, and warnings that name a fix.
"""

from __future__ import annotations

import argparse
import json
import math
import shlex
import sys

from rich.markup import escape
from rich.table import Table

from tuner.cli import consoles, guarded, in_config, parser, exit_with
from tuner.config import DEFAULT_CONFIG, load_config
from tuner.errors import ConfigError, LaunchError, TunerError
from tuner.measure.objectives import load_objectives, score
from tuner.measure.runner import Measurement, measure
from tuner.measure.workload import load_workload
from tuner.results.terminal import fmt
from tuner.sequence import connected, launch_and_measure, refuse_if_answering
from tuner.server.client import ServerClient

__all__ = ["main", "measurement_table", "warnings_for", "build_parser", "blame_flags"]


def measurement_table(m: Measurement, objectives) -> Table:
    table = Table(title="Measurement", title_justify="left")
    table.add_column("figure")
    table.add_column("value", justify="right")
    table.add_column("spread / detail")
    lo, hi = m.single_ci95
    table.add_row("single_tps", f"{m.single_tps:.1f} tok/s", f"95% CI {lo:.1f} … {hi:.1f} (±{m.single_spread * 100:.1f}%), {len(m.single_runs)} passes: {', '.join(f'{x:.1f}' for x in m.single_runs)}")
    for level, rate in m.concurrent_tps_by_level.items():
        table.add_row(f"concurrent_tps @{level}", f"{rate:.1f} tok/s", f"steady window {m.concurrent_window_s[level]:.1f} s, p99 ITL {m.concurrent_p99_itl_ms[level]:.1f} ms")
    table.add_row("accept_length", fmt(m.accept_length, 2), _accept_detail(m))
    if m.thinking_tokens:
        table.add_row("thinking_tokens", fmt(m.thinking_tokens), "of the completion tokens, thinking (timed like the answer)")
    table.add_row("max_total_num_tokens", fmt(m.max_total_num_tokens), "")
    table.add_row("max_running_requests", fmt(m.max_running_requests), "")
    table.add_row("TTFT", f"{m.ttft_ms:.1f} ms", f"p90 {m.ttft_p90_ms:.1f}, p99 {m.ttft_p99_ms:.1f} (single stream)")
    table.add_row("ITL", f"{m.itl_ms:.2f} ms", f"p90 {m.itl_p90_ms:.2f}, p99 {m.itl_p99_ms:.2f} (single stream)")
    table.add_row("end-to-end", f"{m.e2e_ms:.0f} ms", f"p90 {m.e2e_p90_ms:.0f}, p99 {m.e2e_p99_ms:.0f}")
    if m.greedy_inflation:
        table.add_row("greedy_inflation", f"{m.greedy_inflation:.2f}x", "single_tps with ignore_eos / stopping at EOS")
    for objective, value in zip(objectives, score(objectives, m)):
        table.add_row(f"objective {objective.name}", fmt(value), objective.unit)
    table.add_row("time", f"{m.duration_s:.1f} s", f"{m.completion_tokens:,} completion tokens")
    return table


def _accept_detail(m: Measurement) -> str:
    """Where the accept length came from (tuner/measure/phases.py · acceptance), and the depth histogram."""
    source = {"sglext": "completion tokens / spec_verify_ct of every measured request (sglext)",
              "generate": "completion tokens / spec_verify_ct of native /generate requests",
              "no speculation": "one token per forward", "unknown": "the server reports no verify steps"}
    detail = source.get(m.accept_length_source, m.accept_length_source)
    if m.accept_histogram:
        detail += f"; verify steps by drafts accepted {list(m.accept_histogram)}"
    return detail


def warnings_for(m: Measurement, bench) -> list[str]:
    out = []
    if m.single_spread > bench.single_target_ci and math.isfinite(m.single_spread):
        out.append(
            f"single_tps spread ±{m.single_spread * 100:.1f}% after {len(m.single_runs)} passes is above "
            f"single_target_ci ({bench.single_target_ci * 100:.0f}%): raise [bench] single_max_passes, or measure on a quieter machine"
        )
    for level in bench.concurrency_levels:
        if bench.concurrent_requests < 3 * level:
            out.append(
                f"concurrency {level} with {bench.concurrent_requests} requests barely reaches a steady state: "
                f"raise [bench] concurrent_requests to at least {3 * level}"
            )
    if m.ignore_eos:
        out.append("ignore_eos is on: these speeds are inflated (see greedy_inflation); set [bench] ignore_eos = false for real traffic")
    return out


def _measure(args, err) -> tuple:
    config = load_config(args.config)
    objectives = load_objectives(config.study.objectives, config.bench.concurrency_levels)
    workload = load_workload(config.bench.prompts, seed=config.bench.seed, base_dir=config.base_dir)
    def phase(text: str) -> None:  # one line per finished benchmark phase ("single 4/4")
        done, _, total = text.rpartition(" ")[2].partition("/")
        if done and done == total:
            err.print(f"  {text}", highlight=False)

    if args.flags is None:
        client = ServerClient(config.target.url, api_key=config.target.api_key())
        try:
            if client.health_generate(timeout_s=30) != 200:
                raise ConfigError(f"nothing ready answers at {config.target.url}; start the server, or pass --flags to launch it")
            m = measure(url=config.target.url, bench=config.bench, info=client.server_info(), workload=workload, client=client,
                        api_key=config.target.api_key())
        finally:
            client.close()
        return config, objectives, m
    try:
        extra = shlex.split(args.flags)
    except ValueError as exc:
        raise ConfigError(f"--flags: {exc}") from None
    with connected(config) as target:
        refuse_if_answering(target.client, config.target)
        spec = target.spec(config.server.command_line.params(), extra=extra)
        err.print(f"launching: {spec.launch_command}", highlight=False, markup=False)
        _, m = launch_and_measure(target, spec, workload, phase=phase,
                                  on_ready=lambda ready: err.print(f"ready in {ready.startup_s:.1f} s", highlight=False))
    return config, objectives, m


def build_parser() -> argparse.ArgumentParser:
    p = parser("tuner.bench", "Measure one SGLang server through the code a trial uses, no study: the server running now, "
               "or the config's command launched with --flags.")
    p.add_argument("--config", default=DEFAULT_CONFIG, help="study config: target, command and [bench] workload")
    p.add_argument("--flags", help="launch the config's command with these flags (replacing the same flags in it) instead of measuring the running server")
    p.add_argument("--json", action="store_true", help="print the measurement as JSON")
    return p


def blame_flags(reason: str, flags: str | None) -> str:
    """A launch error caused by a flag given in --flags names --flags, not [server] command."""
    if not flags or "[server] command" not in reason:
        return reason
    if any(token.split("=")[0] in reason for token in flags.split() if token.startswith("-")):
        return reason.replace("[server] command", "--flags")
    return reason


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    out, err = consoles()

    def body() -> int:
        config, objectives, m = _measure(args, err)
        if args.json:
            out.print_json(json.dumps({"single_tps": m.single_tps, "single_ci95": m.single_ci95, "concurrent_tps": m.concurrent_tps_by_level,
                                       "accept_length": m.accept_length, "accept_length_source": m.accept_length_source,
                                       "accept_histogram": list(m.accept_histogram) if m.accept_histogram else None,
                                       "thinking_tokens": m.thinking_tokens, "max_total_num_tokens": m.max_total_num_tokens,
                                       "max_running_requests": m.max_running_requests, "ttft_ms": m.ttft_ms, "itl_p99_ms": m.itl_p99_ms,
                                       "greedy_inflation": m.greedy_inflation, "objectives": dict(zip([o.name for o in objectives], score(objectives, m)))}))
        else:
            out.print(measurement_table(m, objectives))
        for warning in warnings_for(m, config.bench):
            err.print(f"[yellow]warning:[/yellow] {escape(warning)}", highlight=False, soft_wrap=True)
        return 0

    def blamed() -> int:
        try:
            return body()
        except LaunchError as exc:
            raise LaunchError(in_config(blame_flags(exc.reason, args.flags), args.config), kind=exc.kind, fatal=exc.fatal) from None
        except ConfigError:
            raise
        except TunerError as exc:
            raise TunerError(in_config(str(exc), args.config)) from None

    return guarded(blamed)


if __name__ == "__main__":
    exit_with(main())
