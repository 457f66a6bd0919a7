"""Choosing from a finished study: the best configuration per objective, a balanced one, ties.

Two configurations tie on an objective when their values differ by less than the measurement
noise: a trial's own 95% interval where it has one (single_tps), else `DEFAULT_NOISE` (2%, the
launch-to-launch spread benchmarks/measurement_noise.py measures is ~1%); integer objectives
(capacity) tie only when equal.  Among tied configurations the pick favours fewer draft tokens
(more KV headroom), then the smaller topk, then fewer steps, then the higher capacity, then the
earlier trial; the pick's reason quotes the chosen trial's own figures and names the rule that
decided each tie.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import optuna
from optuna.trial import FrozenTrial, TrialState

from tuner.results import record

__all__ = ["DEFAULT_NOISE", "PICKS", "measured_front", "noise", "tied", "pick", "Pick", "balanced_scores"]

DEFAULT_NOISE = 0.02
PICKS = ("single_tps", "concurrent_tps", "capacity", "balanced")


@dataclass(frozen=True)
class Pick:
    trial: FrozenTrial
    how: str
    tied_with: tuple[int, ...]  # other trial numbers within noise of the best
    reason: str


def measured_front(study: optuna.Study) -> list[FrozenTrial]:
    """Pareto-optimal trials that were really measured (a duplicate only repeats its original)."""
    return [t for t in study.best_trials if t.user_attrs.get(record.DUPLICATE_OF) is None]


def noise(trial: FrozenTrial, index: int, name: str) -> float:
    """Absolute noise of objective `index` of a trial."""
    value = trial.values[index]
    if name == "single_tps":
        ci = trial.user_attrs.get(record.SINGLE_TPS_CI95)
        if isinstance(ci, list) and len(ci) == 2 and all(math.isfinite(x) for x in ci):
            return max((ci[1] - ci[0]) / 2, DEFAULT_NOISE * abs(value))
    if name == "capacity" or float(value).is_integer() and name.startswith("capacity"):
        return 0.0
    return DEFAULT_NOISE * abs(value)


def tied(a: FrozenTrial, b: FrozenTrial, index: int, name: str) -> bool:
    tolerance = max(noise(a, index, name), noise(b, index, name))
    return abs(a.values[index] - b.values[index]) <= tolerance if tolerance else a.values[index] == b.values[index]


def _shape(trial: FrozenTrial) -> tuple[int, int, int]:
    """(draft tokens, topk, steps) as passed to the server; SGLang forces draft = steps + 1 at topk 1."""
    flags = trial.user_attrs.get(record.FLAGS) or trial.params
    steps = int(flags.get("speculative_num_steps") or 0)
    topk = int(flags.get("speculative_eagle_topk") or 0)
    draft = flags.get("speculative_num_draft_tokens")
    if draft is None and topk == 1 and steps:
        draft = steps + 1
    return int(draft or 0), topk, steps


# The tie rules in order: (what a smaller key means, how a value reads).
TIE_RULES = ("fewer draft tokens", "smaller topk", "fewer steps", "higher capacity", "earlier trial")


def _tie_key(trial: FrozenTrial, names: list[str]) -> tuple:
    return (*_shape(trial), -_capacity(trial, names), trial.number)


def _decided_by(chosen: FrozenTrial, other: FrozenTrial, names: list[str]) -> str:
    """`other (rule: mine vs its)`: the first tie rule on which the two differ."""
    mine, its = _tie_key(chosen, names), _tie_key(other, names)
    for rule, a, b in zip(TIE_RULES, mine, its):
        if a != b:
            if rule == "higher capacity":
                a, b = -a, -b
            if rule == "earlier trial":
                return f"{other.number} ({rule})"
            return f"{other.number} ({rule}: {a:g} vs {b:g})"
    return str(other.number)


def _capacity(trial: FrozenTrial, names: list[str]) -> float:
    return trial.values[names.index("capacity")] if "capacity" in names else 0.0


def balanced_scores(trials: list[FrozenTrial]) -> dict[int, float]:
    """Each trial's worst objective, relative to the best value of that objective on the front:
    the balanced pick maximises it (no objective left far behind)."""
    if not trials:
        return {}
    n = len(trials[0].values)
    best = [max(t.values[i] for t in trials) or 1.0 for i in range(n)]
    return {t.number: min(t.values[i] / best[i] for i in range(n)) for t in trials}


def pick(study: optuna.Study, how: str = "balanced") -> Pick:
    names = list(study.metric_names or [f"objective_{i}" for i in range(len(study.directions))])
    front = measured_front(study)
    if not front:
        raise ValueError(f"study {study.study_name!r} has no completed trial yet")
    if how == "balanced":
        scores = balanced_scores(front)
        top = max(scores.values())
        # Ties: within the default noise of the best balanced score.
        candidates = [t for t in front if scores[t.number] >= top * (1 - DEFAULT_NOISE)]
    else:
        matches = [n for n in names if n == how or n.startswith(how + "@")]
        if not matches:
            raise ValueError(f"--pick {how}: the study's objectives are {', '.join(names)}")
        index = names.index(matches[-1])  # for per-level objectives: the most loaded level
        best = max(front, key=lambda t: t.values[index])
        candidates = [t for t in front if tied(t, best, index, names[index])]
    # Among ties: fewer draft tokens (more KV headroom), smaller topk, fewer steps, more capacity, earlier.
    chosen = min(candidates, key=lambda t: _tie_key(t, names))
    if how == "balanced":
        mine = scores[chosen.number]
        reason = f"the smallest of its objectives relative to the front's best is the highest ({mine:.0%})"
        if mine < top:
            reason = f"the smallest of its objectives relative to the front's best is {mine:.0%}, within noise of the highest ({top:.0%})"
    else:
        reason = f"the highest {names[index]} ({chosen.values[index]:.1f})"
        if chosen.number != best.number:
            reason = (f"{names[index]} {chosen.values[index]:.1f}, within measurement noise of the highest "
                      f"({best.values[index]:.1f}, trial {best.number})")
    others = tuple(t.number for t in candidates if t.number != chosen.number)
    if others:
        decided = ", ".join(_decided_by(chosen, t, names) for t in candidates if t.number != chosen.number)
        reason += f"; tied within measurement noise with trial(s) {decided}"
    return Pick(chosen, how, others, reason)


def complete_trials(study: optuna.Study) -> list[FrozenTrial]:
    return study.get_trials(deepcopy=False, states=(TrialState.COMPLETE,))
