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
- Memory is linear.  KV tokens = (mem_fraction x pre-load memory - weights - per-draft-token
  state) / cell: a line in the fraction (slope from the server's `memory_usage`: pre-load memory
  = (weight + kvcache) / fraction, tokens per GiB = token_capacity / kvcache).  CUDA graphs need
  g0 + graph_bs x (a x draft + b x topk x (steps - 1)) plus, for trees on FlashInfer, index
  buffers in graph_bs x draft and graph_bs x steps x topk; fitted on the per-runner graph GiB
  each launch reports.  What is left after capture (`startup_available`) is the graph-OOM
  margin: slack (1 - fraction) x pre-load - other - graphs must stay above a threshold that
  failed launches bound from below and started ones from above.

Uncertainties are simple: residual-based log-normal spreads, widened for shapes unlike any
measured one (an unseen topk, deeper or wider than measured), and a normal margin for starting.
A measured shape is anchored: at another fraction it is predicted from its own measurement, and
only what the fraction changes (the batch the pool allows) is uncertain (`Model.anchors`).
Pure numpy/scipy on `FrozenTrial`s; nothing here knows the emulator.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

import numpy as np
from optuna.trial import FrozenTrial, TrialState
from scipy.optimize import nnls
from scipy.stats import norm

from tuner.results import record

__all__ = ["Shape", "Launch", "launches", "reach_from_histogram", "pooled_depth_rates", "tree_reach",
           "memory_line", "Model", "fit", "Prediction"]

_KNEES = (32.0, 64.0, 128.0, 192.0, 256.0, 384.0, 512.0, 768.0, 1024.0, 2048.0, 1e9)
_MEM_FAILURES = ("memory_graph", "memory_runtime")
_SAME = 0.0  # relative spread of a measured shape's throughput at another fraction, same batch
_TIME_PRIOR = 0.3  # weight of the "step time does not depend on the shape" prior, per slope


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
        return self.attrs.get(record.MEMORY_USAGE)


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
            values = dict(zip(metric_names or [], t.values))
            out.append(Launch(shape, float(mfs), "ok", values, dict(attrs)))
        elif t.state in (TrialState.PRUNED, TrialState.FAIL):
            kind = attrs.get(record.FAILURE_KIND)
            state = kind if kind in (*_MEM_FAILURES, "memory_kv") else "other"
            out.append(Launch(shape, float(mfs), state, {}, dict(attrs)))
        elif t.state == TrialState.RUNNING:
            out.append(Launch(shape, float(mfs), "other", {}, dict(attrs), running=True))
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


def _time_features(steps, topk, draft, batch, accept, concurrent, knee):
    """Features of one decode iteration's time (ms): overhead, per-request work, draft forwards
    (flat, and growing with batch x topk), tree bookkeeping, the verify's compute past the knee,
    and, under load, the prefills of replacing finished requests (per accepted token)."""
    steps, topk, draft, batch = (np.asarray(v, dtype=float) for v in (steps, topk, draft, batch))
    tokens = batch * draft
    return np.stack([
        np.ones_like(tokens), batch, steps, steps * batch * topk, (topk > 1).astype(float),
        np.maximum(tokens - knee, 0.0), np.asarray(concurrent, dtype=float) * batch * np.asarray(accept, dtype=float),
    ], axis=-1)


@dataclass
class StepTime:
    coef: np.ndarray
    knee: float
    spread: float  # relative std of time predictions (residual based)

    def ms(self, steps, topk, draft, batch, accept, concurrent) -> np.ndarray:
        return _time_features(steps, topk, draft, batch, accept, concurrent, self.knee) @ self.coef


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
    y = a[:, 6]
    best = None
    for knee in _KNEES:
        X = _time_features(a[:, 0], a[:, 1], a[:, 2], a[:, 3], a[:, 4], a[:, 5], knee)
        Xw = X / y[:, None]  # relative errors
        # Ridge rows pull every slope (not the constant) toward zero: with a launch or two the
        # step time is mostly the weights' streaming, the same for every shape; the data
        # overrule the prior as launches accumulate.
        scale = np.abs(Xw).mean(axis=0)
        prior = np.diag(np.r_[0.0, _TIME_PRIOR * scale[1:]])
        coef, _ = nnls(np.vstack([Xw, prior]), np.r_[np.ones(len(y)), np.zeros(len(scale))])
        loss = float(np.sum(((X @ coef - y) / y) ** 2))
        if best is None or loss < best[0]:
            best = (loss, knee, coef)
    loss, knee, coef = best
    return StepTime(coef, knee, math.sqrt(loss / len(y)))


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


@dataclass
class Memory:
    pre: float  # GiB the static fraction is taken of (pre-load memory)
    fixed: float  # GiB of the static pool that is not KV: weights
    cell: np.ndarray  # GiB per KV token = cell[0] + cell[1] x draft (hybrids keep per-draft-token state per slot)
    running_cap: float
    running_per_token: float  # hybrid models: request slots grow with the pool
    graph_coef: np.ndarray
    other: float  # slack not available to graphs (activations), GiB
    theta: float  # the startup_available below which capture fails, GiB
    theta_sd: float
    spread: float  # GiB std of a graph-need prediction for measured-like shapes
    seen_topk: set
    max_draft: dict
    drafts: tuple = ()  # draft tokens of the launches the KV line was fitted on

    def kv_tokens(self, mfs, draft) -> np.ndarray:
        gib = self.pre * np.asarray(mfs) - self.fixed
        return np.floor(np.maximum(gib, 0.0) / (self.cell[0] + self.cell[1] * np.asarray(draft)))

    def running(self, tokens) -> np.ndarray:
        return np.minimum(self.running_cap, np.floor(np.asarray(tokens) * self.running_per_token))

    def graphs(self, steps, topk, draft, bs) -> np.ndarray:
        return _graph_features(steps, topk, draft, bs) @ self.graph_coef

    def margin(self, steps, topk, draft, mfs, bs) -> np.ndarray:
        """startup_available predicted minus the failure threshold (GiB)."""
        slack = self.pre * (1 - np.asarray(mfs))
        return slack - self.other - self.graphs(steps, topk, draft, bs) - self.theta


def _fit_graphs(rows: list[tuple], extra: list[tuple] = ()) -> tuple[np.ndarray, float]:
    a = np.array(list(rows) + list(extra), dtype=float)
    X = _graph_features(a[:, 0], a[:, 1], a[:, 2], a[:, 3])
    coef, _ = nnls(X, a[:, 4])
    res = X[: len(rows)] @ coef - a[: len(rows), 4]
    return coef, float(np.sqrt(np.mean(res ** 2))) if len(rows) > 1 else 0.0


def _graph_gib(usage: dict) -> float:
    """GiB of all CUDA graphs: 0.5.23 reports {runner: GiB}, 0.5.9 one figure."""
    graph = usage.get("graph") or {}
    return float(sum(graph.values())) if isinstance(graph, dict) else float(graph)


def _fit_memory(ls: list[Launch]) -> Memory | None:
    ok = [x for x in ls if x.state == "ok" and x.memory and x.memory.get("kvcache") and x.memory.get("token_capacity")]
    if not ok:
        return None
    mu = [x.memory for x in ok]
    # The static pool is mfs x pre-load memory: weights, then the KV pool (for hybrids also the
    # recurrent state of each request slot and its per-draft-token intermediate state, so the
    # GiB per KV token grows with draft tokens: a line fitted once two drafts were launched).
    pre = float(np.median([(m.get("weight", 0.0) + m["kvcache"]) / x.mfs for m, x in zip(mu, ok)]))
    fixed = float(np.median([pre * x.mfs - m["kvcache"] for m, x in zip(mu, ok)]))
    per_token = np.array([m["kvcache"] / m["token_capacity"] for m in mu])
    drafts = np.array([x.shape.draft for x in ok], dtype=float)
    cell = np.array([float(np.median(per_token)), 0.0])
    if np.ptp(drafts) > 0:
        cell, _ = nnls(np.stack([np.ones_like(drafts), drafts], axis=1), per_token)
    running = [float(x.attrs.get(record.MAX_RUNNING_REQUESTS) or 0) for x in ok]
    # The declared --max-running-requests (48 under speculation); below it the pool decides
    # (tokens // 2, or a hybrid model's state slots, which grow with the pool like its tokens).
    declared = [float(x.attrs.get(record.DECLARED_MAX_RUNNING) or 0) for x in ok]
    cap = max(declared) if all(declared) else max(running)
    capped = [run / m["token_capacity"] for run, m in zip(running, mu) if run < cap]
    slots = float(np.median(capped)) if capped else 1e9
    rows = [(x.shape.steps, x.shape.topk, x.shape.draft, run, _graph_gib(m)) for x, m, run in zip(ok, mu, running)]
    coef, spread = _fit_graphs(rows)
    # What the slack holds besides the graphs (activations), from what was left after capture;
    # a server that does not say (0.5.9) leaves it at 0: the edge is then learned from failures.
    others = [pre * (1 - x.mfs) - g[4] - m["startup_available"] for x, m, g in zip(ok, mu, rows) if m.get("startup_available") is not None]
    mem = Memory(pre, fixed, cell, cap, slots, coef, float(np.median(others)) if others else 0.0, 0.0, 0.0, spread + 0.05,
                 {x.shape.topk for x in ok}, {})
    mem.drafts = tuple(sorted({x.shape.draft for x in ok}))
    for x in ok:
        mem.max_draft[x.shape.topk] = max(mem.max_draft.get(x.shape.topk, 0), x.shape.draft)
    _fit_threshold(mem, ok, [x for x in ls if x.state in _MEM_FAILURES], rows)
    return mem


def _fit_threshold(mem: Memory, ok: list[Launch], failed: list[Launch], rows: list[tuple]) -> None:
    """The startup_available below which capture fails: above what failed launches would have
    had, at or below what started launches had; a prior of 1% of the card in between."""
    upper = min(float(x.memory["startup_available"]) if x.memory.get("startup_available") is not None
                else mem.pre * (1 - x.mfs) - mem.other - float(mem.graphs(*r[:4])) for x, r in zip(ok, rows))
    prior = 0.01 * mem.pre
    if not failed:
        mem.theta, mem.theta_sd = min(prior, upper), prior / 2
        return

    def avail(x: Launch) -> float:
        bs = float(mem.running(mem.kv_tokens(x.mfs, x.shape.draft)))
        return float(mem.pre * (1 - x.mfs) - mem.other - mem.graphs(x.shape.steps, x.shape.topk, x.shape.draft, bs))

    lower = max(avail(x) for x in failed)
    mem.theta = min(max(prior, lower + 0.05), upper) if lower < upper else upper
    mem.theta_sd = max(0.05, min(prior / 2, (upper - max(lower, 0.0)) / 4))
    # Failures the line calls feasible mean the graphs of that shape were underestimated:
    # they needed at least the slack the launch had (a lower bound fed back to the fit).
    extra = []
    for x in failed:
        if avail(x) >= mem.theta:
            bs = float(mem.running(mem.kv_tokens(x.mfs, x.shape.draft)))
            need = mem.pre * (1 - x.mfs) - mem.other - mem.theta + 0.05
            extra.append((x.shape.steps, x.shape.topk, x.shape.draft, bs, need))
    if extra:
        mem.graph_coef, _ = _fit_graphs(rows, extra)


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

    def interval(self, i: int, z: float = 1.64) -> dict[str, list[float]]:
        """90% intervals of candidate i, for reports."""
        out = {}
        for j, (name, mid) in enumerate((("single_tps", self.single), ("concurrent_tps", self.concurrent), ("capacity", self.capacity))):
            m = float(mid[i])
            out[name] = [round(m * math.exp(-z * self.sd[i, j]), 1), round(m, 1), round(m * math.exp(z * self.sd[i, j]), 1)]
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

    def predict(self, steps, topk, draft, mfs) -> Prediction:
        steps, topk, draft, mfs = (np.atleast_1d(np.asarray(v)) for v in (steps, topk, draft, mfs))
        cache: dict[tuple, float] = {}
        for key in zip(steps.tolist(), topk.tolist(), draft.tolist()):
            if key not in cache:
                cache[key] = self.acceptance.accept(Shape(int(key[0]), int(key[1]), int(key[2])))
        accept = np.array([cache[key] for key in zip(steps.tolist(), topk.tolist(), draft.tolist())])
        m = self.memory
        tokens = m.kv_tokens(mfs, draft)
        running = m.running(tokens)
        batch = np.maximum(np.minimum(self.level, running), 1)
        t1 = self.time.ms(steps, topk, draft, np.ones_like(batch), accept, 0)
        tb = self.time.ms(steps, topk, draft, batch, accept, 1)
        single = accept / np.maximum(t1, 1e-3) * 1000
        concurrent = batch * accept / np.maximum(tb, 1e-3) * 1000
        capacity = np.minimum(running, np.floor(tokens / self.request_tokens))
        novelty = self._novelty(steps, topk, draft)
        base = math.hypot(self.acceptance.spread, self.time.spread) + 0.02
        sd_single = base + 0.15 * novelty
        sd_concurrent = sd_single.copy()
        for i, key in enumerate(zip(steps.tolist(), topk.tolist(), draft.tolist())):
            anchor = self.anchors.get(Shape(int(key[0]), int(key[1]), int(key[2])))
            if anchor is None:
                continue
            r_single, r_concurrent, batch_measured = anchor
            single[i] *= math.exp(r_single)
            concurrent[i] *= math.exp(r_concurrent)
            # The measurement's own noise is not something to explore: a draw of it is shared
            # with the measured point already on the front (noisy EHVI's correlation), so only
            # what the fraction changes (the batch the pool allows) is uncertain.
            sd_single[i] = _SAME
            sd_concurrent[i] = _SAME + 0.5 * abs(math.log(batch[i] / batch_measured))
        sd = np.stack([sd_single, sd_concurrent, 0.01 + 0.02 * novelty + self._kv_novelty(draft)], axis=1)
        margin = m.margin(steps, topk, draft, mfs, np.maximum(running, 1))
        graph = m.graphs(steps, topk, draft, np.maximum(running, 1))
        # A shape unlike any launched (a first tree, say) may need memory no launch has shown:
        # tree masks and wider verify activations sit beside the graphs, so its doubt scales
        # with everything the slack holds besides the KV pool, not with the graphs alone.
        sd_margin = np.sqrt(m.theta_sd ** 2 + m.spread ** 2 + (0.3 * novelty * (graph + m.other)) ** 2)
        p_start = norm.cdf(margin / sd_margin) * (tokens > 0) * (running >= 1)
        return Prediction(single, concurrent, capacity, accept, sd, p_start)

    def _kv_novelty(self, draft) -> np.ndarray:
        """Until launches with two draft-token counts fix the per-draft-token state (hybrid
        models), capacity away from the measured count is uncertain."""
        if len(self.memory.drafts) >= 2:
            return np.zeros(len(draft))
        d0 = self.memory.drafts[0]
        return 0.3 * np.minimum(1.0, np.abs(np.asarray(draft, dtype=float) - d0) / np.maximum(np.asarray(draft, dtype=float), d0))

    def _novelty(self, steps, topk, draft) -> np.ndarray:
        """0 for shapes like measured ones; up to 1 for an unseen topk or far extrapolation."""
        out = np.zeros(len(steps))
        for i, (s, k, d) in enumerate(zip(steps, topk, draft)):
            if int(k) not in self.measured_steps:
                out[i] = 1.0
                continue
            deeper = max(0, int(s) - self.measured_steps[int(k)])
            wider = max(0, int(d) - self.memory.max_draft.get(int(k), int(d))) / max(int(d), 1)
            out[i] = min(1.0, 0.15 * deeper + wider)
        return out


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
    model.fit_error = _fit_error(model, ok)
    model.anchors = _anchors(model, ok)
    return model, "fitted on %d launches" % len(ls)


def _anchors(model: Model, ok: list[Launch]) -> dict:
    """Per measured shape, the mean log ratio of measured to predicted throughputs (model.anchors)."""
    p = model.predict([x.shape.steps for x in ok], [x.shape.topk for x in ok], [x.shape.draft for x in ok], [x.mfs for x in ok])
    batch = np.maximum(np.minimum(model.level, model.memory.running(model.memory.kv_tokens([x.mfs for x in ok], [x.shape.draft for x in ok]))), 1)
    by_shape: dict[Shape, list] = {}
    for i, x in enumerate(ok):
        if x.values.get("single_tps") and x.values.get("concurrent_tps"):
            by_shape.setdefault(x.shape, []).append((math.log(x.values["single_tps"] / p.single[i]),
                                                     math.log(x.values["concurrent_tps"] / p.concurrent[i]), float(batch[i])))
    return {shape: (float(np.mean([r[0] for r in rows])), float(np.mean([r[1] for r in rows])), float(np.median([r[2] for r in rows])))
            for shape, rows in by_shape.items()}


def _fit_error(model: Model, ok: list[Launch]) -> float:
    """Relative RMS error of the throughput predictions at the launches themselves."""
    p = model.predict([x.shape.steps for x in ok], [x.shape.topk for x in ok], [x.shape.draft for x in ok], [x.mfs for x in ok])
    errs = []
    for i, x in enumerate(ok):
        for name, pred in (("single_tps", p.single), ("concurrent_tps", p.concurrent)):
            if x.values.get(name):
                errs.append(math.log(pred[i] / x.values[name]))
    return float(np.sqrt(np.mean(np.square(errs)))) if errs else 0.0
