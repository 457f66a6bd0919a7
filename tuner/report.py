"""`python -m tuner.report`: a study as a self-contained HTML page and a Markdown file, with plots."""

from __future__ import annotations

import argparse
import base64
import html
import io
import math
import sys
import warnings
from dataclasses import dataclass, field
from datetime import datetime
from itertools import combinations
from pathlib import Path
from typing import Any

import optuna
from matplotlib.backends.backend_agg import FigureCanvasAgg
from matplotlib.figure import Figure
from matplotlib.ticker import MaxNLocator
from optuna.trial import FrozenTrial, TrialState

from .config import DEFAULT_CONFIG, Config, apply_overrides, load_config
from .errors import TunerError
from .history import params_of
from .hypervolume import study_history
from .picks import measured_front, pick
from .space import Params
from .storage import load_existing_study
from .terminal import PARAM_COLUMNS, fmt

__all__ = ["Report", "Table", "Choice", "Plot", "build", "write_html", "write_markdown", "default_out", "main"]

STEPS, TOPK, DRAFT, MEM = (key for key, _ in PARAM_COLUMNS)
DPI = 100
# How each way a trial can end is drawn on the failure map.
OUTCOMES = {
    "complete": dict(marker="o", color="#2e7d32", label="complete"),
    "memory_kv": dict(marker="x", color="#c62828", label="pruned: KV cache / state did not fit"),
    "memory_graph": dict(marker="^", color="#ef6c00", label="pruned: CUDA graph OOM"),
    "invalid": dict(marker="s", color="#6a1b9a", label="pruned: invalid combination"),
    "timeout": dict(marker="D", color="#6d4c41", label="pruned: not ready in time"),
    "ruled_out": dict(marker="x", color="#9e9e9e", label="pruned: ruled out by an earlier failure (no launch)"),
    "pruned": dict(marker="v", color="#757575", label="pruned: other"),
    "fail": dict(marker="X", color="#000000", label="failed (crash, interruption)"),
}


@dataclass
class Table:
    header: list[str]
    rows: list[list[str]]


@dataclass
class Choice:
    label: str  # an objective name, or "balanced"
    trial: int
    values: str
    reason: str
    tied_with: tuple[int, ...]
    flags: str


@dataclass
class Plot:
    name: str  # file stem of the PNG beside report.md
    title: str
    caption: str
    png: bytes


@dataclass
class Report:
    study_name: str
    summary: list[tuple[str, str]]
    notes: list[str]
    pareto: Table
    choices: list[Choice]
    failures: Table
    plots: list[Plot] = field(default_factory=list)
    generated: str = ""


# --- reading trials -------------------------------------------------------------------------

def _param(trial: FrozenTrial, key: str) -> Any:
    """A searched flag's value as passed to the server: the `flags` attr, else trial.params."""
    flags = trial.user_attrs.get("flags")
    value = flags.get(key) if isinstance(flags, dict) else None
    if value is None:
        value = trial.params.get(key)
    if value is None and key == DRAFT and trial.params.get(TOPK) == 1 and trial.params.get(STEPS) is not None:
        value = trial.params[STEPS] + 1  # SGLang forces it when topk is 1
    return value


def _number(value: Any) -> float | None:
    return float(value) if isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value) else None


def _flags_text(trial: FrozenTrial) -> str:
    params = params_of(trial) or Params(**{key: _param(trial, key) for key, _ in PARAM_COLUMNS})
    return " ".join(params.flags()) or "(the base command's own flags)"


def _cell(value: Any) -> str:
    return f"{value:g}" if isinstance(value, float) else fmt(value)


def _names(study: optuna.Study) -> list[str]:
    return list(study.metric_names or [f"objective_{i}" for i in range(len(study.directions))])


# --- content --------------------------------------------------------------------------------

def _summary(study: optuna.Study, trials: list[FrozenTrial], names: list[str], sampler: str | None, target: str | None) -> list[tuple[str, str]]:
    counts: dict[str, int] = {}
    for t in trials:
        counts[t.state.name.lower()] = counts.get(t.state.name.lower(), 0) + 1
    rows = [
        ("study", study.study_name),
        ("objectives", ", ".join(names) + " (all maximised)"),
        ("trials", f"{len(trials)}: " + ", ".join(f"{n} {s}" for s, n in sorted(counts.items())) if trials else "none yet"),
    ]
    duplicates = sum(1 for t in trials if t.user_attrs.get("duplicate_of") is not None)
    ruled_out = sum(1 for t in trials if t.user_attrs.get("ruled_out_by") is not None)
    settled = [f"{duplicates} duplicate(s) of an earlier trial" if duplicates else "",
               f"{ruled_out} ruled out by an earlier memory failure" if ruled_out else ""]
    if duplicates or ruled_out:
        rows.append(("settled without a launch", ", ".join(filter(None, settled))))
    rows.append(("Pareto front", f"{len(measured_front(study))} measured configuration(s)"))
    if sampler:
        rows.append(("sampler (config)", sampler))
    where = sorted({str(t.user_attrs["target"]) for t in trials if t.user_attrs.get("target")})
    if target and where and all(target.startswith(w + " ") for w in where):
        where = []  # every trial ran on the configured host
    if target or where:
        rows.append(("target", "; ".join(filter(None, [target, ("trials ran on " + ", ".join(where)) if where else ""]))))
    for attr, label in (("sglang_version", "SGLang"), ("accelerator", "accelerator")):
        seen = sorted({str(t.user_attrs[attr]) for t in trials if t.user_attrs.get(attr)})
        if seen:
            rows.append((label, ", ".join(seen)))
    finished = [t for t in trials if t.state.is_finished()]
    grown = _last_growth(finished)
    if grown is not None:
        since = sum(1 for t in finished if t.number > grown)
        rows.append(("front last grew", f"at trial {grown}; the {since} finished trial(s) since added nothing" if since else f"at trial {grown}, the latest"))
    starts = [t.datetime_start for t in trials if t.datetime_start]
    ends = [t.datetime_complete for t in trials if t.datetime_complete]
    if starts and ends:
        rows.append(("ran", f"{min(starts):%Y-%m-%d %H:%M} to {max(ends):%Y-%m-%d %H:%M}"))
    return rows


def _last_growth(finished: list[FrozenTrial]) -> int | None:
    ordered = sorted(finished, key=lambda t: t.number)
    series = study_history(ordered)
    last = None
    for i, t in enumerate(ordered):
        if series[i] > (series[i - 1] if i else 0.0) + 1e-12:
            last = t.number
    return last


def _notes(trials: list[FrozenTrial], complete: list[FrozenTrial]) -> list[str]:
    notes = []
    if not complete:
        notes.append("No trial has completed yet: there is no Pareto front, best configuration or trade-off plot. "
                     "The pruned and failed trials below say what went wrong.")
    no_flags = [t.number for t in trials if not isinstance(t.user_attrs.get("flags"), dict)]
    if no_flags:
        notes.append(f"{len(no_flags)} trial(s) carry no `flags` attribute (made by another tool?): their parameters "
                     "come from the trial's params, and missing measurements show as '-'.")
    duplicates = [t.number for t in complete if t.user_attrs.get("duplicate_of") is not None]
    if duplicates:
        notes.append(f"Trial(s) {', '.join(map(str, duplicates))} repeat an earlier trial's flags (`duplicate_of`) and "
                     "carry its values; the tables show only the trials that were measured.")
    return notes


def _pareto(study: optuna.Study, names: list[str], choices: list[Choice]) -> Table:
    header = ["trial", *(short for _, short in PARAM_COLUMNS), *names, "accept", "max_running", "kv_tokens", "picked for"]
    picked: dict[int, list[str]] = {}
    for c in choices:
        picked.setdefault(c.trial, []).append(c.label)
    rows = []
    for t in sorted(measured_front(study), key=lambda t: -t.values[0]):
        rows.append([
            str(t.number),
            *(_cell(_param(t, key)) for key, _ in PARAM_COLUMNS),
            *(fmt(v) for v in t.values),
            fmt(t.user_attrs.get("accept_length"), 2),
            fmt(t.user_attrs.get("max_running_requests")),
            fmt(t.user_attrs.get("max_total_num_tokens")),
            ", ".join(picked.get(t.number, [])),
        ])
    return Table(header, rows)


def _choices(study: optuna.Study, names: list[str]) -> list[Choice]:
    out = []
    for how in [*names, *(["balanced"] if len(names) > 1 else [])]:
        try:
            p = pick(study, how)
        except ValueError:
            continue
        values = ", ".join(f"{n} {fmt(v)}" for n, v in zip(names, p.trial.values))
        out.append(Choice(how, p.trial.number, values, p.reason, p.tied_with, _flags_text(p.trial)))
    return out


def _failures(trials: list[FrozenTrial]) -> Table:
    header = ["trial", "state", *(short for _, short in PARAM_COLUMNS), "kind", "reason"]
    rows = []
    for t in trials:
        if t.state not in (TrialState.PRUNED, TrialState.FAIL):
            continue
        kind = t.user_attrs.get("failure_kind") or "-"
        if t.user_attrs.get("ruled_out_by") is not None:
            kind = f"ruled out by {t.user_attrs['ruled_out_by']}"
        reason = (str(t.user_attrs.get("fail_reason") or "").splitlines() or ["-"])[0]
        rows.append([str(t.number), t.state.name, *(_cell(_param(t, key)) for key, _ in PARAM_COLUMNS), kind, reason])
    return Table(header, rows)


# --- plots ----------------------------------------------------------------------------------

def _png(fig: Figure) -> bytes:
    FigureCanvasAgg(fig)
    buf = io.BytesIO()
    fig.savefig(buf, format="png", dpi=DPI, bbox_inches="tight", metadata={"Software": None})
    return buf.getvalue()


def _front_plot(complete: list[FrozenTrial], front: list[FrozenTrial], names: list[str]) -> Plot | None:
    pairs = list(combinations(range(len(names)), 2))
    if not complete or not pairs:
        return None
    cols = min(3, len(pairs))
    rows = math.ceil(len(pairs) / cols)
    fig = Figure(figsize=(3.9 * cols, 3.3 * rows), layout="constrained")
    for k, (i, j) in enumerate(pairs):
        ax = fig.add_subplot(rows, cols, k + 1)
        ax.scatter([t.values[i] for t in complete], [t.values[j] for t in complete], s=22, color="#b0b0b0", label="all complete trials")
        ax.scatter([t.values[i] for t in front], [t.values[j] for t in front], s=40, color="#d32f2f", edgecolor="black", linewidth=0.5, label="Pareto front", zorder=3)
        for n, t in enumerate(sorted(front, key=lambda t: (t.values[i], t.values[j]))):
            # Alternate above/below so that labels of neighbouring points do not overprint.
            ax.annotate(str(t.number), (t.values[i], t.values[j]), textcoords="offset points", xytext=(4, 3 if n % 2 else -9), fontsize=7)
        ax.set_xlabel(names[i])
        ax.set_ylabel(names[j])
        ax.grid(alpha=0.3)
        if k == 0:
            ax.legend(fontsize=7, loc="best")
    return Plot("front", "Pareto front, projected on each pair of objectives",
                "Every complete trial in grey, the Pareto-optimal ones in red with their trial number. A front point can sit "
                "inside the cloud of one projection: it is best on another objective.", _png(fig))


def _acceptance_plot(complete: list[FrozenTrial]) -> Plot | None:
    points = [(_number(_param(t, STEPS)), _param(t, TOPK), _number(t.user_attrs.get("accept_length")), _param(t, DRAFT)) for t in complete]
    points = [(s, k, a, d) for s, k, a, d in points if s is not None and a is not None]
    if not points:
        return None
    fig = Figure(figsize=(7.5, 4.2), layout="constrained")
    ax = fig.add_subplot()
    topks = sorted({k for _, k, _, _ in points}, key=lambda k: (k is None, k))
    width = 0.5 / max(1, len(topks))
    for n, k in enumerate(topks):
        offset = (n - (len(topks) - 1) / 2) * width
        group = [(s, a, d) for s, kk, a, d in points if kk == k]
        color = f"C{n}"
        ax.scatter([s + offset for s, _, _ in group], [a for _, a, _ in group], color=color, s=30, alpha=0.8, label=f"topk {k if k is not None else '?'}")
        for s, a, d in group:
            if k != 1 and d is not None:  # a tree verifies only its draft tokens: they cap acceptance
                ax.annotate(f"d={d}", (s + offset, a), textcoords="offset points", xytext=(4, -9), fontsize=7, color=color)
        steps = sorted({s for s, _, _ in group})
        means = [sum(a for s2, a, _ in group if s2 == s) / sum(1 for s2, _, _ in group if s2 == s) for s in steps]
        ax.plot([s + offset for s in steps], means, color=color, alpha=0.6)
    steps = sorted({s for s, _, _, _ in points})
    ax.plot(steps, [s + 1 for s in steps], linestyle="--", color="#9e9e9e", label="steps + 1 (every draft accepted)")
    ax.set_xticks(steps)
    ax.set_xlabel("speculative_num_steps")
    ax.set_ylabel("accept length (tokens per verify step)")
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8)
    return Plot("acceptance", "Accept length vs speculative_num_steps, by topk",
                "The server's average accept length over the measured phases; lines join the mean per step count. "
                "Deeper drafts are accepted less and less per extra step, and a tree (topk > 1) verifies only its "
                "speculative_num_draft_tokens (labelled d=N), which caps its accept length.",
                _png(fig))


def _capacity_plot(complete: list[FrozenTrial], names: list[str]) -> Plot | None:
    if "capacity" in names:
        label, y_of = "capacity (requests)", (lambda t: t.values[names.index("capacity")])
    else:
        label, y_of = "max_running_requests", (lambda t: _number(t.user_attrs.get("max_running_requests")))
    points = [(_number(_param(t, DRAFT)), _number(_param(t, MEM)), y_of(t)) for t in complete]
    points = [p for p in points if p[2] is not None and (p[0] is not None or p[1] is not None)]
    if not points:
        return None
    fig = Figure(figsize=(11, 4.2), layout="constrained")
    for k, (x_index, c_index, xlabel, clabel, cmap) in enumerate((
        (0, 1, "speculative_num_draft_tokens", "mem_fraction_static", "viridis"),
        (1, 0, "mem_fraction_static", "speculative_num_draft_tokens", "plasma"),
    )):
        ax = fig.add_subplot(1, 2, k + 1)
        shown = [p for p in points if p[x_index] is not None]
        colors = [p[c_index] if p[c_index] is not None else math.nan for p in shown]
        art = ax.scatter([p[x_index] for p in shown], [p[2] for p in shown], c=colors, cmap=cmap, s=36, edgecolor="black", linewidth=0.4)
        if any(not math.isnan(c) for c in colors):
            fig.colorbar(art, ax=ax, label=clabel)
        if x_index == 0:
            ax.xaxis.set_major_locator(MaxNLocator(integer=True))
        ax.set_xlabel(xlabel)
        ax.set_ylabel(label)
        ax.grid(alpha=0.3)
    return Plot("capacity", f"{label.split(' ')[0].capitalize()} vs draft tokens and vs mem_fraction_static",
                "Requests of this workload the KV cache holds at once. Every draft token is verified for every running request, "
                "so more draft tokens cost KV room; a higher mem_fraction_static buys it back until CUDA graphs no longer fit.",
                _png(fig))


def _hypervolume_plot(finished: list[FrozenTrial]) -> Plot | None:
    ordered = sorted(finished, key=lambda t: t.number)
    if not any(t.state == TrialState.COMPLETE for t in ordered):
        return None
    series = study_history(ordered)
    numbers = [t.number for t in ordered]
    fig = Figure(figsize=(7.5, 3.6), layout="constrained")
    ax = fig.add_subplot()
    ax.step(numbers, series, where="post", color="#1565c0")
    for state, style in ((TrialState.COMPLETE, dict(marker="o", color="#1565c0", label="complete")),
                         (TrialState.PRUNED, dict(marker="x", color="#c62828", label="pruned")),
                         (TrialState.FAIL, dict(marker="X", color="#000000", label="failed"))):
        xs = [(n, h) for n, h, t in zip(numbers, series, ordered) if t.state == state]
        if xs:
            ax.scatter([n for n, _ in xs], [h for _, h in xs], s=24, zorder=3, **style)
    ax.set_ylim(0, 1.05)
    ax.xaxis.set_major_locator(MaxNLocator(integer=True))
    ax.set_xlabel("trial")
    ax.set_ylabel("hypervolume (fraction of the final box)")
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8, loc="lower right")
    return Plot("hypervolume", "Hypervolume of the front over trials",
                "How much of the objective space the front dominates after each trial, each objective divided by its best value. "
                "A long flat tail means more trials are unlikely to find much better trade-offs.", _png(fig))


def _outcome(trial: FrozenTrial) -> str:
    if trial.state == TrialState.COMPLETE:
        return "complete"
    if trial.state == TrialState.FAIL:
        return "fail"
    if trial.user_attrs.get("ruled_out_by") is not None:
        return "ruled_out"
    kind = trial.user_attrs.get("failure_kind")
    return kind if kind in OUTCOMES else "pruned"


def _failure_plot(finished: list[FrozenTrial]) -> Plot | None:
    points = [(_number(_param(t, MEM)), _number(_param(t, DRAFT)), _outcome(t)) for t in finished]
    points = [p for p in points if p[0] is not None and p[1] is not None]
    if not points:
        return None
    fig = Figure(figsize=(7.5, 4.4), layout="constrained")
    ax = fig.add_subplot()
    for outcome, style in OUTCOMES.items():
        group = [(m, d) for m, d, o in points if o == outcome]
        if group:
            look = dict(facecolors="none", edgecolors=style["color"]) if outcome == "complete" else dict(color=style["color"])
            ax.scatter([m for m, _ in group], [d for _, d in group], s=42, marker=style["marker"], alpha=0.85,
                       label=style["label"], zorder=3, linewidths=1.2, **look)
    ax.yaxis.set_major_locator(MaxNLocator(integer=True))
    ax.set_xlabel("mem_fraction_static")
    ax.set_ylabel("speculative_num_draft_tokens")
    ax.grid(alpha=0.3)
    ax.legend(fontsize=7, loc="best")
    return Plot("failures", "Where configurations fail: mem_fraction_static vs draft tokens",
                "Every finished trial by how it ended. Too little memory for the KV cache fails on the left; "
                "too little left for CUDA graphs fails on the right; crashes mid-benchmark are failures, not pruned.", _png(fig))


# --- build and write ------------------------------------------------------------------------

def build(study: optuna.Study, *, sampler: str | None = None, target: str | None = None) -> Report:
    """Everything the report shows, from the study alone (`sampler`/`target` describe the config)."""
    names = _names(study)
    trials = sorted(study.get_trials(deepcopy=False), key=lambda t: t.number)
    complete = [t for t in trials if t.state == TrialState.COMPLETE and t.values and len(t.values) == len(names)]
    finished = [t for t in trials if t.state.is_finished()]
    front = measured_front(study) if complete else []
    choices = _choices(study, names) if front else []
    plots = [_front_plot(complete, front, names), _acceptance_plot(complete), _capacity_plot(complete, names),
             _hypervolume_plot(finished), _failure_plot(finished)]
    return Report(
        study_name=study.study_name,
        summary=_summary(study, trials, names, sampler, target),
        notes=_notes(trials, complete),
        pareto=_pareto(study, names, choices) if front else Table([], []),
        choices=choices,
        failures=_failures(trials),
        plots=[p for p in plots if p is not None],
        generated=f"{datetime.now():%Y-%m-%d %H:%M}",
    )


_CSS = """
body { font: 15px/1.5 system-ui, -apple-system, "Segoe UI", Roboto, sans-serif; color: #1d1d1f; background: #fafafa; margin: 0; }
main { max-width: 1180px; margin: 0 auto; padding: 24px 32px 64px; }
h1 { font-size: 26px; margin-bottom: 0; } h2 { margin-top: 36px; border-bottom: 1px solid #ddd; padding-bottom: 4px; }
.sub { color: #666; margin-top: 4px; }
table { border-collapse: collapse; background: #fff; font-variant-numeric: tabular-nums; }
th, td { border: 1px solid #e0e0e0; padding: 4px 9px; text-align: right; }
th { background: #f0f0f0; } td.text, th.text { text-align: left; }
table.kv td:first-child { font-weight: 600; text-align: left; white-space: nowrap; } table.kv td { text-align: left; }
.note { background: #fff8e1; border-left: 4px solid #ffb300; padding: 8px 12px; margin: 12px 0; }
.choices { display: grid; grid-template-columns: repeat(auto-fill, minmax(520px, 1fr)); gap: 14px; }
.choice { background: #fff; border: 1px solid #e0e0e0; border-radius: 6px; padding: 10px 14px; }
.choice h3 { margin: 0 0 4px; font-size: 16px; } .choice p { margin: 4px 0; }
pre { background: #263238; color: #eceff1; padding: 8px 10px; border-radius: 4px; white-space: pre-wrap; overflow-wrap: anywhere; margin: 6px 0 0; }
figure { margin: 18px 0 28px; } figure img { max-width: 100%; border: 1px solid #e0e0e0; background: #fff; }
figcaption { color: #444; max-width: 900px; } .legend { color: #555; font-size: 13px; }
"""


def _html_table(table: Table, text_columns: tuple[str, ...] = ()) -> str:
    def cls(name: str) -> str:
        return ' class="text"' if name in text_columns else ""

    head = "".join(f"<th{cls(h)}>{html.escape(h)}</th>" for h in table.header)
    body = "".join("<tr>" + "".join(f"<td{cls(h)}>{html.escape(c)}</td>" for h, c in zip(table.header, row)) + "</tr>" for row in table.rows)
    return f"<table><thead><tr>{head}</tr></thead><tbody>{body}</tbody></table>"


def _choice_html(c: Choice) -> str:
    return (f'<div class="choice"><h3>{html.escape(c.label)}: trial {c.trial}</h3><p>{html.escape(c.values)}</p>'
            f"<p>Why: {html.escape(c.reason)}.</p><pre><code>{html.escape(c.flags)}</code></pre></div>")


def write_html(report: Report, path: Path) -> Path:
    """One file: styles inline, plots as base64 PNGs, no script and no external reference."""
    e = html.escape
    parts = [f'<!doctype html>\n<html lang="en"><head><meta charset="utf-8"><title>Study {e(report.study_name)}: speculative-decoding report</title>'
             f"<style>{_CSS}</style></head><body><main>",
             f"<h1>Speculative-decoding study <code>{e(report.study_name)}</code></h1>",
             f'<p class="sub">Generated {e(report.generated)} by <code>python -m tuner.report</code>.</p>',
             "<h2>Summary</h2><table class=\"kv\">" + "".join(f"<tr><td>{e(k)}</td><td>{e(v)}</td></tr>" for k, v in report.summary) + "</table>",
             *(f'<p class="note">{e(n)}</p>' for n in report.notes)]
    if report.choices:
        parts.append("<h2>Best configuration per objective</h2><p>From <code>tuner.picks</code>: ties within measurement noise "
                     "go to fewer draft tokens (more KV headroom). Append the flags to the launch command, or run "
                     "<code>python -m tuner.best --pick NAME</code>.</p>")
        parts.append('<div class="choices">' + "".join(_choice_html(c) for c in report.choices) + "</div>")
    if report.pareto.rows:
        parts.append("<h2>Pareto front</h2>" + _html_table(report.pareto, ("picked for",)))
        parts.append(f'<p class="legend">{e(_LEGEND)}</p>')
    if report.plots:
        parts.append("<h2>Figures</h2>")
        for p in report.plots:
            data = base64.b64encode(p.png).decode("ascii")
            parts.append(f'<figure id="{e(p.name)}"><h3>{e(p.title)}</h3><img alt="{e(p.title)}" src="data:image/png;base64,{data}">'
                         f"<figcaption>{e(p.caption)}</figcaption></figure>")
    parts.append("<h2>Pruned and failed trials</h2>")
    parts.append(_html_table(report.failures, ("kind", "reason", "state")) if report.failures.rows else "<p>None.</p>")
    parts.append("</main></body></html>\n")
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("\n".join(parts), encoding="utf-8")
    return path


_LEGEND = ("steps, topk, draft, mem: --speculative-num-steps, --speculative-eagle-topk, --speculative-num-draft-tokens, "
           "--mem-fraction-static; accept: average accept length; max_running: max_running_requests; "
           "kv_tokens: max_total_num_tokens. Sorted by the first objective.")


def _md_cell(value: str) -> str:
    return value.replace("|", "\\|").replace("\n", " ")


def _md_table(table: Table) -> str:
    lines = ["| " + " | ".join(table.header) + " |", "|" + "|".join("---:" if h not in ("kind", "reason", "state", "picked for") else "---" for h in table.header) + "|"]
    lines += ["| " + " | ".join(_md_cell(c) for c in row) + " |" for row in table.rows]
    return "\n".join(lines)


def write_markdown(report: Report, path: Path) -> list[Path]:
    """report.md, and its plots as PNG files beside it; returns every path written."""
    path.parent.mkdir(parents=True, exist_ok=True)
    lines = [f"# Speculative-decoding study `{report.study_name}`", "", f"Generated {report.generated} by `python -m tuner.report`.", "",
             "## Summary", "", *(f"- **{k}**: {v}" for k, v in report.summary), ""]
    lines += [f"> {n}\n" for n in report.notes]
    if report.choices:
        lines += ["## Best configuration per objective", "",
                  "From `tuner.picks`: ties within measurement noise go to fewer draft tokens (more KV headroom).", ""]
        for c in report.choices:
            lines += [f"### {c.label}: trial {c.trial}", "", c.values, "", f"Why: {c.reason}.", ""]
            lines += ["```", c.flags, "```", ""]
    if report.pareto.rows:
        lines += ["## Pareto front", "", _md_table(report.pareto), "", _LEGEND, ""]
    written = []
    if report.plots:
        lines += ["## Figures", ""]
        for p in report.plots:
            png = path.parent / f"{p.name}.png"
            png.write_bytes(p.png)
            written.append(png)
            lines += [f"### {p.title}", "", f"![{p.title}]({png.name})", "", p.caption, ""]
    lines += ["## Pruned and failed trials", "", _md_table(report.failures) if report.failures.rows else "None.", ""]
    path.write_text("\n".join(lines), encoding="utf-8")
    return [path, *written]


# --- command line ---------------------------------------------------------------------------

def default_out(config: Config) -> Path:
    """`<dir of the sqlite file>/<name>.report/` (studies/demo.report for the demo), else studies/<name>.report/."""
    url = config.storage_url
    if url.startswith("sqlite:///") and url[len("sqlite:///"):] not in ("", ":memory:"):
        return Path(url[len("sqlite:///"):]).expanduser().parent / f"{config.study.name}.report"
    return Path("studies") / f"{config.study.name}.report"


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m tuner.report", description="Write a study as a self-contained HTML page and a Markdown report with plots.")
    p.add_argument("--config", default=DEFAULT_CONFIG, help=f"study config (default {DEFAULT_CONFIG})")
    p.add_argument("--study-name", help="overrides [study] name")
    p.add_argument("--storage", help="overrides [study] storage")
    p.add_argument("--out", help="output directory (default: <name>.report/ beside the sqlite file, else studies/<name>.report/)")
    args = p.parse_args(argv)
    optuna.logging.set_verbosity(optuna.logging.WARNING)
    warnings.filterwarnings("ignore", category=optuna.exceptions.ExperimentalWarning)
    out = None
    try:
        config = apply_overrides(load_config(args.config), study_name=args.study_name, storage=args.storage)
        study = load_existing_study(config)
        report = build(study, sampler=config.study.sampler, target=f"{config.target.host} ({config.target.manager}), {config.target.url}")
        out = Path(args.out) if args.out else default_out(config)
        paths = [write_html(report, out / "report.html"), *write_markdown(report, out / "report.md")]
    except TunerError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    except OSError as exc:
        print(f"error: cannot write the report to {out}: {exc.strerror or exc}; pass --out with a writable directory", file=sys.stderr)
        return 2
    for path in paths:
        print(path)
    return 0


if __name__ == "__main__":
    sys.exit(main())
