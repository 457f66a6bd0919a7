"""Several workers, one study, in a real PostgreSQL (started by .ci/services.sh)."""

from __future__ import annotations

import os
import subprocess
import uuid
from pathlib import Path

import optuna
import pytest
from optuna.trial import TrialState

from ..conftest import (
    PYTHON,
    REPO,
    free_port,
    run_cli,
    stop_servers_left_in,
    wait_serving,
    write_config,
)

pytestmark = [pytest.mark.e2e, pytest.mark.postgres]

ENV_FILE = REPO / ".ci" / ".postgres" / "env"


@pytest.fixture(scope="module")
def postgres() -> str:
    if ENV_FILE.exists():
        url = dict(line.split("=", 1) for line in ENV_FILE.read_text().splitlines() if "=" in line)["TUNER_TEST_POSTGRES"]
        try:
            optuna.storages.RDBStorage(url)
            return url
        except Exception as exc:  # noqa: BLE001 - reported below
            reason = f"PostgreSQL at {url} does not answer: {exc}"
    else:
        reason = "no PostgreSQL (run .ci/services.sh up as root)"
    if os.environ.get("TUNER_REQUIRE_SERVICES") == "1":
        pytest.fail(reason)
    pytest.skip(reason)


def _worker(config: Path, study: str, storage: str, trials: int, *extra: str) -> subprocess.Popen:
    return subprocess.Popen([PYTHON, "-m", "tuner.optimize", "--config", str(config), "--study-name", study, "--storage", storage,
                             "--trials", str(trials), *extra], cwd=REPO, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


def _overlap(a, b) -> bool:
    return a.datetime_start < b.datetime_complete and b.datetime_start < a.datetime_complete


def test_two_workers_share_a_study_and_a_killed_one_loses_nothing(tmp_path, postgres):
    study_name = f"fleet-{uuid.uuid4().hex[:8]}"
    space = "speculative_num_steps = { low = 1, high = 4 }\nspeculative_eagle_topk = { choices = [1, 2] }\nmem_fraction_static = { low = 0.80, high = 0.92, step = 0.02 }"
    ports = [free_port(), free_port()]
    configs = []
    for i, port in enumerate(ports):
        d = tmp_path / f"w{i}"
        d.mkdir()
        configs.append(write_config(d, name=study_name, port=port, space=space, study="heartbeat_s = 2"))
    doomed = _worker(configs[0], study_name, postgres, 6)
    steady = _worker(configs[1], study_name, postgres, 6)
    # Kill the first worker while its first measured trial's server runs.
    wait_serving(ports[0], timeout=120)
    doomed.kill()
    doomed.wait()
    out, err = steady.communicate(timeout=600)
    assert steady.returncode == 0, err
    # The dead worker's server is still up on its port: nobody else owns it; stop it here.
    assert stop_servers_left_in(tmp_path / "w0"), "the killed worker's server should still be running"

    study = optuna.load_study(study_name=study_name, storage=postgres)
    trials = study.trials
    assert not [t for t in trials if t.state == TrialState.RUNNING]
    failed = [t for t in trials if t.state == TrialState.FAIL]
    assert failed, "the killed worker's trial should have been failed by the heartbeat"
    for t in failed:
        assert t.user_attrs.get("fail_reason", "").startswith("interrupted"), t.user_attrs
        # Retried by Optuna's heartbeat (failed_trial) or by the same-host pid check (retry_of).
        retries = [r for r in trials if t.number in (r.system_attrs.get("failed_trial"), r.user_attrs.get("retry_of"))]
        assert retries and all(r.state in (TrialState.COMPLETE, TrialState.PRUNED) for r in retries), (t.number, [r.state for r in retries])
    measured = [t for t in trials if t.state == TrialState.COMPLETE and t.user_attrs.get("duplicate_of") is None]
    for i, a in enumerate(measured):
        for b in measured[i + 1:]:
            if a.user_attrs["flags"] == b.user_attrs["flags"]:
                assert not _overlap(a, b), f"trials {a.number} and {b.number} measured the same flags at the same time"
    targets = {t.user_attrs.get("worker") for t in trials}
    assert len(targets) == 2
    assert study.user_attrs["hardware"]["gpu_count"] == 4


def test_a_worker_on_other_hardware_refuses_to_join(tmp_path, postgres):
    study_name = f"fleet-{uuid.uuid4().hex[:8]}"
    first = write_config(tmp_path, name=study_name, space="speculative_num_steps = { choices = [2] }")
    ok = run_cli("--trials", "1", "--config", str(first), "--study-name", study_name, "--storage", postgres)
    assert ok.returncode == 0, ok.stderr
    other_dir = tmp_path / "h200"
    other_dir.mkdir()
    other = write_config(other_dir, name=study_name, model="meta-llama/Llama-3.1-8B-Instruct --speculative-draft-model-path x/eagle3",
                         command_flags="--speculative-algorithm EAGLE3", space="speculative_num_steps = { choices = [2] }")
    refused = run_cli("--trials", "1", "--config", str(other), "--study-name", study_name, "--storage", postgres)
    assert refused.returncode == 2
    assert "1x NVIDIA H200, but study" in refused.stderr and "4x NVIDIA RTX PRO 6000" in refused.stderr
    assert "--allow-mixed-hardware" in refused.stderr
    allowed = run_cli("--trials", "1", "--config", str(other), "--study-name", study_name, "--storage", postgres, "--allow-mixed-hardware")
    assert allowed.returncode == 0, allowed.stderr
    study = optuna.load_study(study_name=study_name, storage=postgres)
    assert [t.user_attrs.get("accelerator") for t in study.trials if t.state == TrialState.COMPLETE] == [
        "NVIDIA RTX PRO 6000 Blackwell Workstation Edition", "NVIDIA H200"]
