"""The benchmark: what one trial measures on a ready server, through the `openai` client.

Read top-down: `measure()` here runs the phases (`phases.py`) over the wire client
(`wire.py`) and assembles the `Measurement` (`result.py`) with the statistics of `stats.py`.

Order (each phase's definition is in the README, "What the figures mean"):
1. warm-up requests, not measured;
2. `/flush_cache`, which also zeroes SGLang's accept-length counters;
3. single-stream phase: passes over about `single_requests` prompts, every request class of
   the mix in each (workload.py · single_pass), one streaming request at a time; passes repeat
   (at least `single_min_passes`) until the 95% confidence interval of the mix-weighted mean
   pass rate, and of every class's, is within `single_target_ci` of it, or `single_max_passes`,
   as hyperfine repeats a command until its spread is known;
4. concurrent phase, per concurrency level: a closed loop keeping `concurrency` requests in
   flight, drawn in the mix's proportions, until `level_requests(level)` have been sent or
   `level_seconds` have passed since its first completion (steady state); the rate counts
   only the steady window (all slots busy), not the ramp-up or the drain;
5. accept length per request: completion tokens over verify steps (`spec_verify_ct`), summed
   over phases 3-4, from the chat stream's `sglext.spec_tokens_details` (0.5.23, asked with
   `return_spec_tokens_details`) or, on servers without it, from native `/generate` requests'
   `meta_info`.  The server's `avg_spec_accept_length` is kept as a cross-check only: SGLang
   folds its counters every `--decode-log-interval` (40) decode steps per rank, so a short
   phase reads stale or nothing (docs/sglang-real-server.md rows 5, 6).  Unknown stays unknown.
   Per request class the same counts give each class's accept length (by_class.py).
   The same sources give the verify steps by drafts accepted (`accept_histogram`, from which
   tuner/search/model.py reads acceptance by depth); a server reporting none gets a depth probe
   (row 18: a stream's chunks are not always one verify step each);
6. with `[slo]` needed (the objective slo_capacity), the search over load
   (`load_sweep.py`): the loads measured above reused, new closed-loop loads bracketed and
   bisected up to the running-request cap.

Tokens are counted from each response's `usage`, never from stream chunks: SGLang sends every
token accepted in one verify step as one chunk.  A thinking model's first token may be
thinking (`delta.reasoning_content`) or a tool call: the first token of any kind starts the
clock, and a request that is all thinking counts (row 7).
"""

from __future__ import annotations

import asyncio
import statistics
import time

from tuner.config import BenchConfig, SloConfig
from tuner.interrupts import run_async
from tuner.measure import load_sweep, phases
from tuner.measure.by_class import auto_request_tokens, class_figures
from tuner.measure.result import ClassFigures, Measurement, Progress, RequestResult
from tuner.measure.stats import percentile, steady_window_rate, summarize_rate
from tuner.measure.wire import StreamClient, step_tokens
from tuner.measure.workload import Workload
from tuner.server.client import ServerClient, ServerInfo

# The schema and the statistics are re-exported: objective modules and scripts import them from here.
__all__ = ["measure", "Measurement", "ClassFigures", "RequestResult", "Progress", "summarize_rate", "steady_window_rate", "step_tokens"]


def measure(
    *,
    url: str,
    bench: BenchConfig,
    info: ServerInfo,
    workload: Workload,
    client: ServerClient,
    api_key: str | None = None,
    progress: Progress | None = None,
    slo: SloConfig | None = None,
) -> Measurement:
    """Run the benchmark against a ready server; raise MeasureError if it fails or dies.
    With `slo`, also the search over load behind slo_capacity (6. below)."""
    return run_async(
        _measure(url=url, api_key=api_key, bench=bench, info=info, workload=workload, client=client, progress=progress, slo=slo)
    )


async def _measure(
    *, url: str, api_key: str | None, bench: BenchConfig, info: ServerInfo, workload: Workload, client: ServerClient, progress: Progress | None,
    slo: SloConfig | None = None,
) -> Measurement:
    began = time.monotonic()
    model = str(info.args.get("served_model_name") or info.args.get("model_path") or "default")
    runner = StreamClient(url, api_key, bench, model)
    try:
        await phases.warm_up(runner, bench, workload, progress)
        await asyncio.to_thread(client.flush_cache)
        single = await phases.single_phase(runner, bench, workload, progress)
        conc = await phases.concurrent_phases(runner, bench, workload, progress)
        accept = await phases.acceptance(runner, info, bench, workload, single.results + conc.results)
        server_accept = await asyncio.to_thread(client.accept_length)
        curve = None
        if slo is not None:
            curve = await load_sweep.sweep(runner, slo, workload, cap=info.max_running_requests, single=single.results,
                                           levels=conc.level_results, progress=progress, seed=bench.seed)
    finally:
        await runner.close()
    by_class = _by_class(workload, single, conc, info, accept)
    return _measurement(bench, info, single, conc, accept, server_accept, by_class, duration_s=time.monotonic() - began,
                        load_curve=curve)


def _by_class(workload: Workload, single: phases.Single, conc: phases.Concurrent, info: ServerInfo,
              accept: phases.Acceptance) -> dict[str, ClassFigures]:
    return class_figures(workload.mix, single.results, single.class_rates, conc.results, conc.level_results, info.speculative,
                         accept_fallback=accept.by_class)


def _measurement(bench: BenchConfig, info: ServerInfo, single: phases.Single, conc: phases.Concurrent, accept: phases.Acceptance,
                 server_accept: float | None, by_class: dict[str, ClassFigures], *,
                 duration_s: float, load_curve: load_sweep.LoadCurve | None = None) -> Measurement:
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
        request_tokens=auto_request_tokens(by_class) if bench.request_tokens == "auto" else bench.request_tokens,
        request_tokens_auto=bench.request_tokens == "auto",
        by_class=by_class,
        accept_length=accept.length,
        accept_length_source=accept.source,
        accept_histogram=accept.histogram,
        server_accept_length=server_accept,
        ranks=info.ranks,
        thinking_tokens=sum(thinking) if thinking else None,
        ttft_ms=statistics.median(ttfts),
        ttft_p90_ms=percentile(ttfts, 0.9),
        ttft_p99_ms=percentile(ttfts, 0.99),
        itl_ms=statistics.median(itls) if itls else float("nan"),
        itl_p90_ms=percentile(itls, 0.9),
        itl_p99_ms=percentile(itls, 0.99),
        e2e_ms=statistics.median(e2es),
        e2e_p90_ms=percentile(e2es, 0.9),
        e2e_p99_ms=percentile(e2es, 0.99),
        concurrent_p99_itl_ms=conc.p99_itl,
        concurrent_p99_ttft_ms=conc.p99_ttft,
        completion_tokens=sum(r.completion_tokens for r in single.results + conc.results),
        duration_s=duration_s,
        ignore_eos=bench.ignore_eos,
        greedy_inflation=single.tps / single.reference_tps if single.reference_tps else None,
        concurrent_ttft_p99_ms=max(conc.p99_ttft.values()) if conc.p99_ttft else float("nan"),
        concurrent_phase_tps_by_level=conc.whole_phase,
        load_curve=load_curve,
        client_stall_resent=single.stall_resent,
        client_stall_kept=single.stall_kept,
    )
