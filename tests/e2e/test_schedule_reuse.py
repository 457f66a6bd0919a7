"""`tuner.schedule` says what it reuses and why not, shows its plan and an estimate before it
launches, and launches every missing steps value at the table's one memory fraction (issue 25:
steps 3 at 0.80 from trial 0, steps 6 without --mem-fraction-static, a level-16 row that dips)."""

from __future__ import annotations

import subprocess

import optuna
import pytest
from optuna.distributions import CategoricalDistribution, FloatDistribution, IntDistribution
from optuna.trial import TrialState

from ..conftest import PYTHON, REPO, write_config

pytestmark = pytest.mark.e2e

DISTRIBUTIONS = {"speculative_num_steps": IntDistribution(1, 3), "speculative_eagle_topk": CategoricalDistribution([1, 2]),
                 "mem_fraction_static": FloatDistribution(0.80, 0.90, step=0.02)}


def _trial(steps: int, topk: int, mfs: float, *, state=TrialState.COMPLETE, levels=(1, 4)):
    flags = {"speculative_num_steps": steps, "speculative_eagle_topk": topk, "speculative_num_draft_tokens": steps + 1,
             "mem_fraction_static": mfs}
    attrs = {"flags": flags, "max_running_requests": 17, "startup_s": 2.0, "measure_s": 5.0}
    if state == TrialState.COMPLETE:
        attrs["concurrent_tps_by_level"] = {str(lvl): 100.0 * steps + lvl for lvl in levels}
    return optuna.trial.create_trial(
        state=state, params={"speculative_num_steps": steps, "speculative_eagle_topk": topk, "mem_fraction_static": mfs},
        distributions=DISTRIBUTIONS, values=[100.0, 500.0, 17.0] if state == TrialState.COMPLETE else None, user_attrs=attrs)


def test_the_schedule_reuses_what_it_can_says_why_not_and_launches_the_rest_at_one_fraction(tmp_path):
    config = write_config(tmp_path, study="baselines = true")
    storage = f"sqlite:///{tmp_path / 't.db'}"
    study = optuna.create_study(study_name="t", storage=storage, directions=["maximize"] * 3)
    study.set_metric_names(["single_tps", "concurrent_tps", "capacity"])
    for t in (_trial(1, 1, 0.84), _trial(2, 1, 0.84), _trial(2, 1, 0.80), _trial(2, 2, 0.84),
              _trial(3, 1, 0.90, state=TrialState.PRUNED)):
        study.add_trial(t)
    result = subprocess.run([PYTHON, "-m", "tuner.schedule", "--config", str(config), "--levels", "1,4", "--no-verify",
                             "--out", str(tmp_path / "t.adaptive.json")], capture_output=True, text=True, cwd=REPO, timeout=600)
    assert result.returncode == 0, result.stderr
    err = result.stderr
    assert "reusing: steps 1 from study#0" in err and "reusing: steps 2 from study#1" in err
    assert "not reusable: study#2: steps 2 measured at mem_fraction_static 0.8; the table's launches run at 0.84" in err
    assert "not reusable: study#3: topk 2: SGLang's adaptive mode runs topk-1 chains only" in err
    assert "not reusable: study#4: PRUNED, nothing measured" in err
    plan = next(line for line in err.splitlines() if line.startswith("plan: "))
    assert plan.startswith("plan: launch steps 0, 3 (one launch each, every level measured) at mem_fraction_static 0.84; estimate ~")
    assert err.index("plan: ") < err.index("launch (")  # said before the first launch
    launches = optuna.load_study(study_name="t@baselines", storage=storage).trials
    by_steps = {t.user_attrs["schedule"]["steps"]: t for t in launches}
    assert sorted(by_steps) == [0, 3]  # only what is missing
    assert "--mem-fraction-static 0.84" in by_steps[3].user_attrs["launch_command"]
