"""The search over load behind slo_capacity (tuner/measure/load_sweep.py), on synthetic curves."""

import asyncio
import random

import pytest

from tuner.config import ConfigError, SloConfig, parse_config
from tuner.measure.load_sweep import LoadPoint, point_of, search, smoothed
from tuner.measure.result import RequestResult


def _point(load: int, itl: float, *, ttft: float = 100.0, attainment: float = 1.0, source: str = "sweep") -> LoadPoint:
    return LoadPoint(load=load, requests=2 * load, itl_ms={q: itl for q in (50, 90, 95, 99)}, ttft_ms={q: ttft for q in (50, 90, 95, 99)},
                     attainment=attainment, goodput_rps=1.0, tps=100.0, source=source, seconds=1.0)


def _server(itl_at, seed=0, noise=0.0):
    """measure(load) on a server whose p95 ITL at a load is itl_at(load), with relative noise."""
    rng = random.Random(seed)
    asked: list[int] = []

    async def measure(load: int) -> LoadPoint:
        asked.append(load)
        return _point(load, itl_at(load) * (1 + rng.gauss(0, noise)))

    return measure, asked


def _exhaustive(itl_at, cap, limit):
    return max([c for c in range(1, cap + 1) if all(itl_at(k) <= limit for k in range(1, c + 1))], default=0)


@pytest.mark.parametrize("slope,cap", [(0.3, 64), (1.0, 48), (0.1, 200), (2.5, 64)])
def test_search_agrees_with_an_exhaustive_sweep_within_its_precision_in_at_most_six_points(slope, cap):
    slo = SloConfig(p95_itl_ms=50)
    itl_at = lambda c: 10 + slope * c  # noqa: E731
    measure, asked = _server(itl_at)
    curve = asyncio.run(search(measure, [_point(1, itl_at(1), source="single")], cap=cap, slo=slo))
    truth = _exhaustive(itl_at, cap, 50)
    assert abs(curve.slo_capacity - truth) <= max(1, 0.10 * truth), (curve.slo_capacity, truth, asked)
    assert curve.slo_capacity <= truth  # the answer is a load that was measured to hold
    assert len(asked) <= 5, asked
    assert 1 not in asked  # the single-stream phase is load 1


def test_noise_is_smoothed_monotone_so_one_bad_point_does_not_end_the_search_low():
    slo = SloConfig(p95_itl_ms=50)
    itl_at = lambda c: 10 + 1.0 * c  # noqa: E731  -> 40 in flight is the truth
    caps = []
    for seed in range(20):
        measure, _ = _server(itl_at, seed=seed, noise=0.03)
        caps.append(asyncio.run(search(measure, [_point(1, 11)], cap=64, slo=slo)).slo_capacity)
    assert sum(abs(c - 40) <= 4 for c in caps) >= 18, caps


def test_smoothing_pools_a_dip_so_a_load_holds_only_if_every_lower_load_does():
    slo = SloConfig(p95_itl_ms=50)
    points = [_point(1, 10), _point(2, 65), _point(4, 40), _point(8, 70)]  # 4 dips below 2
    broken = smoothed(points, slo)
    assert [bool(broken[k][1]) for k in (1, 2, 4, 8)] == [False, True, True, True]


def test_an_slo_no_load_meets_gives_zero_with_the_reason():
    slo = SloConfig(p95_itl_ms=5, p95_ttft_ms=1000)
    measure, asked = _server(lambda c: 10 + c)
    curve = asyncio.run(search(measure, [_point(1, 11, source="single")], cap=32, slo=slo))
    assert curve.slo_capacity == 0
    assert asked == []  # nothing above a load that fails is worth measuring
    assert "no load holds the SLO" in curve.note and "p95 ITL 11.0 ms > 5 ms" in curve.note


def test_the_running_cap_bounds_the_search_and_reused_levels_above_it_are_dropped():
    slo = SloConfig(p95_itl_ms=50)
    measure, asked = _server(lambda c: 10)
    curve = asyncio.run(search(measure, [_point(1, 10), _point(16, 10, source="concurrent"), _point(64, 10)], cap=24, slo=slo))
    assert curve.slo_capacity == 24 and asked == [24]
    assert [p.load for p in curve.points] == [1, 16, 24]
    assert "running-request cap (24)" in curve.note


def test_attainment_is_a_promise_too():
    slo = SloConfig(p95_itl_ms=50, attainment=0.9)

    async def measure(load):
        return _point(load, 10, attainment=1.0 if load <= 6 else 0.5)

    curve = asyncio.run(search(measure, [_point(1, 10)], cap=64, slo=slo))
    assert curve.slo_capacity == 6
    assert "of requests good < 90%" in curve.note


def test_max_points_stops_the_search_and_says_so():
    slo = SloConfig(p95_itl_ms=50, max_points=2)
    measure, asked = _server(lambda c: 10 + 0.01 * c)
    curve = asyncio.run(search(measure, [_point(1, 10)], cap=256, slo=slo))
    assert len(asked) == 2
    assert curve.slo_capacity == max(asked)  # every load measured holds; the search stopped short of the cap
    assert "stopped at [slo] max_points = 2 below the running-request cap (256)" in curve.note


def _request(start, ttft, gaps, tokens_per_chunk=1):
    times = [start + ttft]
    for g in gaps:
        times.append(times[-1] + g)
    return RequestResult(prompt_tokens=10, completion_tokens=1 + tokens_per_chunk * len(gaps), start=start, first_token=start + ttft,
                         end=times[-1], chunk_times=tuple(times))


def test_a_point_leaves_out_the_ramp_up_and_counts_a_request_good_only_if_it_meets_every_promise():
    slo = SloConfig(p95_itl_ms=50, p95_ttft_ms=500)
    ramp = [_request(0.0, 2.0, [0.01] * 20) for _ in range(2)]  # the burst: TTFT 2 s, not judged
    good = [_request(3.0 + i, 0.1, [0.01] * 20) for i in range(3)]
    slow = [_request(10.0, 0.1, [0.2] * 20)]  # ITL 200 ms
    stalled = [_request(11.0, 0.1, [0.01] * 19 + [0.3])]  # one prefill stall: time per output token 24.5 ms, good
    p = point_of(ramp + good + slow + stalled, 2, slo)
    assert p.requests == 5
    assert p.attainment == pytest.approx(0.8)
    assert p.ttft_ms[95] == pytest.approx(100.0)


def _config(slo: str, objectives='["single_tps", "slo_capacity"]'):
    return parse_config(f"""
[study]
name = "s"
objectives = {objectives}
[server]
command = "python -m sglang_emulator --model-path m --speculative-algorithm NEXTN"
{slo}
""", path="s.toml")


def test_slo_config_errors_are_one_line_naming_the_fix():
    with pytest.raises(ConfigError, match=r"^s.toml \[slo\] p95_itl: unknown key; did you mean p95_itl_ms\?$"):
        _config("[slo]\np95_itl = 50")
    with pytest.raises(ConfigError, match=r"\[slo\]: no latency promise; add one, e.g. p95_itl_ms = 50"):
        _config("[slo]\nattainment = 0.9")
    with pytest.raises(ConfigError, match=r"\[study\] objectives: slo_capacity needs .* add an \[slo\] section"):
        _config("")
    with pytest.raises(ConfigError, match=r"\[slo\] precision"):
        _config("[slo]\np95_itl_ms = 50\nprecision = 2")


def test_the_search_runs_only_when_an_objective_needs_it():
    assert _config("[slo]\np99_itl_ms = 40").sweep_slo.promises == [("itl", 99, 40.0)]
    assert _config("[slo]\np95_itl_ms = 40", objectives='["single_tps"]').sweep_slo is None
    assert _config("", objectives='["single_tps"]').slo is None


def _slo_study():
    """A study of single_tps and slo_capacity where the two disagree: deep speculation is the
    fastest stream, shallow speculation holds more users within the promise."""
    import optuna
    from optuna.trial import create_trial

    study = optuna.create_study(directions=["maximize"] * 2, storage=optuna.storages.InMemoryStorage(), study_name="slo")
    study.set_metric_names(["single_tps", "slo_capacity"])
    for steps, single, cap, broke in ((5, 230.0, 6, 7), (2, 160.0, 14, 18), (1, 120.0, 12, 13)):
        curve = [{"load": c, "source": "sweep", "p95_itl_ms": 8 + 50 / steps * c / 10, "p95_ttft_ms": 30.0 * c, "holds": c <= cap}
                 for c in sorted({1, cap, broke})]
        attrs = {"flags": {"speculative_num_steps": steps, "speculative_eagle_topk": 1, "speculative_num_draft_tokens": steps + 1,
                           "mem_fraction_static": 0.9},
                 "slo_curve": curve, "slo_capacity": cap, "slo_sweep_s": 12.0 + steps, "slo_promise": {"p95_itl_ms": 20, "attainment": 0.95, "arrival": "closed"},
                 "slo_note": f"holds at {cap}"}
        study.add_trial(create_trial(values=[single, float(cap)], user_attrs=attrs, params={}, distributions={}))
    return study


def test_best_picks_the_configuration_holding_the_most_users_within_the_slo():
    from tuner.results.picks import pick

    study = _slo_study()
    assert pick(study, "single_tps").trial.number == 0
    chosen = pick(study, "slo_capacity")
    assert chosen.trial.number == 1 and "the highest slo_capacity (14.0)" in chosen.reason


def test_the_report_draws_latency_against_load_with_the_slo_and_states_the_extra_seconds():
    from tuner.results.report import build

    report = build(_slo_study())
    assert "slo" in [p.name for p in report.plots]
    plot = next(p for p in report.plots if p.name == "slo")
    assert plot.png.startswith(b"\x89PNG") and "slo_capacity" in plot.caption
    row = dict(report.summary)["search over load (slo_capacity)"]
    assert "p95_itl_ms 20" in row and "median 14.0 s extra per trial" in row


def test_poisson_arrival_searches_a_request_rate_down_as_well_as_up():
    slo = SloConfig(p95_ttft_ms=500, arrival="poisson")
    asked = []

    async def measure(rate):  # TTFT grows as the rate nears 3 req/s, the server's throughput
        asked.append(rate)
        return _point(rate, 10, ttft=100 / max(1 - rate / 3, 0.01))

    curve = asyncio.run(search(measure, [], cap=6.0, slo=slo, start=4.0))
    assert asked[0] == 4.0 and asked[1] == 2.0  # the start breaks: half of it
    assert 2.4 * 0.9 <= curve.slo_capacity <= 2.4 and len(asked) <= 6  # the truth: 2.4 req/s
    assert "req/s" in curve.note


def test_the_dry_run_estimate_counts_the_search_over_load():
    import optuna

    from tuner.results.estimate import DEFAULT_MEASURE_S, DEFAULT_SLO_SWEEP_S, estimate

    fresh = estimate([], n_trials=5, n_baselines=0, gpus=1, memory_edge_searched=False, load_sweep=True)
    assert fresh.measure_s == DEFAULT_MEASURE_S + DEFAULT_SLO_SWEEP_S
    assert any("search over load" in s for s in fresh.sources)
    swept = optuna.trial.create_trial(values=[1.0], user_attrs={"startup_s": 10.0, "measure_s": 50.0, "slo_sweep_s": 30.0})
    known = estimate([swept], n_trials=5, n_baselines=0, gpus=1, load_sweep=True)
    assert known.measure_s == 50.0  # the measured trials' measure_s holds their search
    assert any("of which the search over load 30 s" in s for s in known.sources)
    assert estimate([], n_trials=5, n_baselines=0, gpus=1).measure_s == DEFAULT_MEASURE_S
