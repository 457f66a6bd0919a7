"""Every command that launches refuses a port another server already answers on, and every
measurement checks that the server answering is the one launched (issue 25: `bench --flags`
printed "ready in 1.1 s" and the old server's figures while its own launch died on "address
already in use")."""

from __future__ import annotations

import os
import subprocess

import optuna
import pytest
from optuna.distributions import FloatDistribution, IntDistribution

from ..conftest import PYTHON, REPO, server_processes, write_config

pytestmark = pytest.mark.e2e

TAKEN = "something already answers at http://127.0.0.1:{port} that the tuner did not start"


def _cli(module: str, *args: str) -> subprocess.CompletedProcess:
    return subprocess.run([PYTHON, "-m", module, *args], capture_output=True, text=True, cwd=REPO, timeout=180)


def _study_with_one_trial(tmp_path) -> None:
    """A study whose pick is steps 2 (no launch needed to make it)."""
    study = optuna.create_study(study_name="t", storage=f"sqlite:///{tmp_path / 't.db'}", directions=["maximize"] * 3)
    study.set_metric_names(["single_tps", "concurrent_tps", "capacity"])
    flags = {"speculative_num_steps": 2, "speculative_eagle_topk": 1, "speculative_num_draft_tokens": 3, "mem_fraction_static": 0.84}
    study.add_trial(optuna.trial.create_trial(
        params={"speculative_num_steps": 2, "speculative_eagle_topk": 1, "mem_fraction_static": 0.84},
        distributions={"speculative_num_steps": IntDistribution(1, 3), "speculative_eagle_topk": IntDistribution(1, 2),
                       "mem_fraction_static": FloatDistribution(0.8, 0.9, step=0.02)},
        values=[150.0, 900.0, 20.0], user_attrs={"flags": flags, "concurrent_tps_by_level": {"4": 900.0}}))


@pytest.mark.parametrize("command", ["bench", "best --apply", "schedule"])
def test_a_command_that_launches_refuses_a_port_another_server_answers_on(tmp_path, start_emulator, command):
    other = start_emulator("--speculative-algorithm", "NEXTN", "--speculative-num-steps", "3", "--speculative-eagle-topk", "1",
                           "--speculative-num-draft-tokens", "4")
    other.wait_healthy()
    config = write_config(tmp_path, port=other.port)
    _study_with_one_trial(tmp_path)
    args = {"bench": ("tuner.bench", "--config", str(config), "--flags", "--speculative-num-steps 2"),
            "best --apply": ("tuner.best", "--config", str(config), "--apply"),
            "schedule": ("tuner.schedule", "--config", str(config), "--levels", "1", "--no-verify",
                         "--out", str(tmp_path / "t.adaptive.json"))}[command]
    result = _cli(*args)
    assert result.returncode == 2, result.stderr
    assert TAKEN.format(port=other.port) in result.stderr
    assert "ready in" not in result.stderr and "launching" not in result.stderr
    assert {os.getpgid(p) for p in server_processes(other.port)} == {other.proc.pid}  # nothing of ours started beside it
    assert other.proc.poll() is None  # and the other server was left alone


def test_the_dry_run_sees_a_missing_model_as_the_real_run_does(tmp_path):
    config = write_config(tmp_path, model="Qwen/Qwen3.5-999B-A1B --tp 4")
    dry = _cli("tuner.optimize", "--trials", "2", "--config", str(config), "--dry-run")
    assert dry.returncode == 2, dry.stderr
    assert "error: model Qwen/Qwen3.5-999B-A1B does not exist on the target" in dry.stderr
    assert "fix --model-path in [server] command" in dry.stderr
    assert not (tmp_path / "t.db").exists()
    real = _cli("tuner.optimize", "--trials", "2", "--config", str(config))
    assert real.returncode == 2 and "Qwen/Qwen3.5-999B-A1B does not exist on the target" in real.stderr
