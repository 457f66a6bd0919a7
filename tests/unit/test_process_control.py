"""ProcessControl on this machine, through the same Shell the SSH path uses."""

import os
import signal
import subprocess
import time

from tuner.config import TargetConfig
from tuner.server.control.process import ProcessControl
from tuner.server.host import connect

from ..control_contract import ControlContract, wait_for


class TestLocalProcessControl(ControlContract):
    def make_control(self, tmp_path):
        return ProcessControl(connect(TargetConfig()), workdir=str(tmp_path / "state"), name="study", stop_timeout_s=5)

    def test_a_server_left_by_a_killed_run_is_stopped_first(self, tmp_path):
        marker = f"sleep 61.{time.time_ns() % 10**9}"
        first = self.make_control(tmp_path)
        first.start(self.spec(f"exec {marker}"))
        wait_for(lambda: self.process_alive(first, marker))
        # A new run (new control object, same state directory) starts a server.
        second = self.make_control(tmp_path)
        with second:
            second.start(self.spec("exec sleep 60"))
            wait_for(lambda: not self.process_alive(second, marker), timeout=10)

    def test_a_reused_pid_is_not_killed(self, tmp_path):
        control = self.make_control(tmp_path)
        state = tmp_path / "state" / "study"
        state.mkdir(parents=True)
        # A foreign process group whose leader has exited (as a CI runner's shell can be),
        # named by a stale pid file: it must survive our stop().
        foreign = subprocess.Popen(["setsid", "sh", "-c", "sleep 30 & echo $$"], stdout=subprocess.PIPE, text=True)
        group = int(foreign.stdout.readline())
        foreign.wait()
        try:
            (state / "server.pid").write_text(str(group))
            control.stop()
            assert not (state / "server.pid").exists()
            os.killpg(group, 0)  # still alive: raises ProcessLookupError if we killed it
        finally:
            os.killpg(group, signal.SIGKILL)
        # Our own test process group is never signalled either.
        (state / "server.pid").write_text(str(os.getpgrp()))
        control.stop()
