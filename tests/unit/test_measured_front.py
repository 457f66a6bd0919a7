"""benchmarks/measured_front.py: live studies scored side by side on what they measured."""

import importlib.util
from pathlib import Path

import optuna
import pytest
from optuna.trial import TrialState

_ROOT = Path(__file__).resolve().parents[2]
_spec = importlib.util.spec_from_file_location("measured_front", _ROOT / "benchmarks" / "measured_front.py")
F = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(F)


def _study(path: Path, values: list, failed: int = 0) -> str:
    url = f"sqlite:///{path}"
    study = optuna.create_study(storage=url, study_name="s", directions=["maximize"] * 2)
    study.set_metric_names(["single_tps", "slo_capacity"])
    optuna.create_study(storage=url, study_name="s@baselines", directions=["maximize"] * 2)  # not scored
    for v in values:
        study.add_trial(optuna.trial.create_trial(params={}, distributions={}, values=v))
    for _ in range(failed):
        study.add_trial(optuna.trial.create_trial(params={}, distributions={}, state=TrialState.PRUNED))
    return url


def test_each_arm_is_scored_on_the_groups_common_scale(tmp_path, capsys):
    optuna.logging.set_verbosity(optuna.logging.ERROR)
    before = _study(tmp_path / "a.db", [[100.0, 10.0]], failed=1)
    after = _study(tmp_path / "b.db", [[200.0, 5.0], [100.0, 20.0]])
    assert F.main([f"g:before={before}", f"g:after={after}"]) == 0
    out = capsys.readouterr().out
    # scale (200, 20): before (0.5, 0.5) -> 0.25; after (1, 0.25), (0.5, 1) -> 0.25 + 0.5 x 0.75
    assert "single_tps 200, slo_capacity 20" in out
    assert f"{before}: 2 trials, HV 0.250, failed 1" in out
    assert f"{after}: 2 trials, HV 0.625, failed 0" in out


def test_an_argument_without_an_arm_names_the_form(tmp_path):
    with pytest.raises(SystemExit, match="<group>:<arm>=<storage URL>"):
        F.main([f"sqlite:///{tmp_path / 'x.db'}"])
