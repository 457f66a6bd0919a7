"""The service-control contract, run against every implementation (Optuna's StorageTestCase idea).

A subclass provides `make_control(tmp_path)` and `spec(script)`; the script is a shell
snippet the "server" runs.  Local ProcessControl always runs; the SSH and systemd variants run
on the CI test host.
"""

from __future__ import annotations

import shlex
import socket
import time

import pytest

from tuner.errors import HostError
from tuner.server.control.base import TUNER_ID
from tuner.server.launch import LaunchSpec


def wait_for(predicate, timeout: float = 10.0, interval: float = 0.1):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = predicate()
        if value:
            return value
        time.sleep(interval)
    raise AssertionError("condition not met in time")


class ControlContract:
    def make_control(self, tmp_path):
        raise NotImplementedError

    def spec(self, script: str, env: dict[str, str] | None = None) -> LaunchSpec:
        return LaunchSpec(argv=("sh", "-c", script), env=env or {})

    def process_alive(self, control, pattern: str) -> bool:
        """Whether a process whose command line contains `pattern` runs on the target."""
        # "[s]leep" matches "sleep" but not the command line of the shell running pgrep.
        regex = f"[{pattern[0]}]{pattern[1:]}"
        return control.shell.run(f"pgrep -f {regex!r} >/dev/null").ok

    def test_start_poll_and_log(self, tmp_path):
        control = self.make_control(tmp_path)
        with control:
            control.start(self.spec('echo "hello $GREETING"; exec sleep 30', env={"GREETING": "world"}))
            wait_for(lambda: "hello world" in (control.poll()[1] + control.log()))
            status, _ = control.poll()
            assert status.running

    def test_exit_status_is_seen(self, tmp_path):
        control = self.make_control(tmp_path)
        with control:
            control.start(self.spec("echo bye; exit 3"))
            status = wait_for(lambda: (lambda s: s if s.state == "exited" else None)(control.poll()[0]))
            assert status.exit_code == 3
            assert "bye" in control.log()

    def test_killed_by_signal_reports_minus_nine(self, tmp_path):
        control = self.make_control(tmp_path)
        with control:
            control.start(self.spec("kill -9 $$"))
            status = wait_for(lambda: (lambda s: s if s.state == "exited" else None)(control.poll()[0]))
            assert status.exit_code == -9

    def test_stop_takes_the_whole_process_group_and_is_idempotent(self, tmp_path):
        control = self.make_control(tmp_path)
        marker = f"sleep 60.{time.time_ns() % 10**9}"  # a unique command line to look for
        with control:
            # A child of the server: it must die with the group.
            control.start(self.spec(f"{marker} & exec sleep 60"))
            wait_for(lambda: self.process_alive(control, marker))
            control.stop()
            wait_for(lambda: not self.process_alive(control, marker), timeout=5)
            assert not control.poll()[0].running
            control.stop()

    def test_a_stop_right_after_the_start_takes_the_server(self, tmp_path):
        """A signal at "launching" stops the server the moment its start returns: before its
        command has run.  Every process of the group must carry the state marker from its fork
        on (the stop signals only a group that does), or that stop takes the group for someone
        else's and the server is left running."""
        control = self.make_control(tmp_path)
        marker = f"sleep 62.{time.time_ns() % 10**9}"
        with control:
            for _ in range(5):
                control.start(self.spec(f"exec {marker}"))
                group = control.shell.run(f"cat {shlex.quote(control.dir)}/server.pid").stdout.strip()
                listed = control.shell.run(
                    f"for p in $(pgrep -g {group}); do tr '\\0' '\\n' < /proc/$p/environ 2>/dev/null | grep -c '^SGLANG_TUNER_STATE=' || true; done")
                assert listed.stdout.split() and "0" not in listed.stdout.split(), listed.stdout
                control.stop()
            wait_for(lambda: not self.process_alive(control, marker), timeout=15)

    def test_stop_escalates_to_sigkill(self, tmp_path):
        control = self.make_control(tmp_path)
        control.stop_timeout_s = 0.5
        with control:
            control.start(self.spec("trap '' TERM; echo trapped; while true; do sleep 0.1; done"))
            # TERM is ignored only once the trap has run: a SIGTERM before it ends the shell and
            # the test would pass without the escalation.
            wait_for(lambda: "trapped" in (control.poll()[1] + control.log()))
            started = time.monotonic()
            control.stop()
            assert 0.5 <= time.monotonic() - started < 10  # waited out stop_timeout_s, then SIGKILL
            assert not control.poll()[0].running

    def test_restart_replaces_the_previous_server(self, tmp_path):
        control = self.make_control(tmp_path)
        with control:
            control.start(self.spec("echo first; exec sleep 60"))
            wait_for(lambda: "first" in control.log() or "first" in control.poll()[1])
            control.start(self.spec("echo second; exec sleep 60"))
            wait_for(lambda: "second" in control.poll()[1] + control.log())
            assert "first" not in control.log()

    def _write_owner(self, control, owner: str) -> None:
        path = shlex.quote(control.owner_path)
        assert control.shell.run(f"mkdir -p $(dirname {path}) && printf %s {shlex.quote(owner)} > {path}", sudo=True).ok

    def _read_owner(self, control) -> str:
        return control.shell.run(f"cat {shlex.quote(control.owner_path)} 2>/dev/null || true", sudo=True).stdout.strip()

    def test_a_second_tuner_on_the_same_server_is_refused_and_touches_nothing(self, tmp_path):
        control = self.make_control(tmp_path)
        live = f"{socket.gethostname()}:1:"  # pid 1 lives for as long as the machine
        self._write_owner(control, live)
        with pytest.raises(HostError, match=rf"driven by another tuner \(host {socket.gethostname()}, pid 1\)"):
            with control:
                control.prepare()
        assert self._read_owner(control) == live
        self._write_owner(control, "")

    def test_a_dead_owners_leftover_is_adopted_and_the_lock_released_at_the_end(self, tmp_path):
        control = self.make_control(tmp_path)
        self._write_owner(control, f"{socket.gethostname()}:999999999:0")
        with control:
            control.prepare()
            assert self._read_owner(control) == TUNER_ID
        assert self._read_owner(control) == ""
