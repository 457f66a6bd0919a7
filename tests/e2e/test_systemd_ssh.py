"""The operator's real path: a systemd unit on a (test) host, driven over SSH with Fabric.

Needs the test host `.ci/services.sh up` starts (Debian with its own systemd and sshd on
127.0.0.1:2222, the emulator installed at /opt/sglang-emu).  Skipped without it, unless
TUNER_REQUIRE_SERVICES=1 (CI), where a missing host is a failure.
"""

from __future__ import annotations

import os
import subprocess
import textwrap
import threading
import time
from pathlib import Path

import httpx
import optuna
import pytest
from optuna.trial import TrialState

from ..conftest import FAST_BENCH, REPO, free_port, run_cli

pytestmark = [pytest.mark.e2e, pytest.mark.ssh]

ENV_FILE = REPO / ".ci" / ".testhost" / "env"
EMU = "/opt/sglang-emu/bin/python -m sglang_emulator --model-path Qwen/Qwen3.5-122B-A10B --tp 4 --host 127.0.0.1"


@pytest.fixture(scope="module")
def host():
    if not ENV_FILE.exists():
        if os.environ.get("TUNER_REQUIRE_SERVICES") == "1":
            pytest.fail("the SSH test host is not running: .ci/services.sh up failed")
        pytest.skip("no SSH test host (run .ci/services.sh up as root)")
    env = dict(line.split("=", 1) for line in ENV_FILE.read_text().splitlines() if "=" in line)
    return env


def ssh(host, command: str, user: str | None = None, check: bool = True) -> subprocess.CompletedProcess:
    argv = ["ssh", "-o", "StrictHostKeyChecking=yes", "-o", f"UserKnownHostsFile={host['TH_KNOWN_HOSTS']}", "-o", "BatchMode=yes",
            "-i", host["TH_KEY"], "-p", host["TH_PORT"], f"{user or host['TH_USER']}@{host['TH_HOST']}", command]
    return subprocess.run(argv, capture_output=True, text=True, check=check, timeout=60)


def make_unit(host, name: str, port: int, *, restart: str = "no", start: bool = True, extra_env: str = "") -> str:
    unit = textwrap.dedent(f"""\
        [Unit]
        Description=SGLang server (emulator) for the tuner's tests

        [Service]
        ExecStart={EMU} --port {port} --speculative-algorithm NEXTN --speculative-num-steps 1 --speculative-eagle-topk 1 --speculative-num-draft-tokens 2
        Environment=SGLANG_EMULATOR_LOAD_SCALE=0.005 SGLANG_EMULATOR_TIME_SCALE=0.25 {extra_env}
        Restart={restart}
        RestartSec=0.5

        [Install]
        WantedBy=multi-user.target
        """)
    path = f"/etc/systemd/system/{name}.service"
    ssh(host, f"cat > {path} <<'EOF'\n{unit}EOF\nsystemctl daemon-reload" + (f" && systemctl start {name}" if start else ""))
    return path


def unit_hash(host, path: str) -> str:
    return ssh(host, f"sha256sum {path}").stdout.split()[0]


def wait_http(url: str, timeout: float = 30) -> dict:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            if httpx.get(url + "/health_generate", timeout=5).status_code == 200:
                return httpx.get(url + "/server_info").json()
        except httpx.HTTPError:
            pass
        time.sleep(0.2)
    raise AssertionError(f"{url} not healthy in {timeout} s")


def config(tmp_path: Path, host, *, unit: str, port: int, user: str | None = None, known_hosts: str | None = "default",
           space: str | None = None, ssh_port: str | None = None, extra_target: str = "") -> Path:
    known = host["TH_KNOWN_HOSTS"] if known_hosts == "default" else known_hosts
    known_line = f'known_hosts = "{known}"' if known else ""
    space = space or 'speculative_num_steps = { choices = [2, 3] }\nmem_fraction_static = { choices = [0.86, 0.88] }'
    text = textwrap.dedent(f"""
        [study]
        name = "{unit}"
        storage = "sqlite:///{tmp_path / 'study.db'}"
        artifacts = "{tmp_path / 'artifacts'}"

        [target]
        host = "{user or host['TH_USER']}@{host['TH_HOST']}:{ssh_port or host['TH_PORT']}"
        manager = "systemd"
        unit = "{unit}"
        identity_file = "{host['TH_KEY']}"
        {known_line}
        url = "http://127.0.0.1:{port}"
        ready_timeout_s = 60
        poll_interval_s = 0.3
        {extra_target}

        [server]
        command = "{EMU} --port {port} --speculative-algorithm NEXTN"
        env = {{ SGLANG_EMULATOR_LOAD_SCALE = "0.005", SGLANG_EMULATOR_TIME_SCALE = "0.25" }}

        [space]
        {space}

        [bench]
        {FAST_BENCH}
    """)
    path = tmp_path / "study.toml"
    path.write_text(text)
    return path


def _study(tmp_path, name):
    return optuna.load_study(study_name=name, storage=f"sqlite:///{tmp_path / 'study.db'}")


def test_a_study_over_ssh_leaves_the_unit_byte_identical_and_running_as_before(tmp_path, host):
    port = free_port()
    name = f"sglang-a{port}"
    path = make_unit(host, name, port)
    before = unit_hash(host, path)
    assert wait_http(f"http://127.0.0.1:{port}")["speculative_num_steps"] == 1
    result = run_cli("--trials", "2", "--config", str(config(tmp_path, host, unit=name, port=port)), "--seed", "0")
    assert result.returncode == 0, result.stderr
    trials = _study(tmp_path, name).trials
    assert [t.state for t in trials] == [TrialState.COMPLETE] * 2
    for t in trials:
        assert f"--speculative-num-steps {t.params['speculative_num_steps']}" in t.user_attrs["launch_command"]
        assert t.user_attrs["target"].endswith(f"@127.0.0.1:{host['TH_PORT']}")
    assert unit_hash(host, path) == before
    assert ssh(host, f"test -e /etc/systemd/system/{name}.service.d/zz-sglang-tuner.conf", check=False).returncode != 0
    # The operator's own command runs again.
    info = wait_http(f"http://127.0.0.1:{port}")
    assert info["speculative_num_steps"] == 1 and info["mem_fraction_static"] == pytest.approx(0.854)
    ssh(host, f"systemctl stop {name}; rm -f {path}; systemctl daemon-reload")


def test_a_stopped_unit_stays_stopped_and_sudo_works_for_a_plain_user(tmp_path, host):
    port = free_port()
    name = f"sglang-b{port}"
    path = make_unit(host, name, port, start=False)
    result = run_cli("--trials", "1", "--config", str(config(tmp_path, host, unit=name, port=port, user=host["TH_SUDO_USER"])))
    assert result.returncode == 0, result.stderr
    assert _study(tmp_path, name).trials[0].state == TrialState.COMPLETE
    assert ssh(host, f"systemctl is-active {name}", check=False).stdout.strip() in ("inactive", "failed")
    ssh(host, f"rm -f {path}; systemctl daemon-reload")


def test_a_unit_in_a_restart_loop_is_a_pruned_trial_not_a_timeout(tmp_path, host):
    port = free_port()
    name = f"sglang-c{port}"
    path = make_unit(host, name, port, restart="always", start=False)
    cfg = config(tmp_path, host, unit=name, port=port, space="mem_fraction_static = { choices = [0.60] }\nspeculative_num_steps = { choices = [2] }")
    result = run_cli("--trials", "1", "--config", str(cfg))
    assert result.returncode == 0, result.stderr
    (trial,) = _study(tmp_path, name).trials
    assert trial.state == TrialState.PRUNED
    assert "KV cache does not fit" in trial.user_attrs["fail_reason"]
    assert "Loaded weights leave no GPU memory" in trial.user_attrs["log_tail"]
    # The trial, not the command's imports and set-up (which a loaded machine stretches to 15-25 s):
    # a restart loop read as a timeout would wait out ready_timeout_s.
    took = (trial.datetime_complete - trial.datetime_start).total_seconds()
    assert took < 30, took
    assert ssh(host, f"systemctl is-active {name}", check=False).stdout.strip() != "active"
    ssh(host, f"systemctl stop {name}; rm -f {path}; systemctl daemon-reload")


def test_a_dropped_ssh_connection_is_reestablished(tmp_path, host):
    port = free_port()
    name = f"sglang-d{port}"
    path = make_unit(host, name, port, start=False)
    cfg = config(tmp_path, host, unit=name, port=port, space="speculative_num_steps = { choices = [2] }")
    proc = subprocess.Popen([os.sys.executable, "-m", "tuner.optimize", "--trials", "2", "--config", str(cfg)],
                            cwd=REPO, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)

    def drop_sessions():
        # Once the first trial's server is up, kill every SSH session on the host (the tuner's too).
        wait_http(f"http://127.0.0.1:{port}", timeout=60)
        ssh(host, "pkill -f 'sshd: root@' || true", check=False)

    dropper = threading.Thread(target=drop_sessions)
    dropper.start()
    out, err = proc.communicate(timeout=300)
    dropper.join()
    assert proc.returncode == 0, err
    trials = _study(tmp_path, name).trials
    assert len(trials) == 2
    assert all(t.state in (TrialState.COMPLETE, TrialState.FAIL) for t in trials)
    assert trials[-1].state == TrialState.COMPLETE  # the run carried on after reconnecting
    assert "connection lost" in err or all(t.state == TrialState.COMPLETE for t in trials)
    assert ssh(host, f"test -e /etc/systemd/system/{name}.service.d/zz-sglang-tuner.conf", check=False).returncode != 0
    ssh(host, f"systemctl stop {name}; rm -f {path}; systemctl daemon-reload")


def test_an_unknown_host_key_is_rejected_before_any_trial(tmp_path, host):
    port = free_port()
    empty = tmp_path / "known_hosts"
    empty.write_text("")
    result = run_cli("--trials", "1", "--config", str(config(tmp_path, host, unit="sglang-x", port=port, known_hosts=str(empty))))
    assert result.returncode == 2
    assert "unknown SSH host key; add the host to known_hosts (ssh-keyscan) or set [target] accept_unknown_host = true" in result.stderr
    assert not (tmp_path / "study.db").exists() or not _study(tmp_path, "sglang-x").trials


def test_a_changed_host_key_is_refused(tmp_path, host):
    wrong = tmp_path / "known_hosts"
    keygen = subprocess.run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-f", str(tmp_path / "other")], capture_output=True)
    assert keygen.returncode == 0
    key = (tmp_path / "other.pub").read_text().split()
    wrong.write_text(f"[127.0.0.1]:{host['TH_PORT']} {key[0]} {key[1]}\n")
    result = run_cli("--trials", "1", "--config", str(config(tmp_path, host, unit="sglang-x", port=free_port(), known_hosts=str(wrong))))
    assert result.returncode == 2
    assert "host key does not match known_hosts" in result.stderr


def test_an_unreachable_host_names_the_fix(tmp_path, host):
    result = run_cli("--trials", "1", "--config", str(config(tmp_path, host, unit="sglang-x", port=free_port(), ssh_port=str(free_port()))))
    assert result.returncode == 2
    assert "connection refused; check [target] host (and its port) and that sshd runs" in result.stderr


def test_a_missing_unit_names_the_fix(tmp_path, host):
    result = run_cli("--trials", "1", "--config", str(config(tmp_path, host, unit="no-such-unit", port=free_port())))
    assert result.returncode == 2
    assert "no such unit" in result.stderr and "[target] unit" in result.stderr


def test_a_killed_run_leaves_a_drop_in_that_the_next_run_removes(tmp_path, host):
    port = free_port()
    name = f"sglang-e{port}"
    path = make_unit(host, name, port)  # running the operator's command
    before = unit_hash(host, path)
    cfg = config(tmp_path, host, unit=name, port=port, space="speculative_num_steps = { choices = [3] }")
    # The killed run decodes in real time, so it is still in its trial when killed; the next run,
    # which only has to find and remove the drop-in, runs at the usual speed.
    slow = tmp_path / "slow.toml"
    slow.write_text(cfg.read_text().replace('SGLANG_EMULATOR_TIME_SCALE = "0.25"', 'SGLANG_EMULATOR_TIME_SCALE = "1"'))
    assert slow.read_text() != cfg.read_text()
    proc = subprocess.Popen([os.sys.executable, "-m", "tuner.optimize", "--trials", "1", "--config", str(slow)],
                            cwd=REPO, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        try:
            if httpx.get(f"http://127.0.0.1:{port}/server_info", timeout=5).json().get("speculative_num_steps") == 3:
                break
        except (httpx.HTTPError, ValueError):
            pass
        time.sleep(0.2)
    proc.kill()
    proc.wait()
    dropin = f"/etc/systemd/system/{name}.service.d/zz-sglang-tuner.conf"
    assert ssh(host, f"grep -c 'original-state: active' {dropin}").stdout.strip() == "1"
    again = run_cli("--trials", "1", "--config", str(cfg))
    assert again.returncode == 0, again.stderr
    assert ssh(host, f"test -e {dropin}", check=False).returncode != 0
    assert unit_hash(host, path) == before
    info = wait_http(f"http://127.0.0.1:{port}")
    assert info["speculative_num_steps"] == 1  # the operator's command, as before the killed run
    ssh(host, f"systemctl stop {name}; rm -f {path}; systemctl daemon-reload")


from ..control_contract import ControlContract  # noqa: E402


class TestProcessControlOverSSH(ControlContract):
    """The process manager on a host without systemd: the same contract as locally, over SSH."""

    @pytest.fixture(autouse=True)
    def _host(self, host):
        self.host_env = host

    def make_control(self, tmp_path):
        from tuner.config import TargetConfig
        from tuner.server.control.process import ProcessControl
        from tuner.server.host import connect

        h = self.host_env
        target = TargetConfig(host=f"{h['TH_USER']}@{h['TH_HOST']}:{h['TH_PORT']}", identity_file=h["TH_KEY"], known_hosts=h["TH_KNOWN_HOSTS"])
        return ProcessControl(connect(target), workdir=f"/tmp/contract-{tmp_path.name}", name="study", stop_timeout_s=5)


def test_best_apply_installs_a_drop_in_of_its_own(tmp_path, host):
    port = free_port()
    name = f"sglang-f{port}"
    path = make_unit(host, name, port)
    before = unit_hash(host, path)
    cfg = config(tmp_path, host, unit=name, port=port, space="speculative_num_steps = { choices = [3] }")
    assert run_cli("--trials", "1", "--config", str(cfg)).returncode == 0
    applied = subprocess.run([os.sys.executable, "-m", "tuner.best", "--config", str(cfg), "--apply"],
                             capture_output=True, text=True, cwd=REPO, timeout=300)
    assert applied.returncode == 0, applied.stderr
    assert wait_http(f"http://127.0.0.1:{port}")["speculative_num_steps"] == 3
    dropin = ssh(host, f"cat /etc/systemd/system/{name}.service.d/50-sglang-tuner-best.conf").stdout
    assert "--speculative-num-steps 3" in dropin and "ExecStart=\n" in dropin
    assert unit_hash(host, path) == before
    # --restore: the drop-in gone, the unit back on its own command (steps 1, as its ExecStart says).
    restored = subprocess.run([os.sys.executable, "-m", "tuner.best", "--config", str(cfg), "--restore"],
                              capture_output=True, text=True, cwd=REPO, timeout=300)
    assert restored.returncode == 0, restored.stderr
    assert f"{name}.service restarted on its own command" in restored.stderr
    assert ssh(host, f"test -e /etc/systemd/system/{name}.service.d/50-sglang-tuner-best.conf", check=False).returncode != 0
    assert wait_http(f"http://127.0.0.1:{port}", timeout=60)["speculative_num_steps"] == 1
    ssh(host, f"systemctl stop {name}; rm -rf {path} /etc/systemd/system/{name}.service.d; systemctl daemon-reload")


def test_leave_best_keeps_the_studys_best_applied_as_best_apply_would(tmp_path, host):
    port = free_port()
    name = f"sglang-g{port}"
    path = make_unit(host, name, port)
    before = unit_hash(host, path)
    cfg = config(tmp_path, host, unit=name, port=port, space="speculative_num_steps = { choices = [4] }",
                 extra_target="leave_best = true")
    result = run_cli("--trials", "1", "--config", str(cfg))
    assert result.returncode == 0, result.stderr
    assert "leave_best: trial 0" in result.stderr
    # The run's drop-in is gone; the best configuration sits in a drop-in of its own and runs.
    assert ssh(host, f"test -e /etc/systemd/system/{name}.service.d/zz-sglang-tuner.conf", check=False).returncode != 0
    dropin = ssh(host, f"cat /etc/systemd/system/{name}.service.d/50-sglang-tuner-best.conf").stdout
    assert "--speculative-num-steps 4" in dropin
    assert wait_http(f"http://127.0.0.1:{port}")["speculative_num_steps"] == 4
    assert unit_hash(host, path) == before
    ssh(host, f"systemctl stop {name}; rm -rf {path} /etc/systemd/system/{name}.service.d; systemctl daemon-reload")


def test_schedule_apply_installs_the_table_beside_a_drop_in_and_restore_removes_both(tmp_path, host):
    import json

    port = free_port()
    name = f"sglang-s{port}"
    path = make_unit(host, name, port)
    before = unit_hash(host, path)
    cfg = config(tmp_path, host, unit=name, port=port, space="speculative_num_steps = { choices = [2] }\nspeculative_eagle_topk = { choices = [1] }")
    assert run_cli("--trials", "1", "--config", str(cfg)).returncode == 0
    out = tmp_path / "table.json"
    table = f"/etc/sglang-tuner/{name}.adaptive.json"
    dropin_path = f"/etc/systemd/system/{name}.service.d/50-sglang-tuner-best.conf"
    try:
        applied = subprocess.run([os.sys.executable, "-m", "tuner.schedule", "--config", str(cfg), "--levels", "2", "--out", str(out),
                                  "--no-verify", "--apply"], capture_output=True, text=True, cwd=REPO, timeout=600)
        assert applied.returncode == 0, applied.stderr
        assert f"table {table}" in applied.stderr
        assert json.loads(ssh(host, f"cat {table}").stdout) == json.loads(out.read_text())
        dropin = ssh(host, f"cat {dropin_path}").stdout
        assert f"--speculative-adaptive-config {table}" in dropin and "--speculative-adaptive " in dropin and "ExecStart=\n" in dropin
        info = wait_http(f"http://127.0.0.1:{port}")
        assert info["speculative_adaptive"] is True and f"--speculative-adaptive-config {table}" in info["launch_command"]
        assert unit_hash(host, path) == before
        restored = subprocess.run([os.sys.executable, "-m", "tuner.schedule", "--config", str(cfg), "--restore"],
                                  capture_output=True, text=True, cwd=REPO, timeout=300)
        assert restored.returncode == 0, restored.stderr
        assert "restored:" in restored.stderr
        for gone in (table, dropin_path):
            assert ssh(host, f"test -e {gone}", check=False).returncode != 0, f"{gone} is still there"
        # The unit runs its own command again: steps 1 as its ExecStart says, no adaptive mode.
        info = wait_http(f"http://127.0.0.1:{port}", timeout=60)
        assert info["speculative_num_steps"] == 1 and "--speculative-adaptive" not in info["launch_command"]
        assert info.get("speculative_adaptive") in (False, None)
        assert unit_hash(host, path) == before
    finally:
        ssh(host, f"systemctl stop {name}; rm -rf {path} /etc/systemd/system/{name}.service.d {table}; systemctl daemon-reload", check=False)


def test_two_units_side_by_side_and_a_second_tuner_on_one_is_refused(tmp_path, host):
    from tuner.config import TargetConfig
    from tuner.errors import HostError
    from tuner.server.control.systemd import SystemdControl
    from tuner.server.host import connect

    target = TargetConfig(host=f"{host['TH_USER']}@{host['TH_HOST']}:{host['TH_PORT']}", identity_file=host["TH_KEY"],
                          known_hosts=host["TH_KNOWN_HOSTS"], manager="systemd", unit="x")
    names = [f"sglang-l{free_port()}", f"sglang-m{free_port()}"]
    paths = [make_unit(host, name, 0, start=False) for name in names]
    a, b = (SystemdControl(connect(target), unit=n, name="s", stop_timeout_s=5) for n in names)
    try:
        with a, b:
            a.prepare()
            b.prepare()  # another unit: no conflict
            owner = ssh(host, f"cat /run/sglang-tuner/{names[0]}.service.owner").stdout
            # Another tuner (here: one whose pid lives, pid 1 of the host running the tests).
            ssh(host, f"printf %s {owner.split(':')[0]}:1: > /run/sglang-tuner/{names[0]}.service.owner")
            intruder = SystemdControl(connect(target), unit=names[0], name="s", stop_timeout_s=5)
            with pytest.raises(HostError, match=r"driven by another tuner \(host .*, pid 1\)"):
                with intruder:
                    intruder.prepare()
            ssh(host, f"printf %s {owner} > /run/sglang-tuner/{names[0]}.service.owner")
        for name in names:
            assert ssh(host, f"test -e /run/sglang-tuner/{name}.service.owner", check=False).returncode == 1
    finally:
        ssh(host, f"rm -f {' '.join(paths)}; systemctl daemon-reload")
