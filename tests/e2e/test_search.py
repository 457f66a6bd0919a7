"""Search features end to end: baselines, warm start, duplicates, the stop rule, applying the best."""

from __future__ import annotations

import subprocess
import sys

import httpx
import optuna
import pytest
from optuna.trial import TrialState

from ..conftest import REPO, run_cli, stop_servers_left_in, write_config

pytestmark = pytest.mark.e2e


def test_baselines_warm_start_and_the_comparison(tmp_path):
    config = write_config(tmp_path, study="baselines = true", command_flags="--speculative-algorithm NEXTN --speculative-num-steps 2 --speculative-eagle-topk 1 --speculative-num-draft-tokens 3",
                          space="speculative_num_steps = { low = 1, high = 4 }\nspeculative_eagle_topk = { choices = [1, 2] }\nmem_fraction_static = { low = 0.80, high = 0.92, step = 0.02 }")
    result = run_cli("--trials", "3", "--config", str(config))
    assert result.returncode == 0, result.stderr
    storage = f"sqlite:///{tmp_path / 't.db'}"
    base = optuna.load_study(study_name="t@baselines", storage=storage)
    kinds = {t.user_attrs["baseline"]: t for t in base.trials}
    assert set(kinds) == {"no_speculation", "adaptive"} and all(t.state == TrialState.COMPLETE for t in kinds.values())
    assert "--speculative" not in kinds["no_speculation"].user_attrs["launch_command"]
    assert kinds["adaptive"].user_attrs["launch_command"].endswith("--speculative-adaptive")
    assert kinds["no_speculation"].user_attrs.get("accept_length") in (None, 1.0)
    assert "Baselines" in result.stdout and "over no speculation:" in result.stdout and "over adaptive:" in result.stdout
    study = optuna.load_study(study_name="t", storage=storage)
    first, second = study.trials[:2]
    assert first.user_attrs["warm_start"] == "current" and first.params["speculative_num_steps"] == 2
    assert second.user_attrs["warm_start"] == "sglang_default" and second.params["speculative_num_steps"] == 3
    # A second run measures no baseline again.
    again = run_cli("--trials", "1", "--config", str(config))
    assert again.returncode == 0, again.stderr
    assert len(optuna.load_study(study_name="t@baselines", storage=storage).trials) == 2


def test_patience_stops_a_study_that_no_longer_improves(tmp_path):
    config = write_config(tmp_path, space="speculative_num_steps = { choices = [2] }\nspeculative_eagle_topk = { choices = [1] }")
    result = run_cli("--trials", "8", "--config", str(config), "--patience", "2")
    assert result.returncode == 0, result.stderr
    trials = optuna.load_study(study_name="t", storage=f"sqlite:///{tmp_path / 't.db'}").trials
    assert len(trials) < 8 and "stopping (--patience 2)" in result.stderr
    # One configuration only: later trials are settled as duplicates, without a launch.
    assert sum(1 for t in trials if t.user_attrs.get("duplicate_of") is None) == 1


def test_best_prints_and_applies_the_pick(tmp_path):
    config = write_config(tmp_path, space="speculative_num_steps = { choices = [1, 3] }")
    assert run_cli("--trials", "2", "--config", str(config), "--seed", "1").returncode == 0
    flags = subprocess.run([sys.executable, "-m", "tuner.best", "--config", str(config), "--pick", "single_tps"],
                           capture_output=True, text=True, cwd=REPO, timeout=120)
    assert flags.returncode == 0, flags.stderr
    assert flags.stdout.startswith("--speculative-num-steps 3 --speculative-eagle-topk 1 --speculative-num-draft-tokens 4")
    assert "single_tps" in flags.stderr
    unit = subprocess.run([sys.executable, "-m", "tuner.best", "--config", str(config), "--format", "systemd"],
                          capture_output=True, text=True, cwd=REPO, timeout=120)
    assert "ExecStart=\nExecStart=" in unit.stdout and "50-sglang-tuner-best.conf" in unit.stdout
    applied = subprocess.run([sys.executable, "-m", "tuner.best", "--config", str(config), "--pick", "single_tps", "--apply"],
                             capture_output=True, text=True, cwd=REPO, timeout=300)
    assert applied.returncode == 0, applied.stderr
    url = config.read_text().split('url = "')[1].split('"')[0]
    try:
        info = httpx.get(url + "/server_info").json()
        assert info["speculative_num_steps"] == 3
        # `--apply` leaves the pick running, as an operator wants; `--restore` undoes it.
        restored = subprocess.run([sys.executable, "-m", "tuner.best", "--config", str(config), "--restore"],
                                  capture_output=True, text=True, cwd=REPO, timeout=120)
        assert restored.returncode == 0, restored.stderr
        assert "restored: the applied server stopped" in restored.stderr
        with pytest.raises(httpx.TransportError):
            httpx.get(url + "/health", timeout=10)
    finally:
        stop_servers_left_in(tmp_path / "work")


def test_model_sampler_study_on_the_emulator(tmp_path):
    """`--sampler model` end to end: the trials record what the model fits on (the depth probe's
    histogram, the server's memory_usage) and why each configuration was chosen."""
    config = write_config(tmp_path, command_flags="--speculative-algorithm NEXTN",
                          space="speculative_num_steps = { low = 1, high = 4 }\nspeculative_eagle_topk = { choices = [1, 2] }\n"
                                "mem_fraction_static = { low = 0.80, high = 0.92, step = 0.01 }")
    result = run_cli("--trials", "3", "--config", str(config), "--sampler", "model")
    assert result.returncode == 0, result.stderr
    study = optuna.load_study(study_name="t", storage=f"sqlite:///{tmp_path / 't.db'}")
    done = [t for t in study.trials if t.state == TrialState.COMPLETE and t.user_attrs.get("duplicate_of") is None]
    assert done, [t.user_attrs.get("fail_reason") for t in study.trials]
    first = done[0].user_attrs
    assert sum(first["accept_histogram"]) > 10 and first["memory_usage"]["token_capacity"] == first["max_total_num_tokens"]
    assert all(t.user_attrs.get("model_note") for t in study.trials)
    assert any(t.user_attrs.get("model_note", "").startswith(("model: largest expected", "model: a reserve probe"))
               for t in study.trials[1:])
