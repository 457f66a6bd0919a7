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
