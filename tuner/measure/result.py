"""What one trial's benchmark measured: one request (`RequestResult`) and the whole
measurement (`Measurement`), the schema every objective module scores from.  How each figure is
measured is in `tuner/measure/runner.py`; how it is stored in `tuner/results/record.py`."""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Callable

from tuner.measure.stalls import stalled
from tuner.server.client import Rank

if TYPE_CHECKING:
    from tuner.measure.load_sweep import LoadCurve

__all__ = ["RequestResult", "ClassFigures", "Measurement", "Progress"]

Progress = Callable[[str, int, int], None]  # (phase, done, total)


@dataclass(frozen=True)
class RequestResult:
    prompt_tokens: int
    completion_tokens: int
    start: float  # monotonic seconds
    first_token: float
    end: float
    chunk_times: tuple[float, ...] = ()
    finish_reason: str | None = None
    reasoning_tokens: int | None = None  # of completion_tokens, thinking (usage), when reported
    spec_verify_ct: int | None = None  # verify steps (sglext.spec_tokens_details), when reported
    # Verify steps by drafts accepted (sglext.spec_tokens_details.spec_correct_drafts_histogram,
    # 0.5.23), when reported: index k counts the steps that accepted k drafts.
    accept_histogram: tuple[int, ...] | None = None
    request_class: str = "user"  # the prompt's class (workload.py): its category, split by context_buckets
    max_tokens: int = 0  # what the request asked for (the KV it may come to hold: prompt_tokens + this)
    # Which request it was (the hash of its text and max_tokens, None when unknown): one a measurement sent
    # twice counts once in the workload's footprint (by_class.auto_request_tokens).
    prompt_key: int | None = None
    client_stall_s: float = 0.0  # of start..end, the seconds the measuring client could not run (stalls.py)
    # Chunk gaps (i: chunk_times[i] -> [i + 1]) the client was starved through: the client's, not the server's.
    client_stall_gaps: tuple[int, ...] = ()

    @property
    def ttft_s(self) -> float:
        return self.first_token - self.start

    @property
    def decode_s(self) -> float:
        return self.end - self.first_token

    @property
    def client_stalled(self) -> bool:
        """Its timing measured the client, starved of CPU, more than the server (stalls.py)."""
        return stalled(self.client_stall_s, self.start, self.end)

    @property
    def decode_tps(self) -> float | None:
        """Tokens after the first over the time from the first to the last token."""
        if self.completion_tokens < 2 or self.decode_s <= 0:
            return None
        return (self.completion_tokens - 1) / self.decode_s

    def itl_s(self) -> list[float]:
        """Per-token inter-token latencies: each chunk gap spread over the tokens it carried.

        Chunks carry several tokens under speculation; usage gives the total, so a gap is
        divided by the request's mean tokens per chunk (SGLang's bench divides by the chunk's
        own count, which we do not read from the text).  A gap the measuring client was
        starved through is left out: the stall was the client's (stalls.py), and one such gap
        in every stream of a concurrency level would be that level's p99.
        """
        times = self.chunk_times
        if len(times) < 2 or self.completion_tokens < 2:
            return []
        per_chunk = (self.completion_tokens - 1) / (len(times) - 1)
        skip = set(self.client_stall_gaps)
        gaps = [b - a for i, (a, b) in enumerate(zip(times, times[1:])) if i not in skip]
        return [g / per_chunk for g in gaps for _ in range(max(1, round(per_chunk)))]


@dataclass(frozen=True)
class ClassFigures:
    """One request class's figures in one trial (the user attr `by_class`, docs/contract.md)."""

    requests: int  # measured requests of the class, all phases
    single_tps: float  # mean decode rate of its single-stream requests (mean over passes)
    single_tps_ci95: tuple[float, float]
    accept_length: float | None  # its completion tokens / its verify steps; 1.0 without speculation
    prompt_tokens_median: float  # as the server's usage counts them
    concurrent_tps: float | None  # its share of the first level's steady-window rate
    share: float  # its weight in the mix
    single_s: float  # seconds its single-stream requests took: what measuring the class costs
    mean_request_tokens: float  # mean of prompt tokens + max_tokens over its requests
    # its share of each level's steady-window rate ([bench] concurrency levels); the first is concurrent_tps
    concurrent_tps_by_level: dict[int, float] = field(default_factory=dict)


@dataclass(frozen=True)
class Measurement:
    """One trial's figures; objectives are pure functions of this."""

    single_tps: float
    single_runs: tuple[float, ...]  # one mean decode rate per pass
    single_ci95: tuple[float, float]
    concurrent_tps_by_level: dict[int, float]
    concurrent_window_s: dict[int, float]
    max_total_num_tokens: int  # summed over DP ranks
    max_running_requests: int  # effective, summed over DP ranks
    request_tokens: int
    accept_length: float | None  # completion tokens / verify steps over the measured requests; None if unknown
    ttft_ms: float
    ttft_p90_ms: float
    ttft_p99_ms: float
    itl_ms: float
    itl_p90_ms: float
    itl_p99_ms: float
    e2e_ms: float
    e2e_p90_ms: float
    e2e_p99_ms: float
    concurrent_p99_itl_ms: dict[int, float] = field(default_factory=dict)
    concurrent_p99_ttft_ms: dict[int, float] = field(default_factory=dict)
    completion_tokens: int = 0
    duration_s: float = 0.0
    ignore_eos: bool = False
    greedy_inflation: float | None = None  # single_tps with ignore_eos / without, same prompts
    concurrent_ttft_p99_ms: float = float("nan")
    concurrent_phase_tps_by_level: dict[int, float] = field(default_factory=dict)  # ramp-up and drain included
    ranks: tuple[Rank, ...] = ()  # each DP rank's own capacity
    server_accept_length: float | None = None  # avg_spec_accept_length: a cross-check only
    accept_length_source: str = "unknown"  # "sglext" | "generate" | "no speculation" | "unknown"
    thinking_tokens: int | None = None  # completion tokens that were thinking (usage.reasoning_tokens)
    # Verify steps by drafts accepted: accept_histogram[k] = steps that accepted k drafts
    # (1 + k tokens), summed over the measured requests (`_acceptance` says from where); None
    # without speculation or when the server gives no per-step counts.  What
    # tuner/search/model.py fits acceptance on.
    accept_histogram: tuple[int, ...] | None = None
    # The search over load behind slo_capacity (tuner/measure/load_sweep.py), when [slo] is needed.
    load_curve: "LoadCurve | None" = None
    by_class: dict[str, ClassFigures] = field(default_factory=dict)
    request_tokens_auto: bool = False  # request_tokens was measured ([bench] request_tokens = "auto")
    # Single-stream requests sent again because the measuring client was starved of CPU during
    # them (stalls.py), and those still starved after the last try (kept: a caveat says so).
    client_stall_resent: int = 0
    client_stall_kept: int = 0

    @property
    def capacity(self) -> int:
        """Running requests of `request_tokens` the server holds at once: per DP rank
        min(its running cap, its KV tokens // request_tokens), summed (a request cannot span
        ranks)."""
        ranks = self.ranks or (Rank(self.max_total_num_tokens, self.max_running_requests),)
        return sum(min(r.max_running_requests, r.max_total_num_tokens // self.request_tokens) for r in ranks)

    def slo_values(self, *, p99_itl_ms: float | None, ttft_ms: float | None) -> list[float]:
        """Optuna constraint values (<= 0 is feasible) for SLOs under load: the p99 ITL and
        p99 TTFT of the concurrent phase, at its most loaded level."""
        out = []
        if p99_itl_ms is not None:
            out.append(max(self.concurrent_p99_itl_ms.values()) - p99_itl_ms)
        if ttft_ms is not None:
            out.append(self.concurrent_ttft_p99_ms - ttft_ms)
        return out

    @property
    def concurrent_tps(self) -> float:
        """The rate at the first (or only) concurrency level."""
        return next(iter(self.concurrent_tps_by_level.values()))

    @property
    def single_spread(self) -> float:
        """Half-width of the 95% interval relative to the mean."""
        lo, hi = self.single_ci95
        return (hi - lo) / 2 / self.single_tps if self.single_tps else math.inf
