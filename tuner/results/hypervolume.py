"""How much of the objective space a study's front covers, and when it stops growing.

Objectives are maximised and non-negative (tokens per second, requests), so each is divided
by its largest value among the trials considered and the reference point is the origin: the
hypervolume of a front is a fraction of the unit box, comparable across the trials of one
history.  Small fronts only (tens of points): an exact recursive slicing is enough, and avoids
depending on Optuna's private hypervolume module.
"""

from __future__ import annotations

from typing import Sequence

import optuna
from optuna.trial import FrozenTrial, TrialState

__all__ = ["hypervolume", "history", "study_history", "stalled"]


def _pareto(points: list[tuple[float, ...]]) -> list[tuple[float, ...]]:
    out = []
    for p in points:
        if not any(all(q[i] >= p[i] for i in range(len(p))) and q != p for q in points):
            if p not in out:
                out.append(p)
    return out


def hypervolume(points: Sequence[Sequence[float]]) -> float:
    """Exact hypervolume dominated by `points` (maximisation) above the origin."""
    pts = _pareto([tuple(max(0.0, float(x)) for x in p) for p in points])
    if not pts:
        return 0.0
    if len(pts[0]) == 1:
        return max(p[0] for p in pts)
    # Slice along the last objective: between consecutive levels, the (d-1)-volume of the
    # points reaching that level.
    levels = sorted({p[-1] for p in pts}, reverse=True)
    volume = 0.0
    for i, level in enumerate(levels):
        below = levels[i + 1] if i + 1 < len(levels) else 0.0
        slab = [p[:-1] for p in pts if p[-1] >= level]
        volume += hypervolume(slab) * (level - below)
    return volume


def history(values: list[Sequence[float]]) -> list[float]:
    """Normalised hypervolume after each of a sequence of measured values (None: not measured)."""
    measured = [v for v in values if v is not None]
    if not measured:
        return [0.0] * len(values)
    scale = [max(v[i] for v in measured) or 1.0 for i in range(len(measured[0]))]
    out, seen = [], []
    for v in values:
        if v is not None:
            seen.append([x / s for x, s in zip(v, scale)])
        out.append(hypervolume(seen))
    return out


def study_history(trials: list[FrozenTrial]) -> list[float]:
    """Hypervolume after each trial, in trial order; duplicates add nothing new."""
    ordered = sorted(trials, key=lambda t: t.number)
    return history([list(t.values) if t.state == TrialState.COMPLETE and t.values else None for t in ordered])


def stalled(study: optuna.Study, patience: int, *, threshold: float = 0.01) -> bool:
    """True when the last `patience` trials grew the hypervolume by less than `threshold`."""
    trials = [t for t in study.get_trials(deepcopy=False) if t.state.is_finished()]
    if patience <= 0 or len(trials) <= patience:
        return False
    series = study_history(trials)
    before, now = series[-patience - 1], series[-1]
    if now == 0:
        return False
    return (now - before) / now < threshold
