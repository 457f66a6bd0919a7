"""benchmarks/sampler_benchmark.py: its ceiling (the best 10-trial set a sampler that knew the
landscape could pick, greedy hypervolume subset selection after the warm start) and one replayed study."""

import dataclasses
import importlib.util
import math
import sys
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import pytest

_PATH = Path(__file__).resolve().parents[2] / "benchmarks" / "sampler_benchmark.py"
_spec = importlib.util.spec_from_file_location("sampler_benchmark", _PATH)
B = importlib.util.module_from_spec(_spec)
sys.modules.setdefault("sampler_benchmark", B)  # its dataclasses look their module up
_spec.loader.exec_module(B)

A, C, D = (1.0, 1.0, 0.5), (0.5, 0.5, 1.0), (0.2, 0.2, 0.2)  # A alone 0.5, C alone 0.25, D dominated


def test_greedy_picks_the_largest_gain_and_counts_the_first_pick():
    front = np.array([C, A])
    assert math.isclose(B.greedy_hv_set(front, 1), 0.5)  # A, the larger box
    assert math.isclose(B.greedy_hv_set(front, 2), 0.5 + 0.25 - 0.125)  # both; their overlap counted once
    assert math.isclose(B.greedy_hv_set(front, 2, first=np.array(D)), 0.5)  # the warm start takes a slot


def _expectation(values, feasible=True):
    return SimpleNamespace(feasible=feasible, values=lambda: values)


def test_ceiling_starts_from_the_warm_shape_at_its_best_fraction():
    # Two shapes; the warm start's shape (3, 1, 4) has a point off the front (its low fraction) and
    # one on it (0.9); the front is A (the warm shape at 0.9) and C.
    table = {(3, 1, 4, 0.8): _expectation(D), (3, 1, 4, 0.9): _expectation(A),
             (5, 1, 6, 0.9): _expectation(C), (5, 1, 6, 0.95): _expectation(A, feasible=False)}
    front = {(3, 1, 4, 0.9): np.array(A), (5, 1, 6, 0.9): np.array(C)}
    lands = SimpleNamespace(table=table, front=front, scale=np.ones(3), front_hv=0.625,
                            warm_start={"speculative_num_steps": 3, "speculative_eagle_topk": 1, "mem_fraction_static": 0.8})
    assert math.isclose(B.ceiling(lands, 1), 0.5 / 0.625)  # the warm shape at 0.9, not at its default 0.8
    assert math.isclose(B.ceiling(lands, 2), 1.0)


def test_late_trials_take_no_long_shot_for_a_small_gain():
    # family:7 (a hybrid MoE with a 7.8% unreported reserve), 20 trials: with nothing left to
    # gain, the model sampler launched (1, 1, 2) one step up at P(start) 0.53-0.56 for a gain of
    # 0.003 and failed, a second failed launch in 10 of 20 seeds.  A failure has a price now.
    run = B.simulate("family:7", "auto: model (--sampler model) (DEFAULT)", seed=3, n_trials=20)
    failed = run["at"][20]["memory_graph"] + run["at"][20]["memory_kv"]
    assert failed <= 1, run["at"][20]
    assert run["at"][20]["hv"] > 0.97


def test_a_study_that_failed_once_takes_no_second_long_shot_before_its_tenth_launch():
    # tp4:30, a four-GPU world no change was tuned on, seed 0: its reserve probe failed at the
    # fourth launch, and at the ninth a launch at P(start) 0.73 for a small gain failed too: two
    # failed launches in ten.  One failure per ten launches is the allowance; within the first
    # ten a second one costs double, and the study keeps its front.
    run = B.simulate("tp4:30", "auto: model (--sampler model) (DEFAULT)", seed=0, n_trials=10)
    failed = run["at"][10]["memory_graph"] + run["at"][10]["memory_kv"]
    assert failed == 1, run["p_start"]
    assert run["at"][10]["hv"] > 0.99, run["at"][10]


def test_a_reserve_probe_after_the_first_failure_is_still_taken():
    # family:0 seed 16: the first probe, (5, 4, 8) at 0.88, fails.  The probe that follows, the
    # same shape at 0.85 (P(start) 0.64), starts and pins the reserve, and every later shape goes
    # to its edge.  Priced as a gamble beyond the allowance it was not taken: the study climbed
    # one step at a time and reached 89% of the front's hypervolume at 10 launches, not 97%.
    run = B.simulate("family:0", "auto: model (--sampler model) (DEFAULT)", seed=16, n_trials=10)
    calls = sorted(run["p_start"], key=lambda call: call[2])
    assert [call[1] for call in calls[:2]] == [False, True], calls
    assert 0.55 <= calls[1][0] <= 0.8, calls  # the second call is a probe
    assert run["at"][10]["hv"] > 0.95, run["at"][10]


def test_a_reserve_probe_is_named_as_one_in_its_trials_note():
    # tp4:16 seed 0: the second and third launches raise the first one's shape (3, 1, 4) to learn
    # the reserve; the fourth, after the third failed, raises it again.  Their notes gave the
    # largest expected gain of another candidate, (1, 1, 2) at 0.88, as if it were theirs
    # ("largest expected hypervolume gain 0.0837 (P(start) 0.66)" for a probe whose own was 0.0031).
    run = B.simulate("tp4:16", "auto: model (--sampler model) (DEFAULT)", seed=0, n_trials=5)
    assert run["probes"] == [2, 3, 4], run["probes"]


def test_after_two_failed_launches_the_study_takes_no_long_shot(monkeypatch):
    # family:7 drawn with a 12% capture reserve (beyond the model's 10% prior): every fraction
    # above the warm start's 0.83 fails.  Each reserve probe above it was an honest P(start)
    # 0.6-0.7 and failed, four failed launches in 10 on every seed; after two the study's trust
    # is spent and no launch is a long shot.
    monkeypatch.setattr(B, "CAPTURE_RESERVE", 0.12)
    monkeypatch.setattr(B, "_CACHE", {})
    run = B.simulate("family:7", "auto: model (--sampler model) (DEFAULT)", seed=0, n_trials=10)
    failed = 0
    for p_start, started, number, _ in sorted(run["p_start"], key=lambda call: call[2]):
        if failed >= 2:
            assert p_start >= 0.9, (number, p_start, run["p_start"])
        failed += not started
    assert failed <= 3, run["p_start"]


def test_a_replayed_0_5_9_launch_reports_what_was_left_only_through_its_capture_log(monkeypatch):
    # --sglang-version 0.5.9: memory_usage as 0.5.9's get_internal_state has it (no
    # startup_available, one graph figure); what was left is in the capture log the tuner parses,
    # and the model reads the same figure from there as from 0.5.23's field.
    from tuner.search.model import Launch

    lands = B.landscape("family:2")
    params = dataclasses.replace(lands.base, speculative_num_steps=3, speculative_eagle_topk=1,
                                 speculative_num_draft_tokens=4, mem_fraction_static=0.85)
    e = lands.expect(params)
    new = B._server_attrs(lands, e, params, 0)
    monkeypatch.setattr(B, "SGLANG_VERSION", "0.5.9")
    old = B._server_attrs(lands, e, params, 0)
    assert "startup_available" not in old["memory_usage"] and isinstance(old["memory_usage"]["graph"], float)
    assert old["capture_memory"]["failed_runner"] is None
    left = Launch(shape=None, mfs=0.85, state="ok", attrs=old).memory["startup_available"]
    assert abs(left - new["memory_usage"]["startup_available"]) <= 0.01


def test_a_misspelt_landscape_is_a_one_line_error_naming_the_choices(capsys):
    # It was ignored, and a run of only misspelt names said "no sampler or landscape selected".
    with pytest.raises(SystemExit) as stop:
        B.main(["--landscapes", "qwen-demo,famly:3", "--seeds", "1"])
    assert stop.value.code == 2
    err = capsys.readouterr().err.strip().splitlines()[-1]
    assert "--landscapes famly:3: no such landscape" in err and "family:N or tp4:N" in err and "qwen-demo" in err


def test_the_start_share_interval_counts_landscapes_not_launches():
    # 40 launches from two landscapes, one always starting, one never: the share is 0.5 whatever
    # the launch count, and two landscapes cannot pin it down (a launch-level interval would be
    # 0.5 +- 0.13).  Twenty landscapes alike in the same proportions: a narrow interval.
    two = [("a", True)] * 20 + [("b", False)] * 20
    lo, hi = B.started_interval(two)
    assert lo <= 0.05 and hi >= 0.95
    many = [(f"w{i}", i % 2 == 0) for i in range(20) for _ in range(2)]
    lo, hi = B.started_interval(many)
    assert 0.25 < lo < 0.5 < hi < 0.75
    # All started, on five landscapes: not certainty (each landscape one observation).
    lo, hi = B.started_interval([(f"w{i}", True) for i in range(5)])
    assert hi == 1.0 and 0.4 < lo < 0.7
    assert B.started_interval([("a", True), ("a", False)]) is None


def _rendered_reliability(tmp_path, runs: list[dict]) -> dict[str, list[str]]:
    """Store `runs` (landscape, p_start calls) as a run's JSON, render it, and return the
    reliability table's rows by sampler label, each as its cells."""
    cell = {"seeds": 1, "seconds_per_run": 1.0,
            **{b: {"mean": 0.97, "std": 0.01, "min": 0.95, "launches": 10.0, "duplicate": 0.0, "ruled_out": 0.0,
                   "memory_kv": 0.0, "memory_graph": 0.5, "invalid": 0.0, "max_failed": 1.0, "worst_seed": 0}
               for b in ("10", "20")}}
    cells = {"model": {r["landscape"]: {**cell, "p_start": r["p_start"]} for r in runs}}
    meta = {"seeds": 1, "first_seed": 0, "sglang_version": "0.5.23", "budgets": [10, 20], "noise": 0.015, "wall_s": 1.0,
            "jobs": 1, "optuna": "5.0.0", "numpy": "2.4.6", "python": "3.11.7", "machine": "x86_64, 2 cores"}
    payload = {"meta": meta,
               "landscapes": {r["landscape"]: {"perturbed": False, "note": "", "grid": 1, "failures": {}, "front_size": 1,
                                               "front_hv": 1.0, "scale": [1, 1, 1], "warm_start": {}, "concurrency": 8,
                                               "request_tokens": 1024, "space": {}, "profile": "p", "family": True,
                                               "ceiling": {"10": 0.99, "20": 1.0}} for r in runs},
               "cells": cells, "unavailable": {}}
    stored = tmp_path / "run.json"
    stored.write_text(__import__("json").dumps(payload))
    assert B.main(["--render", str(stored)]) == 0
    text = (tmp_path / "run.md").read_text()
    table = text[text.index("## P(start) reliability"):].split("\n\n")[1]
    return {line.split(" | ")[0].lstrip("| "): line.split(" | ")[1:] for line in table.splitlines() if line.startswith("| model")}


def test_a_stored_run_renders_again_with_the_interval_and_flags_a_bucket_off_by_more(tmp_path, capsys):
    # Predicted 0.65 on 12 landscapes; a third of them started: more than 10 points off and
    # outside the interval.  Predicted 0.75 and 0.73 started: inside.
    runs = [{"landscape": f"family:{i}", "p_start": [[0.65, i % 3 == 0, 2], [0.75, i % 4 != 0, 3]]} for i in range(12)]
    low, mid = _rendered_reliability(tmp_path, runs)["model"][:2]
    assert low.startswith("0.65 -> 0.33 [") and "**outside**" in low and "12 landscapes" in low
    assert mid.startswith("0.75 -> 0.75 [") and "outside" not in mid


def test_the_reliability_table_shows_predictions_after_a_failed_launch_apart(tmp_path):
    # What the held-out worlds show (a reserve probe at P 0.6-0.7 after a failed launch started
    # 55 times in 60): one bucket, two stories.  Before any failure a third started; after one,
    # every launch did.  Together they read 0.65 -> 0.67, as if calibrated.
    runs = [{"landscape": f"family:{i}", "p_start": [[0.65, i % 3 == 0, 2, 0], [0.65, True, 4, 1]]} for i in range(12)]
    rows = _rendered_reliability(tmp_path, runs)
    assert rows["model"][0].startswith("0.65 -> 0.67 [") and "outside" not in rows["model"][0]
    assert rows["model (no failed launch yet)"][0].startswith("0.65 -> 0.33 [") and "n=12" in rows["model (no failed launch yet)"][0]
    after = rows["model (after a failed launch)"][0]
    assert after.startswith("0.65 -> 1.00 [") and "**outside**" in after and "n=12" in after


def test_rendering_a_file_that_is_not_a_stored_run_is_a_one_line_error(tmp_path, capsys):
    bad = tmp_path / "notes.json"
    bad.write_text("[1, 2]")
    with pytest.raises(SystemExit) as stop:
        B.main(["--render", str(bad)])
    assert stop.value.code == 2
    err = capsys.readouterr().err.strip().splitlines()[-1]
    assert f"--render {bad}: not a stored sampler_benchmark run" in err and "give the .json a run wrote" in err


def test_noise_is_set_per_objective_and_a_bad_value_is_a_one_line_error(monkeypatch, capsys):
    # The live studies scatter more than the replay's 1.5% (single 2.5-3.6%, concurrent
    # 5.5-6.3%): --noise replays at other stds, each throughput at its own.
    lands = B.landscape("qwen-demo")
    params = B.Params(speculative_num_steps=3, speculative_eagle_topk=1, speculative_num_draft_tokens=4, mem_fraction_static=0.85)
    truth = lands.expect(params).values()
    monkeypatch.setattr(B, "NOISE", (0.0, 0.06))
    single, concurrent, capacity = B._measure(lands.expect(params), params, seed=3)
    assert single == truth[0] and concurrent != truth[1] and capacity == truth[2]
    concurrent_by_seed = [B._measure(lands.expect(params), params, seed=s)[1] / truth[1] - 1 for s in range(200)]
    assert 0.045 < float(np.std(concurrent_by_seed)) < 0.075
    with pytest.raises(SystemExit) as stop:
        B.main(["--noise", "0.03,six", "--seeds", "1"])
    assert stop.value.code == 2
    err = capsys.readouterr().err.strip().splitlines()[-1]
    assert "--noise 0.03,six: give one or two relative stds, e.g. 0.03 or 0.03,0.06" in err


def test_a_request_class_study_is_scored_on_the_classs_truth_and_ranked_by_the_model(monkeypatch):
    # --request-class long_context: the study's first objective is that class's single-stream rate,
    # its truth the landscape's expectation for 16,000-token prompts (slower than the mix's), and
    # the trials record the mix's rate (single_tps_runs) from which the model predicts the class.
    monkeypatch.setattr(B, "REQUEST_CLASS", "long_context")
    monkeypatch.setattr(B, "_CACHE", {})
    lands = B.landscape("qwen-demo")
    params = dataclasses.replace(lands.base, speculative_num_steps=3, speculative_eagle_topk=1,
                                 speculative_num_draft_tokens=4, mem_fraction_static=0.85)
    e = lands.expect(params)
    assert e.single_tps < 0.95 * lands.mix_single[B._key(params)]
    assert B._server_attrs(lands, e, params, 0)["single_tps_runs"][0] == pytest.approx(lands.mix_single[B._key(params)], rel=0.1)
    run = B.simulate("qwen-demo", "auto: model (--sampler model) (DEFAULT)", seed=0, n_trials=10)
    assert run["at"][10]["hv"] > 0.9, run["at"]
