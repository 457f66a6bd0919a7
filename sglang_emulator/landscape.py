"""What the emulator's model predicts a trial will measure, without running a server.

Used offline: by the sampler benchmark (the exhaustive Pareto front of a space costs
milliseconds here instead of hours of trials) and by tests that check measured figures
against the model.  The expectations follow the model's own rules; the measured values add
the engine's scheduling, prompt mix and timing noise.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from . import model as m
from .args import ADAPTIVE_CANDIDATES
from .profiles import PROFILES

__all__ = ["Expectation", "expect", "Workload"]


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


def _accept(profile: m.Profile, spec: m.SpecShape, w: Workload) -> float:
    """Mean accept length over the prompt mix and, with ignore_eos, the post-EOS tail."""
    if not spec.enabled:
        return 1.0
    spread = profile.acceptance.prompt_spread if w.prompt_spread is None else w.prompt_spread
    natural = [
        m.expected_accept_length(profile, spec, temperature=w.temperature, top_p=w.top_p, prompt_shift=z * spread)
        for z in _SHIFT_QUANTILES
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


def adaptive_steps_for(batch: int) -> tuple[int, ...]:
    candidates = ADAPTIVE_CANDIDATES[0][1]
    for low, cands in ADAPTIVE_CANDIDATES:
        if batch >= low:
            candidates = cands
    return candidates


def _is_close(a: float, b: float) -> bool:
    return math.isclose(a, b, rel_tol=1e-9)
