"""`--sampler model`: propose the configuration with the largest expected hypervolume gain
under the study's fitted landscape model (tuner/search/model.py).

One proposal per trial, computed once when Optuna first asks for a parameter and then handed
out parameter by parameter (`sample_independent`): the draft-token range depends on steps and
topk, so Optuna's relative search space cannot hold the whole shape.  Everything is derived from
`study.get_trials()` (no state between trials), so a resumed study and parallel workers get the
same proposals from the same history; RUNNING trials of other workers are pending: their
configurations are not proposed again and their predicted values join the front (a constant
liar), so two workers do not chase the same gain.

Candidates: every shape of the [space] grid (less those a shallower tree or the chain beats by
construction, `_undominated`) x every mem fraction of the range.  Score: P(start)
x the mean over `draws` samples of the predictive distribution of the hypervolume the point
adds to the measured front (objectives normalised, origin reference: the benchmark's score).
A candidate that P(start) puts below `min_p_start` is never launched; nor is one an earlier
memory failure rules out, or one already measured.  A measured shape at another fraction adds
only what its batch changes (model.py's anchors): re-measuring noise is not exploration.  When no
candidate is expected to add anything, the least known one (largest spread x P(start)) is tried.

No model yet (nothing completed): the warm start's shape, or else the deepest chain (its
acceptance by depth gives every shallower chain's), at a safe fraction: the command's own, or
55% up the range, and lower after each graph OOM.  A shape's first start goes where P(start)
>= 0.9 (a shape no larger than a started one in steps, topk and draft is no first start,
`_inside`); a failed launch has a price (`_FAILURE_PRICE`), paid with 1 - P(start), which
doubles with each memory failure beyond one per ten launches (`_failure_price`); after two
failures of launches it proposed only a candidate at P(start) >= 0.98 is launched while there
is one (`_TRUSTED_P`).  While
the unreported reserve is uncertain (and the study has failed fewer than two launches), a
reserve probe (`_reserve_probe`) raises a measured shape, while an objective moves with the
pool (`_pool_matters`: not slo_capacity where the latency promise caps it at every shape),
and a climb is worth what the whole front would gain (`_climb_gain`); once it is
known, a climb is worth its own gain.  Objectives: the model's three, a request class's speed
(model.ClassRatio) and slo_capacity under an ITL promise (model.SloFit).  Where it cannot rank
configurations (SLO constraints, objectives it does not predict) the default sampler picks the
shape and the memory model the fraction (`_safe_fraction`), with a reserve probe every other
trial while the reserve is unknown (`_fallback_probe`); where the server reports no
memory_usage, the default sampler picks both.  Either says so in the trial's `model_note`; a
poor throughput fit only widens the intervals (issue #23).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

import numpy as np
import optuna
from optuna.trial import FrozenTrial, TrialState

from tuner.measure.objectives import split_name
from tuner.search import model as M
from tuner.search.space import DEFAULT_STEPS, grid
from tuner.results import record

__all__ = ["ModelSampler", "Decision", "expected_hv_gain", "PREDICTED"]

PREDICTED = ("single_tps", "concurrent_tps", "capacity")
_NAMES = {"speculative_num_steps": 0, "speculative_eagle_topk": 1, "speculative_num_draft_tokens": 2, "mem_fraction_static": 3}


@dataclass
class Decision:
    params: dict = field(default_factory=dict)
    fallback: bool = False
    note: str = ""
    prediction: dict | None = None
    relative: dict = field(default_factory=dict)  # what the fallback sampled for the shape (a fallback decision)


def _box_volumes(front: np.ndarray, cells: int) -> np.ndarray:
    """Cumulative count of grid cells (in [0, 1]^3) the front does not dominate: the free
    volume inside the box [0, p] of any point p is one lookup."""
    centres = (np.arange(cells) + 0.5) / cells
    free = np.ones((cells, cells, cells), dtype=float)
    for f in front:
        ix, iy, iz = (np.searchsorted(centres, v, side="right") for v in f)
        free[:ix, :iy, :iz] = 0.0
    return free.cumsum(0).cumsum(1).cumsum(2) / cells ** 3


def expected_hv_gain(front: np.ndarray, samples: np.ndarray, cells: int = 40) -> np.ndarray:
    """Mean hypervolume gain of each candidate over `front` (normalised, maximised, origin
    reference); samples: (candidates, draws, 3) in the same normalised units."""
    table = _box_volumes(np.clip(front, 0, 1), cells)
    idx = np.floor(np.clip(samples, 0, 1) * cells - 0.5 + 1e-9).astype(int)
    inside = np.all(idx >= 0, axis=-1)
    idx = np.clip(idx, 0, cells - 1)
    gain = table[idx[..., 0], idx[..., 1], idx[..., 2]] * inside
    return gain.mean(axis=1)


def _contains(dist, value) -> bool:
    if isinstance(dist, optuna.distributions.CategoricalDistribution):
        return any(c == value for c in dist.choices)
    return dist.low - 1e-9 <= value <= dist.high + 1e-9


class ModelSampler(optuna.samplers.BaseSampler):
    def __init__(self, fallback: optuna.samplers.BaseSampler, *, seed: int | None = None, draws: int = 64,
                 min_p_start: float = 0.5, first_p_start: float = 0.9, usable: str | None = None):
        self._fallback = fallback
        self._seed = seed or 0
        self._draws = draws
        self._min_p = min_p_start
        self._first_p = first_p_start
        self._usable = usable  # why the model cannot be used at all (SLO constraints), or None
        self._space = None
        self._base = None
        self._decisions: dict[tuple[str, int], Decision] = {}
        self._random = optuna.samplers.RandomSampler(seed=seed)  # redraws of a spent chain (_spent)
        self._memory_cache: tuple = (None, None)  # (finished trials, their memory model): _memory

    # -- wiring --
    def bind_space(self, space, base) -> None:
        """The [space] and the command's Params (space.suggest calls this before sampling)."""
        self._space, self._base = space, base

    def explain(self, study: optuna.Study, number: int) -> Decision | None:
        return self._decisions.get((study.study_name, number))

    def infer_relative_search_space(self, study, trial):
        if self._decide(study, trial).fallback:
            return self._fallback.infer_relative_search_space(study, trial)
        return {}

    def sample_relative(self, study, trial, search_space):
        d = self._decide(study, trial)
        if d.fallback:
            d.relative = self._fallback.sample_relative(study, trial, search_space)
            for _ in range(_REDRAWS):  # a chain with nowhere to climb: another shape (_spent)
                if not self._spent(study, {**trial.params, **d.relative}):
                    break
                d.relative = {name: self._random.sample_independent(study, trial, name, dist) for name, dist in search_space.items()}
            return d.relative
        return {}

    def sample_independent(self, study, trial, param_name, param_distribution):
        d = self._decide(study, trial)
        if d.fallback and param_name == "mem_fraction_static":
            value = self._safe_fraction(study, trial, param_distribution, d)
            if value is not None:
                return value
        if d.fallback and param_name in ("speculative_num_steps", "speculative_eagle_topk", "speculative_num_draft_tokens"):
            value = self._fallback.sample_independent(study, trial, param_name, param_distribution)
            if not self._spent(study, {**trial.params, param_name: value}):
                return value
            # Another value at random among those of use (every one tried: a topk has 3-4, a draft count up to ~30).
            options = list(param_distribution.choices) if isinstance(param_distribution, optuna.distributions.CategoricalDistribution) \
                else list(range(param_distribution.low, param_distribution.high + 1, param_distribution.step or 1))
            rng = np.random.default_rng([self._seed, trial.number])
            return next((options[i] for i in rng.permutation(len(options))
                         if not self._spent(study, {**trial.params, param_name: options[i]})), value)
        if d.fallback or param_name not in d.params:
            return self._fallback.sample_independent(study, trial, param_name, param_distribution)
        if any(trial.params.get(k, v) != v for k, v in d.params.items()):
            # Earlier answers came from elsewhere (a fixed or enqueued value): decide again under them.
            d = self._decide(study, trial, again=True)
        value = d.params.get(param_name)
        if d.fallback or value is None or not _contains(param_distribution, value):
            return self._fallback.sample_independent(study, trial, param_name, param_distribution)
        return value

    def before_trial(self, study, trial):
        self._fallback.before_trial(study, trial)

    def after_trial(self, study, trial, state, values):
        self._fallback.after_trial(study, trial, state, values)
        self._decisions.pop((study.study_name, trial.number), None)

    def reseed_rng(self):
        self._fallback.reseed_rng()

    # -- the decision --------------------------------------------------------------------------
    def _decide(self, study, trial, again: bool = False) -> Decision:
        key = (study.study_name, trial.number)
        if again or key not in self._decisions:
            fixed = {**(trial.system_attrs.get("fixed_params") or {}), **trial.params}
            self._decisions[key] = self._make_decision(study, fixed)
        return self._decisions[key]

    def _make_decision(self, study, fixed: dict) -> Decision:
        if self._usable:
            return self._fallback_probe(study, fixed) or \
                Decision(fallback=True, note=f"model sampler off: {self._usable}; the default sampler chose")
        if self._space is None or self._space.mem_fraction_static is None:
            return Decision(fallback=True, note="model sampler off: mem_fraction_static is not searched; the default sampler chose")
        names = list(study.metric_names or PREDICTED[: len(study.directions)])
        if not _predictable(names):
            other = ", ".join(sorted(n for n in names if n not in PREDICTED and M.class_base(n) is None))
            return self._fallback_probe(study, fixed) or \
                Decision(fallback=True, note=f"model sampler off: it does not predict {other}; the default sampler chose")
        shapes, mfs_values = self._candidates(fixed)
        if not shapes or not mfs_values:
            return Decision(fallback=True, note="no configuration of the space matches the fixed parameters; the default sampler chose")
        trials = study.get_trials(deepcopy=False)
        model, why = M.fit(trials, names)
        if model is None:
            if any(t.state == TrialState.COMPLETE for t in trials):
                # slo_capacity without an ITL promise of a closed loop (TTFT alone, a rate) is as
                # unpredicted as an objective the model does not know: the same probes.
                probe = self._fallback_probe(study, fixed) if "slo_capacity" in names else None
                return probe or Decision(fallback=True, note=f"model not fitted ({why}); the default sampler chose")
            return self._design(trials, shapes, mfs_values)
        # A poor throughput fit widens the throughput intervals (Model.predict) but keeps what
        # the model knows about memory: handing the study to a sampler that knows nothing about
        # it would cost failed launches (issue #23).
        return self._best(trials, model, names, shapes, mfs_values)

    def _candidates(self, fixed: dict) -> tuple[list[tuple[int, int, int]], list[float]]:
        cached = getattr(self, "_grid_cache", None)
        if cached is None or cached[0] is not self._space:
            configs = grid(self._space, self._base)
            shapes = sorted({(p.speculative_num_steps or DEFAULT_STEPS, p.speculative_eagle_topk or 1,
                              p.speculative_num_draft_tokens or (p.speculative_num_steps or DEFAULT_STEPS) + 1) for p in configs})
            mfs = sorted({round(p.mem_fraction_static, 6) for p in configs if p.mem_fraction_static is not None})
            self._grid_cache = cached = (self._space, shapes, mfs)
        _, shapes, mfs = cached
        allowed = [s for s in shapes if all(fixed.get(name) in (None, s[i]) for name, i in list(_NAMES.items())[:3]
                                            if not (name == "speculative_num_draft_tokens" and s[1] == 1))]
        keep = _undominated(allowed)  # after the fixed parameters: dropped only for a better candidate
        if fixed.get("mem_fraction_static") is not None:
            mfs = [m for m in mfs if abs(m - fixed["mem_fraction_static"]) < 1e-6] or [float(fixed["mem_fraction_static"])]
        return keep, mfs

    def _safe_fraction(self, study, trial, dist, d: Decision) -> float | None:
        """mem_fraction_static for the shape the fallback sampler chose, where the model cannot
        rank shapes (SLO constraints, an objective it does not predict) but its memory model
        still knows where they start (`_fraction_for`).  Before any launch, the designed first
        launch's safe fraction.  None (the fallback's walk down from the top) when the server
        reports no memory_usage.  Why: with slo_capacity the fallback's walk from the top of the
        range failed the demo's first launch (a graph OOM at 0.95) where the designed one
        starts; the edge sampler spends up to 2.9 failed launches a study."""
        values = [m for m in self._candidates({})[1] if _contains(dist, m)]
        if not values:
            return None
        trials = study.get_trials(deepcopy=False)
        memory = self._memory(study, trials)
        if memory is None:
            if any(t.state == TrialState.COMPLETE for t in trials):
                return None
            mfs = _design_fraction(trials, values, self._base)
            d.note += f"; mem_fraction_static {mfs:g}: the designed first launch's safe fraction"
            return mfs
        choice = _fraction_for(memory, trials, self._shape_of({**d.relative, **trial.params}), values, self._first_p)
        if choice is None:
            return None
        i, kind, p = choice
        why = {"climb": "from the memory model", "again": "its highest start; no higher one is sure",
               "likeliest": "the likeliest to start"}[kind]
        d.note += f"; mem_fraction_static {values[i]:g}: {why} (P(start) {p:.2f})"
        d.prediction = {"p_start": round(p, 3)}
        return values[i]

    def _memory(self, study, trials: list[FrozenTrial]) -> M.Memory | None:
        """The memory model of the study's finished launches, fitted once for them: a fallback
        trial asks it for the probe, each candidate value `_spent` checks (up to a few dozen) and
        the fraction."""
        key = (study.study_name, tuple(t.number for t in trials if t.state.is_finished()))
        if self._memory_cache[0] != key:
            self._memory_cache = (key, M.fit_memory(trials))
        return self._memory_cache[1]

    def _spent(self, study, params: dict) -> bool:
        """Whether a shape the fallback sampler proposes is no use to launch: a tree a shallower
        tree or the chain beats by construction (`_undominated`: whatever the objective, it
        verifies the same nodes more slowly), or one `_safe_fraction` could only launch where it
        has been launched, its highest start with no sure climb above (a duplicate, a trial of
        the budget spent without a launch).  Asked with steps and topk (every undominated draft
        count of them launched there), and again with the draft count.  Why: TPE's start-up draws
        re-proposed the reserve probes' chain, (3, 1, 4), one trial in ten of a per-class study
        on the demo (0.4 duplicates in ten trials over ten seeds of
        tests/unit/test_model_sampler.py's `_slo_study`), and launched (5, 4, 4) in an SLO study,
        which verifies what (3, 4, 4) does."""
        steps, topk = params.get("speculative_num_steps"), params.get("speculative_eagle_topk")
        if steps is None or self._space is None:
            return False
        shapes, values = self._candidates({})
        if topk is None:  # steps alone: every topk of them spent
            return all(self._spent(study, {**params, "speculative_eagle_topk": k}) for k in sorted({sh[1] for sh in shapes}))
        trials = study.get_trials(deepcopy=False)
        if self._space.mem_fraction_static is None:
            # The server's own fraction for every launch: a launched shape again is a duplicate.
            # Why: a study searching the shape alone drew (3, 2, 2), which the chain (1, 1, 2)
            # beats by construction, in its first four launches on the demo.
            done = {M._shape_of(t.user_attrs.get(record.FLAGS) or t.params) for t in trials if t.state.is_finished()}
            if topk != 1 and params.get("speculative_num_draft_tokens") is not None:
                shape = self._shape_of(params)
                return shape not in set(shapes) or M.Shape(*shape) in done
            return all(M.Shape(*sh) in done for sh in shapes if sh[:2] == (steps, topk))
        launched = {c: t.state == TrialState.COMPLETE for t in trials if t.state.is_finished() and (c := _config(t)) is not None}
        if topk != 1 and params.get("speculative_num_draft_tokens") is not None:  # the draft count too
            shape, mfs = self._shape_of(params), params.get("mem_fraction_static")
            # launched there, or started as high: its measurement has the same speed and no less pool
            below = mfs is not None and any(c[:3] == shape and (c[3] >= mfs - 1e-9 if ok else abs(c[3] - mfs) < 1e-9)
                                            for c, ok in launched.items())
            return shape not in set(shapes) or below
        mine = [sh for sh in shapes if sh[:2] == (steps, topk)]
        memory = self._memory(study, trials)
        if not mine or memory is None:
            return not mine
        choice = _fraction_for(memory, trials, self._shape_of(params), values, self._first_p)
        return choice is not None and all((*sh, round(values[choice[0]], 6)) in launched for sh in mine)

    def _fallback_probe(self, study, fixed: dict) -> Decision | None:
        """A reserve probe in a study the model cannot rank (as `_reserve_probe`, without a gain
        to choose by): while the unreported reserve is known within more than 2% of the memory
        and fewer than _PROBE_FAILURES launches failed, every other trial raises a Pareto-front
        shape to the highest fraction it has not launched at that starts with P 0.55-0.8.
        Without probes `_safe_fraction` kept demo-slo's shapes at 0.80-0.85, where the running
        requests a fraction allows capped slo_capacity (13 at best, 16-17 at the edge)."""
        trials = study.get_trials(deepcopy=False)
        if self._space is None or self._space.mem_fraction_static is None or not _pool_matters(study.metric_names or [], trials):
            return None
        if _after_probe(trials):
            return None  # every other trial: the default sampler's shapes are the search
        memory = self._memory(study, trials)
        ls = M.launches(trials, None)
        if memory is None or not _memory_uncertain(memory) or _failed_launches(ls) >= _PROBE_FAILURES:
            return None
        shapes, values = self._candidates(fixed)  # the fixed parameters' shapes, the searched fractions
        cand = np.array(values, dtype=float)
        front = {c[:3] for t in study.best_trials if (c := _config(t)) is not None}
        best: tuple | None = None
        for shape in sorted(front & set(shapes)):
            tried = [x.mfs for x in _launches_of(ls, shape)]
            p = memory.start_probability(*(np.full(len(cand), v) for v in shape), cand)
            ok = (p >= _PROBE_P[0]) & (p <= _PROBE_P[1]) & (cand > max(tried, default=0.0) + 1e-9)
            if ok.any() and (best is None or cand[np.flatnonzero(ok)[-1]] > best[1]):
                i = int(np.flatnonzero(ok)[-1])
                best = (shape, float(cand[i]), float(p[i]))
        if best is None:
            return None
        shape, mfs, p_start = best
        lo, hi = memory.theta_range()
        return Decision(dict(zip(_NAMES, (*shape, round(mfs, 6)))), prediction={"p_start": round(p_start, 3)},
                        note=f"model: a reserve probe, a front shape raised to learn the memory the capture needs beyond "
                             f"what it reports ({lo:.1f}-{hi:.1f} GiB so far; the model cannot rank this study's "
                             f"configurations, the default sampler chooses the others) (P(start) {p_start:.2f})")

    def _shape_of(self, params: dict) -> tuple[int, int, int]:
        """(steps, topk, draft) of a proposal whose fraction is sampled before its draft tokens:
        a tree's widest draft count the space allows, where the proposal has none yet (graphs
        grow with it: the fraction is then safe for any)."""
        base = self._base
        steps = int(params.get("speculative_num_steps") or (base and base.speculative_num_steps) or DEFAULT_STEPS)
        topk = int(params.get("speculative_eagle_topk") or (base and base.speculative_eagle_topk) or 1)
        if topk == 1:
            return steps, 1, steps + 1
        draft = params.get("speculative_num_draft_tokens")
        if draft is None:
            draft = max((s[2] for s in self._candidates({})[0] if s[:2] == (steps, topk)), default=steps * topk + 1)
        return steps, topk, int(draft)

    def _design(self, trials: list[FrozenTrial], shapes, mfs_values) -> Decision:
        """The first launch: the warm start's shape (fixed) or the deepest chain, at a safe
        fraction, lowered (raised) by 3, 6, 12 points after graph (KV) failures."""
        chains = [s for s in shapes if s[1] == 1]
        # Another worker already launching the deepest chain: the next one, so that two
        # workers starting together measure two shapes (the model pools their depths).
        running = {c[:3] for t in trials if t.state == TrialState.RUNNING and (c := _config(t)) is not None}
        # A shape SGLang rejected, or whose server died for no reason the log ties to memory: the
        # next first launch tries another (the same flags would only repeat it; tuner/study.py
        # ends a run whose launches keep dying alike).
        rejected = {c[:3] for t in trials if t.user_attrs.get(record.FAILURE_KIND) in ("invalid", "exit") and (c := _config(t)) is not None}
        order = [s for s in sorted(chains or shapes, key=lambda s: (-s[0], s[2])) if s not in rejected] or \
            [s for s in sorted(shapes, key=lambda s: (-s[0], s[2])) if s not in rejected] or sorted(shapes)
        shape = next((s for s in order if s not in running), order[0])
        mfs = _design_fraction(trials, mfs_values, self._base)
        params = dict(zip(_NAMES, (*shape, mfs)))
        return Decision(params, note=f"model: no launch completed yet; a designed first launch "
                                     f"({'deepest chain' if shape[1] == 1 else 'a shape'} for acceptance by depth, "
                                     f"mem fraction {mfs:g} for a safe start)")

    def _best(self, trials, model: M.Model, names: list[str], shapes, mfs_values) -> Decision:
        # Highest fraction first: among equal gains argmax keeps the larger KV pool.
        cand = np.array([(*s, m) for s in shapes for m in reversed(mfs_values)], dtype=float)
        pred = model.predict(cand[:, 0].astype(int), cand[:, 1].astype(int), cand[:, 2].astype(int), cand[:, 3], names)
        # A shape's first start goes where it starts with high confidence (the upper bound of its
        # graph memory, below every failure of it); raising its fraction later is a launch of its own,
        # worth it only if the expected gain says so.
        started = {c[:3] for t in trials if t.state == TrialState.COMPLETE and (c := _config(t)) is not None}
        first = ~_inside(cand, started)
        ls = M.launches(trials, None)
        failed, launched, own_failed = _failed_launches(ls), len(ls), _failed_launches(ls, predicted=True)
        allowed, trusted_only = _launchable(pred.p_start, np.where(first, self._first_p, self._min_p),
                                            _excluded(cand, trials), own_failed)
        if not allowed.any():
            return Decision(fallback=True, note="the model rules out every remaining configuration of the space "
                                                "(measured, ruled out, or unlikely to start); the default sampler chose")
        mids, sds = pred.columns(names)
        measured = np.array([t.values for t in trials if t.state == TrialState.COMPLETE and t.values], dtype=float)
        pending = _pending(cand, trials)
        front = np.concatenate([measured.reshape(-1, len(names)), mids[pending]])
        scale = np.maximum(front.max(axis=0) if len(front) else 0, mids[allowed].max(axis=0)) * 1.05
        scale[scale <= 0] = 1.0
        n_done = sum(1 for t in trials if t.state.is_finished())
        rng = np.random.default_rng([self._seed, n_done])
        idx = np.flatnonzero(allowed)
        z = rng.standard_normal((1, self._draws, len(names)))
        samples = mids[idx, None, :] * np.exp(sds[idx, None, :] * z)
        for c in (names.index(n) for n in ("capacity", "slo_capacity") if n in names):
            samples[..., c] = np.minimum(samples[..., c], model.memory.running_cap)  # never above the cap, a known constant
        samples = samples / scale
        gain = expected_hv_gain(_pad3(front / scale), _pad3(samples))
        if "capacity" in names and _reserve_uncertain(model):
            gain = np.maximum(gain, _CLIMB_WEIGHT * _climb_gain(cand[idx], pred.capacity[idx], pred.p_start[idx], trials,
                                                             measured, names, scale))
        # A failed launch is not free (a model load, and an operator's trust): its price is
        # subtracted with the chance of paying it, so a long shot for a small gain is not taken.
        # A reserve probe is the price of learning the edge, not a gamble on gain: it is priced
        # within the allowance, whatever the study's count of launches (_failure_price).
        value, p = gain, pred.p_start[idx]
        gain = value * p - (1 - p) * _failure_price(failed, launched)
        probe_gain = value * p - (1 - p) * _failure_price(failed, max(launched, _LAUNCHES_PER_FAILURE))
        best = int(idx[int(np.argmax(gain))]) if gain.max() > 0 else int(idx[int(np.argmax(sds[idx].sum(1) * pred.p_start[idx]))])
        # A reserve probe climbs a measured shape, not one inside it: the climbs of one shape pin
        # the edge (qwen-demo's warm start reached its chains' 0.94 edge; probes on shapes inside
        # it left the chains a step below, 20 seeds: HV at 10 95.1% vs 94.2%; family:0 at 20
        # 97.5% vs 96.8%).
        measured_shape = np.array([tuple(int(x) for x in row[:3]) in started for row in cand], dtype=bool)
        probe = _reserve_probe(model, names, trials, cand[idx], p, probe_gain, ~measured_shape[idx]) if failed < _PROBE_FAILURES else None
        if probe is not None:
            best = int(idx[probe])
        s, k, d, m = cand[best]
        params = dict(zip(_NAMES, (int(s), int(k), int(d), round(float(m), 6))))
        why = _why(model, float(gain.max()), None if probe is None else float(probe_gain[probe]))
        note = (f"model: {why} (P(start) {pred.p_start[best]:.2f}); "
                f"fitted on {launched} launches, throughput fit error {model.fit_error:.1%}"
                + (f"; {own_failed} of its launches failed: only P(start) >= {_TRUSTED_P:g}" if trusted_only else ""))
        return Decision(params, note=note, prediction=pred.interval(best))


def _fraction_for(memory: M.Memory, trials: list[FrozenTrial], shape: tuple[int, int, int], values: list[float],
                  bar: float) -> tuple[int, str, float] | None:
    """Where the memory model would launch `shape` (ModelSampler._safe_fraction): the highest
    fraction above the shape's own starts (a lower one is the same speed with less pool) whose
    P(start) is at least `bar` ("climb"); else its highest start again ("again", a duplicate
    settled without a launch), or for a shape never started the likeliest ("likeliest").  So a
    shape's first launch starts and a later proposal of it climbs from below.  (index, kind,
    P(start)), or None when no fraction is left."""
    cand = np.array(values, dtype=float)
    n = len(cand)
    steps, topk, draft = shape
    p = memory.start_probability(np.full(n, steps), np.full(n, topk), np.full(n, draft), cand)
    mine = _launches_of(M.launches(trials, None), shape)
    tried = {round(x.mfs, 6) for x in mine}
    top = max((x.mfs for x in mine if x.state == "ok"), default=None)
    fresh = np.array([round(v, 6) not in tried and (top is None or v > top + 1e-9) for v in values])
    sure = fresh & (p >= bar)
    if sure.any():  # highest fraction first: the sure one with the largest pool
        i, kind = int(np.flatnonzero(sure)[-1]), "climb"
    elif top is not None:
        i, kind = int(np.argmin(np.abs(cand - top))), "again"
    elif fresh.any():
        i, kind = int(np.flatnonzero(fresh & (p >= p[fresh].max() - 1e-9))[-1]), "likeliest"
    else:
        return None
    return i, kind, float(p[i])


def _launches_of(ls: list[M.Launch], shape: tuple[int, int, int]) -> list[M.Launch]:
    return [x for x in ls if (x.shape.steps, x.shape.topk, x.shape.draft) == tuple(shape)]


def _design_fraction(trials: list[FrozenTrial], mfs_values: list[float], base) -> float:
    """A first launch's fraction: the command's, else 55% up the searched range; lowered (raised)
    by 3, 6, 12 points below (above) the study's graph (KV) failures."""
    lo, hi = mfs_values[0], mfs_values[-1]
    start = base.mem_fraction_static if base and base.mem_fraction_static else lo + 0.55 * (hi - lo)
    ls = M.launches(trials, None)
    graph = [x.mfs for x in ls if x.state in ("memory_graph", "memory_runtime")]
    kv = [x.mfs for x in ls if x.state == "memory_kv"]
    cap = min(graph) - 0.03 * 2 ** (len(graph) - 1) if graph else hi
    floor = max(kv) + 0.03 * 2 ** (len(kv) - 1) if kv else lo
    target = min(max(start, floor), cap)
    below = [m for m in mfs_values if m <= target + 1e-9]
    return below[-1] if below else mfs_values[0]


def _why(model: M.Model, best_gain: float, probe_gain: float | None) -> str:
    """Why the chosen configuration, for the trial's model_note.  A reserve probe says it is one,
    with its own expected gain beside the largest of any candidate (usually another's, not the probe's)."""
    if probe_gain is not None:
        lo, hi = model.memory.theta_range()
        return (f"a reserve probe, a measured shape raised to learn the memory the capture needs beyond what "
                f"it reports ({lo:.1f}-{hi:.1f} GiB so far; its own expected gain {probe_gain:.4f}, "
                f"the largest of any candidate {best_gain:.4f})")
    if best_gain > 0:
        return f"largest expected hypervolume gain {best_gain:.4f}"
    return "no configuration is expected to add to the front; the least known one"


def _undominated(shapes: list[tuple[int, int, int]]) -> list[tuple[int, int, int]]:
    """The shapes no other shape of the list beats by construction.  EAGLE verifies the
    draft - 1 most probable nodes of its tree, and a node is never more probable than its
    parent, so no verified node lies deeper than draft - 1: steps beyond that only add draft
    forwards (and graph memory), and (steps, topk, draft) with steps > draft - 1 verifies the same
    nodes as (draft - 1, topk, draft), more slowly.  A tree of two draft tokens verifies the one
    most probable child, the chain's (1, 1, 2), with wider drafts.  Launching such a shape to
    learn its throughput (an unseen topk looks uncertain to the model) spends a trial on a
    configuration that cannot reach the front: qwen-demo's studies launched (1, 4, 2), (2, 2, 2)
    and (2, 4, 2) beside (1, 1, 2).  Kept when the shape that beats it is not in the list."""
    have = set(shapes)
    out = []
    for s, k, d in shapes:
        better = (1, 1, 2) if k > 1 and d == 2 else (d - 1, k, d) if k > 1 and s > d - 1 else None
        if better is None or better not in have:
            out.append((s, k, d))
    return out


# Raising a measured shape's fraction also tells every other shape how much memory the capture
# really needs (the reserve is the same for all): while the reserve is uncertain, its worth is the
# hypervolume the whole measured front would gain if every point's capacity grew as this one's
# would, and it is taken only where P(start) >= 0.7.  Once the reserve is known (the probes'
# rule, _RESERVE_KNOWN), a climb tells the other shapes nothing they do not know: its worth is
# its own gain, like any candidate's.  Counting the whole front's lift then spent launches on
# one-step climbs the capacity did not follow (qwen-demo: (5, 1, 6) from 0.92 to 0.93, 17
# requests both, predicted 18) and, at 20 trials, graph OOMs at the edge: over 15 landscapes x
# 4 seeds, failed launches at 20 went from 0.5 to 0.25 per study on qwen-demo, 1.0 to 0.5 on
# qwen-mtp-strong, 1.75 to 1.0 on family:7; HV at 10 +0.3 points on average.
_CLIMB_WEIGHT = 1.0
_CLIMB_P = 0.7
# The price of a failed launch in the gain's units (normalised hypervolume).  Without it, late
# trials with nothing left to gain took P 0.5-0.6 launches for gains of 0.003 (family:7, 20
# seeds: 1.55 failed launches a study at 20 trials -> 1.00; qwen-demo 1.05 -> 0.40, and 0.80 once
# probes stayed on measured shapes), while a reserve probe (gains of 0.1-0.25 at P 0.55-0.8)
# still pays for itself.
_FAILURE_PRICE = 0.02
# An operator's trust is spent by failures beyond an allowance (below): one failure is the price
# of finding the edge, each further one multiplies the price of the next by _PRICE_GROWTH, and after
# _PROBE_FAILURES no launch is a reserve probe.  Without it, a study whose warm start sat at its
# edge (drawn landscapes with a 12% capture reserve: every fraction above the warm start's
# failed) probed one step lower after each failure, at an honest P(start) 0.6-0.7, four times in
# ten launches.  Doubling from the first failure cost family:0 0.7 points of HV at 10 launches
# (its worst seed 94.8 -> 91.8%): its one failure is a probe's.
_PRICE_GROWTH = 2.0
_PROBE_FAILURES = 2
# ... and after _PROBE_FAILURES failures of launches the model itself proposed (a designed first
# launch had no model to be wrong), any launch needs this P(start), while some candidate has it.
# Two such failures say the server's memory is not what the model assumed, and its less sure
# predictions were then wrong: in the 12%-reserve worlds (`sampler_benchmark.py --capture-reserve
# 0.12`, 160 20-launch studies) 211 launches after them had P 0.7-0.98 and half of them failed (P
# 0.95-0.98: 85 of 92 started, family:7's 6 all failed), the third failure of 98 studies; family:0,
# whose two were its first launch and a probe, started all of its 56 such launches.  Where the
# prior holds it hardly binds: 2 launches of the 23 landscapes' and the held-out worlds' 20-launch
# studies (both started).
_TRUSTED_P = 0.98
# The allowance behind that "one failure": one failed launch per ten launches, the rate issue #23
# asks of a study and an operator forgives.  A study that failed once in its first ten launches
# pays double for the next failure until its tenth launch, and the base price again after it; a
# reserve probe is priced within the allowance (it is the price of learning the edge: a probe
# after a failure started 88-96% of the time on the held-out worlds).  Held out, 50 four-GPU
# worlds (`sampler_benchmark.py --landscapes none --family-tp4 50 --family-first 8 --seeds 1`):
# failed launches in the first ten 1.18 -> 1.06 a study, worlds with two 11 -> 5, HV at 10
# 97.82 -> 97.73%, at 20 98.47 -> 98.41%; the 23 landscapes 97.55 -> 97.45% at 10, 98.95% at 20
# both (tp4:5's (1, 1, 2) climbing 0.91 -> 0.92 at P 0.70 for its 42nd request waits for the
# eleventh launch).  Doubling from the first failure for the whole study instead lost 0.26
# points at 20 on the four-GPU worlds (tp4:40 99.8 -> 96.6%: the edge never climbed); the
# allowance applied to the probes too priced out family:0's probe after its first failure
# (family:0 96.5 -> 95.3% at 10, a worst seed of 89.0%).
_LAUNCHES_PER_FAILURE = 10
_RESERVE_KNOWN = M._RESERVE_KNOWN  # one figure: the probes stop where the model puts its least-margin atom (model.py)


def _failure_price(failed: int, launched: int) -> float:
    """The price of the next failed launch for a study that has failed `failed` of its
    `launched` launches: the base price, doubled for each failure beyond one per ten launches
    made (a failure before the tenth launch is beyond it until then)."""
    return _FAILURE_PRICE * _PRICE_GROWTH ** max(failed - launched // _LAUNCHES_PER_FAILURE, 0)


def _launchable(p_start: np.ndarray, bar: np.ndarray, excluded: np.ndarray, mispredicted: int) -> tuple[np.ndarray, bool]:
    """The candidates a launch may go to: P(start) at their bar (a first start's or the least),
    not excluded; after _PROBE_FAILURES failures of launches the model predicted, only those at
    _TRUSTED_P, while any is (and then True)."""
    allowed = (p_start >= bar) & ~excluded
    if mispredicted >= _PROBE_FAILURES and (trusted := allowed & (p_start >= _TRUSTED_P)).any():
        return trusted, True
    return allowed, False


def _failed_launches(launches: list[M.Launch], predicted: bool = False) -> int:
    """Launches of the study (model.launches: not the duplicates or the configurations
    history.check ruled out unlaunched) that failed for memory; with `predicted`, only those the
    model proposed with a P(start) (not a designed first launch, nor one an operator enqueued)."""
    return sum(1 for x in launches if x.state not in ("ok", "other")
               and (not predicted or (x.attrs.get(record.MODEL_PREDICTION) or {}).get("p_start") is not None))


def _reserve_uncertain(model: M.Model) -> bool:
    return _memory_uncertain(model.memory)


def _memory_uncertain(memory: M.Memory) -> bool:
    lo, hi = memory.theta_range()
    return hi - lo > _RESERVE_KNOWN * memory.pre


def _predictable(names: list[str]) -> bool:
    """Whether the model predicts every objective: its own three, and single_tps or
    concurrent_tps of one request class (`single_tps:long_context`: the mix's figure times the
    class's fitted ratio, model.ClassRatio)."""
    return all(n in PREDICTED or n == "slo_capacity" or M.class_base(n) is not None for n in names)


def _pool_matters(names: list[str], trials: list[FrozenTrial]) -> bool:
    """Whether an objective moves with the static pool (running requests, the batch a level
    runs at): capacity, concurrent_tps (any level or class), and slo_capacity while the pool
    caps it somewhere (`_slo_pool_bound`).  A reserve probe learns where the pool's edge is; a
    study of single-stream speed or accept length gains nothing from it (a single_tps study on
    the demo raised (5, 4, 10) 0.82 -> 0.85 for 236.5 tok/s against 237.9, its third launch of
    four)."""
    bases = {split_name(n).base for n in names}
    return bool(bases & {"capacity", "concurrent_tps"}) or ("slo_capacity" in bases and _slo_pool_bound(trials))


def _after_probe(trials: list[FrozenTrial]) -> bool:
    """Whether the last finished trial was a reserve probe.  A study that scores capacity may
    probe again at once: a climb's worth there counts the lift of every measured shape
    (`_climb_gain`), and the fixed landscapes reach their edge through consecutive probes (at
    most two in a row lost 0.1 points of HV at 10 launches, docs/search-figures.md).  Any
    other study probes every other trial, as the default sampler's (`_fallback_probe`): its
    probe's worth is its own small gain, and live the demo's SLO study (p95 ITL <= 40 ms, the
    pool capping slo_capacity) spent its trials 1-5 raising (3, 1, 4) 0.80 -> 0.94, 13 -> 24
    requests, and measured no other shape."""
    finished = [t for t in trials if t.state.is_finished()]
    return bool(finished) and str(finished[-1].user_attrs.get(record.MODEL_NOTE, "")).startswith("model: a reserve probe")


def _slo_pool_bound(trials: list[FrozenTrial]) -> bool:
    """Whether the running requests cap slo_capacity at some shape: at its highest launched
    fraction the load search held up to the server's cap (record.SLO_CAPACITY >= its running
    requests); True before any such measurement.  Where the latency promise breaks below the cap
    at every shape, more pool adds nothing the study scores.  Why: the demo's SLO study (p95 ITL
    <= 20 ms) spent four of its first six launches raising (3, 1, 4) 0.80 -> 0.92 while its
    slo_capacity stayed at 15-16 under 17-22 running requests."""
    top: dict = {}
    for t in trials:
        c, slo = _config(t), t.user_attrs.get(record.SLO_CAPACITY)
        if t.state == TrialState.COMPLETE and c is not None and slo is not None and t.user_attrs.get(record.MAX_RUNNING_REQUESTS):
            if c[:3] not in top or c[3] > top[c[:3]][0]:
                top[c[:3]] = (c[3], float(slo) >= float(t.user_attrs[record.MAX_RUNNING_REQUESTS]))
    return not top or any(bound for _, bound in top.values())


_REDRAWS = 8  # draws for a shape other than a spent chain, as MemoryEdgeSampler's dedupe
_PROBE_P = (0.55, 0.8)  # a reserve probe starts with this probability: a failure is the price of learning


def _reserve_probe(model: M.Model, names: list[str], trials: list[FrozenTrial], cand: np.ndarray, p_start: np.ndarray,
                   gain: np.ndarray, first: np.ndarray) -> int | None:
    """While the unreported reserve is known only within more than 2% of the memory, the next
    launch is a measured shape at a higher fraction that starts with P 0.55-0.8 (the most
    gain among them): each success lowers the reserve's bound for every shape at once, each
    failure raises it, so new shapes can then start near the edge at P >= 0.9 instead of
    climbing one fraction step per launch.  None when the reserve is known, no objective moves with the pool
    (`_pool_matters`), the last trial was a probe in a study without capacity (`_after_probe`), or
    no such candidate."""
    if not _reserve_uncertain(model) or not _pool_matters(names, trials) or ("capacity" not in names and _after_probe(trials)):
        return None
    ok = (~first) & (p_start >= _PROBE_P[0]) & (p_start <= _PROBE_P[1]) & (gain > 0)
    if not ok.any():
        return None
    return int(np.flatnonzero(ok)[int(np.argmax(gain[ok]))])


def _hv(points: np.ndarray) -> float:
    """Hypervolume of normalised points (maximised, origin reference) on the gain's grid."""
    return 1.0 - float(_box_volumes(np.clip(_pad3(points), 0, 1), 40)[-1, -1, -1])


def _climb_gain(cand: np.ndarray, capacity: np.ndarray, p_start: np.ndarray, trials, measured: np.ndarray,
                names: list[str], scale: np.ndarray) -> np.ndarray:
    """Per candidate, the front's gain if its capacity ratio over its shape's best measured one
    applied to every measured point; 0 for shapes not measured, or below _CLIMB_P."""
    out = np.zeros(len(cand))
    best: dict[tuple, float] = {}
    for t in trials:
        c = _config(t)
        if t.state == TrialState.COMPLETE and c is not None and t.values:
            best[c[:3]] = max(best.get(c[:3], 0.0), float(t.values[names.index("capacity")]))
    if not best or not len(measured):
        return out
    front = measured.reshape(-1, len(names)) / scale
    base = _hv(front)
    col = names.index("capacity")
    cache: dict[float, float] = {}
    for i, row in enumerate(cand):
        had = best.get(tuple(int(x) for x in row[:3]))
        if not had or p_start[i] < _CLIMB_P or p_start[i] > 0.999 or capacity[i] <= had:
            continue
        ratio = round(float(capacity[i]) / had, 2)
        if ratio not in cache:
            lifted = front.copy()
            lifted[:, col] = lifted[:, col] * ratio
            cache[ratio] = max(_hv(np.concatenate([front, lifted])) - base, 0.0)
        out[i] = cache[ratio]
    return out


def _inside(cand: np.ndarray, started: set) -> np.ndarray:
    """Candidates whose shape is no larger than a started one in steps, topk and draft tokens.
    Every graph term grows with each of them (graph tokens, tree buffers), so such a shape's
    graphs need no more than the started one's at the same graph batch: its launch is no first
    start into unknown graph memory, and needs P(start) >= 0.5, not 0.9 (P(start) still prices
    its batch).  qwen-demo's chains (1, 1, 2) and (2, 1, 3), inside the warm start (3, 1, 4),
    then start at their 0.94 edge once the warm start has, not a step below it."""
    if not started:
        return np.zeros(len(cand), dtype=bool)
    have = np.array(sorted(started), dtype=float)
    return np.any(np.all(cand[:, None, :3] <= have[None, :, :] + 1e-9, axis=2), axis=1)


def _pad3(a: np.ndarray) -> np.ndarray:
    """Fewer than three objectives: the missing axes are full (1), so volumes are areas/lengths."""
    if a.shape[-1] == 3:
        return a
    pad = np.ones(a.shape[:-1] + (3 - a.shape[-1],))
    return np.concatenate([a, pad], axis=-1)


def _config(t: FrozenTrial) -> tuple | None:
    flags = t.user_attrs.get(record.FLAGS) or t.params
    shape = M._shape_of(flags)
    if shape is None or flags.get("mem_fraction_static") is None:
        return None
    return (shape.steps, shape.topk, shape.draft, round(float(flags["mem_fraction_static"]), 6))


def _pending(cand: np.ndarray, trials: list[FrozenTrial]) -> np.ndarray:
    """Candidates another worker is measuring now (RUNNING trials with their flags chosen)."""
    running = {c for t in trials if t.state == TrialState.RUNNING and (c := _config(t)) is not None}
    return np.array([tuple(int(x) for x in row[:3]) + (round(float(row[3]), 6),) in running for row in cand], dtype=bool)


def _excluded(cand: np.ndarray, trials: list[FrozenTrial]) -> np.ndarray:
    """Measured (or below a measured fraction of its shape), being measured, or ruled out by a
    memory failure (tuner/search/history.py's rules:
    a graph OOM rules out everything at least as large at an equal or higher fraction, a KV
    failure everything with as many draft tokens at an equal or lower one), or a shape SGLang
    rejected."""
    out = _pending(cand, trials)
    keys = [tuple(int(x) for x in row[:3]) + (round(float(row[3]), 6),) for row in cand]
    # Measured, and a measured shape at a lower fraction: its measurement dominates it (the same
    # draft and verify steps, so the same single-stream speed; a smaller pool, so no more running
    # requests and no larger batch).  Its throughput spread at another batch is symmetric in the
    # model, so without the lower fractions the demo's trials 13-14 re-launched (5, 1, 6)
    # 0.93 -> 0.88 and (1, 1, 2) 0.93 -> 0.92 for draws above the measured speed that a smaller
    # batch cannot give.
    highest: dict[tuple, float] = {}
    for t in trials:
        if t.state == TrialState.COMPLETE and (c := _config(t)) is not None:
            highest[c[:3]] = max(highest.get(c[:3], 0.0), c[3])
    out |= np.array([k[:3] in highest and k[3] <= highest[k[:3]] + 1e-9 for k in keys], dtype=bool)
    for t in trials:
        kind = t.user_attrs.get(record.FAILURE_KIND)
        c = _config(t)
        if t.state == TrialState.COMPLETE or c is None or t.user_attrs.get(record.RULED_OUT_BY) is not None:
            continue
        if kind in ("memory_graph", "memory_runtime"):
            out |= np.all(cand >= np.array(c, dtype=float) - 1e-9, axis=1)
        elif kind == "memory_kv":
            out |= (cand[:, 3] <= c[3] + 1e-9) & (cand[:, 2] >= c[2])
        elif kind == "invalid":  # SGLang's rules on a shape do not depend on the fraction
            out |= np.all(np.abs(cand[:, :3] - np.array(c[:3], dtype=float)) < 1e-9, axis=1)
    return out


def predicted_front(study: optuna.Study, space, base, *, near: float = 0.02, limit: int = 10) -> tuple[list[str], list[list[str]], str]:
    """Configurations never launched that the study's model expects on the measured front or
    within `near` of it (likely to start: P >= 0.5), with 90% intervals: (header, rows, note)."""
    names = list(study.metric_names or [])
    trials = study.get_trials(deepcopy=False)
    if not names or not _predictable(names) or space.mem_fraction_static is None:
        return [], [], "the model predicts only single_tps, concurrent_tps (also per request class) and capacity over a searched mem fraction"
    model, why = M.fit(trials, names)
    if model is None:
        return [], [], f"no model: {why}"
    sampler = ModelSampler(optuna.samplers.RandomSampler())
    sampler.bind_space(space, base)
    shapes, mfs = sampler._candidates({})
    cand = np.array([(*s, m) for s in shapes for m in mfs], dtype=float)
    pred = model.predict(cand[:, 0].astype(int), cand[:, 1].astype(int), cand[:, 2].astype(int), cand[:, 3], names)
    mids, _ = pred.columns(names)
    measured = np.array([t.values for t in trials if t.state == TrialState.COMPLETE and t.values], dtype=float).reshape(-1, len(names))
    launched = {c for t in trials if (c := _config(t)) is not None}
    keys = [tuple(int(x) for x in row[:3]) + (round(float(row[3]), 6),) for row in cand]
    rows, shown = [], set()
    for i in np.lexsort((-cand[:, 3], -mids[:, 0])):  # fastest first; per shape its highest fraction
        if pred.p_start[i] < 0.5 or keys[i] in launched or keys[i][:3] in shown:
            continue
        if np.any(np.all(measured >= mids[i] * (1 + near), axis=1)):
            continue  # clearly dominated by a measured trial
        if any(np.all(mids[j] >= mids[i]) and np.any(mids[j] > mids[i]) for j in np.flatnonzero(pred.p_start >= 0.5)):
            continue  # dominated by another prediction
        iv = pred.interval(int(i))
        shown.add(keys[i][:3])
        rows.append([str(keys[i][0]), str(keys[i][1]), str(keys[i][2]), f"{keys[i][3]:g}",
                     *(f"{iv[n][1]:g} [{iv[n][0]:g}, {iv[n][2]:g}]" for n in names), f"{iv['p_start']:.2f}"])
        if len(rows) >= limit:
            break
    header = ["steps", "topk", "draft", "mem", *names, "P(start)"]
    return header, rows, f"model {why}, throughput fit error {model.fit_error:.1%}"
