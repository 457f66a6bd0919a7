"""Which of a study's measurements an adaptive table can reuse, at which one memory fraction
the rest is launched, and what those launches will cost -- said before anything is launched.

One table, one memory fraction: throughput under load depends on the KV pool, so figures of
steps 3 at 0.80 beside steps 4 at 0.93 make a level's row dip where the schedule should not
(issue 25: "2:1,137 3:1,090 4:1,347" at level 16).  The fraction is the one most reusable
launches ran at (ties: the lower, which the deeper steps more likely start at); every missing
steps value is launched there, and figures at other fractions are set aside with the reason.
Steps 0 (no speculation) keeps the command's own fraction: its pool holds no draft state.
"""

from __future__ import annotations

import math
from collections import Counter
from dataclasses import dataclass
from typing import Iterable, Mapping

from optuna.trial import FrozenTrial, TrialState

from tuner.results import record
from tuner.results.adaptive_table import Sample
from tuner.results.estimate import DEFAULT_MEASURE_S, DEFAULT_STARTUP_S

__all__ = ["table_fraction", "at_fraction", "not_reusable", "launch_plan_lines"]


def table_fraction(samples: Iterable[Sample], fallback: float | None) -> float | None:
    """The memory fraction of the table: the one most speculative launches measured ran at."""
    counts = Counter(round(s.mem_fraction_static, 4) for s in samples if s.steps > 0 and s.mem_fraction_static is not None)
    if not counts:
        return fallback
    return min(counts, key=lambda f: (-counts[f], f))


def _same(a: float | None, b: float | None) -> bool:
    return a is None and b is None or (a is not None and b is not None and math.isclose(a, b, abs_tol=1e-4))


def at_fraction(samples: Iterable[Sample], fraction: float | None) -> tuple[list[Sample], dict[str, str]]:
    """The samples measured at `fraction` (and steps 0), and why each other one is set aside."""
    kept, dropped = [], {}
    for s in samples:
        if s.steps == 0 or _same(s.mem_fraction_static, fraction):
            kept.append(s)
        else:
            dropped[s.source] = (f"steps {s.steps} measured at mem_fraction_static {s.mem_fraction_static}; "
                                 f"the table's launches run at {fraction} (one table, one fraction)")
    return kept, dropped


def not_reusable(trials: Iterable[FrozenTrial], levels: Iterable[int], source: str = "study") -> dict[str, str]:
    """Per trial of the study that gives the table nothing, why (a line each for the user)."""
    wanted = set(levels)
    out = {}
    for t in trials:
        flags = t.user_attrs.get(record.FLAGS) or {}
        measured = {int(k) for k in (t.user_attrs.get(record.CONCURRENT_TPS_BY_LEVEL) or {}) if str(k).isdigit()}
        if t.state != TrialState.COMPLETE:
            why = f"{t.state.name}, nothing measured"
        elif t.user_attrs.get(record.DUPLICATE_OF) is not None:
            why = f"a duplicate of trial {t.user_attrs[record.DUPLICATE_OF]}"
        elif flags.get("speculative_eagle_topk") not in (1, None):
            why = f"topk {flags['speculative_eagle_topk']}: SGLang's adaptive mode runs topk-1 chains only"
        elif not measured & wanted:
            why = f"measured at level(s) {sorted(measured) or 'none'}, none of {sorted(wanted)}"
        else:
            continue
        out[f"{source}#{t.number}"] = why
    return out


@dataclass(frozen=True)
class LaunchCost:
    startup_s: float
    measure_s: float


def launch_cost(trials: Iterable[FrozenTrial], levels_ratio: float) -> LaunchCost:
    """One schedule launch from the study's history: its median start-up, and its median
    measurement scaled by how many more levels a schedule launch measures."""
    done = [t for t in trials if t.state == TrialState.COMPLETE]

    def median(key: str) -> float | None:
        values = sorted(v for t in done if isinstance(v := t.user_attrs.get(key), (int, float)))
        return values[len(values) // 2] if values else None

    return LaunchCost(median(record.STARTUP_S) or DEFAULT_STARTUP_S, (median(record.MEASURE_S) or DEFAULT_MEASURE_S) * levels_ratio)


def launch_plan_lines(reused: Mapping[int, list[str]], todo: list[int], fraction: float | None, cost: LaunchCost,
                      set_aside: Mapping[str, str]) -> list[str]:
    """What the schedule reuses, sets aside (and why), launches, and what that costs."""
    lines = [f"reusing: steps {s} from {', '.join(src)}" for s, src in sorted(reused.items()) if src]
    lines += [f"not reusable: {src}: {why}" for src, why in set_aside.items()]
    if not todo:
        return lines + ["plan: every steps value has figures at every level; nothing is started"]
    at = f"mem_fraction_static {fraction}" if fraction is not None else "the command's mem_fraction_static"
    each = cost.startup_s + cost.measure_s
    lines.append(f"plan: launch steps {', '.join(map(str, todo))} (one launch each, every level measured) at {at}; "
                 f"estimate ~{len(todo) * each / 60:.0f} min ({cost.startup_s:.0f} s start-up + {cost.measure_s:.0f} s "
                 "measurement per launch, from the study's history)")
    return lines
