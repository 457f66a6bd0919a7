"""How long a run will take and how much GPU time it holds, from the study's own history.

Per launch that completes: start-up + measurement (the `startup_s` and `measure_s` of earlier
complete trials and baselines, medians); per launch that fails to start: the wall time of earlier
pruned launches.  The baselines' start-ups count: they are the server's load time without the
speculative flags.  Before any history: `DEFAULT_STARTUP_S` and `DEFAULT_MEASURE_S`.  While the memory edge is unknown (no trial has completed yet) the first
`EDGE_LAUNCHES` trials are counted as failed launches, as the memory-edge sampler spends them.
"""

from __future__ import annotations

import statistics
from dataclasses import dataclass, field

from optuna.trial import FrozenTrial, TrialState

from tuner.results import record

__all__ = ["Estimate", "estimate", "DEFAULT_STARTUP_S", "DEFAULT_MEASURE_S", "DEFAULT_SLO_SWEEP_S", "EDGE_LAUNCHES", "duration"]

DEFAULT_STARTUP_S = 120.0  # a large model's load + CUDA graph capture on SGLang
DEFAULT_MEASURE_S = 60.0
# The search over load behind slo_capacity, before a trial has run one: [slo] max_points (6)
# closed-loop loads of (rounds + 1) x load requests, ~15 s each with 256-token answers.
DEFAULT_SLO_SWEEP_S = 90.0
EDGE_LAUNCHES = 2  # failed launches the memory-edge search costs before the first measurement (1-3 measured)


@dataclass
class Estimate:
    trials: int
    baselines: int
    startup_s: float
    measure_s: float
    pruned_s: float
    expected_pruned: int
    gpus: int
    sources: list[str] = field(default_factory=list)  # where each figure comes from
    warnings: list[str] = field(default_factory=list)

    @property
    def complete_s(self) -> float:
        return self.startup_s + self.measure_s

    @property
    def total_s(self) -> float:
        measured = max(self.trials - self.expected_pruned, 0) + self.baselines
        return measured * self.complete_s + min(self.expected_pruned, self.trials) * self.pruned_s

    @property
    def per_trial_s(self) -> float:
        return self.total_s / max(self.trials + self.baselines, 1)

    @property
    def gpu_hours(self) -> float:
        return self.total_s * self.gpus / 3600


def duration(t: FrozenTrial) -> float | None:
    if t.datetime_start and t.datetime_complete:
        return (t.datetime_complete - t.datetime_start).total_seconds()
    return None


def _median(values: list[float]) -> float | None:
    values = [v for v in values if isinstance(v, (int, float)) and v > 0]
    return statistics.median(values) if values else None


def _sweep_extra(complete: list[FrozenTrial], sources: list[str]) -> float:
    """Seconds the search over load adds to a measurement: nothing when the measured trials ran
    it (their measure_s holds it), else its default."""
    swept = _median([t.user_attrs.get(record.SLO_SWEEP_S) for t in complete if record.SLO_SWEEP_S in t.user_attrs])
    if any(record.SLO_SWEEP_S in t.user_attrs for t in complete):
        sources.append(f"of which the search over load {swept or 0:.0f} s (median)")
        return 0.0
    sources.append(f"+ search over load {DEFAULT_SLO_SWEEP_S:.0f} s (default: [slo] max_points loads, none measured yet)")
    return DEFAULT_SLO_SWEEP_S


def _per_class_text(complete: list[FrozenTrial]) -> str:
    """"; single stream per class: chat 0.5 s, long_context 1.2 s" (medians), what each class of
    the mix adds to a measurement."""
    seconds: dict[str, list[float]] = {}
    for t in complete:
        for name, figures in record.by_class_of(t).items():
            seconds.setdefault(name, []).append(figures.get("single_s"))
    medians = {name: _median(values) for name, values in seconds.items()}
    parts = [f"{name} {value:.1f} s" for name, value in medians.items() if value]
    return f"; single stream per class: {', '.join(parts)}" if parts else ""


# The project's emulator loads in seconds instead of minutes (README, "Quick start"); the demo's
# launches measured ~3 s start-up and ~17 s of benchmark (five request classes), the defaults before it has history.
EMULATOR_STARTUP_S = 3.0
EMULATOR_MEASURE_S = 17.0


def estimate(trials: list[FrozenTrial], *, n_trials: int, n_baselines: int, gpus: int | None,
             memory_edge_searched: bool = True, concurrent_cap_s: float | None = None, load_sweep: bool = False,
             emulator: bool = False) -> Estimate:
    """The run's duration from `trials` (the study's and its baselines', finished);
    `concurrent_cap_s`: what `[bench] level_seconds` caps the concurrent levels at, shown beside;
    `load_sweep`: the search over load behind slo_capacity runs in each measurement.
    Before any history: a real server's defaults, or the emulator's when the command runs it."""
    default_startup, default_measure = (EMULATOR_STARTUP_S, EMULATOR_MEASURE_S) if emulator else (DEFAULT_STARTUP_S, DEFAULT_MEASURE_S)
    default = "the emulator's default" if emulator else "default"
    complete = [t for t in trials if t.state == TrialState.COMPLETE and t.user_attrs.get(record.DUPLICATE_OF) is None]
    launched_pruned = [t for t in trials if t.state == TrialState.PRUNED and t.user_attrs.get(record.RULED_OUT_BY) is None]
    sources = []
    startup = _median([t.user_attrs.get(record.STARTUP_S) for t in complete])
    sources.append(f"start-up {startup:.0f} s (median of {len(complete)} earlier launch(es))" if startup
                   else f"start-up {default_startup:.0f} s ({default}: no launch measured yet)")
    startup = startup or default_startup
    measure = _median([t.user_attrs.get(record.MEASURE_S) for t in complete])
    cap = f", concurrent levels capped at {concurrent_cap_s:.0f} s by [bench] level_seconds" if concurrent_cap_s else ""
    sources.append(f"measurement {measure:.0f} s per trial (median{cap}{_per_class_text(complete)})" if measure
                   else f"measurement {default_measure:.0f} s per trial ({default}{cap})")
    measure = measure or default_measure
    if load_sweep:
        measure += _sweep_extra(complete, sources)
    pruned = _median([duration(t) for t in launched_pruned])
    sources.append(f"failed launch {pruned:.0f} s (median of {len(launched_pruned)})" if pruned else f"failed launch ~ start-up ({startup:.0f} s)")
    pruned = pruned or startup
    study_trials = [t for t in trials if t.user_attrs.get(record.BASELINE) is None]
    edge_unknown = memory_edge_searched and not any(t.state == TrialState.COMPLETE for t in study_trials)
    expected_pruned = EDGE_LAUNCHES if edge_unknown else 0
    est = Estimate(n_trials, n_baselines, startup, measure, pruned, expected_pruned, gpus or 1, sources)
    if edge_unknown and n_trials <= EDGE_LAUNCHES:
        est.warnings.append(
            f"--trials {n_trials}: the first trials find the memory edge (the top of mem_fraction_static usually fails "
            f"to start; 1-3 launches), so this run may measure nothing; use --trials {EDGE_LAUNCHES + 3} or more")
    return est

