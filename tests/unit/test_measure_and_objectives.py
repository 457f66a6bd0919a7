"""Benchmark arithmetic and the objectives, on hand-built samples."""


import pytest

from objectives import capacity, concurrent_tps, single_tps
from tuner.measure.runner import Measurement, RequestResult, steady_window_rate, summarize_rate
from tuner.measure.objectives import load_objectives, score
from tuner.errors import ConfigError


def _m(**kw) -> Measurement:
    base = dict(single_tps=150.0, single_runs=(149.0, 151.0), single_ci95=(140.0, 160.0), concurrent_tps_by_level={16: 1200.0, 32: 1500.0},
                concurrent_window_s={16: 10.0, 32: 10.0}, max_total_num_tokens=300_000, max_running_requests=17, request_tokens=8192,
                accept_length=2.9, ttft_ms=50, ttft_p90_ms=60, ttft_p99_ms=70, itl_ms=6, itl_p90_ms=7, itl_p99_ms=9, e2e_ms=900,
                e2e_p90_ms=950, e2e_p99_ms=990)
    base.update(kw)
    return Measurement(**base)


def test_capacity_is_the_smaller_of_slots_and_kv():
    assert capacity.score(_m()) == 17  # 300000 // 8192 = 36 > 17 slots
    assert capacity.score(_m(max_total_num_tokens=100_000)) == 12


def test_objectives_expand_per_concurrency_level():
    objs = load_objectives(["single_tps", "concurrent_tps", "capacity"], [16, 32])
    assert [o.name for o in objs] == ["single_tps", "concurrent_tps@16", "concurrent_tps@32", "capacity"]
    assert score(objs, _m()) == [150.0, 1200.0, 1500.0, 17.0]
    assert concurrent_tps.score(_m()) == 1200.0 and single_tps.score(_m()) == 150.0


def test_unknown_objective_lists_the_choices():
    with pytest.raises(ConfigError, match="unknown objective 'tps'; available: accept_length, capacity, concurrent_tps, single_tps"):
        load_objectives(["tps"], [16])


def test_decode_rate_counts_usage_tokens_after_the_first():
    r = RequestResult(prompt_tokens=10, completion_tokens=101, start=0.0, first_token=0.5, end=1.5, chunk_times=(0.5, 1.0, 1.5))
    assert r.decode_tps == pytest.approx(100.0)
    assert r.ttft_s == 0.5
    # 3 chunks carried 100 tokens after the first: 50 per gap, ITL 10 ms each
    assert r.itl_s()[0] == pytest.approx(0.01)


def test_confidence_interval_shrinks_with_agreeing_samples():
    mean, (lo, hi) = summarize_rate([100.0, 101.0, 99.0, 100.0])
    assert mean == 100.0 and hi - lo < 3.0
    _, (lo2, hi2) = summarize_rate([80.0, 120.0])
    assert hi2 - lo2 > 50


def test_steady_window_excludes_ramp_up_and_drain():
    # A closed loop with 4 slots: each request waits 0.5 s for its first token, then decodes
    # 100 tokens in 1 s, and the slot sends the next one.  Steady state: 4 x 101 tokens / 1.5 s.
    results = []
    for wave in range(20):
        for slot in range(4):
            start = wave * 1.5 + slot * 0.1
            results.append(RequestResult(10, 101, start, start + 0.5, start + 1.5))
    # The last request sent is long: 1,000 tokens alone at the end (the drain).
    results.append(RequestResult(10, 1001, 30.0, 30.5, 40.5))
    steady = 4 * 101 / 1.5
    rate, window = steady_window_rate(results, 4)
    naive = sum(r.completion_tokens for r in results) / (max(r.end for r in results) - min(r.start for r in results))
    assert rate == pytest.approx(steady, rel=0.05)
    assert window < 31
    assert naive < 0.9 * steady


def test_the_loop_watch_sees_a_client_that_could_not_run_mid_request():
    import asyncio
    import time

    from tuner.measure.stalls import LoopWatch, stalled

    async def main():
        watch = LoopWatch()
        watch.start()
        await asyncio.sleep(0.03)  # it has ticked
        start = time.monotonic()
        time.sleep(0.2)  # the loop cannot run, as when the process is descheduled on a busy machine
        end = time.monotonic()
        starved = watch.starved_s(start, end)  # asked before the watch's own late wake-up has run
        gaps = watch.starved_gaps((start - 0.01, start, end))
        await watch.stop()
        return starved, start, end, gaps

    starved, start, end, gaps = asyncio.run(main())
    assert starved >= 0.15 and stalled(starved, start, end)
    assert 1 in gaps  # the chunk gap the stall fell in


def test_a_chunk_gap_the_client_was_starved_through_is_not_an_inter_token_latency():
    # Chunks every 10 ms, one gap of 300 ms while the client could not run: without it the
    # p99 ITL of every stream in flight would be 300 ms and fail an SLO the server meets.
    times = (0.0, 0.01, 0.02, 0.32, 0.33, 0.34)
    r = RequestResult(10, 6, 0.0, 0.0, 0.34, chunk_times=times, client_stall_gaps=(2,))
    assert max(r.itl_s()) == pytest.approx(0.01) and len(r.itl_s()) == 4
    assert max(RequestResult(10, 6, 0.0, 0.0, 0.34, chunk_times=times).itl_s()) == pytest.approx(0.30)


def test_a_single_stream_request_timed_while_the_client_was_starved_is_sent_again():
    # The live benchmark's family:0 seed 4: one request read in a burst after a stall reported
    # 5.6x the server's rate and steered the study.  The starved request is sent again; its
    # burst does not reach single_tps, and a request starved on every try is a caveat.
    import asyncio

    from tuner.config import parse_config
    from tuner.measure import phases
    from tuner.measure.caveats import caveats
    from tuner.measure.workload import Prompt, Workload

    bench = parse_config('[study]\nname = "s"\n[server]\ncommand = "x"\n[bench]\nsingle_requests = 3\n'
                         'single_min_passes = 1\nsingle_max_passes = 1\n').bench
    workload = Workload([Prompt(({"role": "user", "content": f"question {i}"},), "chat", f"q{i}") for i in range(6)])

    class Runner:
        def __init__(self, starved):
            self.starved, self.calls = starved, 0

        async def one(self, prompt, max_tokens):
            self.calls += 1
            t = float(self.calls)
            if self.calls in self.starved:  # first chunk read 0.39 s late, the rest in a burst
                return RequestResult(10, 101, t, t + 0.39, t + 0.4, client_stall_s=0.39, request_class=prompt.request_class)
            return RequestResult(10, 101, t, t + 0.02, t + 1.02, request_class=prompt.request_class)  # 100 tok/s

    runner = Runner(starved={2})
    single = asyncio.run(phases.single_phase(runner, bench, workload, None))
    assert single.tps == pytest.approx(100.0) and single.stall_resent == 1 and single.stall_kept == 0
    assert runner.calls == 4

    always = Runner(starved={2, 3, 4})  # starved on all STALL_TRIES sends
    single = asyncio.run(phases.single_phase(always, bench, workload, None))
    assert single.stall_resent == phases.STALL_TRIES - 1 and single.stall_kept == 1
    warning = caveats(_m(client_stall_resent=single.stall_resent, client_stall_kept=single.stall_kept), bench)
    assert any("starved of CPU" in w and "quieter machine" in w for w in warning)
