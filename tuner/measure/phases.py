"""The phases of a measurement, in the order they run: warm-up, single stream (passes until
the mean's interval is tight), the concurrent levels (a closed loop per level), and the
acceptance figures gathered from what those requests reported."""

from __future__ import annotations

import asyncio
import math
import statistics
import time
from dataclasses import dataclass, field

from tuner.config import BenchConfig
from tuner.errors import MeasureError
from tuner.measure.result import Progress, RequestResult
from tuner.measure.stats import percentile, steady_window_rate, summarize_rate
from tuner.measure.wire import StreamClient, sum_histograms
from tuner.measure.workload import Prompt, Workload
from tuner.server.client import ServerInfo

__all__ = ["max_tokens_of", "closed_loop", "Single", "Concurrent", "warm_up", "single_phase", "concurrent_phases", "acceptance", "Acceptance", "depth_histogram"]


STALL_TRIES = 3  # sends of a single-stream request the client was starved through, at most


def max_tokens_of(prompt: Prompt, bench: BenchConfig) -> int:
    """A request's max_tokens: its own (a request log, a synthetic length), else [bench] max_tokens."""
    return prompt.max_tokens or bench.max_tokens


async def closed_loop(runner: StreamClient, prompts: list[Prompt], concurrency: int, progress: Progress | None, phase: str,
                      *, seconds: float | None = None) -> list[RequestResult]:
    """Keep `concurrency` requests in flight until `prompts` are sent or, with `seconds`, until
    the loop has run that long in steady state: the clock starts at the first completion (every
    slot has been filled by then, the ramp-up is over); the requests in flight then finish."""
    queue = list(reversed(prompts))
    results: list[RequestResult] = []
    deadline = math.inf

    async def worker() -> None:
        nonlocal deadline
        while queue and time.monotonic() < deadline:
            prompt = queue.pop()
            results.append(await runner.one(prompt, max_tokens_of(prompt, runner.bench)))
            if seconds is not None and deadline == math.inf:
                deadline = time.monotonic() + seconds
            if progress:
                progress(phase, len(results), len(prompts))

    tasks = [asyncio.create_task(worker()) for _ in range(min(concurrency, len(prompts)))]
    try:
        await asyncio.gather(*tasks)
    except BaseException:
        for t in tasks:
            t.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        raise
    return results


@dataclass
class Single:
    results: list[RequestResult]
    rates: list[float]  # one mix-weighted mean decode rate per pass
    tps: float
    ci95: tuple[float, float]
    reference_tps: float | None  # stopping at EOS, when the workload ignores it
    class_rates: dict[str, list[float]] = field(default_factory=dict)  # per class, one mean rate per pass
    stall_resent: int = 0  # requests sent again: the client was starved during them (stalls.py)
    stall_kept: int = 0  # requests still starved after STALL_TRIES


@dataclass
class Concurrent:
    results: list[RequestResult] = field(default_factory=list)
    by_level: dict[int, float] = field(default_factory=dict)
    whole_phase: dict[int, float] = field(default_factory=dict)
    windows: dict[int, float] = field(default_factory=dict)
    p99_itl: dict[int, float] = field(default_factory=dict)
    p99_ttft: dict[int, float] = field(default_factory=dict)
    level_results: dict[int, list[RequestResult]] = field(default_factory=dict)


async def warm_up(runner: StreamClient, bench: BenchConfig, workload: Workload, progress: Progress | None) -> None:
    for i, prompt in enumerate(workload.for_phase("warmup", bench.warmup_requests)):
        await runner.one(prompt, min(bench.max_tokens, 32))
        if progress:
            progress("warm-up", i + 1, bench.warmup_requests)


def _pass_rates(results: list[RequestResult], classes: list[str]) -> dict[str, float]:
    """Each class's mean decode rate over one pass's requests; a class whose answers were all
    one token long has no decode rate in this pass (it is left out of the pass's weighted mean)."""
    out = {}
    for c in classes:
        rates = [r.decode_tps for r in results if r.request_class == c and r.decode_tps is not None]
        if rates:
            out[c] = statistics.fmean(rates)
    if not out:
        raise MeasureError("no single-stream request produced two tokens; raise [bench] max_tokens")
    return out


def _tight(rates: list[float], target: float) -> bool:
    mean, (lo, hi) = summarize_rate(rates)
    return (hi - lo) / 2 <= target * mean


async def single_phase(runner: StreamClient, bench: BenchConfig, workload: Workload, progress: Progress | None) -> Single:
    """Passes over the same prompts (every class of the mix in each) until the 95% CI of the
    mix-weighted mean and of every class's mean are tight enough, or single_max_passes."""
    singles: list[RequestResult] = []
    rates: list[float] = []
    class_rates: dict[str, list[float]] = {c: [] for c in workload.classes}
    pass_prompts = workload.single_pass(bench.single_requests)
    resent = kept = 0
    while len(rates) < bench.single_max_passes:
        done = []
        for i, prompt in enumerate(pass_prompts):
            result = await runner.one(prompt, max_tokens_of(prompt, bench))
            # A request the client was starved through reads its chunks in a burst: its decode
            # rate is the client's (once 5.6x the server's).  The same prompt is sent again.
            for _ in range(STALL_TRIES - 1):
                if not result.client_stalled:
                    break
                resent += 1
                result = await runner.one(prompt, max_tokens_of(prompt, bench))
            kept += result.client_stalled
            done.append(result)
            if progress:
                progress(f"single pass {len(rates) + 1}", i + 1, len(pass_prompts))
        singles += done
        by_class = _pass_rates(done, workload.classes)
        for c, rate in by_class.items():
            class_rates[c].append(rate)
        weight = sum(workload.mix[c] for c in by_class)
        rates.append(sum(workload.mix[c] * rate for c, rate in by_class.items()) / weight)
        if len(rates) >= bench.single_min_passes and all(_tight(r, bench.single_target_ci) for r in [rates, *class_rates.values()] if r):
            break
    single_tps, ci = summarize_rate(rates)
    reference_tps = None
    if bench.ignore_eos:
        # One pass as real traffic ends (at EOS), to show how much ignore_eos inflates.
        runner.ignore_eos = False
        natural = [r.decode_tps for r in [await runner.one(p, max_tokens_of(p, bench)) for p in pass_prompts] if r.decode_tps]
        runner.ignore_eos = True
        reference_tps = statistics.fmean(natural) if natural else None
    return Single(singles, rates, single_tps, ci, reference_tps, class_rates, resent, kept)


async def concurrent_phases(runner: StreamClient, bench: BenchConfig, workload: Workload, progress: Progress | None) -> Concurrent:
    out = Concurrent()
    for level in bench.concurrency_levels:
        results = await closed_loop(runner, workload.for_phase("concurrent", bench.level_requests(level)), level, progress,
                                    f"concurrency {level}", seconds=bench.level_seconds)
        out.by_level[level], out.windows[level] = steady_window_rate(results, level)
        span = max(r.end for r in results) - min(r.start for r in results)
        out.whole_phase[level] = sum(r.completion_tokens for r in results) / span if span > 0 else 0.0
        out.p99_itl[level] = percentile([x for r in results for x in r.itl_s()], 0.99) * 1000
        out.p99_ttft[level] = percentile([r.ttft_s for r in results], 0.99) * 1000
        out.results += results
        out.level_results[level] = results
    return out


@dataclass(frozen=True)
class Acceptance:
    """What the measured requests say about speculation: the accept length and where it came
    from, the verify steps by drafts accepted, and, where the chat stream gave no per-request
    counts, each class's accept length from the /generate fallback."""

    length: float | None
    source: str
    histogram: tuple[int, ...] | None
    by_class: dict[str, float] = field(default_factory=dict)


def _per_class(prompts: list[Prompt], got: list[tuple[int, int | None, tuple[int, ...] | None]]) -> dict[str, float]:
    tokens: dict[str, int] = {}
    steps: dict[str, int] = {}
    for prompt, (n, ct, _) in zip(prompts, got):
        if ct:
            tokens[prompt.request_class] = tokens.get(prompt.request_class, 0) + n
            steps[prompt.request_class] = steps.get(prompt.request_class, 0) + ct
    return {c: tokens[c] / steps[c] for c in steps}


async def acceptance(runner: StreamClient, info: ServerInfo, bench: BenchConfig, workload: Workload,
                      results: list[RequestResult]) -> Acceptance:
    """Accept length (tokens per verify step over the measured requests) and where it came
    from, and the verify steps by drafts accepted (tuner/search/model.py reads acceptance by
    depth from it), each from the best source the server has:
    1. the chat stream's sglext.spec_tokens_details (0.5.23): spec_verify_ct and
       spec_correct_drafts_histogram of every measured request;
    2. native /generate's meta_info over the single-stream prompts (0.5.9: spec_verify_ct and
       spec_accept_histogram), per request class as well, since the single-stream prompts
       hold every class of the mix;
    3. for the histogram only, the depth probe (`depth_histogram`): verify steps read off a
       stream, for a server that reports no histogram."""
    if not info.speculative:
        return Acceptance(1.0, "no speculation", None)  # one token per forward: exact, not a default
    counted = [r for r in results if r.spec_verify_ct]
    length, source, by_class = None, "unknown", {}
    if counted and len(counted) == len(results):
        length, source = sum(r.completion_tokens for r in counted) / sum(r.spec_verify_ct for r in counted), "sglext"
    histogram = sum_histograms(r.accept_histogram for r in results) if all(r.accept_histogram for r in results) else None
    if length is None or histogram is None:
        # A server without per-request details on the chat route (0.5.9): the same prompts
        # through native /generate, whose meta_info carries spec_verify_ct.
        prompts = workload.for_phase("single", bench.single_requests)
        got = [await runner.generate(p, max_tokens_of(p, bench)) for p in prompts]
        pairs = [(tokens, ct) for tokens, ct, _ in got if ct]
        if length is None and pairs:
            length, source = sum(t for t, _ in pairs) / sum(ct for _, ct in pairs), "generate"
            by_class = _per_class(prompts, got)
        if histogram is None and got and all(h for _, _, h in got):
            histogram = sum_histograms(h for _, _, h in got)
    if histogram is None:
        histogram = await depth_histogram(runner, info, bench, workload)
    return Acceptance(length, source, histogram, by_class)


async def depth_histogram(runner: StreamClient, info: ServerInfo, bench: BenchConfig, workload: Workload) -> tuple[int, ...] | None:
    """The depth probe, for a server that reports no accept histogram: the single-stream
    prompts once more through streaming `/generate`, counting verify steps by accepted drafts
    (`generate_steps`).  A few seconds per trial; None when the stream gives no per-step counts."""
    hist: list[int] = []
    for prompt in workload.for_phase("single", bench.single_requests):
        for tokens in await runner.generate_steps(prompt, max_tokens_of(prompt, bench)):
            while len(hist) < tokens:
                hist.append(0)
            hist[tokens - 1] += 1
    return tuple(hist) if sum(hist) else None
