"""ProcessControl on this machine, through the same Shell the SSH path uses."""

import os
import signal
import subprocess
import time

from tuner.config import TargetConfig
from tuner.server.control.process import ProcessControl
from tuner.server.host import connect
from tuner.server.launch import LaunchSpec

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


def test_a_start_whose_session_dropped_is_not_launched_twice(tmp_path):
    # Over SSH a session killed under the start command (after nohup forked the server) returns
    # no exit status, and Shell.run sends the command again on a new connection.  The retry
    # must find the server already launched: a twin would leave the first holding the port.
    from tuner.server.host import Shell, _local_context

    class DropsTheFirstStart:
        def __init__(self):
            self.inner = _local_context()
            self.dropped = 0

        def run(self, command, **kwargs):
            result = self.inner.run(command, **kwargs)
            if "nohup" in command and not self.dropped:
                self.dropped += 1
                result.exited = -1  # what Fabric returns when the channel closed without a status
            return result

    context = DropsTheFirstStart()
    shell = Shell(lambda: context, description="ssh test", remote=True, use_sudo=False, backoff_s=0.0)
    control = ProcessControl(shell, workdir=str(tmp_path / "state"), name="study", stop_timeout_s=5)
    marker = f"sleep 62.{time.time_ns() % 10**9}"
    servers = lambda: subprocess.run(["pgrep", "-f", f"^{marker}$"], capture_output=True, text=True).stdout.split()
    try:
        with control:
            control.start(LaunchSpec(argv=("sh", "-c", f"exec {marker}"), env={}))
            assert context.dropped == 1
            wait_for(lambda: len(servers()) > 0)
            assert len(servers()) == 1, f"the retried start launched {len(servers())} servers"
        wait_for(lambda: not servers(), timeout=15)
    finally:
        subprocess.run(["pkill", "-f", marker])  # a twin is no one's to stop
