"""What the emulator's model predicts a trial will measure, without running a server.

Used offline: by the sampler benchmark (the exhaustive Pareto front of a space costs
milliseconds here instead of hours of trials) and by tests that check measured figures
against the model.  The expectations follow the model's own rules; the measured values add
the engine's scheduling, prompt mix and timing noise.
"""

from __future__ import annotations

import random
from dataclasses import dataclass, field

from . import model as m
from .adaptive import AdaptiveSpeculativeParams, AdaptiveTable, graph_states, resolve_adaptive_steps, table_from_steps
from .profiles import PROFILES

__all__ = [
    "Expectation",
    "expect",
    "Workload",
    "LevelExpectation",
    "static_level",
    "adaptive_level",
    "best_static_steps",
    "best_steps_by_batch",
    "oracle_table",
    "adaptive_memory",
    "mem_fraction_edge",
    "DEFAULT_LEVELS",
    "ORACLE_STEPS",
]


@dataclass(frozen=True)
class Workload:
    temperature: float = 0.0
    top_p: float = 1.0
    ignore_eos: bool = False
    max_tokens: int = 256
    prompt_tokens: int = 300
    natural_tokens: int = 220  # mean natural answer length of the prompt mix
    concurrency: int = 16
    request_tokens: int = 8192
    prompt_spread: float | None = None  # None: the profile's own
    # The kind of text asked for (model.prompt_category's names): its shift of logit(q), as the
    # engine applies it per request (engine.py · prompt_traits); "chat" shifts nothing.
    category: str = "chat"
    # The shifts of the very prompts a benchmark sends (engine.py · prompt_traits of each, its
    # category and context included), in place of the mix's quantiles: what a few fixed prompts
    # measure is the expectation over those prompts, not over the mix (three chat prompts can
    # sit +0.4 above it, and a deep chain gains from that more than a wide tree).
    shifts: tuple[float, ...] | None = None


def _mean_shift(profile: m.Profile, w: Workload) -> float:
    """The workload's shift of logit(q) before the per-prompt spread: its category and its
    prompts' context length, as engine.py · prompt_traits adds them to each request."""
    return m.category_shift(profile.acceptance, w.category) + m.context_shift(profile.acceptance, w.prompt_tokens)


@dataclass(frozen=True)
class Expectation:
    feasible: bool
    failure: str | None
    single_tps: float = 0.0
    concurrent_tps: float = 0.0
    capacity: float = 0.0
    accept_length: float = 1.0
    max_total_num_tokens: int = 0
    max_running_requests: int = 0

    def values(self) -> tuple[float, float, float]:
        return (self.single_tps, self.concurrent_tps, self.capacity)


_SHIFT_QUANTILES = (-1.2816, -0.5244, 0.0, 0.5244, 1.2816)  # 10/30/50/70/90% of N(0, 1)


def _prompt_shifts(profile: m.Profile, w: Workload) -> list[float]:
    """The prompt mix as five prompts: the 10/30/50/70/90% quantiles of the per-prompt shift;
    or the workload's own prompts, when it names them."""
    if w.shifts is not None:
        return list(w.shifts)
    spread = profile.acceptance.prompt_spread if w.prompt_spread is None else w.prompt_spread
    return [_mean_shift(profile, w) + z * spread for z in _SHIFT_QUANTILES]


def _accept(profile: m.Profile, spec: m.SpecShape, w: Workload) -> float:
    """Mean accept length over the prompt mix and, with ignore_eos, the post-EOS tail."""
    if not spec.enabled:
        return 1.0
    natural = [
        m.expected_accept_length(profile, spec, temperature=w.temperature, top_p=w.top_p, prompt_shift=shift)
        for shift in _prompt_shifts(profile, w)
    ]
    mean_natural = sum(natural) / len(natural)
    if not w.ignore_eos or w.max_tokens <= w.natural_tokens:
        return mean_natural
    degenerate = m.expected_accept_length(profile, spec, temperature=w.temperature, top_p=w.top_p, degenerate=True)
    share = (w.max_tokens - w.natural_tokens) / w.max_tokens
    return (1 - share) * mean_natural + share * degenerate


def expect(
    profile: m.Profile | str,
    *,
    steps: int | None,
    topk: int | None,
    draft_tokens: int | None,
    mem_fraction_static: float,
    workload: Workload = Workload(),
    algorithm: str | None = "EAGLE",
    tp: int | None = None,
    max_running_requests: int | None = None,
) -> Expectation:
    """The model's expectation of (single_tps, concurrent_tps, capacity) for one configuration."""
    if isinstance(profile, str):
        profile = PROFILES[profile]
    tp = tp or profile.reference_tp
    if steps is None or algorithm is None:
        spec = m.SpecShape(None, 0, 0, 0)
    else:
        spec = m.SpecShape(algorithm, steps, topk or 1, draft_tokens or steps + 1)
    if spec.enabled and spec.topk > 1 and spec.draft_tokens - 1 > m.tree_pool_size(spec.steps, spec.topk):
        return Expectation(False, "invalid: draft tree wider than the candidate pool")
    chunk, max_bs = m.default_graph_settings(profile.gpu.total_mib, tp)
    requested = max_running_requests if max_running_requests is not None else (48 if spec.enabled else None)
    try:
        plan = m.size_memory(
            profile, tp=tp, dp=1, mem_fraction_static=mem_fraction_static, spec=spec,
            max_running_requests=requested, max_total_tokens=None, chunked_prefill_size=chunk,
            cuda_graph_max_bs=max_bs if requested is None else min(max_bs, requested),
        )
    except m.MemoryFailure as failure:
        return Expectation(False, f"memory_{failure.phase}")
    accept = _accept(profile, spec, w=workload)
    out_tokens = workload.max_tokens if workload.ignore_eos else min(workload.max_tokens, workload.natural_tokens)
    ctx1 = workload.prompt_tokens + out_tokens // 2
    single = accept / m.step_ms(profile, spec=spec, batch=1, context_tokens=ctx1, tp=tp) * 1000
    batch = max(1, min(workload.concurrency, plan.max_running_requests))
    step = m.step_ms(profile, spec=spec, batch=batch, context_tokens=batch * ctx1, tp=tp)
    # Each finished request makes room for a new one whose prefill pauses decoding.
    prefill = m.prefill_ms(profile, tokens=workload.prompt_tokens, tp=tp)
    new_per_step = batch * accept / max(out_tokens, 1)
    concurrent = batch * accept / (step + new_per_step * prefill) * 1000
    capacity = min(plan.max_running_requests, plan.max_total_num_tokens // workload.request_tokens)
    return Expectation(
        True, None, single, concurrent, float(capacity), accept, plan.max_total_num_tokens, plan.max_running_requests
    )


# --- Batch levels and adaptive tables ------------------------------------------------------------
#
# For `tuner.schedule` and schedule benchmarks: what a decode batch of B running requests
# yields per second with a static speculative shape, with an adaptive table (SGLang's EMA policy
# run on the model's expected acceptance), and which topk-1 steps are truly best at each B.

DEFAULT_LEVELS: tuple[int, ...] = (1, 2, 4, 8, 16, 24, 32, 48)  # 48: the spec default max_running_requests
ORACLE_STEPS: tuple[int, ...] = tuple(range(0, 9))  # topk-1 chains 0..8 (0: adaptive's zero-step state)


@dataclass(frozen=True)
class LevelExpectation:
    """Expected decode throughput with `batch` requests running (tokens/s, all requests).

    `steps` are the adaptive states visited with their share of decode batches (a static shape
    visits one).  Includes the prefill pauses of replacing finished requests, as
    `expect(...).concurrent_tps` does.
    """

    batch: int
    tokens_per_s: float
    accept_length: float
    step_ms: float
    steps: tuple[tuple[int, float], ...]


def _spec_for(algorithm: str | None, steps: int | None, topk: int = 1, draft_tokens: int | None = None) -> m.SpecShape:
    """steps None: no speculation; steps 0: adaptive's zero-step state (one verify token, the
    draft extend still runs: eagle_worker_v2.py · forward_batch_generation)."""
    if steps is None or algorithm is None:
        return m.SpecShape(None, 0, 0, 0)
    return m.SpecShape(algorithm, steps, topk, draft_tokens or steps + 1)


def _level_rate(profile: m.Profile, spec: m.SpecShape, batch: int, w: Workload, tp: int) -> tuple[float, float, float]:
    """(tokens per decode batch, ms per decode batch incl. amortised prefill, accept length)."""
    accept = _accept(profile, spec, w)
    out_tokens = w.max_tokens if w.ignore_eos else min(w.max_tokens, w.natural_tokens)
    ctx = w.prompt_tokens + out_tokens // 2
    step = m.step_ms(profile, spec=spec, batch=batch, context_tokens=batch * ctx, tp=tp)
    prefill = m.prefill_ms(profile, tokens=w.prompt_tokens, tp=tp)
    new_per_step = batch * accept / max(out_tokens, 1)
    return batch * accept, step + new_per_step * prefill, accept


def static_level(
    profile: m.Profile | str,
    *,
    batch: int,
    steps: int | None,
    topk: int = 1,
    draft_tokens: int | None = None,
    workload: Workload = Workload(),
    algorithm: str | None = "EAGLE",
    tp: int | None = None,
) -> LevelExpectation:
    """Expected throughput at `batch` running requests for one static shape (memory not checked)."""
    if isinstance(profile, str):
        profile = PROFILES[profile]
    tp = tp or profile.reference_tp
    spec = _spec_for(algorithm, steps, topk, draft_tokens)
    tokens, ms, accept = _level_rate(profile, spec, batch, workload, tp)
    return LevelExpectation(batch, tokens / ms * 1000, accept, ms, ((steps if steps is not None else -1, 1.0),))


@dataclass
class _Request:
    shift: float  # its prompt's shift of logit(q)
    generated: int = 0


@dataclass
class _PolicyFeed:
    """The accepted drafts of each running request per decode batch, as engine.py · _decode
    draws them: one uniform per request against P(accepted >= j) of its own prompt (a quantile
    of the mix, drawn per new request); a request done after the workload's output tokens is
    replaced by a new one, as a benchmark client keeps `batch` in flight."""

    profile: m.Profile
    w: Workload
    algorithm: str
    batch: int
    rng: random.Random
    running: list[_Request] = field(default_factory=list)
    _masses: dict = field(default_factory=dict)

    def __post_init__(self) -> None:
        self._shifts = _prompt_shifts(self.profile, self.w)
        self._out = self.w.max_tokens if self.w.ignore_eos else min(self.w.max_tokens, self.w.natural_tokens)
        self.running = [_Request(self.rng.choice(self._shifts)) for _ in range(self.batch)]

    def _mass(self, steps: int, shift: float, degenerate: bool) -> list[float]:
        key = (steps, shift, degenerate)
        if key not in self._masses:
            qs = m.depth_acceptance(self.profile.acceptance, steps=steps, temperature=self.w.temperature,
                                    top_p=self.w.top_p, prompt_shift=shift, degenerate=degenerate)
            self._masses[key] = m.accept_length_distribution(qs, topk=1, draft_tokens=steps + 1,
                                                             second_share=self.profile.acceptance.second_share)
        return self._masses[key]

    def accepted_drafts(self, steps: int) -> list[int]:
        """One batch's num_correct_drafts_per_req (all 0 at steps 0: only the bonus token)."""
        out = []
        for i, req in enumerate(self.running):
            degenerate = self.w.ignore_eos and req.generated >= self.w.natural_tokens
            u = self.rng.random()
            accepted = sum(1 for p in self._mass(steps, req.shift, degenerate) if u < p) if steps > 0 else 0
            out.append(accepted)
            req.generated += 1 + accepted
            if req.generated >= self._out:
                self.running[i] = _Request(self.rng.choice(self._shifts))
        return out


def adaptive_level(
    profile: m.Profile | str,
    table: AdaptiveTable,
    *,
    batch: int,
    workload: Workload = Workload(),
    algorithm: str = "EAGLE",
    tp: int | None = None,
    initial_steps: int | None = None,
    cuda_graph_bs: tuple[int, ...] | None = None,
    decode_batches: int = 400,
    seed: int = 0,
) -> LevelExpectation:
    """Expected throughput at `batch` with an adaptive table: SGLang's own policy
    (adaptive.AdaptiveSpeculativeParams) run for `decode_batches` batches past warm-up; throughput is the
    tokens of those batches over their time (so a slot that keeps probing 0 -> 1 -> 0 pays for
    its probes).  `initial_steps` defaults to SGLang's resolution (middle of the candidate
    union); `cuda_graph_bs` defaults to the spec capture sizes up to 48.

    The policy is fed what the live engine feeds it (`_PolicyFeed`, drawn from `seed`): each
    request's own accepted drafts, not the mean, so a small batch's noisy EMA crosses the
    thresholds the live server crosses (at one stream, chat, SGLang's default slot [1,3,5,7]
    moves 3 <-> 5 instead of staying at 3); the batches are paid at the mean rates of the steps
    visited, so a pinned table still equals its static level.
    """
    if isinstance(profile, str):
        profile = PROFILES[profile]
    tp = tp or profile.reference_tp
    start = resolve_adaptive_steps(table, initial_steps)
    graph_bs = cuda_graph_bs if cuda_graph_bs is not None else m.capture_batch_sizes(48, True)
    rates: dict[int, tuple[float, float, float]] = {}
    policy = AdaptiveSpeculativeParams(start, table, graph_bs, announce=False, quiet=True)
    feed = _PolicyFeed(profile, workload, algorithm, batch, random.Random(seed))
    warm = policy.slot(batch).cfg.warmup_batches
    tokens = ms = accepted_tokens = 0.0
    visits: dict[int, int] = {}
    for i in range(warm + decode_batches):
        steps = policy.activate_step_by_batch(batch)
        if steps not in rates:
            rates[steps] = _level_rate(profile, _spec_for(algorithm, steps), batch, workload, tp)
        t, dt, _ = rates[steps]
        if i >= warm:
            tokens, ms, accepted_tokens = tokens + t, ms + dt, accepted_tokens + t / batch
            visits[steps] = visits.get(steps, 0) + 1
        policy.on_verify_complete(feed.accepted_drafts(steps), batch)
    n = sum(visits.values())
    shares = tuple(sorted((s, c / n) for s, c in visits.items()))
    return LevelExpectation(batch, tokens / ms * 1000, accepted_tokens / n, ms / n, shares)


def best_static_steps(
    profile: m.Profile | str,
    *,
    batch: int,
    workload: Workload = Workload(),
    candidates: tuple[int, ...] = ORACLE_STEPS,
    algorithm: str = "EAGLE",
    tp: int | None = None,
) -> int:
    """The oracle: the topk-1 steps (0 included) with the highest throughput at `batch`."""
    return max(
        candidates,
        key=lambda s: static_level(profile, batch=batch, steps=s, workload=workload, algorithm=algorithm, tp=tp).tokens_per_s,
    )


def best_steps_by_batch(
    profile: m.Profile | str,
    *,
    levels: tuple[int, ...] = DEFAULT_LEVELS,
    workload: Workload = Workload(),
    candidates: tuple[int, ...] = ORACLE_STEPS,
    algorithm: str = "EAGLE",
    tp: int | None = None,
) -> dict[int, int]:
    """The oracle per batch level: {batch: best topk-1 steps}."""
    return {
        b: best_static_steps(profile, batch=b, workload=workload, candidates=candidates, algorithm=algorithm, tp=tp)
        for b in levels
    }


def oracle_table(
    profile: m.Profile | str,
    *,
    levels: tuple[int, ...] = DEFAULT_LEVELS,
    workload: Workload = Workload(),
    candidates: tuple[int, ...] = ORACLE_STEPS,
    algorithm: str = "EAGLE",
    tp: int | None = None,
) -> AdaptiveTable:
    """A tuned table: one pinned candidate per level key (a static per-batch-size schedule).

    Keys are the levels; a batch routes to the nearest lower key after padding to the graph
    size, so each key should be a capture size (DEFAULT_LEVELS are).  Adjacent levels with the
    same best steps are merged.
    """
    best = best_steps_by_batch(profile, levels=levels, workload=workload, candidates=candidates, algorithm=algorithm, tp=tp)
    merged: dict[int, int] = {}
    previous = None
    for b in sorted(best):
        if best[b] != previous:
            merged[b] = best[b]
            previous = best[b]
    return table_from_steps(merged)


def adaptive_memory(
    profile: m.Profile | str,
    table: AdaptiveTable,
    *,
    mem_fraction_static: float,
    algorithm: str = "EAGLE",
    tp: int | None = None,
    max_running_requests: int | None = 48,
    initial_steps: int | None = None,
) -> m.MemoryPlan:
    """What start-up sizes in adaptive mode (raises model.MemoryFailure like `size_memory`):
    draft buffers for max(candidate_steps) + 1 tokens, one set of graphs per candidate."""
    if isinstance(profile, str):
        profile = PROFILES[profile]
    tp = tp or profile.reference_tp
    start = resolve_adaptive_steps(table, initial_steps)
    top = max(table.candidate_steps)
    chunk, max_bs = m.default_graph_settings(profile.gpu.total_mib, tp)
    return m.size_memory(
        profile, tp=tp, dp=1, mem_fraction_static=mem_fraction_static, spec=m.SpecShape(algorithm, top, 1, top + 1),
        max_running_requests=max_running_requests, max_total_tokens=None, chunked_prefill_size=chunk,
        cuda_graph_max_bs=max_bs, graph_states=lambda bs: graph_states(table, start, bs),
    )


def mem_fraction_edge(
    profile: m.Profile | str,
    *,
    steps: int | None,
    topk: int | None = 1,
    draft_tokens: int | None = None,
    algorithm: str | None = "EAGLE",
    tp: int | None = None,
    low: float = 0.30,
    high: float = 0.99,
    resolution: float = 1e-4,
) -> float | None:
    """The largest mem_fraction_static at which this shape starts (graphs fit the slack), or
    None if it fails everywhere in [low, high].  Below the edge the KV pool shrinks; above it
    graph capture fails.  Bisection on `expect`'s feasibility, which is monotone in between
    (a KV failure only at the low end, a graph failure only at the high end)."""
    if isinstance(profile, str):
        profile = PROFILES[profile]

    def ok(mfs: float) -> bool:
        e = expect(profile, steps=steps, topk=topk, draft_tokens=draft_tokens, mem_fraction_static=mfs,
                   algorithm=algorithm, tp=tp)
        return e.feasible

    if ok(high):
        return high
    lo = low
    while not ok(lo):
        lo += 0.05  # step out of the KV-failure end
        if lo >= high:
            return None
    hi = high
    while hi - lo > resolution:
        mid = (lo + hi) / 2
        lo, hi = (mid, hi) if ok(mid) else (lo, mid)
    return lo
