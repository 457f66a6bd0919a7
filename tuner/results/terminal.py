"""How a study reads in a terminal: one line per trial, the Pareto table at the end."""

from __future__ import annotations

import math
from typing import Any

import optuna
from optuna.trial import FrozenTrial, TrialState
from rich.markup import escape
from rich.table import Table
from rich.text import Text

from tuner.results import record

__all__ = ["trial_line", "pareto_table", "baselines_table", "counts_line", "fmt", "PARAM_COLUMNS", "interrupted_line"]

PARAM_COLUMNS = (
    ("speculative_num_steps", "steps"),
    ("speculative_eagle_topk", "topk"),
    ("speculative_num_draft_tokens", "draft"),
    ("mem_fraction_static", "mem"),
)


def fmt(value: Any, digits: int = 1) -> str:
    if value is None:
        return "-"
    if isinstance(value, float):
        if math.isnan(value):
            return "-"
        return f"{value:.{digits}f}" if abs(value) < 1e5 else f"{value:,.0f}"
    if isinstance(value, int):
        return f"{value:,}"
    return str(value)


def _flags(trial: FrozenTrial) -> dict[str, Any]:
    return trial.user_attrs.get(record.FLAGS) or trial.params


def _params_text(trial: FrozenTrial) -> str:
    flags = _flags(trial)
    parts = []
    for key, short in PARAM_COLUMNS:
        if key in flags:
            value = flags[key]
            parts.append(f"{short}={value:g}" if isinstance(value, float) else f"{short}={value}")
    return " ".join(parts) or "base command"


def trial_line(trial: FrozenTrial, metric_names: list[str]) -> str:
    if trial.user_attrs.get(record.BASELINE):
        head = f"baseline  {trial.user_attrs[record.BASELINE].replace('_', ' '):<38}"
    else:
        head = f"trial {trial.number:>3} {_params_text(trial):<38}"
    if trial.state == TrialState.COMPLETE:
        values = "  ".join(f"{n}={fmt(v)}" for n, v in zip(metric_names, trial.values))
        spread = trial.user_attrs.get(record.SINGLE_TPS_SPREAD)
        extra = f"  (±{spread * 100:.1f}%)" if isinstance(spread, float) else ""
        accept = trial.user_attrs.get(record.ACCEPT_LENGTH)
        acc = f"  accept={accept:.2f}" if isinstance(accept, float) else ""
        return f"{head} [green]COMPLETE[/green] {values}{extra}{acc}{_request_tokens_text(trial)}"
    reason = escape(trial.user_attrs.get(record.FAIL_REASON, ""))
    color = "yellow" if trial.state == TrialState.PRUNED else "red"
    return f"{head} [{color}]{trial.state.name}[/{color}] {reason}"


def _request_tokens_text(trial: FrozenTrial) -> str:
    """The KV footprint capacity was computed with, when it was measured (`request_tokens = "auto"`)."""
    tokens = trial.user_attrs.get(record.REQUEST_TOKENS)
    return f"  request_tokens={tokens:,} (auto)" if trial.user_attrs.get(record.REQUEST_TOKENS_AUTO) and isinstance(tokens, int) else ""


def counts_line(study: optuna.Study) -> str:
    counts: dict[str, int] = {}
    for t in study.trials:
        counts[t.state.name] = counts.get(t.state.name, 0) + 1
    return ", ".join(f"{n} {s.lower()}" for s, n in sorted(counts.items())) or "no trials"


def pareto_table(study: optuna.Study, metric_names: list[str]) -> Table:
    """The Pareto-optimal trials, best first by the first objective."""
    table = Table(title=f"Pareto front of study {study.study_name!r} ({counts_line(study)})", title_justify="left")
    table.add_column("trial", justify="right")
    for _, short in PARAM_COLUMNS:
        table.add_column(short, justify="right")
    for name in metric_names:
        table.add_column(name, justify="right")
    table.add_column("accept", justify="right")
    table.add_column("max_running", justify="right")
    table.add_column("kv_tokens", justify="right")
    best = sorted(study.best_trials, key=lambda t: -t.values[0])
    for t in best:
        flags = _flags(t)
        row = [str(t.number)]
        for key, _ in PARAM_COLUMNS:
            value = flags.get(key)
            row.append(f"{value:g}" if isinstance(value, float) else fmt(value))
        row += [fmt(v) for v in t.values]
        row += [
            fmt(t.user_attrs.get(record.ACCEPT_LENGTH), 2),
            fmt(t.user_attrs.get(record.MAX_RUNNING_REQUESTS)),
            fmt(t.user_attrs.get(record.MAX_TOTAL_NUM_TOKENS)),
        ]
        table.add_row(*row)
    return table


def baselines_table(baselines: dict[str, FrozenTrial], metric_names: list[str]) -> Table:
    """The baselines beside the front: same columns of figures."""
    table = Table(title="Baselines (measured like trials, once per study)", title_justify="left")
    table.add_column("baseline")
    for name in metric_names:
        table.add_column(name, justify="right")
    table.add_column("accept", justify="right")
    table.add_column("max_running", justify="right")
    table.add_column("kv_tokens", justify="right")
    failed = []
    for kind, t in baselines.items():
        label = kind.replace("_", " ")
        if t.state != TrialState.COMPLETE:
            # The reason whole, under the table: cut to a column it lost its fix ("fix -"), and
            # cut after escaping it could eat "[server]" as markup.
            table.add_row(label, t.state.name, *[""] * (len(metric_names) + 1))
            failed.append(f"{label}: {t.state.name} {t.user_attrs.get(record.FAIL_REASON, '')}".rstrip())
            continue
        table.add_row(label, *[fmt(v) for v in t.values], fmt(t.user_attrs.get(record.ACCEPT_LENGTH), 2),
                      fmt(t.user_attrs.get(record.MAX_RUNNING_REQUESTS)), fmt(t.user_attrs.get(record.MAX_TOTAL_NUM_TOKENS)))
    if failed:
        table.caption = Text("\n".join(failed))
        table.caption_justify = "left"
    return table


def interrupted_line(interrupted: list[FrozenTrial]) -> str:
    """What a Ctrl-C or SIGTERM interrupted, said once the target is restored: the trial, the
    baseline (measured again on the next run) or the schedule launch recorded FAIL, or none."""
    def what(t: FrozenTrial) -> str:
        if t.user_attrs.get(record.BASELINE):
            return f"baseline {t.user_attrs[record.BASELINE].replace('_', ' ')} (measured again on the next run)"
        if t.user_attrs.get(record.SCHEDULE):
            return f"schedule launch {t.number} ({_params_text(t)})"
        return f"trial {t.number} ({_params_text(t)})"

    if not interrupted:
        return "interrupted between launches: no trial was running, none recorded; the target was restored"
    return f"interrupted: {', '.join(what(t) for t in interrupted)} recorded as FAIL (interrupted); the target was restored"
