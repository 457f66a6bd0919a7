"""The per-load schedule: SGLang 0.5.23's `--speculative-adaptive-config`, chosen from measurements.

Pure functions: trials in, figures per (steps, level) out; figures in, `candidate_steps` per level
out; a table in, the JSON SGLang loads out.  `tuner.schedule` does the launching.

The format is what SGLang 0.5.23 loads (`srt/speculative/adaptive_spec_params.py`):

- `_load_adaptive_config`: `json.load` of the file; every top-level key for which
  `key.isdigit()` is a batch-size slot, every other key is ignored there and merged under each
  slot by `AdaptiveSpeculativeParams.__init__` (`cfg={**cfg, **entry}`); a slot's
  `candidate_steps` must be a non-empty list of ints >= 0 (else `ValueError("BS <key>:
  candidate_steps must be a list of non-negative ints, got ...")`), and at least one slot must
  exist;
- `AdaptiveStepSlot.__init__` reads `ema_alpha` (0.2), `update_interval` (5), `warmup_batches`
  (10), `down_hysteresis` (-0.25), `up_hysteresis` (0.0), `ceiling_coeff` (0) with those
  defaults, so a table that omits them gets SGLang's own;
- `_find_closest_bs`: the running batch, padded to the CUDA-graph batch size, uses the nearest
  key at or below it (the smallest key below the smallest);
- `resolve_candidate_steps_from_config` + `speculative_hook.py · _init_adaptive_speculative_params`:
  `--speculative-num-steps` must be in the union of all candidate_steps (unset: its middle
  element), draft tokens = steps + 1, draft buffers sized for `max(union) + 1`.

Choice per level: a single candidate, the steps with the best measured throughput there, under
the one constraint the table shares across levels: adaptive mode sizes its draft buffers, hence
the running-request cap, for the largest candidate, so a deep candidate at one stream caps the
full batch too.  Every ceiling is tried (levels above its cap run the cap's requests, routed to
the key below it) and the one delivering the most over all levels wins.  One candidate because
SGLang moves within a slot by the EMA of accepted drafts, not by throughput: the offline
benchmark (benchmarks/schedule_benchmark.py) showed tied candidates settling 1-3% below the
measured best.  The hysteresis keys are never written: with one candidate a slot never moves.
"""

from __future__ import annotations

import json
import math
import statistics
from dataclasses import dataclass
from typing import Any, Iterable, Mapping

from optuna.trial import FrozenTrial, TrialState

from tuner.results import record
from tuner.results.picks import DEFAULT_NOISE

__all__ = [
    "DEFAULT_ADAPTIVE_CONFIG", "Sample", "Figure", "levels_up_to", "parse_levels", "samples_from_trials",
    "figures", "choose", "table_for", "validate", "dumps", "candidates_of", "missing_steps", "launch_mem_fraction",
    "steps_range", "running_cap", "expected_tps", "union_of", "Row", "best_static", "rows_for", "verdict", "comparison_markdown",
]

# adaptive_spec_params.py · DEFAULT_ADAPTIVE_CONFIG (0.5.23), verbatim.
DEFAULT_ADAPTIVE_CONFIG: dict[str, dict[str, Any]] = {
    "1": {"candidate_steps": [1, 3, 5, 7], "up_hysteresis": 0.0, "down_hysteresis": -0.25, "ceiling_coeff": 0},
    "8": {"candidate_steps": [0, 1, 3], "up_hysteresis": 0.0, "down_hysteresis": 0.0, "ceiling_coeff": 0},
    "32": {"candidate_steps": [0, 1], "up_hysteresis": 0.0, "down_hysteresis": 0.0, "ceiling_coeff": 0},
    "64": {"candidate_steps": [0], "up_hysteresis": 0.0, "down_hysteresis": 0.0, "ceiling_coeff": 0},
}


@dataclass(frozen=True)
class Sample:
    """One measured launch of a static configuration: its steps (0 = no speculation), memory
    fraction, and concurrent throughput per level (requests in flight)."""

    steps: int
    mem_fraction_static: float | None
    tps_by_level: Mapping[int, float]
    source: str  # "study#12", "baselines#3": where the figures come from
    max_running_requests: int | None = None  # the server's running-request cap (None: not recorded)


@dataclass(frozen=True)
class Figure:
    """What is known of `steps` at one level: the mean over its launches (the best memory
    fraction's group), and the absolute noise around it."""

    steps: int
    level: int
    tps: float
    noise: float
    runs: int
    mem_fraction_static: float | None
    sources: tuple[str, ...]
    max_running_requests: int | None = None  # the launch's running-request cap: above it, requests queued


# -- levels ----------------------------------------------------------------------------------
def levels_up_to(cap: int) -> list[int]:
    """Powers of two up to the server's running-request cap (at least [1])."""
    out, level = [], 1
    while level <= max(cap, 1):
        out.append(level)
        level *= 2
    return out


def parse_levels(text: str) -> list[int]:
    """`--levels 1,2,4,8`: distinct positive integers, sorted."""
    try:
        values = sorted({int(x) for x in text.replace(" ", "").split(",") if x})
    except ValueError:
        raise ValueError(f"--levels {text!r}: give requests in flight as integers, e.g. 1,2,4,8,16,32,64") from None
    if not values or values[0] < 1:
        raise ValueError(f"--levels {text!r}: give requests in flight >= 1, e.g. 1,2,4,8,16,32,64")
    return values


def steps_range(space_values: Iterable[int] | None, current: int | None) -> list[int]:
    """The steps the table may choose from: the study's searched range (or the command's own
    value when steps is not searched), plus 0 (speculation off)."""
    values = set(space_values or ([] if current is None else [current]))
    return sorted(values | {0})


# -- trials -> samples -----------------------------------------------------------------------
def _levels_of(trial: FrozenTrial) -> dict[int, float]:
    raw = trial.user_attrs.get(record.CONCURRENT_TPS_BY_LEVEL) or {}
    out = {}
    for key, value in raw.items():
        if str(key).isdigit() and isinstance(value, (int, float)) and math.isfinite(value) and value > 0:
            out[int(key)] = float(value)
    return out


def _same_hardware(trial: FrozenTrial, hardware: Mapping[str, Any] | None) -> bool:
    if not hardware or not trial.user_attrs.get(record.ACCELERATOR):
        return True
    return (trial.user_attrs.get(record.ACCELERATOR) == hardware.get("accelerator")
            and trial.user_attrs.get(record.GPU_COUNT) == hardware.get("gpu_count"))


def _static_steps(trial: FrozenTrial) -> tuple[int, float | None] | None:
    """(steps, memory fraction) of a measured static launch whose figures a table may use:
    a study trial with topk 1, the no-speculation baseline (steps 0), or a schedule launch."""
    schedule = trial.user_attrs.get(record.SCHEDULE)
    flags = trial.user_attrs.get(record.FLAGS) or {}
    mfs = flags.get("mem_fraction_static")
    if isinstance(schedule, dict):
        if schedule.get("role") != "static":
            return None
        return int(schedule["steps"]), mfs
    if trial.user_attrs.get(record.BASELINE) == "no_speculation":
        return 0, None
    if trial.user_attrs.get(record.BASELINE) or trial.user_attrs.get(record.DUPLICATE_OF) is not None:
        return None
    steps, topk = flags.get("speculative_num_steps"), flags.get("speculative_eagle_topk")
    if steps is None or topk not in (1, None):
        return None
    return int(steps), mfs


def samples_from_trials(trials: Iterable[FrozenTrial], *, source: str, hardware: Mapping[str, Any] | None = None,
                        workload: Mapping[str, Any] | None = None) -> list[Sample]:
    """The static topk-1 measurements among `trials` (a study's, or its `@baselines`' ones):
    COMPLETE, on the study's hardware, and -- for schedule launches, which record it -- of the
    same workload."""
    out = []
    for t in trials:
        if t.state != TrialState.COMPLETE or not _same_hardware(t, hardware):
            continue
        schedule = t.user_attrs.get(record.SCHEDULE)
        if workload is not None and isinstance(schedule, dict) and schedule.get("workload") not in (None, dict(workload)):
            continue
        found = _static_steps(t)
        levels = _levels_of(t)
        if found is None or not levels:
            continue
        cap = t.user_attrs.get(record.MAX_RUNNING_REQUESTS)
        cap = cap if isinstance(cap, int) and not isinstance(cap, bool) and cap > 0 else None
        out.append(Sample(found[0], found[1], levels, f"{source}#{t.number}", cap))
    return out


# -- samples -> figures ----------------------------------------------------------------------
def _noise(values: list[float]) -> float:
    """Absolute noise of a mean: the project's relative noise, or the half-range of repeated
    launches where that is wider."""
    mean = statistics.fmean(values)
    return max(DEFAULT_NOISE * abs(mean), (max(values) - min(values)) / 2)


def figures(samples: Iterable[Sample], levels: Iterable[int]) -> dict[int, dict[int, Figure]]:
    """level -> steps -> Figure.  Launches of the same (steps, memory fraction) are pooled;
    among memory fractions of the same steps, the best mean at that level stands for the steps."""
    groups: dict[tuple[int, float | None], list[Sample]] = {}
    for s in samples:
        key = (s.steps, round(s.mem_fraction_static, 4) if s.mem_fraction_static is not None else None)
        groups.setdefault(key, []).append(s)
    out: dict[int, dict[int, Figure]] = {}
    for level in levels:
        row: dict[int, Figure] = {}
        for (steps, mfs), group in groups.items():
            values = [s.tps_by_level[level] for s in group if level in s.tps_by_level]
            if not values:
                continue
            caps = [s.max_running_requests for s in group if s.max_running_requests is not None]
            fig = Figure(steps, level, statistics.fmean(values), _noise(values), len(values), mfs,
                         tuple(s.source for s in group if level in s.tps_by_level), min(caps) if caps else None)
            if steps not in row or fig.tps > row[steps].tps:
                row[steps] = fig
        out[level] = row
    return out


def missing_steps(figs: Mapping[int, Mapping[int, Figure]], steps: Iterable[int]) -> list[int]:
    """The steps that lack a figure at some level: each needs one launch (all levels at once)."""
    return [s for s in steps if any(s not in row for row in figs.values())]


def launch_mem_fraction(samples: Iterable[Sample], steps: int, fallback: float | None) -> float | None:
    """The memory fraction to launch `steps` with: the one its best measured launch used, or
    that of the nearest larger steps that ran (more steps need more memory), else `fallback`."""
    ran = [s for s in samples if s.steps >= steps and s.steps > 0 and s.mem_fraction_static is not None]
    if not ran:
        return fallback
    nearest = min(s.steps for s in ran)
    mine = [s for s in ran if s.steps == nearest]
    return max(mine, key=lambda s: max(s.tps_by_level.values())).mem_fraction_static


# -- figures -> table ------------------------------------------------------------------------
def running_cap(figs: Mapping[int, Mapping[int, Figure]], steps: int) -> int | None:
    """The running-request cap `steps` launched with (the smallest recorded; None: unknown)."""
    caps = [row[steps].max_running_requests for row in figs.values() if steps in row and row[steps].max_running_requests]
    return min(caps) if caps else None


def _at_batch(figs: Mapping[int, Mapping[int, Figure]], steps: int, batch: int) -> float | None:
    """Throughput of `steps` with `batch` requests running, from its figures: each level ran
    min(level, cap) requests; linear between the two nearest, the nearest past either end."""
    cap = running_cap(figs, steps) or max(figs)
    points = sorted({min(lvl, cap): row[steps].tps for lvl, row in figs.items() if steps in row}.items())
    if not points:
        return None
    below = [p for p in points if p[0] <= batch] or points[:1]
    above = [p for p in points if p[0] >= batch] or points[-1:]
    (b0, t0), (b1, t1) = below[-1], above[0]
    return t0 if b1 == b0 else t0 + (t1 - t0) * (batch - b0) / (b1 - b0)


def _route(keys: list[int], batch: int) -> int:
    """SGLang's `_find_closest_bs`: the nearest key at or below the running batch (else the smallest)."""
    return max((k for k in keys if k <= batch), default=keys[0])


def _plan(figs: Mapping[int, Mapping[int, Figure]], allowed: list[int], best: Mapping[int, float]) -> tuple[float, dict[int, int]]:
    """One steps value per level key from `allowed`, with adaptive's running-request cap that of
    the largest allowed steps (its draft buffers are sized for the largest candidate): a level
    above the cap runs cap requests, routed to the key at or below the cap.  Each key gets the
    steps best over the levels it serves (sum of throughput relative to each level's best).
    Returns (that sum over all levels, the choice)."""
    levels = sorted(figs)
    cap = running_cap(figs, max(allowed))
    batch = {lvl: lvl if cap is None else min(lvl, cap) for lvl in levels}
    served: dict[int, list[int]] = {}
    for lvl in levels:
        served.setdefault(_route(levels, batch[lvl]), []).append(lvl)

    def estimate(steps: int, lvl: int) -> float | None:
        if batch[lvl] == lvl:
            fig = figs[lvl].get(steps)
            return fig.tps if fig is not None else None
        return _at_batch(figs, steps, batch[lvl])

    choice, score = {}, 0.0
    for key, lvls in served.items():
        scored = []
        for steps in allowed:
            values = [estimate(steps, lvl) for lvl in lvls]
            if all(v is not None for v in values):
                scored.append((sum(v / best[lvl] for v, lvl in zip(values, lvls)), -steps))
        if not scored:
            continue
        value, neg = max(scored)
        choice[key], score = -neg, score + value
    top = _route(levels, max(batch.values()))
    for lvl in levels:  # a key no batch reaches (above the cap) repeats the one that serves the cap
        if lvl not in choice and top in choice:
            choice[lvl] = choice[top]
    return score, choice


def choose(figs: Mapping[int, Mapping[int, Figure]], allowed: Iterable[int] | None = None) -> dict[int, list[int]]:
    """Per level, a single candidate: the steps with the best measured throughput there, under
    the one constraint a table shares across levels -- adaptive mode sizes the draft buffers,
    hence the running-request cap, for the largest candidate at every load.  Every ceiling (the
    largest steps allowed) is tried; the one whose choice delivers the most over all levels
    (relative to each level's best static figure, lost capacity included) wins, the smaller
    ceiling on a tie.  A level with no figure is left out.

    One candidate, not every steps value within noise: within a slot SGLang moves by the EMA of
    accepted drafts (about round(ema) + 1), not by throughput, so extra candidates let it settle
    below the measured best, and a 0 among them makes it probe in and out of speculation.
    """
    present = sorted({s for row in figs.values() for s in row if allowed is None or s in set(allowed)})
    rows = {lvl: {s: f for s, f in row.items() if s in present} for lvl, row in figs.items()}
    rows = {lvl: row for lvl, row in rows.items() if row}
    if not rows:
        return {}
    best = {lvl: max(f.tps for f in row.values()) for lvl, row in rows.items()}
    plans = [_plan(rows, [s for s in present if s <= ceiling], best) for ceiling in present]
    score, choice = max(plans, key=lambda p: (round(p[0], 9), -max(p[1].values(), default=0)))
    return {lvl: [choice[lvl]] for lvl in sorted(choice)}


def table_for(candidates: Mapping[int, Iterable[int]]) -> dict[str, dict[str, list[int]]]:
    """The JSON object SGLang loads: one slot per level, keyed by the level as a string."""
    return {str(level): {"candidate_steps": sorted({int(s) for s in steps})} for level, steps in sorted(candidates.items())}


def validate(cfg: Mapping[str, Any]) -> list[int]:
    """Check `cfg` as `_load_adaptive_config` does, with its messages; return the union of the
    candidate steps (what `--speculative-num-steps` must be one of)."""
    union: set[int] = set()
    for key, entry in cfg.items():
        if not key.isdigit():
            continue
        steps = entry.get("candidate_steps") if isinstance(entry, Mapping) else None
        # bool is an int to Python's isinstance, as it is to SGLang's check; json writes it as true.
        if not isinstance(steps, list) or not steps or not all(isinstance(s, int) and not isinstance(s, bool) and s >= 0 for s in steps):
            raise ValueError(f"BS {key}: candidate_steps must be a list of non-negative ints, got {steps!r}")
        union.update(steps)
    if not union:
        raise ValueError("speculative_adaptive_config must contain at least one integer-string BS key, "
                         f'e.g. {{"1": {{"candidate_steps": [1,3,7]}}}}. Got keys: {list(cfg.keys())}')
    return sorted(union)


def union_of(cfg: Mapping[str, Any]) -> list[int]:
    return validate(cfg)


def candidates_of(cfg: Mapping[str, Any]) -> dict[int, list[int]]:
    return {int(k): sorted(set(v["candidate_steps"])) for k, v in cfg.items() if k.isdigit()}


def dumps(cfg: Mapping[str, Any]) -> str:
    """The file's text: one slot per line, keys in the table's order (plain JSON)."""
    validate(cfg)
    lines = [f"  {json.dumps(str(k))}: {json.dumps(v)}" for k, v in cfg.items()]
    return "{\n" + ",\n".join(lines) + "\n}\n"


def expected_tps(figs: Mapping[int, Mapping[int, Figure]], cfg: Mapping[str, Any], level: int) -> float | None:
    """What a table can at best deliver at `level` from the static figures: the best of the
    candidates of the slot that level routes to (nearest key at or below it)."""
    slots = candidates_of(cfg)
    keys = sorted(slots)
    key = max((k for k in keys if k <= level), default=keys[0])
    known = [figs.get(level, {}).get(s) for s in slots[key]]
    known = [f.tps for f in known if f is not None]
    return max(known) if known else None


# -- verification ----------------------------------------------------------------------------
@dataclass(frozen=True)
class Row:
    """One level of the verification: the study's best static configuration there, SGLang's
    default table and the tuned table, each measured (tok/s), with the noise that ties them."""

    level: int
    best_static: Figure | None
    default: float | None
    tuned: float | None

    def _tie(self, value: float | None) -> bool | None:
        if value is None or self.best_static is None:
            return None
        return self.best_static.tps - value <= max(self.best_static.noise, DEFAULT_NOISE * value)

    @property
    def tuned_matches_static(self) -> bool | None:
        return self._tie(self.tuned)

    @property
    def tuned_vs_default(self) -> float | None:
        return (self.tuned - self.default) / self.default if self.tuned and self.default else None


def best_static(figs: Mapping[int, Mapping[int, Figure]], level: int) -> Figure | None:
    row = list(figs.get(level, {}).values())
    return max(row, key=lambda f: f.tps) if row else None


def rows_for(figs: Mapping[int, Mapping[int, Figure]], levels: Iterable[int], default: Mapping[int, float],
             tuned: Mapping[int, float]) -> list[Row]:
    return [Row(lvl, best_static(figs, lvl), default.get(lvl), tuned.get(lvl)) for lvl in levels]


def verdict(rows: list[Row]) -> str:
    """One sentence: does the tuned table hold each level's own best, and where does it beat
    SGLang's default table beyond noise."""
    measured = [r for r in rows if r.tuned_matches_static is not None]
    if not measured:
        return "the tuned table was not measured: no verdict"
    behind = [r.level for r in measured if not r.tuned_matches_static]
    ahead = [r.level for r in rows if r.tuned_vs_default is not None and r.tuned_vs_default > DEFAULT_NOISE]
    worse = [r.level for r in rows if r.tuned_vs_default is not None and r.tuned_vs_default < -DEFAULT_NOISE]
    head = ("the tuned table is within measurement noise of the best static configuration at every level"
            if not behind else f"the tuned table falls behind the best static configuration at level(s) {', '.join(map(str, behind))}")
    parts = [head]
    if ahead:
        parts.append(f"ahead of SGLang's default table at {', '.join(map(str, ahead))}")
    if worse:
        parts.append(f"behind it at {', '.join(map(str, worse))}")
    if not ahead and not worse and any(r.tuned_vs_default is not None for r in rows):
        parts.append("level with SGLang's default table within noise")
    return "; ".join(parts)


def _cell(value: float | None) -> str:
    return "-" if value is None else f"{value:,.0f} ±{DEFAULT_NOISE * value:,.0f}"


def comparison_markdown(rows: list[Row], cfg: Mapping[str, Any]) -> str:
    """The per-level comparison as a Markdown table (the verification's dashboard note and the
    terminal print it)."""
    slots = candidates_of(cfg)
    lines = ["| in flight | best static (steps) | SGLang default table | tuned table | tuned candidates | tuned vs default |",
             "|---:|---|---|---|---|---:|"]
    for r in rows:
        b = r.best_static
        static = "-" if b is None else f"{b.tps:,.0f} ±{b.noise:,.0f} ({b.steps})"
        key = max((k for k in slots if k <= r.level), default=min(slots))
        gain = "-" if r.tuned_vs_default is None else f"{r.tuned_vs_default:+.1%}"
        lines.append(f"| {r.level} | {static} | {_cell(r.default)} | {_cell(r.tuned)} | {slots[key]} | {gain} |")
    return "\n".join(lines) + "\n"
