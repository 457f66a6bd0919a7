"""The per-load schedule's pure half: SGLang's loader rules, the choice per level with ties, and
which measurements are reused (tuner/results/adaptive_table.py)."""

from __future__ import annotations

import json

import optuna
import pytest
from optuna.distributions import IntDistribution
from optuna.trial import TrialState, create_trial

from tuner.results import adaptive_table as sch


# SGLang 0.5.23, srt/speculative/adaptive_spec_params.py · _load_adaptive_config (l.103-139),
# verbatim but for reading a dict instead of opening the path: the table must pass it.
def sglang_load_adaptive_config(cfg: dict) -> tuple[dict, dict[int, dict]]:
    bs_entries: dict[int, dict] = {}
    for key, entry in cfg.items():
        if not key.isdigit():
            continue

        steps = entry.get("candidate_steps")
        if (
            not isinstance(steps, list)
            or not steps
            or not all(isinstance(s, int) and s >= 0 for s in steps)
        ):
            raise ValueError(
                f"BS {key}: candidate_steps must be a list of non-negative ints, "
                f"got {steps!r}"
            )
        bs_entries[int(key)] = entry

    if not bs_entries:
        raise ValueError(
            "speculative_adaptive_config must contain at least one integer-string "
            'BS key, e.g. {"1": {"candidate_steps": [1,3,7]}}. '
            f"Got keys: {list(cfg.keys())}"
        )
    return cfg, bs_entries


def figs_from(table: dict[int, dict[int, float]], noise: float = sch.DEFAULT_NOISE) -> dict:
    return {level: {s: sch.Figure(s, level, tps, noise * tps, 1, None, ()) for s, tps in row.items()} for level, row in table.items()}


def test_the_written_table_loads_in_sglangs_loader_and_reads_back():
    cfg = sch.table_for({1: [3, 5], 8: [1], 32: [0]})
    text = sch.dumps(cfg)
    loaded = json.loads(text)
    _, slots = sglang_load_adaptive_config(loaded)
    assert sorted(slots) == [1, 8, 32]
    assert loaded == {"1": {"candidate_steps": [3, 5]}, "8": {"candidate_steps": [1]}, "32": {"candidate_steps": [0]}}
    assert list(loaded) == ["1", "8", "32"]  # keys are the levels as strings, in order
    # No hysteresis or EMA keys unless measured: SGLang's defaults apply (AdaptiveStepSlot.__init__).
    assert all(set(v) == {"candidate_steps"} for v in loaded.values())
    assert sch.validate(loaded) == [0, 1, 3, 5]  # --speculative-num-steps must be one of these


def test_the_default_table_is_sglangs_verbatim_and_valid():
    _, slots = sglang_load_adaptive_config(sch.DEFAULT_ADAPTIVE_CONFIG)
    assert {k: v["candidate_steps"] for k, v in slots.items()} == {1: [1, 3, 5, 7], 8: [0, 1, 3], 32: [0, 1], 64: [0]}


@pytest.mark.parametrize("bad", [
    {"1": {"candidate_steps": []}},
    {"1": {"candidate_steps": [-1]}},
    {"1": {"candidate_steps": [1.0]}},
    {"1": {"candidate_steps": "3"}},
    {"1": {}},
    {"ema_alpha": 0.2},
])
def test_validate_refuses_what_sglang_refuses_with_its_message(bad):
    with pytest.raises(ValueError) as ours:
        sch.validate(bad)
    with pytest.raises(ValueError) as theirs:
        sglang_load_adaptive_config(bad)
    assert str(ours.value) == str(theirs.value)


def test_non_digit_keys_are_globals_not_slots():
    assert sch.validate({"ema_alpha": 0.3, "4": {"candidate_steps": [2]}}) == [2]
    assert sch.candidates_of({"ema_alpha": 0.3, "4": {"candidate_steps": [2, 1]}}) == {4: [1, 2]}


def test_choice_per_level_is_the_single_measured_best():
    figs = figs_from({
        1: {0: 100, 1: 160, 2: 200, 3: 203, 4: 190},  # 2 and 3 within noise: only the measured best is kept
        16: {0: 900, 1: 1000, 2: 960, 3: 850},
        64: {0: 2000, 1: 1700, 2: 1500, 3: 1300},  # speculation off wins at load
    })
    # One candidate per slot: SGLang moves within a slot by acceptance (about round(ema) + 1),
    # not by throughput, so a tied candidate would let it settle below the measured best.
    assert sch.choose(figs) == {1: [3], 16: [1], 64: [0]}


def test_an_exact_tie_takes_the_smaller_steps_and_zero_competes():
    figs = figs_from({8: {0: 500, 1: 500, 2: 400}})
    assert sch.choose(figs) == {8: [0]}


def _capped(table: dict[int, dict[int, float]], caps: dict[int, int]) -> dict:
    return {lvl: {s: sch.Figure(s, lvl, tps, 0.02 * tps, 1, None, (), caps[s]) for s, tps in row.items()} for lvl, row in table.items()}


def test_the_largest_candidate_caps_every_level_so_a_deep_candidate_must_pay_for_itself():
    # Steps 4 is best alone but its launch holds only 8 requests; adaptive sizes for the largest
    # candidate, so a table with 4 anywhere runs at most 8 everywhere: level 32 would lose 40%.
    figs = _capped({
        1: {0: 60, 2: 170, 4: 200},
        8: {0: 400, 2: 900, 4: 1000},
        32: {0: 1300, 2: 1800, 4: 1000},  # 4 ran 8 requests here (its cap)
    }, caps={0: 64, 2: 40, 4: 8})
    assert sch.running_cap(figs, 4) == 8
    assert sch.choose(figs) == {1: [2], 8: [2], 32: [2]}
    # Where the deep steps win by enough at low load, it is kept and level 32 is served by the
    # cap's slot (key 8): the dead key repeats it.
    figs = _capped({
        1: {0: 60, 2: 100, 4: 200},
        8: {0: 400, 2: 500, 4: 1000},
        32: {0: 1100, 2: 1200, 4: 1000},
    }, caps={0: 64, 2: 40, 4: 8})
    assert sch.choose(figs) == {1: [4], 8: [4], 32: [4]}


def test_without_recorded_caps_every_level_takes_its_own_best():
    figs = figs_from({1: {0: 60, 2: 170, 4: 200}, 32: {0: 1300, 2: 1800, 4: 1000}})
    assert sch.choose(figs) == {1: [4], 32: [2]}


def test_figures_pool_repeated_launches_and_take_the_best_memory_fraction():
    samples = [
        sch.Sample(2, 0.80, {1: 100.0, 16: 1000.0}, "study#0"),
        sch.Sample(2, 0.80, {1: 110.0}, "study#1"),
        sch.Sample(2, 0.90, {16: 1200.0}, "baselines#0"),
    ]
    figs = sch.figures(samples, [1, 16])
    assert figs[1][2].tps == pytest.approx(105.0) and figs[1][2].runs == 2
    assert figs[1][2].noise == pytest.approx(5.0)  # half the range beats 2% of 105
    assert figs[16][2].tps == 1200.0 and figs[16][2].mem_fraction_static == 0.9
    assert sch.missing_steps(figs, [0, 2]) == [0]


def _trial(number, *, attrs, state=TrialState.COMPLETE):
    t = create_trial(state=state, values=[1.0] if state == TrialState.COMPLETE else None,
                     params={"speculative_num_steps": 1}, distributions={"speculative_num_steps": IntDistribution(1, 8)},
                     user_attrs=attrs)
    t.number = number
    return t


def test_reuse_takes_topk1_trials_no_speculation_and_schedule_launches_of_the_same_workload_and_hardware():
    wl = {"temperature": 0.0}
    hw = {"accelerator": "H100", "gpu_count": 4}
    by_level = {"16": 1000.0}
    trials = [
        _trial(0, attrs={"flags": {"speculative_num_steps": 3, "speculative_eagle_topk": 1, "mem_fraction_static": 0.85},
                         "concurrent_tps_by_level": by_level, "accelerator": "H100", "gpu_count": 4}),
        _trial(1, attrs={"flags": {"speculative_num_steps": 3, "speculative_eagle_topk": 2}, "concurrent_tps_by_level": by_level}),
        _trial(2, attrs={"flags": {"speculative_num_steps": 2, "speculative_eagle_topk": 1}, "concurrent_tps_by_level": by_level,
                         "accelerator": "A100", "gpu_count": 4}),
        _trial(3, attrs={"flags": {"speculative_num_steps": 1, "speculative_eagle_topk": 1}, "concurrent_tps_by_level": by_level,
                         "duplicate_of": 0}),
        _trial(4, attrs={"baseline": "no_speculation", "concurrent_tps_by_level": by_level}),
        _trial(5, attrs={"baseline": "adaptive", "concurrent_tps_by_level": by_level}),
        _trial(6, attrs={"schedule": {"role": "static", "steps": 5, "workload": wl}, "concurrent_tps_by_level": {"1": 50.0, "64": 9.0},
                         "max_running_requests": 17}),
        _trial(7, attrs={"schedule": {"role": "static", "steps": 6, "workload": {"temperature": 0.7}}, "concurrent_tps_by_level": by_level}),
        _trial(8, attrs={"schedule": {"role": "tuned"}, "concurrent_tps_by_level": by_level}),
        _trial(9, attrs={"flags": {"speculative_num_steps": 4, "speculative_eagle_topk": 1}}, state=TrialState.PRUNED),
    ]
    samples = sch.samples_from_trials(trials, source="x", hardware=hw, workload=wl)
    assert [(s.steps, s.source) for s in samples] == [(3, "x#0"), (0, "x#4"), (5, "x#6")]
    assert samples[0].mem_fraction_static == 0.85 and samples[2].tps_by_level == {1: 50.0, 64: 9.0}
    assert samples[0].max_running_requests is None and samples[2].max_running_requests == 17


def test_launch_memory_fraction_comes_from_the_same_or_nearest_larger_steps():
    samples = [sch.Sample(3, 0.88, {1: 10.0}, "a"), sch.Sample(3, 0.84, {1: 12.0}, "b"), sch.Sample(5, 0.80, {1: 9.0}, "c")]
    assert sch.launch_mem_fraction(samples, 3, None) == 0.84
    assert sch.launch_mem_fraction(samples, 4, None) == 0.80
    assert sch.launch_mem_fraction(samples, 6, 0.7) == 0.7


def test_levels():
    assert sch.levels_up_to(48) == [1, 2, 4, 8, 16, 32]
    assert sch.levels_up_to(64) == [1, 2, 4, 8, 16, 32, 64]
    assert sch.parse_levels("64,1, 8,8") == [1, 8, 64]
    with pytest.raises(ValueError):
        sch.parse_levels("0,4")
    with pytest.raises(ValueError):
        sch.parse_levels("a")
    assert sch.steps_range(range(1, 5), 3) == [0, 1, 2, 3, 4]
    assert sch.steps_range(None, 3) == [0, 3]


def test_expected_throughput_of_a_table_routes_a_level_to_the_nearest_lower_key():
    figs = figs_from({1: {3: 300, 5: 320}, 4: {0: 100, 1: 150, 3: 140}, 16: {0: 1000, 1: 900}})
    cfg = sch.DEFAULT_ADAPTIVE_CONFIG
    assert sch.expected_tps(figs, cfg, 1) == 320  # key 1: [1,3,5,7]
    assert sch.expected_tps(figs, cfg, 4) == 150  # key 1 still: 4 < 8
    assert sch.expected_tps(figs, cfg, 16) == 1000  # key 8: [0,1,3]


def test_the_report_shows_the_latest_tuned_table_and_its_per_level_comparison(tmp_path):
    from tuner.results.report import build, write_markdown

    storage = f"sqlite:///{tmp_path / 's.db'}"
    study = optuna.create_study(study_name="s", storage=storage)
    assert build(study).schedule is None  # no schedule launches: no section
    sibling = optuna.create_study(study_name="s@baselines", storage=storage)
    wl = {"temperature": 0.0}
    static = lambda steps, tps: _trial(0, attrs={"schedule": {"role": "static", "steps": steps, "levels": [1, 8], "workload": wl},
                                                 "concurrent_tps_by_level": tps})
    old = {"1": {"candidate_steps": [1]}}
    table = {"1": {"candidate_steps": [3]}, "8": {"candidate_steps": [1]}}
    for t in [static(0, {"1": 60.0, "8": 400.0}), static(1, {"1": 120.0, "8": 700.0}), static(3, {"1": 180.0, "8": 650.0}),
              _trial(0, attrs={"schedule": {"role": "tuned", "table": old, "levels": [1], "workload": wl}, "concurrent_tps_by_level": {"1": 1.0}}),
              _trial(0, attrs={"schedule": {"role": "tuned", "table": table, "levels": [1, 8], "workload": wl},
                               "concurrent_tps_by_level": {"1": 178.0, "8": 690.0}, "speculative_adaptive": True}),
              _trial(0, attrs={"schedule": {"role": "sglang_default", "table": sch.DEFAULT_ADAPTIVE_CONFIG, "levels": [1, 8], "workload": wl},
                               "concurrent_tps_by_level": {"1": 170.0, "8": 640.0}, "speculative_adaptive": True})]:
        sibling.add_trial(t)
    section = build(study).schedule
    assert section.trial == 4 and json.loads(section.table_json) == table
    assert section.comparison.rows == [["1", "180 ±4 (3)", "170", "178", "[3]", "+4.7%"], ["8", "700 ±14 (1)", "640", "690", "[1]", "+7.8%"]]
    assert section.verdict.startswith("the tuned table is within measurement noise of the best static configuration at every level")
    md = (write_markdown(build(study), tmp_path / "r" / "report.md")[0]).read_text()
    from tuner.results.report import write_html
    assert "<h2>Adaptive schedule</h2>" in write_html(build(study), tmp_path / "r" / "report.html").read_text()
    assert "## Adaptive schedule" in md and '"8": {"candidate_steps": [1]}' in md and "| 8 | 700 ±14 (1) | 640 | 690 | [1] | +7.8% |" in md


def test_every_schedule_launch_carries_the_admin_api_key(tmp_path, monkeypatch):
    """The schedule's launches (no speculation, a static steps value, the adaptive server) pass
    --admin-api-key as a trial's do: without it the server answers /flush_cache with 401."""
    from tests.conftest import write_config
    from tuner import adaptive
    from tuner.config import load_config
    from tuner.sequence import connected

    monkeypatch.setenv("T_ADMIN_KEY", "admin-secret-123")
    config = load_config(str(write_config(tmp_path, target='admin_api_key_env = "T_ADMIN_KEY"')))
    plan = adaptive.Plan(config, study=None, levels=[1, 2], steps=[0, 1, 2], workload={})
    with connected(config, prepare=False, restore=False) as target:
        specs = [adaptive.static_spec(plan, target, 0), adaptive.static_spec(plan, target, 2),
                 adaptive.adaptive_spec(config, target, "/tmp/t.adaptive.json", 0.9)]
    for spec in specs:
        assert "--admin-api-key" in spec.argv and "admin-secret-123" in spec.argv
        assert "admin-secret-123" not in spec.launch_command
