"""Hypervolume arithmetic, the stop rule, and picking from a front with ties."""

import optuna
import pytest
from optuna.trial import create_trial

from tuner.results.hypervolume import history, hypervolume, stalled
from tuner.results.picks import pick


def test_hypervolume_of_boxes():
    assert hypervolume([[1, 1, 1]]) == pytest.approx(1.0)
    assert hypervolume([[1, 0.5], [0.5, 1]]) == pytest.approx(0.75)
    assert hypervolume([[1, 0.5, 1], [0.5, 1, 1], [0.2, 0.2, 0.2]]) == pytest.approx(0.75)
    # A dominated point adds nothing.
    assert hypervolume([[1, 1], [0.5, 0.5]]) == pytest.approx(1.0)


def test_history_is_monotone_and_normalised():
    series = history([[100, 1], None, [50, 2], [40, 1]])
    assert series == sorted(series) and series[-1] == pytest.approx(0.75)


def _study(values, drafts, cis=None):
    study = optuna.create_study(directions=["maximize"] * 3)
    study.set_metric_names(["single_tps", "concurrent_tps", "capacity"])
    for i, (v, d) in enumerate(zip(values, drafts)):
        attrs = {"flags": {"speculative_num_steps": d - 1, "speculative_eagle_topk": 1, "speculative_num_draft_tokens": d, "mem_fraction_static": 0.9}}
        if cis:
            attrs["single_tps_ci95"] = cis[i]
        study.add_trial(create_trial(values=v, user_attrs=attrs, params={}, distributions={}))
    return study


def test_ties_go_to_fewer_draft_tokens():
    study = _study([[200.0, 900.0, 10.0], [201.0, 800.0, 12.0], [150.0, 1000.0, 30.0]], drafts=[6, 4, 2])
    best = pick(study, "single_tps")
    assert best.trial.number == 1 and best.tied_with == (0,)  # 200 vs 201 is within 2%
    clear = _study([[200.0, 900.0, 10.0], [230.0, 800.0, 12.0]], drafts=[2, 6])
    assert pick(clear, "single_tps").trial.number == 1 and not pick(clear, "single_tps").tied_with


def test_measured_intervals_widen_ties():
    study = _study([[200.0, 900.0, 10.0], [215.0, 800.0, 12.0]], drafts=[6, 4], cis=[[180.0, 220.0], [213.0, 217.0]])
    assert pick(study, "single_tps").tied_with


def test_balanced_pick_leaves_no_objective_far_behind():
    study = _study([[230.0, 500.0, 5.0], [200.0, 1300.0, 20.0], [120.0, 900.0, 36.0]], drafts=[8, 5, 2])
    assert pick(study, "balanced").trial.number == 1
    assert pick(study, "capacity").trial.number == 2


def test_stop_rule_needs_patience_trials_without_progress():
    study = _study([[100.0, 100.0, 10.0]] + [[50.0, 50.0, 5.0]] * 4, drafts=[2] * 5)
    assert stalled(study, 3) and not stalled(study, 5)


def _shaped(rows):
    """rows: (values, steps, topk, draft, ci)"""
    study = optuna.create_study(directions=["maximize"] * 3)
    study.set_metric_names(["single_tps", "concurrent_tps", "capacity"])
    for v, steps, topk, draft, ci in rows:
        attrs = {"flags": {"speculative_num_steps": steps, "speculative_eagle_topk": topk, "speculative_num_draft_tokens": draft,
                           "mem_fraction_static": 0.9}, "single_tps_ci95": ci}
        study.add_trial(create_trial(values=v, user_attrs=attrs, params={}, distributions={}))
    return study


def test_a_pick_quotes_its_own_figure_not_the_best_of_its_ties():
    # Trial 1 measured 230.5 (the highest), trial 0 229.8 with fewer draft tokens: trial 0 is picked.
    study = _shaped([([229.8, 900.0, 10.0], 2, 1, 3, [225.0, 234.0]), ([230.5, 800.0, 9.0], 3, 2, 6, [226.0, 235.0])])
    choice = pick(study, "single_tps")
    assert choice.trial.number == 0
    assert "229.8" in choice.reason and "highest (230.5, trial 1)" in choice.reason
    assert "1 (fewer draft tokens: 3 vs 6)" in choice.reason


def test_equal_draft_tokens_go_to_the_smaller_topk_then_fewer_steps_and_the_reason_says_so():
    same = [20.0, 500.0, 35.0]
    study = _shaped([([120.0, 890.0, 35.0], 1, 4, 2, None), ([119.0, 895.0, 35.0], 1, 1, 2, None)])
    choice = pick(study, "capacity")
    assert choice.trial.number == 1
    assert "(smaller topk: 1 vs 4)" in choice.reason and "fewest draft tokens" not in choice.reason
    steps = _shaped([(same, 3, 2, 4, None), ([19.0, 510.0, 35.0], 2, 2, 4, None)])
    assert pick(steps, "capacity").trial.number == 1 and "(fewer steps: 2 vs 3)" in pick(steps, "capacity").reason
