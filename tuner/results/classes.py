"""Figures per request class of the front and the baselines, and where a configuration loses.

A configuration can be fast on the mix and slow on one class: speculation's payoff falls with
the context it drafts over (vLLM #47602: position-1 acceptance 93.5% -> 72.1% as the context
grows; llama.cpp: +150% at ~100 tokens, parity at ~86k) and differs by the kind of text
(SPEED-Bench).  `losses` names every class on which a trial's single-stream decode rate is
below the no-speculation baseline's by more than the measurement noise.
"""

from __future__ import annotations

import math

import optuna
from optuna.trial import FrozenTrial, TrialState

from tuner.results import baselines, record
from tuner.results.optuna_private import storage_of
from tuner.results.picks import DEFAULT_NOISE

__all__ = ["CLASS_HEADER", "class_rows", "losses", "no_speculation", "pick_summary", "pick_lines"]

CLASS_HEADER = ["configuration", "class", "share", "requests", "single_tps", "vs no speculation", "accept", "prompt tokens", "concurrent_tps"]


def _num(value, digits: int = 1) -> str:
    if value is None or (isinstance(value, float) and math.isnan(value)):
        return "-"
    return f"{value:,.{digits}f}" if isinstance(value, float) else f"{value:,}"


def no_speculation(study: optuna.Study) -> FrozenTrial | None:
    """The study's no-speculation baseline, when it was measured."""
    arm = baselines.load(storage_of(study), study.study_name).get("no_speculation")
    return arm if arm is not None and arm.state == TrialState.COMPLETE else None


def _ratio(trial: FrozenTrial, base: FrozenTrial | None, name: str) -> float | None:
    mine = record.by_class_of(trial).get(name, {}).get("single_tps")
    theirs = record.by_class_of(base).get(name, {}).get("single_tps") if base is not None else None
    return mine / theirs if mine and theirs else None


def losses(trial: FrozenTrial, base: FrozenTrial | None) -> list[str]:
    """"long_context: 0.80x no speculation (412.0 vs 515.3 tok/s)" for every class this trial
    decodes more slowly than the no-speculation baseline, beyond the noise."""
    out = []
    for name, figures in record.by_class_of(trial).items():
        ratio = _ratio(trial, base, name)
        if ratio is not None and ratio < 1 - DEFAULT_NOISE:
            theirs = record.by_class_of(base)[name]["single_tps"]
            out.append(f"{name}: {ratio:.2f}x no speculation ({figures['single_tps']:,.1f} vs {theirs:,.1f} tok/s)")
    return out


def class_rows(labelled: list[tuple[str, FrozenTrial]], base: FrozenTrial | None) -> list[list[str]]:
    """One row per (configuration, class) of `CLASS_HEADER`; trials recorded before classes give none."""
    rows = []
    for label, trial in labelled:
        for name, f in record.by_class_of(trial).items():
            ratio = _ratio(trial, base, name)
            rows.append([label, name, _num(f.get("share"), 2), _num(f.get("requests")), _num(f.get("single_tps")),
                         f"{ratio:.2f}x" if ratio is not None else "-", _num(f.get("accept_length"), 2),
                         _num(f.get("prompt_tokens_median"), 0), _num(f.get("concurrent_tps"))])
    return rows


def pick_summary(study: optuna.Study, trial: FrozenTrial) -> tuple[list[list[str]], list[str]]:
    """The pick's rows beside the baselines' (CLASS_HEADER), and its losses to no speculation."""
    arms = {k: t for k, t in baselines.load(storage_of(study), study.study_name).items() if t.state == TrialState.COMPLETE}
    base = arms.get("no_speculation")
    labelled = [(f"trial {trial.number}", trial), *((k.replace("_", " "), t) for k, t in arms.items())]
    return class_rows(labelled, base), losses(trial, base)


def pick_lines(study: optuna.Study, trial: FrozenTrial) -> list[str]:
    """For stderr under a pick: its figures per request class beside the baselines' ("#   "
    lines, aligned) and a warning per class it decodes more slowly than no speculation."""
    rows, lost = pick_summary(study, trial)
    lines = []
    if rows:
        widths = [max(len(r[i]) for r in [CLASS_HEADER, *rows]) for i in range(len(CLASS_HEADER))]
        lines = ["#   " + "  ".join(cell.rjust(w) for cell, w in zip(row, widths)) for row in [CLASS_HEADER, *rows]]
    return lines + [f"warning: trial {trial.number} is slower than no speculation on {loss}" for loss in lost]
