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
    assert_no_server,
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
    other_port = free_port()
    other = write_config(other_dir, name=study_name, model="meta-llama/Llama-3.1-8B-Instruct --speculative-draft-model-path x/eagle3",
                         command_flags="--speculative-algorithm EAGLE3", space="speculative_num_steps = { choices = [2] }", port=other_port)
    refused = run_cli("--trials", "1", "--config", str(other), "--study-name", study_name, "--storage", postgres)
    assert refused.returncode == 2
    assert_no_server(other_port)  # refused after its server became ready: that server is stopped
    assert "1x NVIDIA H200, but study" in refused.stderr and "4x NVIDIA RTX PRO 6000" in refused.stderr
    assert "--allow-mixed-hardware" in refused.stderr
    allowed = run_cli("--trials", "1", "--config", str(other), "--study-name", study_name, "--storage", postgres, "--allow-mixed-hardware")
    assert allowed.returncode == 0, allowed.stderr
    study = optuna.load_study(study_name=study_name, storage=postgres)
    assert [t.user_attrs.get("accelerator") for t in study.trials if t.state == TrialState.COMPLETE] == [
        "NVIDIA RTX PRO 6000 Blackwell Workstation Edition", "NVIDIA H200"]


# -- shared hosts, database outages, no orphans ---------------------------------------------------

SPACE = "speculative_num_steps = { low = 1, high = 4 }\nspeculative_eagle_topk = { choices = [1, 2] }\nmem_fraction_static = { low = 0.80, high = 0.92, step = 0.02 }"


def _configs(tmp_path: Path, study_name: str, ports: list[int], study: str = "") -> list[Path]:
    """One config per worker, all with the same [target] workdir (as on one shared host)."""
    configs = []
    for i, port in enumerate(ports):
        d = tmp_path / f"w{i}"
        d.mkdir()
        path = write_config(d, name=study_name, port=port, space=SPACE, study=study)
        path.write_text(path.read_text().replace(f'workdir = "{d / "work"}"', f'workdir = "{tmp_path / "work"}"'))
        configs.append(path)
    return configs


def _measured_once(trials) -> None:
    """Every trial ended, none failed or retried (nothing lost, so nothing measured again), and no
    worker measured the same flags twice.  (Two workers may each measure the same flags once
    while neither knows the other's GPUs match: before its first launch a worker compares only
    with its own target's trials.)"""
    detail = [(t.number, t.state.name, t.user_attrs.get("worker"), t.user_attrs.get("flags"), t.user_attrs.get("fail_reason")) for t in trials]
    assert all(t.state in (TrialState.COMPLETE, TrialState.PRUNED) for t in trials), detail
    assert not [t for t in trials if t.user_attrs.get("retry_of") is not None or "failed_trial" in t.system_attrs], detail
    for worker in {t.user_attrs.get("worker") for t in trials}:
        measured = [str(sorted(t.user_attrs["flags"].items())) for t in trials if t.user_attrs.get("worker") == worker
                    and t.state == TrialState.COMPLETE and t.user_attrs.get("duplicate_of") is None]
        assert len(measured) == len(set(measured)), f"{worker} measured the same flags twice: {detail}"


def test_two_workers_on_one_host_share_the_workdir_and_keep_apart(tmp_path, postgres):
    study_name = f"fleet-{uuid.uuid4().hex[:8]}"
    ports = [free_port(), free_port()]
    workers = [_worker(c, study_name, postgres, 3) for c in _configs(tmp_path, study_name, ports)]
    for w in workers:
        out, err = w.communicate(timeout=600)
        assert w.returncode == 0, err
        assert "left behind" not in err and "adopting" not in err, err
    trials = optuna.load_study(study_name=study_name, storage=postgres).trials
    assert len(trials) == 6 and all(t.state in (TrialState.COMPLETE, TrialState.PRUNED) for t in trials), [t.state for t in trials]
    _measured_once(trials)
    assert {t.user_attrs["url"] for t in trials} == {f"http://127.0.0.1:{p}" for p in ports}
    for port in ports:
        assert_no_server(port)
    assert not list((tmp_path / "work").rglob("server.pid")) and not list((tmp_path / "work").rglob("owner"))


class PrivatePostgres:
    """A PostgreSQL server of the test's own (the binaries .ci/services.sh installs), so stopping
    it mid-run disturbs nobody else's tests."""

    def __init__(self):
        import glob
        import shutil
        import tempfile

        bins = sorted(glob.glob("/usr/lib/postgresql/*/bin"))
        if not bins or os.geteuid() != 0 or not shutil.which("runuser"):
            pytest.skip("needs root and PostgreSQL's binaries (.ci/services.sh up)")
        self.bin = bins[-1]
        self.dir = Path(tempfile.mkdtemp(prefix="tuner-pg-"))
        shutil.chown(self.dir, "postgres", "postgres")
        self.port = free_port()
        self.url = f"postgresql://postgres@127.0.0.1:{self.port}/postgres"
        self._pg("initdb", "-D", f"{self.dir}/data", "-A", "trust", "-U", "postgres")
        self.start()

    def _pg(self, tool: str, *args: str) -> None:
        subprocess.run(["runuser", "-u", "postgres", "--", f"{self.bin}/{tool}", *args], check=True, capture_output=True, timeout=120)

    def start(self) -> None:
        self._pg("pg_ctl", "-D", f"{self.dir}/data", "-l", f"{self.dir}/server.log", "-w",
                 "-o", f"-c listen_addresses=127.0.0.1 -p {self.port} -k {self.dir}", "start")

    def stop(self, mode: str = "immediate") -> None:
        self._pg("pg_ctl", "-D", f"{self.dir}/data", "-m", mode, "-w", "stop")

    def destroy(self) -> None:
        import shutil

        subprocess.run(["runuser", "-u", "postgres", "--", f"{self.bin}/pg_ctl", "-D", f"{self.dir}/data", "-m", "immediate", "stop"],
                       capture_output=True, timeout=60)
        shutil.rmtree(self.dir, ignore_errors=True)


@pytest.fixture
def private_postgres(postgres):
    pg = PrivatePostgres()
    try:
        yield pg
    finally:
        pg.destroy()


def _serving(ports: list[int]) -> int:
    import time

    import httpx

    deadline = time.monotonic() + 120
    while time.monotonic() < deadline:
        for port in ports:
            try:
                if httpx.get(f"http://127.0.0.1:{port}/health_generate", timeout=2).status_code == 200:
                    return port
            except httpx.HTTPError:
                pass
        time.sleep(0.1)
    raise AssertionError("no worker's server became ready")


def test_the_database_stopped_for_20_s_mid_trial_loses_nothing(tmp_path, private_postgres):
    import datetime
    import time

    pg = private_postgres
    study_name = f"outage-{uuid.uuid4().hex[:8]}"
    ports = [free_port(), free_port()]
    optuna.create_study(study_name=study_name, storage=pg.url, directions=["maximize"] * 3)
    workers = [_worker(c, study_name, pg.url, 2) for c in _configs(tmp_path, study_name, ports)]
    try:
        _serving(ports)  # a trial's server is up: stop the database under it
        stopped_at = datetime.datetime.now()
        pg.stop("immediate")
        time.sleep(20)
    finally:
        pg.start()
    results = [w.communicate(timeout=600) for w in workers]
    for w, (out, err) in zip(workers, results):
        assert w.returncode == 0, err
        assert "Traceback" not in err, err
    trials = optuna.load_study(study_name=study_name, storage=pg.url).trials
    assert len(trials) == 4
    _measured_once(trials)
    in_flight = [t for t in trials if t.datetime_start < stopped_at and (t.datetime_complete is None or t.datetime_complete > stopped_at)]
    assert in_flight, "a trial should have been running when the database stopped"
    for t in in_flight:
        assert t.state == TrialState.COMPLETE and "accept_length" in t.user_attrs and t.values, (t.number, t.state, t.user_attrs.get("fail_reason"))
    for port in ports:
        assert_no_server(port)
    assert not list((tmp_path / "work" / "journal").glob("*.jsonl"))


def test_the_database_gone_past_the_limit_stops_with_one_line_and_no_server(tmp_path, private_postgres):
    pg = private_postgres
    study_name = f"gone-{uuid.uuid4().hex[:8]}"
    port = free_port()
    (config,) = _configs(tmp_path, study_name, [port], study="storage_outage_s = 5")
    worker = _worker(config, study_name, pg.url, 2)
    try:
        _serving([port])
        pg.stop("immediate")
        out, err = worker.communicate(timeout=120)
    finally:
        pg.start()
    assert worker.returncode == 2, err
    (line,) = [l for l in err.splitlines() if l.startswith("error:")]
    assert f"127.0.0.1:{pg.port}/postgres did not answer for 5 s" in line and "Traceback" not in err, err
    assert_no_server(port)
    again = _worker(config, study_name, pg.url, 1)
    out, err = again.communicate(timeout=300)
    assert again.returncode == 0, err
    trials = optuna.load_study(study_name=study_name, storage=pg.url).trials
    assert not [t for t in trials if t.state == TrialState.RUNNING]
    assert_no_server(port)
    assert not list((tmp_path / "work" / "journal").glob("*.jsonl"))
