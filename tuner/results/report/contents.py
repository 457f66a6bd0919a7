"""What the report shows, read from the study's trials: its tables, choices and notes."""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any

import optuna
from optuna.trial import FrozenTrial, TrialState

from tuner.results import baselines, classes
from tuner.results.optuna_private import storage_of
from tuner.results.record import params_of
from tuner.results.hypervolume import study_history
from tuner.results.picks import measured_front, pick
from tuner.results import record
from tuner.sglang_args import Params
from tuner.results.terminal import PARAM_COLUMNS, fmt



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
    baselines: Table = field(default_factory=lambda: Table([], []))  # the no-speculation / adaptive arms
    over_baselines: list[str] = field(default_factory=list)  # what tuning adds over each
    schedule: Any = None  # report.adaptive_section.ScheduleSection: the latest tuned adaptive table, if any
    # Configurations never launched that the model sampler's model expects on or near the
    # front (tuner/search/model_sampler.py · predicted_front), set by tuner.report.
    predicted: Table | None = None
    predicted_note: str = ""
    # Figures per request class of the front and the baselines (tuner/results/classes.py), and
    # every front trial's classes slower than no speculation.
    by_class: Table = field(default_factory=lambda: Table([], []))
    class_losses: list[str] = field(default_factory=list)


# --- reading trials -------------------------------------------------------------------------

def param_of(trial: FrozenTrial, key: str) -> Any:
    """A searched flag's value as passed to the server: the `flags` attr, else trial.params."""
    flags = trial.user_attrs.get(record.FLAGS)
    value = flags.get(key) if isinstance(flags, dict) else None
    if value is None:
        value = trial.params.get(key)
    if value is None and key == DRAFT and trial.params.get(TOPK) == 1 and trial.params.get(STEPS) is not None:
        value = trial.params[STEPS] + 1  # SGLang forces it when topk is 1
    return value


def as_number(value: Any) -> float | None:
    return float(value) if isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value) else None


def _flags_text(trial: FrozenTrial) -> str:
    params = params_of(trial) or Params(**{key: param_of(trial, key) for key, _ in PARAM_COLUMNS})
    return " ".join(params.flags()) or "(the base command's own flags)"


def _cell(value: Any) -> str:
    return f"{value:g}" if isinstance(value, float) else fmt(value)


def metric_names_of(study: optuna.Study) -> list[str]:
    return list(study.metric_names or [f"objective_{i}" for i in range(len(study.directions))])


# --- content --------------------------------------------------------------------------------

def summary_rows(study: optuna.Study, trials: list[FrozenTrial], names: list[str], sampler: str | None, target: str | None) -> list[tuple[str, str]]:
    counts: dict[str, int] = {}
    for t in trials:
        counts[t.state.name.lower()] = counts.get(t.state.name.lower(), 0) + 1
    rows = [
        ("study", study.study_name),
        ("objectives", ", ".join(names) + " (all maximised)"),
        ("trials", f"{len(trials)}: " + ", ".join(f"{n} {s}" for s, n in sorted(counts.items())) if trials else "none yet"),
    ]
    duplicates = sum(1 for t in trials if t.user_attrs.get(record.DUPLICATE_OF) is not None)
    ruled_out = sum(1 for t in trials if t.user_attrs.get(record.RULED_OUT_BY) is not None)
    settled = [f"{duplicates} duplicate(s) of an earlier trial" if duplicates else "",
               f"{ruled_out} ruled out by an earlier memory failure" if ruled_out else ""]
    if duplicates or ruled_out:
        rows.append(("settled without a launch", ", ".join(filter(None, settled))))
    rows.append(("Pareto front", f"{len(measured_front(study))} measured configuration(s)"))
    if sampler:
        rows.append(("sampler (config)", sampler))
    where = sorted({str(t.user_attrs[record.TARGET]) for t in trials if t.user_attrs.get(record.TARGET)})
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


def notes_for(trials: list[FrozenTrial], complete: list[FrozenTrial]) -> list[str]:
    notes = []
    if not complete:
        notes.append("No trial has completed yet: there is no Pareto front, best configuration or trade-off plot. "
                     "The pruned and failed trials below say what went wrong.")
    no_flags = [t.number for t in trials if not isinstance(t.user_attrs.get(record.FLAGS), dict)]
    if no_flags:
        notes.append(f"{len(no_flags)} trial(s) carry no `flags` attribute (made by another tool?): their parameters "
                     "come from the trial's params, and missing measurements show as '-'.")
    duplicates = [t.number for t in complete if t.user_attrs.get(record.DUPLICATE_OF) is not None]
    if duplicates:
        notes.append(f"Trial(s) {', '.join(map(str, duplicates))} repeat an earlier trial's flags (`duplicate_of`) and "
                     "carry its values; the tables show only the trials that were measured.")
    return notes


def pareto_for(study: optuna.Study, names: list[str], choices: list[Choice]) -> Table:
    header = ["trial", *(short for _, short in PARAM_COLUMNS), *names, "accept", "max_running", "kv_tokens", "backend / page", "picked for"]
    picked: dict[int, list[str]] = {}
    for c in choices:
        picked.setdefault(c.trial, []).append(c.label)
    rows = []
    for t in sorted(measured_front(study), key=lambda t: -t.values[0]):
        rows.append([
            str(t.number),
            *(_cell(param_of(t, key)) for key, _ in PARAM_COLUMNS),
            *(fmt(v) for v in t.values),
            fmt(t.user_attrs.get(record.ACCEPT_LENGTH), 2),
            fmt(t.user_attrs.get(record.MAX_RUNNING_REQUESTS)),
            fmt(t.user_attrs.get(record.MAX_TOTAL_NUM_TOKENS)),
            # What actually ran: topk > 1 silently switches fa3 to flashinfer on Hopper.
            f"{t.user_attrs.get(record.ATTENTION_BACKEND) or '-'} / {t.user_attrs.get(record.PAGE_SIZE) or '-'}",
            ", ".join(picked.get(t.number, [])),
        ])
    return Table(header, rows)


def choices_for(study: optuna.Study, names: list[str]) -> list[Choice]:
    out = []
    for how in [*names, *(["balanced"] if len(names) > 1 else [])]:
        try:
            p = pick(study, how)
        except ValueError:
            continue
        values = ", ".join(f"{n} {fmt(v)}" for n, v in zip(names, p.trial.values))
        out.append(Choice(how, p.trial.number, values, p.reason, p.tied_with, _flags_text(p.trial)))
    return out


def failures_table(trials: list[FrozenTrial]) -> Table:
    header = ["trial", "state", *(short for _, short in PARAM_COLUMNS), "kind", "reason"]
    rows = []
    for t in trials:
        if t.state not in (TrialState.PRUNED, TrialState.FAIL):
            continue
        kind = t.user_attrs.get(record.FAILURE_KIND) or "-"
        if t.user_attrs.get(record.RULED_OUT_BY) is not None:
            kind = f"ruled out by {t.user_attrs[record.RULED_OUT_BY]}"
        reason = (str(t.user_attrs.get(record.FAIL_REASON) or "").splitlines() or ["-"])[0]
        rows.append([str(t.number), t.state.name, *(_cell(param_of(t, key)) for key, _ in PARAM_COLUMNS), kind, reason])
    return Table(header, rows)




def baselines_for(study: optuna.Study, names: list[str]) -> tuple[Table, list[str]]:
    """The baseline arms (sibling study `<name>@baselines`) beside the front, and what tuning adds."""
    arms = baselines.load(storage_of(study), study.study_name)
    header = ["baseline", "state", *names, "accept", "max_running", "kv_tokens"]
    rows = []
    for kind, t in arms.items():
        if t.state == TrialState.COMPLETE:
            figures = [fmt(v) for v in t.values]
        else:
            figures = [str(t.user_attrs.get(record.FAIL_REASON) or "-").splitlines()[0][:80]] + [""] * (len(names) - 1)
        rows.append([kind.replace("_", " "), t.state.name.lower(), *figures, fmt(t.user_attrs.get(record.ACCEPT_LENGTH), 2),
                     fmt(t.user_attrs.get(record.MAX_RUNNING_REQUESTS)), fmt(t.user_attrs.get(record.MAX_TOTAL_NUM_TOKENS))])
    return Table(header, rows), [line for c in baselines.compare(study, arms) for line in c.lines]


def classes_for(study: optuna.Study, front: list[FrozenTrial]) -> tuple[Table, list[str]]:
    """Per request class: the front's trials (best first objective first) and the baselines."""
    arms = {k: t for k, t in baselines.load(storage_of(study), study.study_name).items() if t.state == TrialState.COMPLETE}
    base = arms.get("no_speculation")
    ordered = sorted(front, key=lambda t: -t.values[0])
    labelled = [(f"trial {t.number}", t) for t in ordered] + [(k.replace("_", " "), t) for k, t in arms.items()]
    losses = [f"trial {t.number}: {loss}" for t in ordered for loss in classes.losses(t, base)]
    return Table(classes.CLASS_HEADER, classes.class_rows(labelled, base)), losses
