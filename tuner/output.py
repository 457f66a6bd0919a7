"""The one output layer: a command's result as a terminal table, JSON or Markdown.

As hyperfine's exporters: a command builds one `View` of its result (the JSON form, the schema
the README documents, and the terminal form, tables and lines in order) and `show` renders it
in the format the user asked for (`--json`, `--markdown`, else the tables).  The Markdown form
is made from the same tables, so the three never disagree.  The views of optimize, bench,
best and schedule are built here, and nowhere else.
"""

from __future__ import annotations


import argparse
import dataclasses
import json
from dataclasses import dataclass, field
from typing import Any

import optuna
from rich.console import Console, RenderableType
from rich.table import Table
from rich.text import Text

from tuner.config import Config
from tuner.measure.objectives import score
from tuner.measure.result import Measurement
from tuner.results import baselines, classes, record
from tuner.results.baselines import compare
from tuner.results.picks import Pick, measured_front
from tuner.results.record import params_of
from tuner.results.resilient import redacted_url
from tuner.results.terminal import baselines_table, counts_line, fmt, pareto_table
from tuner.search.preview import DryRunPlan, clock
from tuner.server.launch import launch_spec
from tuner.study import RunResult

__all__ = ["View", "FORMATS", "add_format_flags", "format_of", "show", "render_json", "render_markdown",
           "study_view", "plan_view", "measurement_view", "pick_view", "list_view", "adaptive_table_view"]

FORMATS = ("table", "json", "markdown")


@dataclass
class View:
    """A result in every form: `data` is its JSON, `blocks` its tables and lines of text (rich
    markup) in the order they print; `json_text` where a file format fixes the JSON's layout;
    `markdown` the Markdown form's blocks where they differ (a pick's flags as a table)."""

    data: Any
    blocks: list[RenderableType | str] = field(default_factory=list)
    json_text: str | None = None
    markdown: list[RenderableType | str] | None = None


def add_format_flags(p: argparse.ArgumentParser, what: str) -> None:
    """`--json` and `--markdown`: the same result in another form, on stdout."""
    group = p.add_mutually_exclusive_group()
    group.add_argument("--json", action="store_true", help=f"print {what} as JSON on stdout")
    group.add_argument("--markdown", action="store_true", help=f"print {what} as Markdown tables on stdout")


def format_of(args: argparse.Namespace) -> str:
    return "json" if getattr(args, "json", False) else "markdown" if getattr(args, "markdown", False) else "table"


def render_json(view: View) -> str:
    return view.json_text if view.json_text is not None else json.dumps(view.data, indent=2) + "\n"


def _cell(value: Any) -> str:
    text = value.plain if isinstance(value, Text) else Text.from_markup(str(value)).plain
    return text.replace("|", "\\|").replace("\n", " ")


def _markdown_table(table: Table) -> str:
    header = [_cell(c.header) for c in table.columns]
    rows = zip(*[list(c.cells) for c in table.columns]) if table.columns else []
    lines = [f"**{_cell(table.title)}**", ""] if table.title else []
    lines += ["| " + " | ".join(header) + " |", "|" + "|".join("---" for _ in header) + "|"]
    lines += ["| " + " | ".join(_cell(v) for v in row) + " |" for row in rows]
    return "\n".join(lines)


def render_markdown(view: View) -> str:
    blocks = view.markdown if view.markdown is not None else view.blocks
    parts = [_markdown_table(b) if isinstance(b, Table) else _cell(b) for b in blocks]
    return "\n\n".join(parts) + "\n"


def show(view: View, fmt: str, out: Console) -> None:
    """Print `view` on stdout in `fmt` (one of FORMATS)."""
    if fmt == "json":
        print(render_json(view), end="", flush=True)
    elif fmt == "markdown":
        print(render_markdown(view), end="", flush=True)
    else:
        for block in view.blocks:
            out.print(block, highlight=False)


# -- tuner.optimize -----------------------------------------------------------------------------

def study_view(result: RunResult, config: Config, trials: int) -> View:
    """The run's result: the measured Pareto front and the baselines."""
    study = result.study
    names = [o.name for o in result.objectives]
    blocks: list[RenderableType | str] = []
    if trials == 0:
        blocks.append(f"study {study.study_name} in {redacted_url(config.storage_url)}: {counts_line(study)}; nothing launched (--trials 0)")
    complete = any(t.state.name == "COMPLETE" for t in study.trials)
    blocks.append(pareto_table(study, names) if complete else f"no trial completed ({counts_line(study)})")
    comparisons = compare(study, result.baselines) if result.baselines else []
    if result.baselines:
        blocks.append(baselines_table(result.baselines, names))
        # Plain text, not markup: a baseline's failure reason says "fix [server] command".
        blocks += [Text(line) for c in comparisons for line in c.lines]
    return View(_study_json(result, config, names, comparisons), blocks)


def _study_json(result: RunResult, config: Config, names: list[str], comparisons) -> dict:
    study = result.study
    counts: dict[str, int] = {}
    for t in study.get_trials(deepcopy=False):
        counts[t.state.name.lower()] = counts.get(t.state.name.lower(), 0) + 1
    front = []
    for t in sorted(measured_front(study), key=lambda t: -t.values[0]) if counts.get("complete") else []:
        front.append({"trial": t.number, "flags": t.user_attrs.get(record.FLAGS) or t.params, "values": dict(zip(names, t.values)),
                      **{k: t.user_attrs.get(k) for k in (record.ACCEPT_LENGTH, record.MAX_RUNNING_REQUESTS,
                                                          record.MAX_TOTAL_NUM_TOKENS, record.LAUNCH_COMMAND)}})
    return {"study": study.study_name, "storage": redacted_url(config.storage_url), "objectives": names,
            "trials_run": result.trials_run, "trials": counts, "front": front,
            "baselines": baselines.as_json(result.baselines, names),
            "over_baselines": {c.kind: c.lines[0] for c in comparisons},
            "error": result.fatal.reason if result.fatal is not None else None}


def plan_view(p: DryRunPlan) -> View:
    """`--dry-run`: what the run would launch first and what it would cost."""
    listening = "a server answers there now (each launch replaces it)" if p.answers else "nothing answers there yet"
    blocks: list[RenderableType | str] = [Text(f"dry run of study {p.study} in {p.storage}: {p.earlier_trials} earlier trial(s); "
                                               f"target {p.target} reached, {p.url}: {listening}; nothing started")]
    for launch in p.launches:
        label = f"baseline {launch['baseline'].replace('_', ' ')}" if "baseline" in launch else f"trial {launch['trial']} ({launch['source']})"
        blocks.append(Text(f"{label}: {launch['launch_command']}"))
    if p.trials > p.proposals:
        blocks.append(f"... {p.trials - p.proposals} more trial(s), proposed from what these measure")
    e = p.estimate
    blocks.append(Text(f"estimate: {clock(round(e.total_s))} for {p.trials} trial(s) and {p.baselines} baseline(s), "
                       f"{round(e.gpu_hours, 2):.2f} GPU-hours on {e.gpus} GPU(s); {'; '.join(e.sources)}"))
    return View(p.as_json(), blocks)


# -- tuner.bench ---------------------------------------------------------------------------------

def measurement_view(m: Measurement, objectives) -> View:
    """One server's measurement: every figure with its spread."""
    values = dict(zip([o.name for o in objectives], score(objectives, m)))
    data = {"single_tps": m.single_tps, "single_ci95": m.single_ci95, "concurrent_tps": m.concurrent_tps_by_level,
            "accept_length": m.accept_length, "accept_length_source": m.accept_length_source,
            "accept_histogram": list(m.accept_histogram) if m.accept_histogram else None,
            "thinking_tokens": m.thinking_tokens, "max_total_num_tokens": m.max_total_num_tokens,
            "max_running_requests": m.max_running_requests, "ttft_ms": m.ttft_ms, "itl_p99_ms": m.itl_p99_ms,
            "greedy_inflation": m.greedy_inflation, "request_tokens": m.request_tokens,
            "client_stall_resent": m.client_stall_resent, "client_stall_kept": m.client_stall_kept,
            "by_class": {c: dataclasses.asdict(f) for c, f in m.by_class.items()}, "objectives": values}
    if m.load_curve is not None:
        data["slo_curve"] = [p.as_record() for p in m.load_curve.points]
        data["slo_note"] = m.load_curve.note
    return View(data, [measurement_table(m, objectives, values)])


def measurement_table(m: Measurement, objectives, values: dict[str, float]) -> Table:
    table = Table(title="Measurement", title_justify="left")
    table.add_column("figure")
    table.add_column("value", justify="right")
    table.add_column("spread / detail")
    # Plain text, not markup: a detail names config keys ("[bench] request_tokens", "[slo] max_points").
    def add(*cells) -> None:
        table.add_row(*(Text(c) if isinstance(c, str) else c for c in cells))

    lo, hi = m.single_ci95
    add("single_tps", f"{m.single_tps:.1f} tok/s", f"95% CI {lo:.1f} … {hi:.1f} (±{m.single_spread * 100:.1f}%), {len(m.single_runs)} passes: {', '.join(f'{x:.1f}' for x in m.single_runs)}")
    for level, rate in m.concurrent_tps_by_level.items():
        add(f"concurrent_tps @{level}", f"{rate:.1f} tok/s", f"steady window {m.concurrent_window_s[level]:.1f} s, p99 ITL {m.concurrent_p99_itl_ms[level]:.1f} ms")
    add("accept_length", fmt(m.accept_length, 2), _accept_detail(m))
    if m.thinking_tokens:
        add("thinking_tokens", fmt(m.thinking_tokens), "of the completion tokens, thinking (timed like the answer)")
    add("max_total_num_tokens", fmt(m.max_total_num_tokens), "")
    add("max_running_requests", fmt(m.max_running_requests), "")
    add("request_tokens", fmt(m.request_tokens), "measured: mean prompt + max_tokens (auto)" if m.request_tokens_auto else "[bench] request_tokens")
    for name, f in m.by_class.items():
        add(f"class {name}", f"{f.single_tps:.1f} tok/s",
            f"share {f.share:.2f}, {f.requests} requests, accept {fmt(f.accept_length, 2)}, prompt tokens {f.prompt_tokens_median:,.0f} (median), "
            f"concurrent {fmt(f.concurrent_tps)} tok/s, single stream {f.single_s:.1f} s")
    add("TTFT", f"{m.ttft_ms:.1f} ms", f"p90 {m.ttft_p90_ms:.1f}, p99 {m.ttft_p99_ms:.1f} (single stream)")
    add("ITL", f"{m.itl_ms:.2f} ms", f"p90 {m.itl_p90_ms:.2f}, p99 {m.itl_p99_ms:.2f} (single stream)")
    add("end-to-end", f"{m.e2e_ms:.0f} ms", f"p90 {m.e2e_p90_ms:.0f}, p99 {m.e2e_p99_ms:.0f}")
    if m.client_stall_resent or m.client_stall_kept:
        add("client stalls", fmt(m.client_stall_resent),
            f"single-stream requests sent again: this client was starved of CPU during them"
            f"{f' ({m.client_stall_kept} still starved)' if m.client_stall_kept else ''}")
    if m.greedy_inflation:
        add("greedy_inflation", f"{m.greedy_inflation:.2f}x", "single_tps with ignore_eos / stopping at EOS")
    if m.load_curve is not None:
        add("slo_capacity", *_slo_cells(m))
    for objective in objectives:
        add(f"objective {objective.name}", fmt(values[objective.name]), objective.unit)
    add("time", f"{m.duration_s:.1f} s", f"{m.completion_tokens:,} completion tokens")
    return table


def _slo_cells(m: Measurement) -> tuple[str, str]:
    """The search over load behind slo_capacity (tuner/measure/load_sweep.py): value, how it ended, the curve."""
    curve = m.load_curve
    unit = "req/s" if curve.promise.get("arrival") == "poisson" else "requests"
    points = ", ".join(f"{p.load:.3g}: p95 ITL {p.itl_ms[95]:.1f} ms, p95 TTFT {p.ttft_ms[95]:.0f} ms, {p.attainment:.0%} good"
                       for p in curve.points)
    return f"{curve.slo_capacity:g} {unit}", f"{curve.note}; {curve.sweep_s:.1f} s of extra load points; {points}"


def _accept_detail(m: Measurement) -> str:
    """Where the accept length came from (tuner/measure/phases.py · acceptance), and the depth histogram."""
    source = {"sglext": "completion tokens / spec_verify_ct of every measured request (sglext)",
              "generate": "completion tokens / spec_verify_ct of native /generate requests",
              "no speculation": "one token per forward", "unknown": "the server reports no verify steps"}
    detail = source.get(m.accept_length_source, m.accept_length_source)
    if m.accept_histogram:
        detail += f"; verify steps by drafts accepted {list(m.accept_histogram)}"
    return detail


# -- tuner.best -----------------------------------------------------------------------------------

def pick_view(config: Config, study: optuna.Study, choice: Pick, how: str, text: str) -> View:
    """The pick: `text` in the form `--format` asked for (flags, command, drop-in)."""
    names = list(study.metric_names or [])
    params = params_of(choice.trial)
    data = {"study": study.study_name, "pick": how, "trial": choice.trial.number, "reason": choice.reason,
            "tied_with": list(choice.tied_with), "values": dict(zip(names, choice.trial.values)),
            "flags": params.as_dict() if params else {}, "flags_text": " ".join(params.flags()) if params else "",
            "launch_command": launch_spec(config.server, params).launch_command if params else None,
            "by_class": record.by_class_of(choice.trial), "losses": classes.pick_summary(study, choice.trial)[1]}
    table = Table(title=f"trial {data['trial']} ({how}): {choice.reason}", title_justify="left")
    for column in ("flags", *names):
        table.add_column(column, justify="left" if column == "flags" else "right")
    table.add_row(data["flags_text"], *[fmt(v) for v in data["values"].values()])
    return View(data, [Text(text.rstrip("\n"))], markdown=[table])


def list_view(rows: list[dict], storage_url: str) -> View:
    """Every study of a store, its trial counts and best figures."""
    if not rows:
        return View(rows, [Text(f"no study in {redacted_url(storage_url)}")])
    lines = []
    table = Table(title=f"Studies in {redacted_url(storage_url)}", title_justify="left")
    for column in ("study", "trials", "best"):
        table.add_column(column)
    for row in rows:
        best = "  ".join(f"{k}={v:,.1f}" for k, v in row["best"].items()) or "nothing measured"
        counts = ", ".join(f"{n} {s}" for s, n in row["trials"].items()) or "no trials"
        if row.get("kinds"):  # a baselines sibling holds tuner.schedule's launches too
            counts += " (" + ", ".join(f"{n} {k}" for k, n in row["kinds"].items() if n) + ")"
        lines.append(Text(f"{row['study']:<24} {counts:<40} best: {best}"))
        table.add_row(row["study"], counts, best)
    return View(rows, lines, markdown=[table])


# -- tuner.schedule -------------------------------------------------------------------------------

def adaptive_table_view(cfg: dict, text: str) -> View:
    """The adaptive table: its JSON exactly as the file holds it (one slot per line)."""
    table = Table(title="--speculative-adaptive-config", title_justify="left")
    table.add_column("level", justify="right")
    table.add_column("candidate_steps")
    for level, slot in cfg.items():
        if isinstance(slot, dict) and "candidate_steps" in slot:
            table.add_row(str(level), ", ".join(map(str, slot["candidate_steps"])))
    return View(cfg, [Text(text.rstrip("\n"))], json_text=text, markdown=[table])
