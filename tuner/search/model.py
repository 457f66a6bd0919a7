"""A physical model of one study's landscape, fitted from what its launches measured.

Every launch reveals structure no generic sampler reads (issue #15); this module fits it and
predicts, for any (steps, topk, draft tokens, mem fraction), single_tps, concurrent_tps,
capacity and whether the server starts, each with an uncertainty:

- Acceptance by depth.  A verify step accepts k drafts with the counts of the trial's
  `accept_histogram` (SGLang's per-request spec_correct_drafts_histogram, summed; or the depth
  probe's, tuner/measure/runner.py).  For a chain, reaching depth j does not depend on deeper drafts, so a
  deep chain's P(accepted >= j) gives every shallower chain's accept length exactly:
  1 + sum_j P(>= j).  Chains are pooled per depth as conditional rates c_j = n(>= j)/n(>= j-1)
  (exact products on any mix of chains); deeper than measured, log c_j is extrapolated
  linearly.  Trees: EAGLE verifies the draft_tokens - 1 most probable nodes of a pool grown
  topk-wide per depth; the r-th candidate is right with (1 - c) * s * (1 - s)^(r - 2) (a
  geometric rank law), s fitted on the trees measured, then one calibration factor per topk on
  the accepted drafts.
- Step time.  A decode iteration is draft forwards + one verify forward + overhead; the verify
  costs the same while memory-bound and grows linearly past a knee in batch x draft tokens
  (docs/h200-forward-times.md).  Fitted (non-negative least squares, knee on a grid) on
  accept / single_tps at batch 1 and batch x accept / concurrent_tps at the measured level.
  Beyond the most verify tokens a launch measured, the fit's knee is a guess: a forward's
  time grows at most in proportion to its tokens (memory- or compute-bound), and the
  prediction lies between the fit and that bound (`StepTime.ms_bound`).
- Memory, with what the launches leave unknown (issue #23; `Memory`, `HybridPool`).  KV tokens
  in SGLang's form (a hybrid's state slots and per-draft-token intermediate state per served
  slot, or a line in the fraction with a per-draft-token term); the graph memory of a shape
  between the linear fit on the graph GiB (a first chain: the trees' scaled runner by runner)
  and an upper bound scaling the most GiB per graph token seen; the reserve a capture needs
  beyond what it reports between none and the
  least `startup_available` a launch started with (a prior of at most 10% of the memory, and
  beyond it as far as the failures' odds say).  P(start) is the share of those
  grids under which the launch fits; every memory failure keeps only the grid points under which
  it would have failed (a graph OOM needed more than the capture log's free memory).

- Objectives beyond those three: a request class's speed as the mix's times a fitted ratio
  (`ClassRatio`); slo_capacity as the most requests in flight whose predicted ITL percentile
  (the step time's per-token ITL times a fitted ratio) keeps its promise, up to the running
  requests the pool allows (`SloFit`).

Throughput uncertainties are residual-based log-normal spreads, widened for shapes unlike any
measured one (an unseen topk, deeper or wider than measured) and by the fit's own error.
A measured shape is anchored: at another fraction it is predicted from its own measurement, and
only what the fraction changes (the batch the pool allows) is uncertain (`Model.anchors`).
Pure numpy/scipy on `FrozenTrial`s; nothing here knows the emulator.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field, replace

import numpy as np
from optuna.trial import FrozenTrial, TrialState
from scipy.optimize import nnls
from scipy.stats import norm

from tuner.measure.objectives import split_name
from tuner.results import record

__all__ = ["Shape", "Launch", "launches", "reach_from_histogram", "pooled_depth_rates", "tree_reach",
           "memory_line", "Model", "fit", "Prediction", "class_base", "SloFit"]

_KNEES = (32.0, 64.0, 128.0, 192.0, 256.0, 384.0, 512.0, 768.0, 1024.0, 2048.0, 1e9)
_MEM_FAILURES = ("memory_graph", "memory_runtime")
_SAME = 0.0  # relative spread of a measured shape's throughput at another fraction, same batch
# The relative noise of one measurement (about [bench] single_target_ci's default 3% 95% half-width,
# over 1.96, rounded up): the narrowest interval a report shows.
REPORT_NOISE = 0.02
# Weight of the "step time does not depend on the shape" prior, per slope.  At 0.3 it held the
# draft steps' cost down after seven launches, so shallower chains than measured looked slower
# than they were (l40s: (4, 1, 5) at batch 25 predicted 1529 tok/s, ran 1634; family:2's (1, 1, 2)
# 3412, ran 3819) and were not launched.  20 seeds x 15 landscapes, HV at 10 launches: 0.3 ->
# 0.1 raised 10 landscapes (family:0 95.7 -> 96.4%, family:1 96.2 -> 97.0%, family:2 93.9 -> 94.2%)
# and lowered 3 (qwen-demo 95.5 -> 95.2%, qwen-mtp-strong 98.1 -> 97.7%, h100-128k 96.1 -> 95.9%);
# 0.03 lowered family:2 to 93.0% with a worst seed of 85%.
_TIME_PRIOR = 0.1


@dataclass(frozen=True)
class Shape:
    steps: int
    topk: int
    draft: int

    @property
    def tree(self) -> bool:
        return self.topk > 1


@dataclass
class Launch:
    """One real launch of the study (settled duplicates and inferences are not evidence)."""

    shape: Shape
    mfs: float
    state: str  # "ok" | "memory_graph" | "memory_kv" | "other"
    values: dict[str, float] = field(default_factory=dict)
    attrs: dict = field(default_factory=dict)
    running: bool = False  # another worker is measuring it now

    @property
    def hist(self) -> list[int] | None:
        h = self.attrs.get(record.ACCEPT_HISTOGRAM)
        return [int(x) for x in h] if h else None

    @property
    def memory(self) -> dict | None:
        """The server's memory_usage; where it has no startup_available (0.5.9's
        get_internal_state), what the capture log says was left after the last graph (each
        runner's "avail mem" after it; the least is after the last)."""
        usage = self.attrs.get(record.MEMORY_USAGE)
        capture = self.attrs.get(record.CAPTURE_MEMORY) or {}
        if not usage or usage.get("startup_available") is not None or capture.get("failed_runner") is not None:
            return usage
        left = [r["avail_after"] for r in (capture.get("runners") or {}).values() if r.get("avail_after") is not None]
        return {**usage, "startup_available": min(left)} if left else usage


def _shape_of(params: dict) -> Shape | None:
    steps = params.get("speculative_num_steps")
    if steps is None:
        return None
    topk = int(params.get("speculative_eagle_topk") or 1)
    draft = int(params.get("speculative_num_draft_tokens") or (steps + 1))
    return Shape(int(steps), topk, steps + 1 if topk == 1 else draft)


def launches(trials: list[FrozenTrial], metric_names: list[str] | None) -> list[Launch]:
    out = []
    for t in trials:
        attrs = t.user_attrs
        if attrs.get(record.DUPLICATE_OF) is not None or attrs.get(record.RULED_OUT_BY) is not None:
            continue
        flags = attrs.get(record.FLAGS) or t.params
        shape, mfs = _shape_of(flags), flags.get("mem_fraction_static")
        if shape is None or mfs is None:
            continue
        if t.state == TrialState.COMPLETE and t.values is not None:
            values = {**_mix_values(attrs, metric_names or []), **dict(zip(metric_names or [], t.values))}
            out.append(Launch(shape, float(mfs), "ok", values, dict(attrs)))
        elif t.state in (TrialState.PRUNED, TrialState.FAIL):
            kind = attrs.get(record.FAILURE_KIND)
            state = kind if kind in (*_MEM_FAILURES, "memory_kv") else "other"
            out.append(Launch(shape, float(mfs), state, {}, dict(attrs)))
        elif t.state == TrialState.RUNNING:
            out.append(Launch(shape, float(mfs), "other", {}, dict(attrs), running=True))
    return out


def _mix_values(attrs: dict, names: list[str]) -> dict[str, float]:
    """The mix's single_tps and concurrent_tps from a trial's record, where the study scores a
    class objective of them and not the mix's own: the model fits its step time on the mix and
    predicts a class as a ratio to it (ClassRatio)."""
    out: dict[str, float] = {}
    bases = {class_base(n) for n in names} - {None}
    if "slo_capacity" in names:  # its load search stands on the step time, fitted on the mix's rates
        bases |= {"single_tps", "concurrent_tps"}
    runs = attrs.get(record.SINGLE_TPS_RUNS)
    if "single_tps" in bases and runs:
        out["single_tps"] = float(np.mean(runs))  # measure/phases.py · single_phase: their mean
    levels = attrs.get(record.CONCURRENT_TPS_BY_LEVEL) or {}
    if "concurrent_tps" in bases and levels and next(iter(levels.values())):
        out["concurrent_tps"] = float(next(iter(levels.values())))  # the first level's, as objectives/concurrent_tps
    return out


# --- acceptance ---------------------------------------------------------------------------------


def reach_from_histogram(hist: list[int]) -> list[float]:
    """P(accepted drafts >= j), j = 1 .. len(hist) - 1, from verify-step counts by drafts accepted."""
    total = float(sum(hist))
    if total <= 0:
        return []
    return [sum(hist[j:]) / total for j in range(1, len(hist))]


def pooled_depth_rates(chains: list[tuple[int, list[int]]]) -> list[tuple[float, float]]:
    """Per depth j = 1.., (conditional rate n(>= j) / n(>= j - 1), denominator) pooled over
    chains (steps, histogram) deep enough to reach j.  On one chain the products are its
    reach probabilities exactly."""
    depth = max((s for s, _ in chains), default=0)
    out = []
    for j in range(1, depth + 1):
        num = den = 0.0
        for steps, hist in chains:
            if steps < j:
                continue
            num += sum(hist[j:])
            den += sum(hist[j - 1:])
        if den <= 0:
            break
        out.append((num / den, den))
    return out


def _chain_rates(rates: list[tuple[float, float]], steps: int) -> list[float]:
    """Conditional rates c_1..c_steps: measured, then log-linear extrapolation."""
    c = [min(max(r, 1e-4), 1 - 1e-4) for r, _ in rates][:steps]
    if len(c) >= steps:
        return c
    if not c:
        c = [0.7]  # nothing measured: a weak prior, made wide by the caller's uncertainty
    ys = np.log(np.array(c))
    slope = float(np.polyfit(np.arange(len(ys)), ys, 1)[0]) if len(ys) >= 3 else math.log(0.95)
    slope = min(max(slope, math.log(0.85)), 0.0)
    while len(c) < steps:
        c.append(float(min(math.exp(math.log(c[-1]) + slope), 0.995)))
    return c


def tree_reach(rates: list[float], topk: int, draft: int, share: float) -> list[float]:
    """Summed path probability per depth of the draft - 1 nodes EAGLE verifies (by path score)."""
    def children(c: float) -> list[float]:
        probs, rest = [c], 1 - c
        for _ in range(1, topk):
            probs.append(rest * share)
            rest *= 1 - share
        return probs

    pool: list[tuple[float, int]] = []
    frontier = [1.0]
    for depth, c in enumerate(rates):
        kids = [p * x for p in frontier for x in children(c)]
        pool.extend((x, depth) for x in kids)
        frontier = sorted(kids, reverse=True)[:topk]
    mass = [0.0] * len(rates)
    for p, depth in sorted(pool, key=lambda n: (-n[0], n[1]))[: max(draft - 1, 0)]:
        mass[depth] += p
    return mass


@dataclass
class Acceptance:
    rates: list[tuple[float, float]]
    share: float
    calib: dict[int, float]
    measured_depth: int
    spread: float  # relative std of accept-length predictions (residual based)

    def accept(self, shape: Shape) -> float:
        c = _chain_rates(self.rates, shape.steps)
        if not shape.tree:
            reach, prod = [], 1.0
            for x in c:
                prod *= x
                reach.append(prod)
            return 1 + sum(reach)
        extra = sum(tree_reach(c, shape.topk, shape.draft, self.share))
        return 1 + extra * self.calib.get(shape.topk, 1.0)


def _fit_acceptance(ls: list[Launch]) -> Acceptance:
    ok = [x for x in ls if x.state == "ok" and x.hist]
    chains = [(x.shape.steps, x.hist) for x in ok if not x.shape.tree]
    rates = pooled_depth_rates(chains)
    if not rates:  # no chain probed yet: read the tree's first-depth mass as a rough chain
        trees = [reach_from_histogram(x.hist) for x in ok if x.shape.tree]
        rates = [(trees[0][0], 1.0)] if trees and trees[0] else []
    acc = Acceptance(rates, 0.5, {}, len(rates), 0.0)
    trees = [x for x in ok if x.shape.tree and x.values.get("accept_length", x.attrs.get(record.ACCEPT_LENGTH))]
    if trees:
        def err(s: float) -> float:
            acc.share = s
            return sum((math.log(acc.accept(x.shape)) - math.log(_accept_of(x))) ** 2 for x in trees)
        acc.share = min(np.linspace(0.05, 0.95, 19), key=err)
        for k in {x.shape.topk for x in trees}:
            got = [(_accept_of(x) - 1, acc.accept(x.shape) - 1) for x in trees if x.shape.topk == k]
            ratio = sum(a for a, _ in got) / max(sum(b for _, b in got), 1e-9)
            acc.calib[k] = 1 + (ratio - 1) * len(got) / (len(got) + 1)  # shrunk toward 1
    res = [math.log(acc.accept(x.shape) / _accept_of(x)) for x in ok if _accept_of(x)]
    acc.spread = float(np.sqrt(np.mean(np.square(res)))) if res else 0.1
    return acc


def _accept_of(x: Launch) -> float | None:
    a = x.attrs.get(record.ACCEPT_LENGTH)
    if a:
        return float(a)
    if x.hist:
        return 1 + sum(reach_from_histogram(x.hist))
    return None


# --- step time ----------------------------------------------------------------------------------


def _time_features(steps, topk, draft, batch, accept, concurrent, knee, experts=0.0):
    """Features of one decode iteration's time (ms): overhead, per-request work, draft forwards
    (flat, and growing with batch x topk), tree bookkeeping, the verify's compute past the knee,
    under load the prefills of replacing finished requests (per accepted token), and a MoE's
    expert reads: the share of experts the verify's tokens touch, 1 - exp(-tokens / experts),
    steep to ~64 tokens and then flat (docs/h200-forward-times.md, "One MoE layer"); a dense
    model's fit leaves it at zero (experts = 0: no column)."""
    steps, topk, draft, batch = (np.asarray(v, dtype=float) for v in (steps, topk, draft, batch))
    tokens = batch * draft
    touched = 1 - np.exp(-tokens / experts) if experts > 0 else np.zeros_like(tokens)
    return np.stack([
        np.ones_like(tokens), batch, steps, steps * batch * topk, (topk > 1).astype(float),
        np.maximum(tokens - knee, 0.0), np.asarray(concurrent, dtype=float) * batch * np.asarray(accept, dtype=float),
        touched,
    ], axis=-1)


# The columns of _time_features that depend on nothing but the verify's tokens (batch x draft):
# the overhead, the compute past the knee and a MoE's expert reads (StepTime.ms_bound scales them).
_VERIFY_COLUMNS = [0, 5, 7]


# Tokens over which a MoE verify touches ~63% of its experts (E / top-k for random routing:
# 128 experts, top-8 -> 16); 0: a dense model.  Fitted on a grid with the knee.
_EXPERT_SCALES = (0.0, 8.0, 16.0, 32.0)


@dataclass
class StepTime:
    coef: np.ndarray
    knee: float
    spread: float  # relative std of time predictions (residual based)
    experts: float = 0.0  # the MoE scale (tokens) of the fit, 0 for a dense one
    max_tokens: float = 0.0  # the most verify tokens (batch x draft) a measurement saw
    min_tokens: float = 0.0  # the fewest verify tokens a measurement under load saw
    below: "StepTime | None" = None  # the fit that lays the load's cost on the verify's tokens (_fit_time)

    def ms(self, steps, topk, draft, batch, accept, concurrent) -> np.ndarray:
        return _time_features(steps, topk, draft, batch, accept, concurrent, self.knee, self.experts) @ self.coef

    def ms_bound(self, steps, topk, draft, batch, accept, concurrent) -> np.ndarray:
        """The slowest step time physics allows beyond the measured verify tokens: a forward is
        memory-bound or compute-bound, max(a, c x tokens), so its time grows at most in
        proportion to its tokens (t(l x T) <= l x t(T), l >= 1, for a dense model's knee as for
        a MoE's experts).  The fit's knee and slope past the last measured tokens are a guess (a
        knee beyond the data has no slope to fit: l40s, launches up to 225 verify tokens, predicted
        (6, 4, 23) at batch 25, 575 tokens, at 1688 tok/s; it ran 1142); this bounds the guess."""
        t = self.ms(steps, topk, draft, batch, accept, concurrent)
        if self.max_tokens <= 0:
            return t
        tokens = np.asarray(batch, dtype=float) * np.asarray(draft, dtype=float)
        top = np.full_like(tokens, self.max_tokens)
        bound = t - self._verify_ms(tokens) + self._verify_ms(top) * tokens / top
        return np.where(tokens > top, np.maximum(t, bound), t)

    def _verify_ms(self, tokens) -> np.ndarray:
        """The part of a step's time that is the verify's tokens alone (_VERIFY_COLUMNS), from
        _time_features itself: a batch of `tokens` one-token requests has the same verify."""
        ones = np.ones_like(tokens)
        features = _time_features(ones, ones, ones, tokens, ones, 0 * ones, self.knee, self.experts)
        return features[..., _VERIFY_COLUMNS] @ self.coef[_VERIFY_COLUMNS]


def _time_rows(ls: list[Launch], level_of) -> list[tuple]:
    rows = []
    for x in ls:
        accept = _accept_of(x)
        if x.state != "ok" or not accept:
            continue
        s = x.shape
        if x.values.get("single_tps"):
            rows.append((s.steps, s.topk, s.draft, 1, accept, 0, accept / x.values["single_tps"] * 1000))
        conc, level = x.values.get("concurrent_tps"), level_of(x)
        running = x.attrs.get(record.MAX_RUNNING_REQUESTS)
        if conc and level:
            batch = min(level, running or level)
            rows.append((s.steps, s.topk, s.draft, batch, accept, 1, batch * accept / conc * 1000))
    return rows


def _fit_time(ls: list[Launch], level_of) -> StepTime | None:
    rows = _time_rows(ls, level_of)
    if len(rows) < 2:
        return None
    a = np.array(rows, dtype=float)
    concurrent = a[:, 5] > 0
    loaded = a[concurrent, 3] * a[concurrent, 2]
    top, bottom = (float(loaded.max()), float(loaded.min())) if concurrent.any() else (0.0, 0.0)
    fitted = _fit_rows(a, _KNEES, _expert_scales(ls))
    time = StepTime(*fitted, top, bottom)
    # The same rows with the load's extra cost laid on the verify's tokens: no per-request column,
    # a knee below the fewest tokens under load.  Where the concurrent measurements all ran at
    # one batch, the per-request column and a rise of the verify below the measured tokens
    # explain them alike; a shape with fewer verify tokens is slower by the first and faster by
    # the second, and only a launch of it tells them apart (predict takes the median between).
    # Evidence: tp4:7 (a 70B on 4x H200) measured trees at batch 32 (256-896 verify tokens); the
    # fit alone put the chains (3, 1, 4) and (2, 1, 3) at 0.93, the front's best concurrency,
    # 10% and 14% slow with a 5% spread, and no study launched them (HV at 20: 95.3%, now 97.7%).
    knees = tuple(k for k in _KNEES if k < bottom)
    if knees:
        time.below = StepTime(*_fit_rows(a, knees, (time.experts,), drop=(_BATCH_COLUMN,)), top, bottom)
    return time


_BATCH_COLUMN = 1  # the per-request column of _time_features


def _fit_rows(a: np.ndarray, knees, experts_scales, drop=()) -> tuple[np.ndarray, float, float, float]:
    """(coef, knee, relative RMS spread, experts) of the best fit over the knee and MoE grids."""
    y = a[:, 6]
    best = None
    for knee, experts in ((k, e) for k in knees for e in experts_scales):
        X = _time_features(a[:, 0], a[:, 1], a[:, 2], a[:, 3], a[:, 4], a[:, 5], knee, experts)
        X[:, list(drop)] = 0.0
        Xw = X / y[:, None]  # relative errors
        # Ridge rows pull every slope (not the constant) toward zero: with a launch or two the
        # step time is mostly the weights' streaming, the same for every shape; the data
        # overrule the prior as launches accumulate.
        scale = np.abs(Xw).mean(axis=0)
        prior = np.diag(np.r_[0.0, _TIME_PRIOR * scale[1:]])
        coef, _ = nnls(np.vstack([Xw, prior]), np.r_[np.ones(len(y)), np.zeros(len(scale))])
        loss = float(np.sum(((X @ coef - y) / y) ** 2))
        if best is None or loss < best[0] - 1e-12:
            best = (loss, knee, coef, experts)
    loss, knee, coef, experts = best
    return coef, knee, math.sqrt(loss / len(y)), experts


def _expert_scales(ls: list[Launch]) -> tuple[float, ...]:
    """The MoE scales to try: all of them unless /model_info names a dense architecture
    (a MoE's name says so: ...Moe..., DeepseekV*, Mixtral, ...)."""
    arch = " ".join(str(x.attrs.get(record.ARCHITECTURE) or "") for x in ls).lower()
    if arch and not any(name in arch for name in ("moe", "deepseek", "mixtral", "qwen3next", "qwen3_5", "gptoss", "glm4moe", "kimi")):
        return (0.0,)
    return _EXPERT_SCALES


# --- memory -------------------------------------------------------------------------------------


def memory_line(points: list[tuple[float, int]]) -> tuple[float, float]:
    """(slope, intercept) of KV tokens in mem_fraction_static from launches of one shape class:
    two launches give the line for every fraction."""
    (m0, t0), (m1, t1) = points[0], points[-1]
    if abs(m1 - m0) < 1e-9:
        raise ValueError("two different mem fractions are needed")
    slope = (t1 - t0) / (m1 - m0)
    return slope, t0 - slope * m0


def _graph_features(shape_steps, topk, draft, bs):
    steps, topk, draft, bs = (np.asarray(v, dtype=float) for v in (shape_steps, topk, draft, bs))
    tree = (topk > 1).astype(float)
    return np.stack([np.ones_like(bs), bs * draft, bs * topk * np.maximum(steps - 1, 0), tree * bs * draft,
                     tree * bs * steps * topk], axis=-1)


def graph_tokens(steps, topk, draft, bs) -> np.ndarray:
    """Tokens of the largest graphs a shape captures: the verify and the draft extend take
    bs x draft tokens, the draft decode bs x topk per step after the first (SGLang's
    decode_cuda_graph_runner.py and eagle_draft_*_cuda_graph_runner.py: max_bs x tokens per request)."""
    steps, topk, draft, bs = (np.asarray(v, dtype=float) for v in (steps, topk, draft, bs))
    return bs * (2 * draft + topk * np.maximum(steps - 1, 0))


# Latent grids: each unknown of the memory model is a point of a fixed grid of quantiles, and
# the launches weigh them (started ones bound them from above, failed ones from below).
_U_GRAPH = (np.arange(12) + 0.5) / 12  # where a shape's graphs sit between the fit and the upper bound
_U_THETA = (np.arange(32) + 0.5) / 32  # the unreported reserve, between 0 and its upper bound
_U_KV = (np.arange(16) + 0.5) / 16  # the per-draft-token KV reservation, between its bounds
# Prior bounds on the reserve a capture needs beyond what it reports, as shares of the memory:
# issue #23 measured ~1-8% of the card; 10% leaves a margin above.  The floor is 0, not 1%: a
# server may need nothing beyond its non-PyTorch memory (the emulator's fixed profiles: 0.6 GiB
# of an H200's 141, 0.4%), and a floor above the truth made every launch near the edge look
# riskier than it was (P 0.5-0.7 started 99% of the time there) and kept qwen-demo's chains one
# fraction step below their 0.94 edge (20 seeds, this change alone: HV at 10 launches 92.5% ->
# 95.7%; with the sampler's other #23 changes of the same round, 95.1%).
_THETA_MIN, _THETA_MAX = 0.0, 0.10
# With tp > 1 the capture may also need communication buffers outside PyTorch's pool and
# outside every figure (NCCL's communicators, the custom all-reduce's IPC buffers), more the
# more GPUs a rank spans: SGLang's own default reserves tp x pp / 8 GiB for them
# (server_args.py · _handle_gpu_memory_settings; docs/sglang-0.5.23.md section 2.1).  The prior's
# range reaches this much per GPU of the rank beyond its 10%: on 50 four-GPU worlds
# (family.draw_tp4_profile, tp4:8-57, 10 trials) the first reserve probes, predicted to start
# with P 0.64 and 0.74, started 38% and 58% of the time with 10% alone, 57% and 71% with it.
# Upward only: a floor at the buffers' size held qwen-demo (2 GiB outside the pool, no reserve)
# below its edge, 95.2% -> 94.2% of the front's HV at 10 launches with 0.5 GiB at tp 4.
_COMM_GIB_PER_GPU = 1.0
# The prior odds that the reserve exceeds 10% of the memory, or that a shape's graphs exceed
# their upper bound: what a failure only such physics explains must overcome (_weigh_graph_failures).
_BEYOND_PRIOR = 0.05
# A launch's need is one figure for every launch only on a deterministic server.  When the
# graph OOMs cannot all be explained with the starts (a shape inside one that started at the same
# fraction failed), the memory varies from launch to launch by at least this much, as shares of
# the memory (doubling; if even the last leaves no weight, the failures are set aside as before).
_LAUNCH_NOISE = (0.0025, 0.005, 0.01, 0.02, 0.04)
# The least margin any start left (its startup_available) bounds the reserve from above, and once
# the reserve is known (its 10-90% range within 2% of the memory: the reserve probes have stopped)
# the climb ended right above it: a fixed need outside every figure sits there (qwen-demo: 2.0 GiB
# of NCCL's buffers at tp 4 in every startup_available, the least margin 2.01 GiB).  Uniform up to
# that margin, a new shape leaving a little less looked 0.95-0.99 sure: 37 of ~7,250 launches
# predicted at P >= 0.9 in the 23 landscapes' 20-launch studies failed this way, on qwen-demo and
# qwen-mtp-strong.  So this share of the prior sits at the margin itself: a launch leaving less
# than any start did is at most 0.9 sure (a first launch's bar) until a start shows it.  38 -> 1
# such failures, HV at 10 97.50 -> 97.51% (benchmarks/results/sampler_benchmark_least_margin.md).
# While the reserve is unknown the atom would steer the probes (a share of 0.1 from the first
# launch: qwen-demo 95.0 -> 92.1% at 10; sampler_rejected_edge_atom.md).
_EDGE_ATOM = 0.1
_RESERVE_KNOWN = 0.02  # the reserve's 10-90% range, as a share of the memory, below which it is known
_CONTRADICTION = 1e-3  # no (graph, reserve) combination gives every failure this likelihood
_UNSEEN_TREE = 1.5  # a first tree's graphs per graph token, up to 1.5x a chain's (FlashInfer's index buffers); a first chain's down to 1/1.5 a tree's
_UNSEEN_TOPK = 1.25  # another topk than any started tree's
_KV_DECADE = 4.0  # a KV failure the line did not foresee: the reservation is 1-4x what it needed
_FLATTEN = (0.25, 0.5, 0.75, 1.0)  # how much the reservation line may flatten beyond the started drafts
# Hybrid (linear-attention) architectures: SGLang reserves their intermediate state per draft token
# and request slot (kv_cache_configurator.py · _handle_max_mamba_cache), so KV tokens fall with draft tokens.
_HYBRID_ARCHS = ("Qwen3Next", "Qwen3_5", "Mamba", "NemotronH", "FalconH", "Jamba", "Lfm2", "GraniteMoeHybrid",
                 "KimiLinear", "Zamba", "Bamba", "MiniMax")


@dataclass
class Memory:
    """The static pool, the request slots and the CUDA-graph edge, each with what the launches
    leave unknown.

    KV tokens in SGLang's form: tokens = alpha x (mfs x pre - weights) - beta x draft, where
    beta x draft is the per-draft-token reservation of a hybrid's intermediate state (SGLang
    reserves it per request slot before splitting the rest between state slots and KV,
    `_handle_max_mamba_cache`; docs/sglang-real-server.md row 15) and alpha folds the state
    share and the KV cell; dense models have beta = 0.  beta is known between [beta_lo, beta_hi].

    A capture starts when free - graphs >= theta: free = (1 - mfs) x pre - other (the capture
    log's "avail mem" before the first graph), graphs between the linear fit and an upper bound
    that scales the most graph memory per graph token any launch showed, theta an unreported
    reserve in [theta_lo, theta_hi] (theta_hi: the least startup_available a launch started with,
    and at most 10% of the memory, plus 1 GiB per GPU of a rank with tp > 1; theta_lo 0).
    Failed launches weigh the (graph, theta) grid: only combinations under which they would
    have failed keep their weight."""

    pre: float  # GiB the static fraction is taken of (pre-load memory)
    fixed: float  # GiB of the static pool that is not KV: weights
    alpha: float  # KV tokens per GiB of the pool
    beta_lo: float  # KV tokens reserved per draft token (hybrids), lower bound
    beta_hi: float
    running_cap: float
    running_per_token: float  # hybrid models: request slots grow with the pool
    graph_coef: np.ndarray
    other: float  # slack not available to graphs (activations), GiB
    theta_hi: float  # upper bound of the reserve (GiB)
    theta_lo: float  # lower bound
    spread: float  # GiB std of a graph-need prediction for measured-like shapes
    seen_topk: set
    max_draft: dict
    rho_chain: float = 0.0  # most GiB per graph token of a started chain
    rho_tree: float = 0.0  # of a started tree
    tree_topk: set = field(default_factory=set)
    measured: dict = field(default_factory=dict)  # (steps, topk, draft) -> (graph batch, GiB) of a started launch
    weights: np.ndarray = field(default_factory=lambda: np.ones((len(_U_GRAPH), len(_U_THETA))))
    # Graph OOMs the bounds did not foresee: per failed shape the least graph GiB it must need
    # (what was free minus the largest reserve), and the factor by which the upper bound of every
    # shape not yet started is widened (it was wrong once by that much).
    floors: dict = field(default_factory=dict)
    hi_scale: float = 1.0
    drafts: tuple = ()  # draft tokens of the launches the KV line was fitted on
    flatten: bool = True  # False once a KV failure beyond them showed the line does not flatten
    hybrid: "HybridPool | None" = None  # a hybrid's pools in SGLang's form, once the state pool capped a launch
    # The most reserve the starts allow (the least startup_available): the prior's range grows to
    # it when the failures need more than the prior's 10% of the memory (_weigh_graph_failures).
    theta_data: float = 0.0
    # (draft counts, log measured/predicted KV tokens, the same for running requests): the
    # form's residual at the launches, per draft count (pool_anchor).
    pool_anchor: tuple | None = None
    # SGLang's cuda_graph_max_bs (a server setting, the same for every launch) where /server_info
    # said it: graphs are captured up to min(it, request slots), so a candidate's graph batch is
    # capped by it as the launches' were (a 48 GB L40S captures up to 32 of 48 slots; uncapped,
    # every new shape's graphs looked 1.5x what the measured ones scale to).  None: not shown.
    graph_max_bs: float | None = None
    # A reserve beyond the prior (between its 10% and theta_data, no graph floors) and its
    # posterior share of P(start), once graph OOMs left it and the prior weight (_weigh_graph_failures).
    beyond: "Memory | None" = None
    beyond_share: float = 0.0
    # GiB std by which one launch's need differs from another's at the same configuration (the
    # allocator, NCCL's and cuBLAS's workspaces): 0 until failures contradict the starts, then
    # the least of _LAUNCH_NOISE under which they do not (_infer_launch_noise).
    launch_noise: float = 0.0
    margin_is_bound: bool = False  # theta_hi is the least margin a start left, and the reserve is known (_EDGE_ATOM)
    # Graph GiB per _graph_features column for a chain while only trees started (_fit_first_chain).
    first_chain_coef: np.ndarray | None = None

    @property
    def beta(self) -> float:
        return math.sqrt(self.beta_lo * self.beta_hi) if self.beta_lo > 0 else (self.beta_lo + self.beta_hi) / 2

    def kv_tokens(self, mfs, draft, beta: float | None = None) -> np.ndarray:
        rest = self.pre * np.asarray(mfs, dtype=float) - self.fixed
        tokens = self.alpha * rest - (self.beta if beta is None else beta) * self.reserved_drafts(draft)
        return np.floor(np.maximum(tokens, 0.0))

    def running(self, tokens) -> np.ndarray:
        return np.minimum(self.running_cap, np.floor(np.asarray(tokens) * self.running_per_token))

    def pool(self, mfs, draft) -> tuple[np.ndarray, np.ndarray]:
        """(KV tokens, running requests) per candidate, corrected by what the launches of the
        same draft count reported (`pool_anchor`)."""
        if self.hybrid is not None:
            tokens, running, _ = self.hybrid.solve(self.pre * np.asarray(mfs, dtype=float) - self.fixed, draft)
        else:
            tokens = self.kv_tokens(mfs, draft)
            running = self.running(tokens)
        if self.pool_anchor is None:
            return tokens, running
        drafts, r_tokens, r_running = self.pool_anchor
        d = np.asarray(draft, dtype=float) * np.ones_like(np.asarray(tokens, dtype=float))
        tokens = np.floor(tokens * np.exp(np.interp(d, drafts, r_tokens)))
        running = np.minimum(self.running_cap, np.floor(running * np.exp(np.interp(d, drafts, r_running)) + 1e-6))
        return tokens, running

    def start_probability(self, steps, topk, draft, mfs) -> np.ndarray:
        """P(start) of each candidate: its graphs fit what the fraction leaves, and its KV pool is not empty."""
        _, running = self.pool(mfs, draft)
        return self.p_graph(steps, topk, draft, mfs, self.graph_batch(running)) * self.p_kv(mfs, draft)

    def graph_batch(self, running) -> np.ndarray:
        """The largest batch a launch with `running` request slots captures graphs for."""
        running = np.maximum(np.asarray(running, dtype=float), 1.0)
        return running if self.graph_max_bs is None else np.minimum(running, self.graph_max_bs)

    def graphs(self, steps, topk, draft, bs) -> np.ndarray:
        return _graph_features(steps, topk, draft, bs) @ self.graph_coef

    def free(self, mfs) -> np.ndarray:
        """GiB free before the first graph is captured."""
        return self.pre * (1 - np.asarray(mfs, dtype=float)) - self.other

    def graph_range(self, steps, topk, draft, bs) -> tuple[np.ndarray, np.ndarray]:
        """(fit, upper bound) of the graph GiB of each shape at graph batch bs."""
        steps, topk, draft, bs = (np.atleast_1d(np.asarray(v, dtype=float)) for v in (steps, topk, draft, bs))
        lo = fit = np.maximum(self.graphs(steps, topk, draft, bs), 0.0)
        tree = topk > 1
        if self.first_chain_coef is not None:
            # No chain started yet: the trees' graphs scaled to a chain runner by runner
            # (_fit_first_chain), index buffers and all, so a chain may need as little as that
            # / _UNSEEN_TREE (the upper bound's factor for a first tree, the other way round).
            scaled = np.maximum(_graph_features(steps, topk, draft, bs) @ self.first_chain_coef, 0.0)
            fit, lo = np.where(tree, fit, scaled), np.where(tree, lo, scaled / _UNSEEN_TREE)
        rho = np.where(tree, self.rho_tree if self.rho_tree > 0 else self.rho_chain * _UNSEEN_TREE,
                       self.rho_chain if self.rho_chain > 0 else self.rho_tree)
        unseen = tree & np.array([int(k) not in self.tree_topk for k in topk]) & (self.rho_tree > 0)
        hi = np.maximum(fit, self.hi_scale * rho * np.where(unseen, _UNSEEN_TOPK, 1.0) * graph_tokens(steps, topk, draft, bs))
        for i, key in enumerate(zip(steps.astype(int).tolist(), topk.astype(int).tolist(), draft.astype(int).tolist())):
            if key in self.measured:  # a started shape: its own figure, scaled by the graph batch
                bs_m, gib = self.measured[key]
                lo[i] = min(lo[i], gib * bs[i] / bs_m)
                hi[i] = gib * max(bs[i] / bs_m, 1.0)
            elif key in self.floors:  # it failed needing more than the bound: at least that, up to twice
                lo[i] = max(lo[i], self.floors[key])
                hi[i] = max(hi[i], 2 * self.floors[key])
        return lo, hi

    def p_graph(self, steps, topk, draft, mfs, bs) -> np.ndarray:
        """P(the graphs fit): over the weighted (graph, theta) grid, mixed with the one beyond the prior."""
        own = self._p_graph(steps, topk, draft, mfs, bs)
        if self.beyond is None:
            return own
        return (1 - self.beyond_share) * own + self.beyond_share * self.beyond._p_graph(steps, topk, draft, mfs, bs)

    def _p_graph(self, steps, topk, draft, mfs, bs) -> np.ndarray:
        lo, hi = self.graph_range(steps, topk, draft, bs)
        room = self.free(mfs)
        edges = self._theta(np.arange(len(_U_THETA) + 1) / len(_U_THETA))
        w = self.weights / self.weights.sum()
        out = np.zeros(len(lo))
        if self.launch_noise > 0:  # the launch's own draw blurs the edge: a margin smaller than it is no margin
            theta = self._theta(_U_THETA)
            sd = math.hypot(self.launch_noise, (edges[1] - edges[0]) / 2)
        at_margin = np.zeros(len(lo))  # P(the launch leaves at least the least margin a start left)
        for g, u in enumerate(_U_GRAPH):
            left = room - (lo + u * (hi - lo))  # what the reserve may take
            if self.launch_noise > 0:
                out += (w[g][None, :] * norm.cdf((left[:, None] - theta[None, :]) / sd)).sum(axis=1)
            else:
                out += np.interp(left, edges, np.concatenate([[0.0], np.cumsum(w[g])]))
            if self.margin_is_bound:
                at_margin += w[g].sum() * (left >= self.theta_hi - 1e-9)
        if self.margin_is_bound and self.beyond is None:  # a share of the prior at the margin (_EDGE_ATOM)
            out = (1 - _EDGE_ATOM) * out + _EDGE_ATOM * at_margin
        return np.clip(out, 0.0, 1.0)

    def _theta(self, u) -> np.ndarray:
        """The reserve at quantile u of its prior: uniform between the bounds."""
        return self.theta_lo + (self.theta_hi - self.theta_lo) * np.asarray(u)

    def theta_range(self, q: float = 0.1) -> tuple[float, float]:
        """The reserve's q and 1 - q quantiles under the launches' weights (GiB), over both ranges."""
        parts = [(self, 1 - self.beyond_share)] + ([(self.beyond, self.beyond_share)] if self.beyond is not None else [])
        theta = np.concatenate([m._theta(_U_THETA) for m, _ in parts])
        mass = np.concatenate([share * m.weights.sum(axis=0) / m.weights.sum() for m, share in parts])
        order = np.argsort(theta, kind="stable")
        theta, cum = theta[order], np.cumsum(mass[order]) / mass.sum()
        return float(theta[min(np.searchsorted(cum, q), len(theta) - 1)]), float(theta[min(np.searchsorted(cum, 1 - q), len(theta) - 1)])

    def reserved_drafts(self, draft, flatten: float = _FLATTEN[1]) -> np.ndarray:
        """Draft tokens as the reservation counts them: beyond the largest started draft count
        SGLang reserves per slot the pool can still serve (min(max running, slots / ratio) + 1),
        which falls as the drafts eat the pool, so the line may flatten there (by `flatten`);
        a KV failure beyond them says it did not (flatten 1)."""
        draft = np.asarray(draft, dtype=float)
        if not self.flatten or not self.drafts:
            return draft
        top = float(max(self.drafts))
        return np.where(draft > top, top + (draft - top) * flatten, draft)

    def p_kv(self, mfs, draft) -> np.ndarray:
        """P(the pool holds a request): over the per-draft-token reservation's range (and how
        much it flattens beyond the measured drafts)."""
        if self.beta_hi <= self.beta_lo:
            betas = np.array([self.beta_lo])
        elif self.beta_lo > 0:
            betas = self.beta_lo * (self.beta_hi / self.beta_lo) ** _U_KV
        else:
            betas = self.beta_lo + (self.beta_hi - self.beta_lo) * _U_KV
        need = max(2.0, 1.0 / max(self.running_per_token, 1e-12))
        rest = self.pre * np.asarray(mfs, dtype=float) - self.fixed
        if self.hybrid is not None:
            return self.hybrid.p_start(rest, np.asarray(draft, dtype=float))
        out = np.zeros(len(rest))
        for f in _FLATTEN:
            tokens = self.alpha * rest[:, None] - betas[None, :] * self.reserved_drafts(draft, f)[:, None]
            out += (tokens >= need).mean(axis=1) / len(_FLATTEN)
        return out


_U_POOL = (np.arange(24) + 0.5) / 24  # the per-draft-token state's grid, as shares of its largest value
_MAMBA_RATIO = 3  # MAMBA_CACHE_SIZE_MAX_RUNNING_REQUESTS_RATIO: state slots per running request
_MAMBA_SHARE = 0.9 / 1.9  # --mamba-full-memory-ratio 0.9: the state's share r / (1 + r) of the rest


@dataclass
class HybridPool:
    """A hybrid model's pools in SGLang's own form (kv_cache_configurator.py ·
    _handle_max_mamba_cache, resolve_max_num_reqs; docs/sglang-real-server.md row 15): of the
    rest (mfs x pre - weights), the intermediate state r x draft per request slot served
    (min(max running, slots / 3) + 1) is reserved first; the state slots K take share x the
    remainder at s GiB each; KV tokens the rest at `cell` GiB; running requests are capped at
    K // 3.  Fitted from launches whose running requests the state pool capped (their K is
    3 x running); r is known on a grid (its weights: how well one s and one cell explain every
    launch, and every KV failure's having failed)."""

    r: np.ndarray  # GiB per draft token and slot, per grid point
    s: np.ndarray  # GiB per state slot, per grid point
    cell: np.ndarray  # GiB per KV token, per grid point
    weights: np.ndarray
    cap: float

    def solve(self, rest, draft, i: int | None = None):
        """(tokens, running, slots) per candidate, at grid point i (None: the weighted centre)."""
        rest, draft = np.asarray(rest, dtype=float), np.asarray(draft, dtype=float)
        if i is None:
            i = int(np.argmin(np.abs(np.cumsum(self.weights) / self.weights.sum() - 0.5)))
        r, s, cell = self.r[i], self.s[i], self.cell[i]
        k = (rest - r * draft) / (s / _MAMBA_SHARE + r * draft / _MAMBA_RATIO)
        capped = k / _MAMBA_RATIO > self.cap  # the request cap binds first
        k = np.where(capped, (rest - r * draft * (self.cap + 1)) * _MAMBA_SHARE / s, k)
        inter = r * draft * (np.minimum(k / _MAMBA_RATIO, self.cap) + 1)
        tokens = np.floor(np.maximum(((1 - _MAMBA_SHARE) * (rest - inter) - s) / cell, 0.0))
        running = np.minimum(np.minimum(self.cap, tokens // 2), np.floor(np.maximum(k, 0.0)) // _MAMBA_RATIO)
        return tokens, running, k

    def p_start(self, rest, draft) -> np.ndarray:
        w = self.weights / self.weights.sum()
        out = np.zeros(len(np.atleast_1d(rest)))
        for i in np.flatnonzero(w > 1e-9):
            tokens, running, _ = self.solve(rest, draft, i)
            out += w[i] * ((tokens >= 2) & (running >= 1))
        return out


def _fit_hybrid_pool(mem: Memory, ok: list[Launch], failed_kv: list[Launch]) -> HybridPool | None:
    """The pool of a hybrid from its state-capped launches, or None when none was capped."""
    capped = [x for x in ok if 0 < float(x.attrs.get(record.MAX_RUNNING_REQUESTS) or 0) < mem.running_cap
              and float(x.attrs[record.MAX_RUNNING_REQUESTS]) < x.memory["token_capacity"] // 2]
    if not capped:
        return None
    rest = np.array([mem.pre * x.mfs - mem.fixed for x in capped])
    draft = np.array([x.shape.draft for x in capped], dtype=float)
    k = 3.0 * np.array([float(x.attrs[record.MAX_RUNNING_REQUESTS]) for x in capped]) + 1.0
    tokens = np.array([float(x.memory["token_capacity"]) for x in capped])
    slots = draft * (k / _MAMBA_RATIO + 1)
    r = float(np.min(rest / slots)) * _U_POOL  # s >= 0 for every launch
    s_each = _MAMBA_SHARE * (rest[None, :] - r[:, None] * slots[None, :]) / k[None, :]
    s = np.median(s_each, axis=1)
    cell = np.median(((1 - _MAMBA_SHARE) * (rest[None, :] - r[:, None] * slots[None, :]) - s[:, None]) / tokens[None, :], axis=1)
    spread = np.std(s_each, axis=1) / np.maximum(s, 1e-9)
    weights = np.exp(-0.5 * (spread / 0.05) ** 2) if len(capped) > 1 else np.ones(len(r))
    pool = HybridPool(r, np.maximum(s, 1e-9), np.maximum(cell, 1e-12), weights, mem.running_cap)
    for x in failed_kv:  # it failed: keep the grid points under which it would have
        started = np.array([pool.solve([mem.pre * x.mfs - mem.fixed], [x.shape.draft], i)[1][0] >= 1 for i in range(len(r))])
        if (pool.weights * ~started).sum() > 1e-6 * pool.weights.sum():
            pool.weights = pool.weights * ~started
        else:
            return None  # the form does not explain it: the line's bounds take over
    return pool


def _fit_graphs(rows: list[tuple]) -> tuple[np.ndarray, float]:
    a = np.array(rows, dtype=float)
    X = _graph_features(a[:, 0], a[:, 1], a[:, 2], a[:, 3])
    coef, _ = nnls(X, a[:, 4])
    res = X @ coef - a[:, 4]
    return coef, float(np.sqrt(np.mean(res ** 2))) if len(rows) > 1 else 0.0


# The columns of _graph_features each runner's graphs grow with: SGLang sizes a runner's capture
# by max_bs x its tokens per request (spec_utils.resolve_num_tokens_per_req: num_draft_tokens for
# target_verify and draft_extend, topk per draft step for draft_decode), the target's fixed
# buffers on target_verify, FlashInfer's tree buffers on target_verify and draft_decode.
_RUNNER_COLUMNS = {"target_verify": (0, 1, 3), "draft_decode": (2, 4), "draft_extend": (1,)}
# The trees cannot tell the columns every shape has from the tree-only ones and the constant:
# the fit takes the shared ones, so a chain gets the trees' graphs scaled by its tokens.
_TIE_WEIGHT = np.array([0.25, 1.0, 1.0, 0.5, 0.5])


def _fit_first_chain(rows: list[tuple], runners: list[dict]) -> np.ndarray | None:
    """While only trees started: graph GiB per _graph_features column, fitted runner by runner
    on the tokens each captures when every launch named the same runners (`_runner_gib`), on
    the total otherwise, in both cases the columns a chain shares before the tree-only ones.

    Fitted on the total without that preference, the NNLS gives the trees' memory to either,
    and a chain's graphs were anywhere from none to the upper bound.  tp4:51, a drawn four-GPU
    world: from the tree (5, 4, 8) alone (1.23 + 1.62 + 0.58 GiB) the chain (6, 1, 7) was put
    at 0-2.0 GiB, so its first launch went to the fraction where the tree had just failed, at
    P(start) 0.91, and failed; runner by runner it needs 1.4-2.1 GiB.  Only for a first chain:
    scaling a started chain runner by runner to a smaller one drops each runner's fixed part
    (12%-reserve worlds, family:2: 7 of 20 studies failed a third launch, (1, 1, 2) below
    (3, 1, 4))."""
    if not rows or any(r[1] <= 1 for r in rows):
        return None
    a = np.array(rows, dtype=float)
    X = _graph_features(a[:, 0], a[:, 1], a[:, 2], a[:, 3])
    columns, figures = _RUNNER_COLUMNS, runners
    if len({frozenset(r) for r in runners}) != 1 or not runners[0]:  # the total on every column
        columns, figures = {"all": tuple(range(X.shape[1]))}, [{"all": r[4]} for r in rows]
    coef = np.zeros(X.shape[1])
    for name in figures[0]:
        cols = list(columns[name])
        w = _TIE_WEIGHT[cols]
        c, _ = nnls(X[:, cols] * w, np.array([f[name] for f in figures], dtype=float))
        coef[cols] += c * w
    return coef


def _runner_gib(x: Launch, usage: dict) -> dict:
    """A started launch's graph GiB by runner of _RUNNER_COLUMNS, or {} if it does not say:
    memory_usage.graph (0.5.23), else the capture log's per-runner "mem usage" (0.5.9 reports
    one figure but logs the target's graphs, a speculative launch's verify, the draft's and the
    draft extend's apart)."""
    graph = usage.get("graph")
    if isinstance(graph, dict) and graph and set(graph) <= _RUNNER_COLUMNS.keys():
        return dict(graph)
    runners = (x.attrs.get(record.CAPTURE_MEMORY) or {}).get("runners") or {}
    out = {("target_verify" if name == "target" else name): r.get("usage") for name, r in runners.items()}
    return out if out and set(out) <= _RUNNER_COLUMNS.keys() and None not in out.values() else {}


def _graph_gib(usage: dict) -> float:
    """GiB of all CUDA graphs: 0.5.23 reports {runner: GiB}, 0.5.9 one figure."""
    graph = usage.get("graph") or {}
    return float(sum(graph.values())) if isinstance(graph, dict) else float(graph)


def _is_hybrid(ok: list[Launch]) -> bool:
    arch = " ".join(str(x.attrs.get(record.ARCHITECTURE) or "") for x in ok)
    return any(name.lower() in arch.lower() for name in _HYBRID_ARCHS)


def _fit_kv(mem: Memory, ok: list[Launch], failed_kv: list[Launch], hybrid: bool) -> None:
    """alpha and the bounds of beta (Memory's KV line), from the started launches' token
    capacity; every KV failure raises beta's lower bound to what it must have been."""
    rest = np.array([mem.pre * x.mfs - mem.fixed for x in ok])
    drafts = np.array([x.shape.draft for x in ok], dtype=float)
    tokens = np.array([float(x.memory["token_capacity"]) for x in ok])
    if len(ok) >= 2 and (np.ptp(drafts) > 0 or np.ptp(rest) > 1e-6):
        (alpha, beta), _ = nnls(np.stack([rest, -drafts], axis=1), tokens)
    else:
        alpha, beta = float(np.median(tokens / np.maximum(rest, 1e-9))), 0.0
    mem.alpha = float(alpha)
    if np.ptp(drafts) > 0:  # two draft counts: the line's slope in drafts is measured
        mem.beta_lo, mem.beta_hi = 0.85 * beta, 1.15 * beta + 1e-9
    elif hybrid:  # one draft count: up to the reservation that would leave the launches a quarter of their pool
        mem.beta_lo, mem.beta_hi = 0.0, max(2 * beta, float(np.min(0.75 * alpha * rest / drafts)))
    else:
        mem.beta_lo, mem.beta_hi = 0.0, 2 * beta
    need = max(2.0, 1.0 / max(mem.running_per_token, 1e-12))
    mem.flatten = not any(x.shape.draft > max(mem.drafts) for x in failed_kv)
    for x in failed_kv:
        at_least = (mem.alpha * (mem.pre * x.mfs - mem.fixed) - need) / max(x.shape.draft, 1)
        if at_least > mem.beta_lo:
            mem.beta_lo = at_least
        if mem.beta_lo >= mem.beta_hi:  # the line did not foresee it: the data no longer bound beta
            mem.beta_hi = _KV_DECADE * mem.beta_lo
    for x in ok:  # a started launch bounds it from above (it held a request at its draft count)
        mem.beta_hi = max(min(mem.beta_hi, (mem.alpha * (mem.pre * x.mfs - mem.fixed) - need) / max(x.shape.draft, 1)), mem.beta_lo)


def _fit_memory(ls: list[Launch]) -> Memory | None:
    ok = [x for x in ls if x.state == "ok" and x.memory and x.memory.get("kvcache") and x.memory.get("token_capacity")]
    if not ok:
        return None
    mu = [x.memory for x in ok]
    # The static pool is mfs x pre-load memory: weights, then the KV pool (for hybrids also the
    # recurrent state of each request slot and its per-draft-token intermediate state).
    pre = float(np.median([(m.get("weight", 0.0) + m["kvcache"]) / x.mfs for m, x in zip(mu, ok)]))
    fixed = float(np.median([pre * x.mfs - m["kvcache"] for m, x in zip(mu, ok)]))
    running = [float(x.attrs.get(record.MAX_RUNNING_REQUESTS) or 0) for x in ok]
    # The declared --max-running-requests (48 under speculation); below it the pool decides
    # (tokens // 2, or a hybrid model's state slots, which grow with the pool like its tokens).
    declared = [float(x.attrs.get(record.DECLARED_MAX_RUNNING) or 0) for x in ok]
    cap = max(declared) if all(declared) else max(running)
    capped = [run / m["token_capacity"] for run, m in zip(running, mu) if run < cap]
    slots = float(np.median(capped)) if capped else 1e9
    rows = [(x.shape.steps, x.shape.topk, x.shape.draft, _graph_bs(x, run), _graph_gib(m)) for x, m, run in zip(ok, mu, running)]
    coef, spread = _fit_graphs(rows)
    # What the slack holds besides the graphs (activations), from what was left after capture;
    # a server that does not say (0.5.9) leaves it at 0: the edge is then learned from failures.
    others = [pre * (1 - x.mfs) - g[4] - m["startup_available"] for x, m, g in zip(ok, mu, rows) if m.get("startup_available") is not None]
    other = float(np.median(others)) if others else 0.0
    left = [m["startup_available"] if m.get("startup_available") is not None else pre * (1 - x.mfs) - other - g[4]
            for x, m, g in zip(ok, mu, rows)]
    gpus = _gpus_per_rank(ok)
    comm = _COMM_GIB_PER_GPU * gpus if gpus > 1 else 0.0
    theta_hi = max(min(_THETA_MAX * pre + comm, min(left)), 0.05)
    mem = Memory(pre, fixed, 0.0, 0.0, 0.0, cap, slots, coef, other, theta_hi, min(_THETA_MIN * pre, 0.5 * theta_hi),
                 spread + 0.05, {x.shape.topk for x in ok}, {})
    mem.theta_data = max(min(left), theta_hi)
    mem.first_chain_coef = _fit_first_chain(rows, [_runner_gib(x, m) for x, m in zip(ok, mu)])
    # The least margin bounds the reserve (not the prior's 10%), and the reserve is known (_EDGE_ATOM):
    # uniform up to theta_hi its 10-90% range is 0.8 theta_hi (the prior's range; the sampler reads the posterior's).
    mem.margin_is_bound = min(left) <= _THETA_MAX * pre + comm and 0.8 * theta_hi <= _RESERVE_KNOWN * pre
    mem.drafts = tuple(sorted({x.shape.draft for x in ok}))
    # The setting as /server_info reports it (record.memory_usage keeps it).  Not the capture
    # log's largest batch: below the setting SGLang captures the schedule's sizes up to the
    # request slots (22 of 23, say), which is no cap on a larger pool (read as one, qwen-demo's
    # replayed studies failed 1.05 launches in 10 instead of 0.05).
    setting = [float(m["cuda_graph_max_bs"]) for m in mu if m.get("cuda_graph_max_bs")]
    mem.graph_max_bs = max(setting) if setting else None
    for x, r in zip(ok, rows):
        mem.max_draft[x.shape.topk] = max(mem.max_draft.get(x.shape.topk, 0), x.shape.draft)
        per_token = r[4] / max(float(graph_tokens(*r[:4])), 1.0)
        if x.shape.tree:
            mem.rho_tree = max(mem.rho_tree, per_token)
            mem.tree_topk.add(x.shape.topk)
        else:
            mem.rho_chain = max(mem.rho_chain, per_token)
        mem.measured[(x.shape.steps, x.shape.topk, x.shape.draft)] = (r[3], r[4])
    _fit_kv(mem, ok, [x for x in ls if x.state == "memory_kv"], _is_hybrid(ok))
    if _is_hybrid(ok):
        mem.hybrid = _fit_hybrid_pool(mem, ok, [x for x in ls if x.state == "memory_kv"])
    mem.pool_anchor = pool_anchor(mem, ok)
    _weigh_graph_failures(mem, [x for x in ls if x.state in _MEM_FAILURES])
    return mem


def _gpus_per_rank(ok: list[Launch]) -> int:
    """GPUs one DP rank spans (tp x pp): the record's gpu_count over its DP ranks; 1 unknown."""
    for x in ok:
        gpus = x.attrs.get(record.GPU_COUNT)
        if gpus:
            return max(int(gpus) // max(len(x.attrs.get(record.DP_RANKS) or ()), 1), 1)
    return 1


def pool_anchor(mem: Memory, ok: list[Launch]) -> tuple | None:
    """Per started draft count, the mean log ratio of the KV tokens and running requests the
    server reported to what the fitted form says at the same fraction; interpolated in draft
    count between them (the nearest one's beyond).  The form is SGLang's, but its constants are
    fitted over every launch, and one request of capacity is a step of the front: a shape's
    other fractions are predicted from its own pool, as its throughputs are from its own
    measurement (Model.anchors).  Example, qwen-demo: the hybrid form said 595k tokens and 34
    running where (1, 1, 2) at 0.93 reported 620k and 35, so 0.94 looked like no gain."""
    rows: dict[int, list[tuple[float, float]]] = {}
    for x in ok:
        tokens, running = float(x.memory["token_capacity"]), float(x.attrs.get(record.MAX_RUNNING_REQUESTS) or 0)
        t_pred, r_pred = (float(v[0]) for v in mem.pool([x.mfs], [x.shape.draft]))
        if tokens > 0 and t_pred > 0:
            r = math.log(running / r_pred) if running > 0 and r_pred > 0 else 0.0
            rows.setdefault(x.shape.draft, []).append((math.log(tokens / t_pred), r))
    if not rows:
        return None
    drafts = sorted(rows)
    return (np.array(drafts, dtype=float), np.array([np.mean([a for a, _ in rows[d]]) for d in drafts]),
            np.array([np.mean([b for _, b in rows[d]]) for d in drafts]))


def _graph_bs(x: Launch, running: float) -> float:
    """The largest graph batch a launch captured: its running-request cap, or the capture's own
    cuda_graph_max_bs when the server said."""
    said = (x.memory or {}).get("cuda_graph_max_bs") or (x.attrs.get(record.CAPTURE_MEMORY) or {}).get("cuda_graph_max_bs")
    return float(min(running, said)) if said else float(max(running, 1))


def _weigh_graph_failures(mem: Memory, failed: list[Launch]) -> None:
    """Keep the (graph, theta) combinations under which every graph OOM would have failed: a
    failure needed more than what was free (the capture log's figure when it has one).

    The reserve's prior range (up to 10% of the memory) is a prior, not a bound: the starts
    allow up to theta_data.  Once a graph OOM is seen, the failures are also weighed under a
    reserve beyond the prior (between its 10% and theta_data, no graph floors; Memory.beyond),
    and the two are mixed by their posterior odds: beyond the prior starts at odds
    _BEYOND_PRIOR, and a graph floor, an explanation the bounds did not foresee, costs the same.
    Keeping only the likelier of the two said what the model did not know: a failure in the
    prior's last 9% (family:7 with a 12% reserve: (3, 1, 4) failed at 0.88 with 7.75 GiB free,
    its graphs 0.62 GiB) left the prior ahead, and the chain inside it, (2, 1, 3) at 0.87, was
    predicted at P(start) 1.00 and failed; mixed, beyond the prior holds 37% and P is 0.66.
    Before the wider range existed, the failures sat in the prior's corner or were set aside,
    and P went back to 0.95-1.00: 6-8 failed launches in 10, four in a row on chains inside the
    one started (`benchmarks/sampler_benchmark.py --capture-reserve 0.12`)."""
    _infer_launch_noise(mem, failed)
    mem.weights, floors = _failure_weights(mem, failed)
    if failed and mem.theta_data > mem.theta_hi:
        beyond = replace(mem, theta_lo=mem.theta_hi, theta_hi=mem.theta_data, floors={}, hi_scale=1.0, beyond=None,
                         margin_is_bound=False)
        beyond.weights, beyond_floors = _failure_weights(beyond, failed)
        odds_prior = (1 - _BEYOND_PRIOR) * mem.weights.mean() * _BEYOND_PRIOR ** floors
        odds_beyond = _BEYOND_PRIOR * beyond.weights.mean() * _BEYOND_PRIOR ** beyond_floors
        share = odds_beyond / (odds_beyond + odds_prior) if odds_beyond > 0 else 0.0
        if share >= 1 - 1e-9:  # the prior's range cannot explain them at all
            mem.theta_lo, mem.theta_hi, mem.floors, mem.hi_scale, mem.weights = (
                beyond.theta_lo, beyond.theta_hi, beyond.floors, beyond.hi_scale, beyond.weights)
        elif share > 1e-3:
            mem.beyond, mem.beyond_share = beyond, share
    if mem.weights.sum() < 1e-6:  # the failures contradict the bounds: forget them rather than divide by zero
        mem.weights = np.ones_like(mem.weights)


def _infer_launch_noise(mem: Memory, failed: list[Launch]) -> None:
    """The least launch-to-launch variation (_LAUNCH_NOISE) under which every graph OOM has a
    (graph, reserve) combination that explains it with the starts; 0 when none is needed.

    A deterministic server never contradicts itself, but a real one does: (5, 1, 6) at 0.88
    failing after (6, 1, 7), larger in every graph term, started at 0.88.  Read as exact, the
    failures left no weight and were set aside, so the next launches were predicted at
    P(start) 0.91-0.98 on the same thin margins and failed three times in a row (family:0 seed
    12 with `benchmarks/sampler_benchmark.py --memory-jitter 0.3`: 6 failed launches in 20)."""
    mem.launch_noise = 0.0
    # Explained if any reserve the starts allow explains them, beyond the prior's 10% too (that
    # is weighed after this, by its odds).
    widest = replace(mem, floors=dict(mem.floors), theta_hi=max(mem.theta_hi, mem.theta_data))
    if not failed or _failure_weights(widest, failed)[0].max() >= _CONTRADICTION:
        return
    for share in _LAUNCH_NOISE:
        trial = replace(widest, floors=dict(mem.floors), launch_noise=share * mem.pre)
        if _failure_weights(trial, failed)[0].max() >= _CONTRADICTION:
            mem.launch_noise = trial.launch_noise
            return
    mem.launch_noise = _LAUNCH_NOISE[-1] * mem.pre


def _failure_weights(mem: Memory, failed: list[Launch]) -> tuple[np.ndarray, int]:
    """The grid's weights under the failures, and how many graph floors they needed."""
    theta = mem._theta(_U_THETA)
    weights = np.ones((len(_U_GRAPH), len(_U_THETA)))
    spread = math.hypot(mem.spread, mem.launch_noise)
    seen = []
    floors = 0
    for x in failed:
        bs = float(mem.graph_batch(mem.pool([x.mfs], [x.shape.draft])[1])[0])
        free = (x.attrs.get(record.CAPTURE_MEMORY) or {}).get("free_before")
        free = float(free) if free is not None else float(mem.free(x.mfs))
        key = (x.shape.steps, x.shape.topk, x.shape.draft)
        lo, hi = mem.graph_range([key[0]], [key[1]], [key[2]], [bs])
        # Even the largest reserve left the graphs too little: their upper bound was wrong.  Not
        # for a shape inside a started one (no larger in steps, topk and draft: every graph term
        # grows with them), whose graphs that start bounds: there the reserve is.
        inside = any(key[0] <= s and key[1] <= k and key[2] <= d for s, k, d in mem.measured)
        floor = free - mem.theta_hi
        if floor > hi[0] + spread and not inside:  # a started shape is inside itself
            mem.floors[key] = max(mem.floors.get(key, 0.0), floor)
            mem.hi_scale = max(mem.hi_scale, floor / max(hi[0], 1e-6))
            lo, hi = mem.graph_range([key[0]], [key[1]], [key[2]], [bs])
            floors += 1
        seen.append((lo[0], hi[0], free))
    for lo, hi, free in seen:
        need = lo + _U_GRAPH[:, None] * (hi - lo) + theta[None, :]
        weights *= norm.cdf((need - free) / spread)
    return weights, floors


# --- the model ----------------------------------------------------------------------------------


@dataclass
class Prediction:
    """Per candidate (arrays): medians, log-normal spreads, and P(start)."""

    single: np.ndarray
    concurrent: np.ndarray
    capacity: np.ndarray
    accept: np.ndarray
    sd: np.ndarray  # (n, 3): log-space std of the three objectives
    p_start: np.ndarray
    # Objectives of one request class (`single_tps:<class>`, `concurrent_tps:<class>`): name ->
    # (median, log-space std), the mix's figure times the class's fitted ratio (ClassRatio).
    classes: dict[str, tuple[np.ndarray, np.ndarray]] = field(default_factory=dict)
    slo_capacity: tuple[np.ndarray, np.ndarray] | None = None  # (median, log-space std), with a SloFit
    running: np.ndarray | None = None  # the running requests each candidate's pool allows (Memory.pool)

    def columns(self, names: list[str]) -> tuple[np.ndarray, np.ndarray]:
        """(medians, log-space stds), one column per objective name, in the study's order."""
        cols = {**self._own(), **self.classes}
        return np.stack([cols[n][0] for n in names], axis=1), np.stack([cols[n][1] for n in names], axis=1)

    def _own(self) -> dict[str, tuple[np.ndarray, np.ndarray]]:
        own = {"single_tps": (self.single, self.sd[:, 0]), "concurrent_tps": (self.concurrent, self.sd[:, 1]),
               "capacity": (self.capacity, self.sd[:, 2])}
        return own if self.slo_capacity is None else {**own, "slo_capacity": self.slo_capacity}

    def interval(self, i: int, z: float = 1.64) -> dict[str, list[float]]:
        """90% intervals of candidate i, for reports."""
        out = {}
        for name, (mid, spread) in {**self._own(), **self.classes}.items():
            m = float(mid[i])
            # The sampler's sd leaves out the noise an anchored shape shares with its measured
            # point (predict); a launch of it would still see that noise, so a report shows it.
            sd = max(float(spread[i]), REPORT_NOISE)
            lo, hi = m * math.exp(-z * sd), m * math.exp(z * sd)
            # Capacity counts requests: whole numbers, as the server's own figure is.
            out[name] = [math.floor(lo), math.floor(m), math.floor(hi)] if name in ("capacity", "slo_capacity") else [round(lo, 1), round(m, 1), round(hi, 1)]
        out["p_start"] = round(float(self.p_start[i]), 3)
        return out


@dataclass
class Model:
    acceptance: Acceptance
    time: StepTime
    memory: Memory
    level: int
    request_tokens: int
    measured_steps: dict[int, int]  # topk -> deepest steps measured
    fit_error: float  # relative RMS of the throughput fit over the launches
    # Per measured shape: (log measured/predicted single, the same for concurrent, batch measured
    # at).  A shape's throughput does not depend on the fraction except through the batch the
    # pool allows, so another fraction of a measured shape is predicted from its measurement,
    # as precisely as the measurement noise: re-launching it is not exploration.
    anchors: dict = field(default_factory=dict)
    # Data-parallel ranks (DP attention): each rank has its own KV pool and request slots, and
    # a request cannot span ranks.  The launches' running requests are the sum over ranks, their
    # token capacity rank 0's (record.memory_usage), so capacity is ranks x min(running per rank,
    # one rank's tokens // request_tokens), as the tuner measures it (contract: capacity).
    ranks: int = 1
    # Objectives of one request class: name -> its ratio to the mix's figure (ClassRatio).
    classes: dict[str, "ClassRatio"] = field(default_factory=dict)
    slo: "SloFit | None" = None  # slo_capacity, when the study scores it

    def predict(self, steps, topk, draft, mfs, names: list[str] | None = None) -> Prediction:
        """Every candidate's prediction; with `names`, also the class objectives among them."""
        pred = self._predict(steps, topk, draft, mfs)
        if self.slo is not None:
            mid, sd = self.slo.predict(self, steps, topk, draft, pred.running)
            pred.slo_capacity = (mid, np.hypot(sd, pred.sd[:, 2]))
        for name in names or []:
            ratio = self.classes.get(name)
            if ratio is not None:
                mid, sd = pred._own()[ratio.base]
                r, r_sd = ratio.log_ratio(self.acceptance, steps, topk, draft)
                pred.classes[name] = (mid * np.exp(r), np.hypot(sd, r_sd))
        return pred

    def _predict(self, steps, topk, draft, mfs) -> Prediction:
        steps, topk, draft, mfs = (np.atleast_1d(np.asarray(v)) for v in (steps, topk, draft, mfs))
        cache: dict[tuple, float] = {}
        for key in zip(steps.tolist(), topk.tolist(), draft.tolist()):
            if key not in cache:
                cache[key] = self.acceptance.accept(Shape(int(key[0]), int(key[1]), int(key[2])))
        accept = np.array([cache[key] for key in zip(steps.tolist(), topk.tolist(), draft.tolist())])
        m = self.memory
        tokens, running = m.pool(mfs, draft)
        batch = np.maximum(np.minimum(self.level, running), 1)
        t1 = self.time.ms(steps, topk, draft, np.ones_like(batch), accept, 0)
        tb = self.time.ms(steps, topk, draft, batch, accept, 1)
        single = accept / np.maximum(t1, 1e-3) * 1000
        concurrent = batch * accept / np.maximum(tb, 1e-3) * 1000
        capacity = np.minimum(running, np.floor(tokens / self.request_tokens))
        if self.ranks > 1:
            capacity = self.ranks * np.minimum(np.floor(running / self.ranks + 1e-9), np.floor(tokens / self.request_tokens))
        novelty = self._novelty(steps, topk, draft)
        # A throughput fit that misses its own launches is as unsure elsewhere (a MoE whose
        # verify cost the features do not hold, say): its error widens every interval.
        base = math.hypot(self.acceptance.spread, self.time.spread, self.fit_error) + 0.02
        sd_single = base + 0.15 * novelty
        # Beyond the measured verify tokens the truth lies between the fit and the physical bound
        # (StepTime.ms_bound): the median between them, the spread covering both.
        slow = batch * accept / np.maximum(self.time.ms_bound(steps, topk, draft, batch, accept, 1), 1e-3) * 1000
        unknown = 0.5 * np.log(np.maximum(concurrent, 1e-9) / np.maximum(slow, 1e-9))
        concurrent = concurrent * np.exp(-unknown)
        # Below the fewest verify tokens under load the truth lies between the fit and the fit
        # that lays the load's cost on the tokens (StepTime.below): the median between, as above.
        if self.time.below is not None:
            fast = batch * accept / np.maximum(self.time.below.ms(steps, topk, draft, batch, accept, 1), 1e-3) * 1000
            fewer = batch * draft < self.time.min_tokens
            beneath = np.where(fewer, 0.5 * np.log(np.maximum(fast, 1e-9) / np.maximum(concurrent, 1e-9)), 0.0)
            concurrent = concurrent * np.exp(beneath)
            unknown = np.hypot(unknown, beneath)
        sd_concurrent = np.hypot(sd_single, unknown)
        for i, key in enumerate(zip(steps.tolist(), topk.tolist(), draft.tolist())):
            anchor = self.anchors.get(Shape(int(key[0]), int(key[1]), int(key[2])))
            if anchor is None:
                continue
            r_single, r_concurrent, batch_measured = anchor
            single[i] *= math.exp(r_single)
            # The measurement's own noise is not something to explore: a draw of it is shared
            # with the measured point already on the front (noisy EHVI's correlation), so only
            # what the fraction changes (the batch the pool allows) is uncertain.
            sd_single[i] = _SAME
            if r_concurrent is not None:
                concurrent[i] *= math.exp(r_concurrent)
                sd_concurrent[i] = _SAME + 0.5 * abs(math.log(batch[i] / batch_measured))
        sd = np.stack([sd_single, sd_concurrent, 0.01 + 0.02 * novelty + self._kv_novelty(draft, mfs)], axis=1)
        # A shape unlike any launched may need graph memory no launch has shown: between the
        # fit and the upper bound that scales the most memory per graph token seen (Memory).
        p_start = m.start_probability(steps, topk, draft, mfs)
        return Prediction(single, concurrent, capacity, accept, sd, p_start, running=running)

    def _kv_novelty(self, draft, mfs) -> np.ndarray:
        """Capacity's doubt from the per-draft-token reservation's range (hybrid models): none
        once two draft counts fixed the line, most far from the measured count."""
        m = self.memory
        if m.hybrid is not None:  # the spread of the pool's grid, weighted
            h, rest = m.hybrid, m.pre * np.asarray(mfs, dtype=float) - m.fixed
            keep = np.flatnonzero(h.weights > 1e-6 * h.weights.sum())
            grid = np.array([h.solve(rest, draft, i)[0] for i in keep])
            return np.minimum(1.0, np.std(grid, axis=0) / np.maximum(grid.mean(axis=0), 1.0))
        tokens = np.maximum(m.kv_tokens(mfs, draft), 1.0)
        # The reservation's range moves KV tokens by what it takes per draft token *beyond* the
        # draft counts launched: at a launched one the pool at any fraction follows from its
        # launches (pool_anchor).  Counted from zero, a chain launched only at 4 draft tokens had a
        # capacity spread of 0.48 at its own shape (family:35, 8-9 requests), and the reserve
        # probes climbed it five times for one request.
        draft = np.asarray(draft, dtype=float)
        beyond = np.min(np.abs(draft[..., None] - np.asarray(m.drafts, dtype=float)), axis=-1) if m.drafts else draft
        return np.minimum(1.0, 0.5 * (m.beta_hi - m.beta_lo) * beyond / tokens)

    def _novelty(self, steps, topk, draft) -> np.ndarray:
        """0 for shapes like measured ones; up to 1 for an unseen topk or far extrapolation."""
        shapes = list(zip(np.asarray(steps).astype(int).tolist(), np.asarray(topk).astype(int).tolist(),
                          np.asarray(draft).astype(int).tolist()))
        per_shape = {key: self._shape_novelty(*key) for key in set(shapes)}  # candidates repeat a shape per fraction
        return np.array([per_shape[key] for key in shapes], dtype=float)

    def _shape_novelty(self, s: int, k: int, d: int) -> float:
        if k not in self.measured_steps and 1 in self.measured_steps and self._verifies_chain(s, k, d):
            k = 1  # its acceptance is the chain's whatever the siblings take: as sure as the chain
        if k not in self.measured_steps:
            # Another tree width measured fixed the rank law's share: only this width's own
            # calibration is unknown.
            return 0.5 if any(x > 1 for x in self.measured_steps) else 1.0
        deeper = max(0, s - self.measured_steps[k])
        # A chain's draft tokens are its steps + 1: its extra draft tokens are its extra depth,
        # counted once (both doubled a deeper chain's spread, and family:2 spent launches on
        # (8, 1, 9) for it).  23 landscapes x 20 seeds, HV at 10 97.45 -> 97.50%, family:2
        # 94.96 -> 95.60%, qwen-demo 95.49 -> 95.00%; held out 97.70 -> 97.72% (one GPU) and
        # 97.73 -> 97.69% with 1.06 -> 1.04 failed launches a study (four GPUs).
        wider = 0.0 if k == 1 else max(0, d - self.memory.max_draft.get(k, d)) / max(d, 1)
        return min(1.0, 0.15 * deeper + wider)

    def _verifies_chain(self, steps, topk, draft) -> bool:
        """Whether EAGLE's draft - 1 most probable nodes of this tree are the chain's whatever
        share of the residual probability the siblings take: the chain's deepest verified node
        is more probable than any sibling could be (one taking all of 1 - c at its depth, the
        most `tree_reach` allows).  Then an unseen topk cannot change the acceptance, only the
        draft's cost, which the step-time fit extrapolates.  qwen-demo, 20 seeds: 2-3 of 10
        launches went to such trees ((2, 2, 3), (3, 4, 4), (5, 2, 6), (5, 4, 6)) for the unseen
        topk's spread, each as fast as its chain or slower."""
        n = int(draft) - 1
        if topk <= 1 or n < 1 or n > int(steps):
            return topk <= 1
        c = np.asarray(_chain_rates(self.acceptance.rates, int(steps))[:n], dtype=float)
        reach = np.cumprod(c)  # the chain's nodes, depth 1 .. n
        sibling = np.concatenate([[1.0], reach[:-1]]) * (1 - c)  # the best sibling per depth
        return bool(reach[-1] > sibling.max())


def _level_of(x: Launch) -> int | None:
    levels = x.attrs.get(record.CONCURRENT_TPS_BY_LEVEL) or {}
    return int(next(iter(levels))) if levels else None


def fit(trials: list[FrozenTrial], metric_names: list[str] | None) -> tuple[Model | None, str]:
    """The model, or None and why it cannot be fitted yet."""
    ls = [x for x in launches(trials, metric_names) if not x.running]
    ok = [x for x in ls if x.state == "ok"]
    if not ok:
        return None, "no launch has completed yet"
    memory = _fit_memory(ls)
    if memory is None:
        return None, "the server reports no memory_usage (internal_states): cannot predict KV tokens or graph memory"
    levels = [lv for lv in map(_level_of, ok) if lv]
    time = _fit_time(ls, _level_of)
    if time is None or not levels:
        return None, "too few throughput measurements to fit step times"
    rt = next((x.attrs.get(record.REQUEST_TOKENS) for x in ok if x.attrs.get(record.REQUEST_TOKENS)), None)
    if rt is None:
        return None, "the trials do not record request_tokens"
    measured: dict[int, int] = {}
    for x in ok:
        measured[x.shape.topk] = max(measured.get(x.shape.topk, 0), x.shape.steps)
    model = Model(_fit_acceptance(ls), time, memory, max(set(levels), key=levels.count), int(rt), measured, 0.0)
    model.ranks = max((len(x.attrs.get(record.DP_RANKS) or ()) for x in ok), default=1) or 1
    model.fit_error = _fit_error(model, ok)
    model.anchors = _anchors(model, ok)
    for name in metric_names or []:
        if class_base(name) is not None:
            ratio = _fit_class_ratio(model, ok, name)
            if ratio is None:
                return None, f"no launch measured both {name} and {class_base(name)}"
            model.classes[name] = ratio
    if "slo_capacity" in (metric_names or []):
        model.slo = _fit_slo(model, ok)
        if model.slo is None:
            return None, "no ITL promise of a closed loop measured: slo_capacity is not predicted"
    return model, "fitted on %d launches" % len(ls)


def fit_memory(trials: list[FrozenTrial]) -> Memory | None:
    """The memory model alone, which needs no throughput: for a study whose objectives the
    model does not predict (accept_length; slo_capacity under TTFT promises alone) or that sets
    SLO constraints.  None before a launch started or when the server reports no memory_usage."""
    return _fit_memory([x for x in launches(trials, None) if not x.running])


def _anchors(model: Model, ok: list[Launch]) -> dict:
    """Per measured shape, the mean log ratio of measured to predicted throughputs (model.anchors);
    None for concurrent_tps where no launch of it measured one.  Why not only launches with both:
    a study of single_tps alone then had no anchor, and re-launched a measured tree one fraction
    up for a draw of its own noise ((6, 2, 13) 0.82 -> 0.83 on the demo, its fifth launch of five)."""
    p = model.predict([x.shape.steps for x in ok], [x.shape.topk for x in ok], [x.shape.draft for x in ok], [x.mfs for x in ok])
    batch = np.maximum(np.minimum(model.level, model.memory.pool([x.mfs for x in ok], [x.shape.draft for x in ok])[1]), 1)
    by_shape: dict[Shape, list] = {}
    for i, x in enumerate(ok):
        if x.values.get("single_tps"):  # a study of single_tps alone measures no concurrent_tps: None
            conc = x.values.get("concurrent_tps")
            by_shape.setdefault(x.shape, []).append((math.log(x.values["single_tps"] / p.single[i]),
                                                     math.log(conc / p.concurrent[i]) if conc else None, float(batch[i])))
    out = {}
    for shape, rows in by_shape.items():
        conc = [r[1] for r in rows if r[1] is not None]
        out[shape] = (float(np.mean([r[0] for r in rows])), float(np.mean(conc)) if conc else None, float(np.median([r[2] for r in rows])))
    return out


def _fit_error(model: Model, ok: list[Launch]) -> float:
    """Relative RMS error of the throughput predictions at the launches themselves."""
    p = model.predict([x.shape.steps for x in ok], [x.shape.topk for x in ok], [x.shape.draft for x in ok], [x.mfs for x in ok])
    errs = []
    for i, x in enumerate(ok):
        for name, pred in (("single_tps", p.single), ("concurrent_tps", p.concurrent)):
            if x.values.get(name):
                errs.append(math.log(pred[i] / x.values[name]))
    return float(np.sqrt(np.mean(np.square(errs)))) if errs else 0.0


# --- objectives of one request class ------------------------------------------------------------


def class_base(name: str) -> str | None:
    """The mix's figure a class objective is a share of: `single_tps:<class>` -> single_tps,
    `concurrent_tps:<class>` -> concurrent_tps; None for any other name (at a level, `@`, the
    batch is not the one the model predicts)."""
    base, level, request_class = split_name(name)
    return base if request_class and not level and base in ("single_tps", "concurrent_tps") else None


# Prior std of the weights of log(class / mix): the intercept (a class 2.7x faster or slower is
# within one sd), the slopes in log accept length and in draft tokens / 8.
_CLASS_PRIOR = np.array([1.0, 0.5, 0.5])
_CLASS_NOISE = 0.05  # log-space std of one launch's ratio: a class's few requests, and the mix's


def _class_features(acceptance: Acceptance, steps, topk, draft) -> np.ndarray:
    steps, topk, draft = (np.atleast_1d(np.asarray(v)).astype(int) for v in (steps, topk, draft))
    accept = {k: acceptance.accept(Shape(*k)) for k in set(zip(steps.tolist(), topk.tolist(), draft.tolist()))}
    log_accept = np.log([accept[k] for k in zip(steps.tolist(), topk.tolist(), draft.tolist())])
    return np.stack([np.ones(len(steps)), log_accept, draft / 8.0], axis=1)


@dataclass
class ClassRatio:
    """A request class's figure over the mix's, log(class / mix), as a line in a shape's features:
    an intercept (the class is faster or slower everywhere), a slope in log accept length (a
    category whose drafts are easier gains more on deep shapes: `Acceptance.category_shifts` in
    the emulator), a slope in draft tokens (long context costs a wide verify more attention, and
    shrinks a wide tree's gain first).  Bayesian linear regression with a prior on each weight:
    one launch moves the intercept only, launches of other shapes pin the slopes, and the
    posterior's spread is the doubt at an unlaunched shape.  Why numpy's closed form and not a
    library: three weights and a fixed prior (scikit-learn's BayesianRidge would also be a new
    dependency, and it estimates the prior from a handful of points).  A launched shape is
    predicted from its own measured ratio (as Model.anchors)."""

    base: str  # "single_tps" | "concurrent_tps"
    mean: np.ndarray
    cov: np.ndarray
    anchors: dict  # Shape -> mean measured log ratio

    def log_ratio(self, acceptance: Acceptance, steps, topk, draft) -> tuple[np.ndarray, np.ndarray]:
        phi = _class_features(acceptance, steps, topk, draft)
        mid = phi @ self.mean
        sd = np.sqrt(np.maximum(np.einsum("ij,jk,ik->i", phi, self.cov, phi), 0.0))
        for i, key in enumerate(zip(*(np.atleast_1d(np.asarray(v)).astype(int).tolist() for v in (steps, topk, draft)))):
            anchor = self.anchors.get(Shape(*key))
            if anchor is not None:
                mid[i], sd[i] = anchor, _SAME
        return mid, sd


def _fit_class_ratio(model: Model, ok: list[Launch], name: str) -> ClassRatio | None:
    base = class_base(name)
    rows = [x for x in ok if (x.values.get(name) or 0) > 0 and (x.values.get(base) or 0) > 0]
    if not rows:
        return None
    r = np.array([math.log(x.values[name] / x.values[base]) for x in rows])
    phi = _class_features(model.acceptance, [x.shape.steps for x in rows], [x.shape.topk for x in rows], [x.shape.draft for x in rows])
    precision = phi.T @ phi / _CLASS_NOISE**2 + np.diag(1 / _CLASS_PRIOR**2)
    cov = np.linalg.inv(precision)
    mean = cov @ phi.T @ r / _CLASS_NOISE**2
    anchors: dict[Shape, list[float]] = {}
    for x, value in zip(rows, r):
        anchors.setdefault(x.shape, []).append(float(value))
    return ClassRatio(base, mean, cov, {shape: float(np.mean(v)) for shape, v in anchors.items()})


# --- the load a configuration holds within its SLO ----------------------------------------------

# Prior std of the weights of log(measured ITL percentile / the step time's mean per-token ITL):
# the intercept (a p95 is 1-3x the mean: a step that accepts one token puts its whole time on
# it), slopes in log accept length, in draft tokens / 8, and in log load / log 16 (under load the
# prefills of replacing requests stretch some steps more than the mean).
_SLO_PRIOR = np.array([1.0, 0.5, 0.5, 0.5])
_SLO_NOISE = 0.1  # log-space std of one load point's percentile: 20-100 judged requests
_SLO_MAX_LOAD = 1024  # loads evaluated per shape; a pool's running requests rarely reach it


def _slo_features(acceptance: Acceptance, steps, topk, draft, load) -> np.ndarray:
    load = np.maximum(np.atleast_1d(np.asarray(load, dtype=float)), 1.0)
    return np.concatenate([_class_features(acceptance, steps, topk, draft), (np.log(load) / math.log(16))[:, None]], axis=1)


@dataclass
class SloFit:
    """`slo_capacity` (closed loop: the most requests in flight within every ITL promise) as
    the model sees it: at a load c the percentile an ITL promise names is the step time's mean
    per-token ITL (StepTime.ms at batch c over the accept length) times a ratio fitted as a line
    in the shape and the load (Bayesian linear regression, as ClassRatio) on every load point
    the launches' searches measured (record.SLO_CURVE); the shape holds up to the last load
    whose predicted percentiles are all within their promises, and never beyond the running
    requests its pool allows (the search stops at the server's cap).  TTFT promises and the
    goodput attainment are not modelled: a launched shape is predicted from its own measured
    slo_capacity over the model's (`anchors`), so what they cost it is kept.  Why: a study of
    slo_capacity went to TPE's start-up draws (six of its first ten launches), with the
    memory model only choosing the fraction."""

    promises: dict[str, float]  # "p95_itl_ms" -> limit, the ITL promises of [slo]
    weights: dict[str, tuple[np.ndarray, np.ndarray]]  # promise -> (mean, cov) of its ratio's weights
    anchors: dict = field(default_factory=dict)  # Shape -> mean log(measured / predicted slo_capacity)

    def loads(self, model: "Model", shape: Shape, z: float = 0.0) -> int:
        """The most requests in flight `shape` holds within every promise, `z` sds of the
        ratio (and the step time's spread) above its median; 0 when one request breaks one."""
        load = np.arange(1, _SLO_MAX_LOAD + 1, dtype=float)
        n = len(load)
        s, k, d = (np.full(n, v) for v in (shape.steps, shape.topk, shape.draft))
        accept = model.acceptance.accept(shape)
        itl = model.time.ms(s, k, d, load, np.full(n, accept), (load > 1).astype(float)) / accept
        phi = _slo_features(model.acceptance, s, k, d, load)
        holds = np.ones(n, dtype=bool)
        for key, limit in self.promises.items():
            mean, cov = self.weights[key]
            sd = np.hypot(np.sqrt(np.maximum(np.einsum("ij,jk,ik->i", phi, cov, phi), 0.0)), model.time.spread)
            holds &= np.log(np.maximum(itl, 1e-6)) + phi @ mean + z * sd <= math.log(limit)
        return int(np.argmin(holds)) if not holds.all() else n

    def predict(self, model: "Model", steps, topk, draft, running) -> tuple[np.ndarray, np.ndarray]:
        """(median, log-space std) of slo_capacity per candidate with `running` request slots."""
        shapes = [Shape(int(a), int(b), int(c)) for a, b, c in zip(np.atleast_1d(steps), np.atleast_1d(topk), np.atleast_1d(draft))]
        cache = {sh: (self.loads(model, sh), self.loads(model, sh, 1.0), self.loads(model, sh, -1.0)) for sh in set(shapes)}
        mid, lo, hi = (np.array([cache[sh][j] for sh in shapes], dtype=float) for j in range(3))
        running = np.maximum(np.asarray(running, dtype=float), 1.0)
        factor = np.exp([self.anchors.get(sh, 0.0) for sh in shapes])
        mid, lo, hi = (np.floor(np.minimum(v, running) * factor + 1e-6) for v in (mid, lo, hi))
        sd = 0.5 * np.log(np.maximum(hi, 1.0) / np.maximum(lo, 1.0))
        return mid, sd


def _fit_slo(model: Model, ok: list[Launch]) -> SloFit | None:
    promise = next((x.attrs.get(record.SLO_PROMISE) for x in ok if x.attrs.get(record.SLO_PROMISE)), None) or {}
    itl = {k: float(v) for k, v in promise.items() if k.endswith("_itl_ms") and v}
    if not itl or promise.get("arrival", "closed") != "closed":
        return None  # a rate (Poisson arrivals) or TTFT alone: nothing the step time says
    weights = {}
    for key in itl:
        rows = [(x, p) for x in ok for p in (x.attrs.get(record.SLO_CURVE) or []) if (p.get(key) or 0) > 0 and p.get("load")]
        if not rows:
            return None
        steps, topk, draft = ([getattr(x.shape, f) for x, _ in rows] for f in ("steps", "topk", "draft"))
        load = np.array([float(p["load"]) for _, p in rows])
        running = np.array([float(x.attrs.get(record.MAX_RUNNING_REQUESTS) or p["load"]) for x, p in rows])
        accept = np.array([model.acceptance.accept(x.shape) for x, _ in rows])
        batch = np.minimum(load, running)
        mean_itl = model.time.ms(steps, topk, draft, batch, accept, (load > 1).astype(float)) / accept
        r = np.log([p[key] for _, p in rows]) - np.log(np.maximum(mean_itl, 1e-6))
        phi = _slo_features(model.acceptance, steps, topk, draft, load)
        cov = np.linalg.inv(phi.T @ phi / _SLO_NOISE**2 + np.diag(1 / _SLO_PRIOR**2))
        weights[key] = (cov @ phi.T @ r / _SLO_NOISE**2, cov)
    fit = SloFit(itl, weights)
    measured = [x for x in ok if x.values.get("slo_capacity") is not None]
    if measured:
        _, running = model.memory.pool([x.mfs for x in measured], [x.shape.draft for x in measured])
        pred, _ = fit.predict(model, *([getattr(x.shape, f) for x in measured] for f in ("steps", "topk", "draft")), running)
        by_shape: dict[Shape, list[float]] = {}
        for x, p in zip(measured, pred):
            by_shape.setdefault(x.shape, []).append(math.log(max(float(x.values["slo_capacity"]), 0.5) / max(p, 0.5)))
        fit.anchors = {sh: float(np.mean(v)) for sh, v in by_shape.items()}
    return fit
