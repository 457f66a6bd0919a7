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


def test_after_two_failed_launches_the_study_takes_no_long_shot(monkeypatch):
    # family:7 drawn with a 12% capture reserve (beyond the model's 10% prior): every fraction
    # above the warm start's 0.83 fails.  Each reserve probe above it was an honest P(start)
    # 0.6-0.7 and failed, four failed launches in 10 on every seed; after two the study's trust
    # is spent and no launch is a long shot.
    monkeypatch.setattr(B, "CAPTURE_RESERVE", 0.12)
    monkeypatch.setattr(B, "_CACHE", {})
    run = B.simulate("family:7", "auto: model (--sampler model) (DEFAULT)", seed=0, n_trials=10)
    failed = 0
    for p_start, started, number in sorted(run["p_start"], key=lambda call: call[2]):
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
