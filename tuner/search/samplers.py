"""Samplers by name (`--sampler`, `[study] sampler`).

"auto" (the default) is "model" (tuner/search/model_sampler.py): a physical model of the
landscape, fitted after every launch (acceptance by depth, step time, the memory line and the
graph-OOM edge), proposes the configuration with the largest expected hypervolume gain.  Where
it cannot rank configurations (SLO constraints, objectives it does not predict) "edge"'s TPE
picks the shape and the memory model still picks the fraction, where P(start) >= 0.9, with a
reserve probe every other trial while the reserve is unknown (ModelSampler._safe_fraction,
_fallback_probe); without memory_usage "edge" picks both.  Its P(start) comes from bounds on
what the launches leave unknown (issue #23,
benchmarks/results/sampler_benchmark_memory.md, 15 landscapes x 20 seeds: at most one failed
launch in a study at 10 or 20 launches, launches predicted at >= 0.9 started 93-98% of the time,
and at 10 launches 94.1-100% of the exhaustive front's hypervolume).  Chosen before that with benchmarks/sampler_benchmark.py
(benchmarks/results/sampler_benchmark_model.md, 20 seeds, 13 landscapes of which 6 drawn from
physical ranges): at 10 launches 96.4-98.6% of the exhaustive front's hypervolume (worst seed
94.1%, <= 0.55 failed launches per study), where "edge" reaches 82-95% (worst seed 74%, up to
2.9 failed launches); at 20, 97.9-99.1% against 92-97%.

"edge" (the default before): multivariate TPE for the speculative shape, wrapped in
`MemoryEdgeSampler`, which puts mem_fraction_static at the highest value that still starts
instead of sampling it.  Against the other Optuna samplers at 20 trials
(benchmarks/results/sampler_benchmark.md): 96% (Qwen MTP profile) and 97.5% (8B EAGLE3); plain
TPE 81% / 96%, random 71% / 95%.  "gp" is not offered: Optuna's GPSampler needs torch (a
multi-GB install), and it measured worse where it matters: alone 62% / 93% (it keeps proposing
shapes that an earlier memory failure rules out), inside MemoryEdgeSampler 96% / 95%.
"""

from __future__ import annotations

import math
from typing import Any, Sequence

import optuna
from optuna.trial import TrialState

from tuner.config import ConstraintsConfig
from tuner.errors import ConfigError
from tuner.results import record

__all__ = ["make_sampler", "SAMPLERS", "constraints_func", "MemoryEdgeSampler", "searches_memory_edge"]

SAMPLERS = ("auto", "model", "edge", "tpe", "nsga2", "random")


def searches_memory_edge(name: str | None) -> bool:
    """Whether the sampler named `name` walks mem_fraction_static down from the top (through
    `MemoryEdgeSampler`), spending a few failed launches before the first measurement."""
    return (name or "auto").lower() in ("auto", "model", "edge")


def constraints_func(constraints: ConstraintsConfig):
    """Optuna's constraint values (<= 0 is feasible) from the user attrs a trial recorded."""
    if constraints.p99_itl_ms is None and constraints.ttft_ms is None:
        return None

    count = (constraints.p99_itl_ms is not None) + (constraints.ttft_ms is not None)

    def values(trial: optuna.trial.FrozenTrial) -> Sequence[float]:
        # A trial that measured nothing (pruned, failed) counts as violating every SLO.
        return trial.user_attrs.get(record.CONSTRAINTS) or [1e9] * count

    return values


def make_sampler(name: str, seed: int | None, *, n_objectives: int, constraints: ConstraintsConfig | None = None) -> optuna.samplers.BaseSampler:
    name = (name or "auto").lower()
    cfunc = constraints_func(constraints) if constraints is not None else None
    tpe = optuna.samplers.TPESampler(seed=seed, multivariate=True, n_startup_trials=6, constant_liar=True, constraints_func=cfunc)
    if name == "edge":  # the default until the model sampler measured better at 10 and 20 launches
        return MemoryEdgeSampler(tpe, seed=seed)
    if name in ("auto", "model"):
        from tuner.search.model_sampler import ModelSampler

        usable = "SLO constraints are set (it does not predict latencies)" if cfunc is not None else None
        return ModelSampler(MemoryEdgeSampler(tpe, seed=seed), seed=seed, usable=usable)
    if name == "tpe":
        return tpe
    if name == "nsga2":
        return optuna.samplers.NSGAIISampler(seed=seed, population_size=8, constraints_func=cfunc)
    if name == "random":
        return optuna.samplers.RandomSampler(seed=seed)
    raise ConfigError(f"--sampler {name!r}: unknown sampler; available: {', '.join(SAMPLERS)}")


class MemoryEdgeSampler(optuna.samplers.BaseSampler):
    """Lets `base` sample the speculative shape and puts mem_fraction_static at the memory edge.

    Why: mem_fraction_static only trades the static pool (KV cache: capacity, and throughput
    once the pool limits the batch) against the slack CUDA graphs and activations need.  No
    objective of the tuner gets better with a smaller pool, so every point of the Pareto front
    sits at the highest fraction that still starts, and sampling the fraction spends most
    trials on dominated configs (capacity scales with it).  The wrapper never samples it:

    - start at the top of the searched range;
    - a CUDA-graph OOM (`failure_kind == "memory_graph"`, or an OOM under load,
      "memory_runtime") at fraction m caps later shapes with
      at least as many steps and as wide a topk one grid step below m (they need at least as
      much graph memory), and every other shape `margin_other` steps below m (default 1: a
      smaller shape may fit at m, but finding out costs a launch);
    - until some trial has started below the cap, back off exponentially (1, 3, 7 steps below
      the top after 1, 2, 3 OOMs); afterwards bisect between the highest fraction that started
      and the cap.  So the edge costs a few failed launches (1-3 on the landscapes here),
      not one per grid step.

    The rule reads the trials' params and the tuner's `failure_kind` / `ruled_out_by` user
    attrs; it assumes no objective prefers a smaller static pool (true of every objective in
    objectives/).

    With `dedupe`, a proposal identical to a measured config is replaced by a random one (up to
    `tries` draws): the tuner settles duplicates without a launch, but each still costs a trial
    of the budget, and with the fraction fixed TPE proposes its favourite chain again and again.
    """

    _MFS = "mem_fraction_static"
    _STEPS = "speculative_num_steps"
    _TOPK = "speculative_eagle_topk"
    _DRAFT = "speculative_num_draft_tokens"

    def __init__(self, base: optuna.samplers.BaseSampler, *, seed: int | None = None, margin_other: int = 1,
                 dedupe: bool = True, tries: int = 8):
        self._base = base
        self._random = optuna.samplers.RandomSampler(seed=seed)
        self._margin_other = margin_other
        self._dedupe = dedupe
        self._tries = tries

    # -- delegation --
    def infer_relative_search_space(self, study, trial):
        space = self._base.infer_relative_search_space(study, trial)
        space.pop(self._MFS, None)
        return space

    def sample_relative(self, study, trial, search_space):
        params = self._base.sample_relative(study, trial, search_space)
        if not (self._dedupe and params.get(self._TOPK) == 1 and self._STEPS in params):
            return params
        # A chain (topk 1) is fully determined by steps and the fraction.  TPE proposes the
        # argmax of its acquisition, so re-asking it repeats itself: draw repeats at random.
        mfs_dist = self._mfs_distribution(study)
        for _ in range(self._tries):
            proposal = dict(params)
            if mfs_dist is not None:
                proposal[self._MFS] = self._edge(study, params, mfs_dist)
            if not self._measured(study, proposal):
                break
            params = {name: self._random.sample_independent(study, trial, name, dist)
                      for name, dist in search_space.items()}
            if params.get(self._TOPK) != 1:
                break
        return params

    def sample_independent(self, study, trial, param_name, param_distribution):
        if param_name == self._MFS:
            return self._edge(study, trial.params, param_distribution)
        value = self._base.sample_independent(study, trial, param_name, param_distribution)
        if self._dedupe and param_name == self._DRAFT:
            for _ in range(self._tries):
                if not self._measured(study, {**trial.params, param_name: value}):
                    break
                value = self._random.sample_independent(study, trial, param_name, param_distribution)
        return value

    def before_trial(self, study, trial):
        self._base.before_trial(study, trial)

    def after_trial(self, study, trial, state, values):
        self._base.after_trial(study, trial, state, values)

    def reseed_rng(self):
        self._base.reseed_rng()
        self._random.reseed_rng()

    # -- the rules --
    @staticmethod
    def _finished(study):
        return study.get_trials(deepcopy=False, states=(TrialState.COMPLETE, TrialState.PRUNED, TrialState.FAIL))

    def _mfs_distribution(self, study):
        for t in reversed(self._finished(study)):
            if self._MFS in t.distributions:
                return t.distributions[self._MFS]
        return None

    def _measured(self, study, params: dict) -> bool:
        return any(t.state == TrialState.COMPLETE and t.params == params for t in self._finished(study))

    def _edge(self, study, params: dict, dist) -> Any:
        if isinstance(dist, optuna.distributions.CategoricalDistribution):
            values = sorted(float(v) for v in dist.choices)
        elif dist.step:
            count = int(math.floor((dist.high - dist.low) / dist.step + 1e-9)) + 1
            values = [round(dist.low + i * dist.step, 10) for i in range(count)]
        else:  # continuous: probe down from the top in steps of 0.01
            count = int(math.floor((dist.high - dist.low) / 0.01 + 1e-9)) + 1
            values = [round(dist.high - i * 0.01, 10) for i in range(count)][::-1]

        def index(m: float) -> int:
            below = [i for i, v in enumerate(values) if v <= m + 1e-9]
            return below[-1] if below else -1

        steps, topk = params.get(self._STEPS), params.get(self._TOPK)
        top = cap = len(values) - 1
        failures = 0
        started = -1
        for t in self._finished(study):
            m = t.params.get(self._MFS)
            if m is None:
                continue
            if t.state == TrialState.COMPLETE:
                started = max(started, index(m))
            elif t.user_attrs.get(record.FAILURE_KIND) in ("memory_graph", "memory_runtime"):
                if t.user_attrs.get(record.RULED_OUT_BY) is None:  # a launch that failed, not an inference
                    failures += 1
                smaller = all(
                    mine is None or theirs is None or theirs <= mine
                    for mine, theirs in ((steps, t.params.get(self._STEPS)), (topk, t.params.get(self._TOPK)))
                )
                cap = min(cap, index(m) - (1 if smaller else self._margin_other))
        cap = max(cap, 0)
        if failures == 0 or started >= cap:
            i = cap
        elif started < 0:
            i = max(0, min(cap, top - (2**failures - 1)))  # back off: 1, 3, 7, ... below the top
        else:
            i = started + (cap - started + 1) // 2  # bisect between what started and the cap
        value = values[i]
        if isinstance(dist, optuna.distributions.CategoricalDistribution):
            return next(c for c in dist.choices if abs(float(c) - value) < 1e-9)
        return value
