"""`python -m tuner.bench --config PATH [--flags "..."]`: measure one server, no study.

Without --flags the server that answers at `[target] url` is measured as it runs now; with
--flags the configured command is launched with those flags (replacing the same flags in it),
through the same control, readiness and benchmark code a trial uses, and the target is
restored afterwards.  Prints every figure with its spread, and warnings that name a fix.
"""

from __future__ import annotations

import argparse
import shlex
import sys

from rich.markup import escape

from tuner import output
from tuner.cli import consoles, exit_with, guarded, in_config, parser
from tuner.config import DEFAULT_CONFIG, load_config
from tuner.errors import ConfigError, LaunchError, TunerError
from tuner.measure.caveats import caveats
from tuner.measure.objectives import check_classes, load_objectives
from tuner.measure.runner import Measurement
from tuner.measure.workload import bench_workload
from tuner.sequence import connected, launch_and_measure, measure_running, refuse_if_answering

__all__ = ["main", "build_parser", "blame_flags"]


def _measure(args, err) -> tuple:
    config = load_config(args.config)
    objectives = load_objectives(config.study.objectives, config.bench.concurrency_levels)
    workload = bench_workload(config.bench, config.base_dir)
    check_classes(objectives, workload.classes)
    def phase(text: str) -> None:  # one line per finished benchmark phase ("single 4/4")
        done, _, total = text.rpartition(" ")[2].partition("/")
        if done and done == total:
            err.print(f"  {text}", highlight=False)

    if args.flags is None:
        return config, objectives, measure_running(config, workload)
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
    output.add_format_flags(p, "the measurement")
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
        output.show(output.measurement_view(m, objectives), output.format_of(args), out)
        for warning in caveats(m, config.bench):
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
