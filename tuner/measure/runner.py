"""The benchmark: what one trial measures on a ready server, through the `openai` client.

Order (each phase's definition is in the README, "What the figures mean"):
1. warm-up requests, not measured;
2. `/flush_cache`, which also zeroes SGLang's accept-length counters;
3. single-stream phase: passes over `single_requests` prompts, one streaming request at a
   time; passes repeat (at least `single_min_passes`) until the 95% confidence interval of
   the mean pass rate is within `single_target_ci` of it, or `single_max_passes`, as
   hyperfine repeats a command until its spread is known;
4. concurrent phase, per concurrency level: a closed loop keeping `concurrency` requests in
   flight until `concurrent_requests` have been sent; the rate counts only the steady window
   (all slots busy), not the ramp-up or the drain;
5. accept length per request: completion tokens over verify steps (`spec_verify_ct`), summed
   over phases 3-4, from the chat stream's `sglext.spec_tokens_details` (0.5.23, asked with
   `return_spec_tokens_details`) or, on servers without it, from native `/generate` requests'
   `meta_info`.  The server's `avg_spec_accept_length` is kept as a cross-check only: SGLang
   folds its counters every `--decode-log-interval` (40) decode steps per rank, so a short
   phase reads stale or nothing (docs/sglang-real-server.md rows 5, 6).  Unknown stays unknown.
   The same sources give the verify steps by drafts accepted (`accept_histogram`, from which
   tuner/search/model.py reads acceptance by depth); a server reporting none gets a depth probe
   (row 18: a stream's chunks are not always one verify step each).

Tokens are counted from each response's `usage`, never from stream chunks: SGLang sends every
token accepted in one verify step as one chunk.  A thinking model's first token may be
thinking (`delta.reasoning_content`) or a tool call: the first token of any kind starts the
clock, and a request that is all thinking counts (row 7).
"""

from __future__ import annotations

import asyncio
import json
import math
import statistics
import time
from dataclasses import dataclass, field
from typing import Callable

import httpx
import openai
from scipy import stats

from tuner.server.client import Rank, ServerClient, ServerInfo
from tuner.config import BenchConfig
from tuner.errors import MeasureError
from tuner.measure.workload import Prompt, Workload

__all__ = ["RequestResult", "Measurement", "measure", "summarize_rate", "steady_window_rate", "Progress"]

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

    @property
    def ttft_s(self) -> float:
        return self.first_token - self.start

    @property
    def decode_s(self) -> float:
        return self.end - self.first_token

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
        own count, which we do not read from the text).
        """
        times = self.chunk_times
        if len(times) < 2 or self.completion_tokens < 2:
            return []
        per_chunk = (self.completion_tokens - 1) / (len(times) - 1)
        gaps = [b - a for a, b in zip(times, times[1:])]
        return [g / per_chunk for g in gaps for _ in range(max(1, round(per_chunk)))]


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


def _pct(values: list[float], q: float) -> float:
    if not values:
        return float("nan")
    ordered = sorted(values)
    k = (len(ordered) - 1) * q
    lo, hi = math.floor(k), math.ceil(k)
    return ordered[lo] + (ordered[hi] - ordered[lo]) * (k - lo)


def summarize_rate(samples: list[float]) -> tuple[float, tuple[float, float]]:
    """Mean and Student-t 95% confidence interval."""
    mean = statistics.fmean(samples)
    if len(samples) < 2:
        return mean, (-math.inf, math.inf)
    sem = statistics.stdev(samples) / math.sqrt(len(samples))
    if sem == 0:
        return mean, (mean, mean)
    lo, hi = stats.t.interval(0.95, len(samples) - 1, loc=mean, scale=sem)
    return mean, (float(lo), float(hi))


def steady_window_rate(results: list[RequestResult], concurrency: int) -> tuple[float, float]:
    """Completion tokens per second while all `concurrency` slots were busy.

    The window opens when the `concurrency`-th request has its first token (every slot
    decoding) and closes when the first slot finds no request left to send (the drain).  Each
    request's tokens are spread evenly over its decode interval and integrated over the window.
    Falls back to tokens over the whole phase when the window is too short (few requests).
    """
    if not results:
        return 0.0, 0.0
    firsts = sorted(r.first_token for r in results)
    opens = firsts[min(concurrency, len(firsts)) - 1]
    # Requests are sent in start order; the drain starts when the last request is sent and a
    # slot then falls idle: the first completion after the last start.
    last_start = max(r.start for r in results)
    ends_after = sorted(r.end for r in results if r.end >= last_start)
    closes = ends_after[0] if ends_after else max(r.end for r in results)
    phase_start = min(r.start for r in results)
    phase_end = max(r.end for r in results)
    if closes - opens < 0.25 * (phase_end - phase_start) or closes <= opens:
        total = sum(r.completion_tokens for r in results)
        return total / max(phase_end - phase_start, 1e-9), phase_end - phase_start
    tokens = 0.0
    for r in results:
        lo, hi = max(r.first_token, opens), min(r.end, closes)
        if hi <= lo:
            continue
        span = r.end - r.first_token
        # One token at the first-token instant, the rest spread over the decode interval.
        tokens += (r.completion_tokens - 1) * (hi - lo) / span if span > 0 else 0.0
        if opens <= r.first_token <= closes:
            tokens += 1
    return tokens / (closes - opens), closes - opens


def _carries_tokens(delta) -> bool:
    """A stream delta with generated tokens of any kind: the answer, thinking
    (`reasoning_content`, an SGLang extension field) or a tool call."""
    if delta is None:
        return False
    extra = delta.model_extra or {}
    return bool(delta.content or extra.get("reasoning_content") or delta.tool_calls)


def _spec_details(chunk) -> dict | None:
    """`sglext.spec_tokens_details` of a chunk (0.5.23 sends it in a chunk of its own, before
    the usage chunk: serving_chat.py · _generate_chat_stream)."""
    sglext = (chunk.model_extra or {}).get("sglext")
    details = sglext.get("spec_tokens_details") if isinstance(sglext, dict) else None
    if isinstance(details, list):  # one per choice (n > 1)
        details = details[0] if details else None
    return details if isinstance(details, dict) else None


def _histogram(value) -> tuple[int, ...] | None:
    """A per-request accept histogram as SGLang reports it (a list of step counts), or None."""
    if not isinstance(value, list) or not value:
        return None
    try:
        hist = tuple(int(x) for x in value)
    except (TypeError, ValueError):
        return None
    return hist if sum(hist) > 0 and min(hist) >= 0 else None


def _sum_histograms(hists) -> tuple[int, ...] | None:
    hists = [h for h in hists if h]
    if not hists:
        return None
    out = [0] * max(len(h) for h in hists)
    for h in hists:
        for k, n in enumerate(h):
            out[k] += n
    return tuple(out)


def step_tokens(counts: list[tuple[int, int | None]]) -> list[int]:
    """Tokens per verify step from a stream's cumulative (completion_tokens, spec_verify_ct)
    per chunk: the differences, first and last chunk dropped; where the chunks count verify
    steps, a delta spanning more (or fewer) than one step was coalesced and is not kept."""
    steps = []
    pairs = list(zip(counts, counts[1:]))[:-1]
    for (t0, v0), (t1, v1) in pairs:
        if v0 is not None and v1 is not None and v1 - v0 != 1:
            continue
        if t1 > t0:
            steps.append(t1 - t0)
    return steps


def _reasoning_tokens(usage) -> int | None:
    """Thinking tokens of a completion: SGLang 0.5.23's usage.reasoning_tokens, or OpenAI's
    completion_tokens_details.reasoning_tokens; None when the server does not count them."""
    value = (usage.model_extra or {}).get("reasoning_tokens")
    details = getattr(usage, "completion_tokens_details", None)
    if not value and details is not None and details.reasoning_tokens:
        value = details.reasoning_tokens
    return int(value) if value else None


class _Runner:
    def __init__(self, url: str, api_key: str | None, bench: BenchConfig, model: str):
        self.bench = bench
        self.model = model
        self.client = openai.AsyncOpenAI(
            base_url=url.rstrip("/") + "/v1",
            api_key=api_key or "EMPTY",
            max_retries=0,
            # A hung server is seen after stall_timeout_s without a byte, not after a whole request.
            timeout=httpx.Timeout(bench.request_timeout_s, read=bench.stall_timeout_s, connect=10.0),
        )
        self.sent = 0
        self.ignore_eos = bench.ignore_eos
        headers = {"Authorization": f"Bearer {api_key}"} if api_key else {}
        self.http = httpx.AsyncClient(base_url=url.rstrip("/"), headers=headers, trust_env=False,
                                      timeout=httpx.Timeout(bench.request_timeout_s, read=bench.stall_timeout_s, connect=10.0))

    async def one(self, prompt: Prompt, max_tokens: int) -> RequestResult:
        try:
            return await asyncio.wait_for(self._one(prompt, max_tokens), self.bench.request_timeout_s)
        except asyncio.TimeoutError:
            raise MeasureError(f"a request took longer than request_timeout_s={self.bench.request_timeout_s:g} s") from None

    async def _one(self, prompt: Prompt, max_tokens: int) -> RequestResult:
        self.sent += 1
        extra = self._extra_body()
        start = time.monotonic()
        first = None
        chunk_times: list[float] = []
        usage = None
        finish = None
        details = None
        try:
            stream = await self.client.chat.completions.create(
                model=self.model,
                messages=list(prompt.messages),
                max_tokens=max_tokens,
                temperature=self.bench.temperature,
                top_p=self.bench.top_p,
                seed=self.bench.seed + self.sent if self.bench.temperature > 0 else None,
                stream=True,
                stream_options={"include_usage": True},
                extra_body=extra,
            )
            async for chunk in stream:
                if chunk.choices:
                    choice = chunk.choices[0]
                    if _carries_tokens(choice.delta):
                        now = time.monotonic()
                        first = first or now
                        chunk_times.append(now)
                    if choice.finish_reason:
                        finish = choice.finish_reason
                details = _spec_details(chunk) or details
                if chunk.usage is not None:
                    usage = chunk.usage
        except openai.APIStatusError as exc:
            raise MeasureError(f"the server answered {exc.status_code} mid-benchmark: {str(exc.message)[:200]}") from exc
        except openai.APITimeoutError as exc:
            raise MeasureError(f"the server sent nothing for {self.bench.stall_timeout_s:g} s mid-benchmark: it hangs") from exc
        except openai.APIConnectionError as exc:
            raise MeasureError(f"the server stopped answering mid-benchmark ({exc.__cause__ or exc})") from exc
        end = time.monotonic()
        if usage is None:
            raise MeasureError("the server sent no usage with stream_options.include_usage; token counts cannot be trusted")
        if first is None:
            first = end
        return RequestResult(
            prompt_tokens=usage.prompt_tokens,
            completion_tokens=usage.completion_tokens,
            start=start,
            first_token=first,
            end=end,
            chunk_times=tuple(chunk_times),
            finish_reason=finish,
            reasoning_tokens=_reasoning_tokens(usage),
            spec_verify_ct=details.get("spec_verify_ct") if details else None,
            accept_histogram=_histogram((details or {}).get("spec_correct_drafts_histogram")),
        )

    def _extra_body(self) -> dict:
        # Unknown fields are ignored by SGLang's request models (0.5.9 too); 0.5.23 answers
        # return_spec_tokens_details with sglext.spec_tokens_details in the stream.
        extra: dict = {"return_spec_tokens_details": True}
        if self.ignore_eos:
            extra["ignore_eos"] = True
        if self.bench.thinking != "server":
            extra["chat_template_kwargs"] = {"enable_thinking": self.bench.thinking == "on"}
        return extra

    async def generate(self, prompt: Prompt, max_tokens: int) -> tuple[int, int | None, tuple[int, ...] | None]:
        """One native `/generate` request: (completion tokens, spec_verify_ct, verify steps by
        drafts accepted) from its meta_info (tokenizer_manager.py ·
        _calculate_spec_decoding_metrics; the histogram is `spec_correct_drafts_histogram` on
        0.5.23, `spec_accept_histogram` on 0.5.9)."""
        body = {"text": prompt.text, "sampling_params": {"max_new_tokens": max_tokens, "temperature": self.bench.temperature,
                                                         "top_p": self.bench.top_p, "ignore_eos": self.ignore_eos}}
        try:
            res = await self.http.post("/generate", json=body)
        except httpx.HTTPError as exc:
            raise MeasureError(f"/generate: {exc}; the server stopped answering") from exc
        if res.status_code != 200:
            return 0, None, None
        meta = res.json().get("meta_info") or {}
        hist = _histogram(meta.get("spec_correct_drafts_histogram") or meta.get("spec_accept_histogram"))
        return int(meta.get("completion_tokens") or 0), meta.get("spec_verify_ct"), hist

    async def generate_steps(self, prompt: Prompt, max_tokens: int) -> list[int]:
        """One streaming native `/generate` request: the tokens each verify step produced
        (cumulative `meta_info.completion_tokens`, differenced).  Asked with stream_interval 1
        (a per-request override of `--stream-interval`), SGLang sends a chunk per decode
        iteration, but its tokenizer manager coalesces chunks a slow reader has not taken yet
        (tokenizer_manager.py · _wait_one_response): where the chunks carry the cumulative
        `spec_verify_ct`, only deltas of exactly one verify step are kept.  The first chunk (the
        prefill's token) and the last (max_tokens may cut it) are dropped."""
        body = {"text": prompt.text, "stream": True,
                "sampling_params": {"max_new_tokens": max_tokens, "temperature": self.bench.temperature,
                                    "top_p": self.bench.top_p, "ignore_eos": self.ignore_eos, "stream_interval": 1}}
        counts: list[tuple[int, int | None]] = []
        try:
            async with self.http.stream("POST", "/generate", json=body) as res:
                if res.status_code != 200:
                    return []
                async for line in res.aiter_lines():
                    if not line.startswith("data:") or line.strip() == "data: [DONE]":
                        continue
                    try:
                        meta = json.loads(line[5:])["meta_info"]
                        ct = meta.get("spec_verify_ct")
                        counts.append((int(meta["completion_tokens"]), None if ct is None else int(ct)))
                    except (ValueError, KeyError, TypeError, AttributeError):
                        return []
        except httpx.HTTPError:
            return []
        return step_tokens(counts)

    async def close(self) -> None:
        await self.http.aclose()
        await self.client.close()


async def _concurrent(runner: _Runner, prompts: list[Prompt], concurrency: int, progress: Progress | None, phase: str) -> list[RequestResult]:
    queue = list(reversed(prompts))
    results: list[RequestResult] = []

    async def worker() -> None:
        while queue:
            prompt = queue.pop()
            results.append(await runner.one(prompt, runner.bench.max_tokens))
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
class _Single:
    results: list[RequestResult]
    rates: list[float]  # one mean decode rate per pass
    tps: float
    ci95: tuple[float, float]
    reference_tps: float | None  # stopping at EOS, when the workload ignores it


@dataclass
class _Concurrent:
    results: list[RequestResult] = field(default_factory=list)
    by_level: dict[int, float] = field(default_factory=dict)
    whole_phase: dict[int, float] = field(default_factory=dict)
    windows: dict[int, float] = field(default_factory=dict)
    p99_itl: dict[int, float] = field(default_factory=dict)
    p99_ttft: dict[int, float] = field(default_factory=dict)


async def _warm_up(runner: "_Runner", bench: BenchConfig, workload: Workload, progress: Progress | None) -> None:
    for i, prompt in enumerate(workload.for_phase("warmup", bench.warmup_requests)):
        await runner.one(prompt, min(bench.max_tokens, 32))
        if progress:
            progress("warm-up", i + 1, bench.warmup_requests)


async def _single_phase(runner: "_Runner", bench: BenchConfig, workload: Workload, progress: Progress | None) -> _Single:
    """Passes over the same prompts until the mean's 95% CI is tight enough."""
    singles: list[RequestResult] = []
    rates: list[float] = []
    pass_prompts = workload.for_phase("single", bench.single_requests)
    while len(rates) < bench.single_max_passes:
        pass_rates = []
        for i, prompt in enumerate(pass_prompts):
            result = await runner.one(prompt, bench.max_tokens)
            singles.append(result)
            if result.decode_tps is not None:
                pass_rates.append(result.decode_tps)
            if progress:
                progress(f"single pass {len(rates) + 1}", i + 1, len(pass_prompts))
        if not pass_rates:
            raise MeasureError("no single-stream request produced two tokens; raise [bench] max_tokens")
        rates.append(statistics.fmean(pass_rates))
        if len(rates) >= bench.single_min_passes:
            mean, (lo, hi) = summarize_rate(rates)
            if (hi - lo) / 2 <= bench.single_target_ci * mean:
                break
    single_tps, ci = summarize_rate(rates)
    reference_tps = None
    if bench.ignore_eos:
        # One pass as real traffic ends (at EOS), to show how much ignore_eos inflates.
        runner.ignore_eos = False
        natural = [r.decode_tps for r in [await runner.one(p, bench.max_tokens) for p in pass_prompts] if r.decode_tps]
        runner.ignore_eos = True
        reference_tps = statistics.fmean(natural) if natural else None
    return _Single(singles, rates, single_tps, ci, reference_tps)


async def _concurrent_phases(runner: "_Runner", bench: BenchConfig, workload: Workload, progress: Progress | None) -> _Concurrent:
    out = _Concurrent()
    for level in bench.concurrency_levels:
        results = await _concurrent(runner, workload.for_phase("concurrent", bench.concurrent_requests), level, progress, f"concurrency {level}")
        out.by_level[level], out.windows[level] = steady_window_rate(results, level)
        span = max(r.end for r in results) - min(r.start for r in results)
        out.whole_phase[level] = sum(r.completion_tokens for r in results) / span if span > 0 else 0.0
        out.p99_itl[level] = _pct([x for r in results for x in r.itl_s()], 0.99) * 1000
        out.p99_ttft[level] = _pct([r.ttft_s for r in results], 0.99) * 1000
        out.results += results
    return out


async def _measure(
    *, url: str, api_key: str | None, bench: BenchConfig, info: ServerInfo, workload: Workload, client: ServerClient, progress: Progress | None
) -> Measurement:
    began = time.monotonic()
    model = str(info.args.get("served_model_name") or info.args.get("model_path") or "default")
    runner = _Runner(url, api_key, bench, model)
    try:
        await _warm_up(runner, bench, workload, progress)
        await asyncio.to_thread(client.flush_cache)
        single = await _single_phase(runner, bench, workload, progress)
        conc = await _concurrent_phases(runner, bench, workload, progress)
        accept, histogram = await _acceptance(runner, info, bench, workload, single.results + conc.results)
        server_accept = await asyncio.to_thread(client.accept_length)
    finally:
        await runner.close()
    return _measurement(bench, info, single, conc, accept, server_accept, histogram, duration_s=time.monotonic() - began)


async def _acceptance(runner: "_Runner", info: ServerInfo, bench: BenchConfig, workload: Workload,
                      results: list[RequestResult]) -> tuple[tuple[float | None, str], tuple[int, ...] | None]:
    """Accept length (tokens per verify step over the measured requests) and where it came
    from, and the verify steps by drafts accepted (tuner/search/model.py reads acceptance by
    depth from it), each from the best source the server has:
    1. the chat stream's sglext.spec_tokens_details (0.5.23): spec_verify_ct and
       spec_correct_drafts_histogram of every measured request;
    2. native /generate's meta_info over the single-stream prompts (0.5.9: spec_verify_ct and
       spec_accept_histogram);
    3. for the histogram only, the depth probe (`depth_histogram`): verify steps read off a
       stream, for a server that reports no histogram."""
    if not info.speculative:
        return (1.0, "no speculation"), None  # one token per forward: exact, not a default
    counted = [r for r in results if r.spec_verify_ct]
    accept: tuple[float | None, str] = (None, "unknown")
    if counted and len(counted) == len(results):
        accept = (sum(r.completion_tokens for r in counted) / sum(r.spec_verify_ct for r in counted), "sglext")
    histogram = _sum_histograms(r.accept_histogram for r in results) if all(r.accept_histogram for r in results) else None
    if accept[0] is None or histogram is None:
        # A server without per-request details on the chat route (0.5.9): the same prompts
        # through native /generate, whose meta_info carries spec_verify_ct.
        got = [await runner.generate(p, bench.max_tokens) for p in workload.for_phase("single", bench.single_requests)]
        pairs = [(tokens, ct) for tokens, ct, _ in got if ct]
        if accept[0] is None and pairs:
            accept = (sum(t for t, _ in pairs) / sum(ct for _, ct in pairs), "generate")
        if histogram is None and got and all(h for _, _, h in got):
            histogram = _sum_histograms(h for _, _, h in got)
    if histogram is None:
        histogram = await depth_histogram(runner, info, bench, workload)
    return accept, histogram


async def depth_histogram(runner: "_Runner", info: ServerInfo, bench: BenchConfig, workload: Workload) -> tuple[int, ...] | None:
    """The depth probe, for a server that reports no accept histogram: the single-stream
    prompts once more through streaming `/generate`, counting verify steps by accepted drafts
    (`generate_steps`).  A few seconds per trial; None when the stream gives no per-step counts."""
    hist: list[int] = []
    for prompt in workload.for_phase("single", bench.single_requests):
        for tokens in await runner.generate_steps(prompt, bench.max_tokens):
            while len(hist) < tokens:
                hist.append(0)
            hist[tokens - 1] += 1
    return tuple(hist) if sum(hist) else None


def _measurement(bench: BenchConfig, info: ServerInfo, single: _Single, conc: _Concurrent, accept: tuple[float | None, str],
                 server_accept: float | None, histogram: tuple[int, ...] | None, *, duration_s: float) -> Measurement:
    thinking = [r.reasoning_tokens for r in single.results + conc.results if r.reasoning_tokens is not None]
    ttfts = [r.ttft_s * 1000 for r in single.results]
    itls = [x * 1000 for r in single.results for x in r.itl_s()]
    e2es = [(r.end - r.start) * 1000 for r in single.results]
    return Measurement(
        single_tps=single.tps,
        single_runs=tuple(single.rates),
        single_ci95=single.ci95,
        concurrent_tps_by_level=conc.by_level,
        concurrent_window_s=conc.windows,
        max_total_num_tokens=info.max_total_num_tokens,
        max_running_requests=info.max_running_requests,
        request_tokens=bench.request_tokens,
        accept_length=accept[0],
        accept_length_source=accept[1],
        accept_histogram=histogram,
        server_accept_length=server_accept,
        ranks=info.ranks,
        thinking_tokens=sum(thinking) if thinking else None,
        ttft_ms=statistics.median(ttfts),
        ttft_p90_ms=_pct(ttfts, 0.9),
        ttft_p99_ms=_pct(ttfts, 0.99),
        itl_ms=statistics.median(itls) if itls else float("nan"),
        itl_p90_ms=_pct(itls, 0.9),
        itl_p99_ms=_pct(itls, 0.99),
        e2e_ms=statistics.median(e2es),
        e2e_p90_ms=_pct(e2es, 0.9),
        e2e_p99_ms=_pct(e2es, 0.99),
        concurrent_p99_itl_ms=conc.p99_itl,
        concurrent_p99_ttft_ms=conc.p99_ttft,
        completion_tokens=sum(r.completion_tokens for r in single.results + conc.results),
        duration_s=duration_s,
        ignore_eos=bench.ignore_eos,
        greedy_inflation=single.tps / single.reference_tps if single.reference_tps else None,
        concurrent_ttft_p99_ms=max(conc.p99_ttft.values()) if conc.p99_ttft else float("nan"),
        concurrent_phase_tps_by_level=conc.whole_phase,
    )


def measure(
    *,
    url: str,
    bench: BenchConfig,
    info: ServerInfo,
    workload: Workload,
    client: ServerClient,
    api_key: str | None = None,
    progress: Progress | None = None,
) -> Measurement:
    """Run the benchmark against a ready server; raise MeasureError if it fails or dies."""
    return asyncio.run(
        _measure(url=url, api_key=api_key, bench=bench, info=info, workload=workload, client=client, progress=progress)
    )
