"""The launch sequence retries a launch the previous server's held ports failed."""

import pytest

from tuner import sequence
from tuner.config import parse_config
from tuner.errors import LaunchError
from tuner.sglang_args import CommandLine, Params
from tuner.server.launch import LaunchSpec
from tuner.server.connection import Target


class FakeControl:
    def __init__(self):
        self.starts = 0
        self.stops = 0

    def start(self, spec):
        self.starts += 1

    def stop(self):
        self.stops += 1


def _target(control):
    cfg = parse_config('[study]\nname = "s"\n[server]\ncommand = "python -m sglang.launch_server --model-path m"\n')
    return Target(cfg, shell=None, control=control, client=None, api_key=None, command=CommandLine.parse(cfg.server.argv))


def test_a_held_port_is_launched_again_after_the_old_processes_are_gone(monkeypatch):
    outcomes = [LaunchError("the previous server still holds a port", kind="port_busy"), "ready"]

    def fake_wait(*args, **kwargs):
        outcome = outcomes.pop(0)
        if isinstance(outcome, Exception):
            raise outcome
        return outcome

    monkeypatch.setattr(sequence, "wait_ready", fake_wait)
    monkeypatch.setattr(sequence.time, "sleep", lambda s: None)
    control = FakeControl()
    assert sequence.launch(_target(control), LaunchSpec(argv=("x",), params=Params())) == "ready"
    assert control.starts == 2 and control.stops == 1


def test_other_launch_failures_are_not_retried(monkeypatch):
    def fake_wait(*args, **kwargs):
        raise LaunchError("the KV cache does not fit", kind="memory_kv")

    monkeypatch.setattr(sequence, "wait_ready", fake_wait)
    control = FakeControl()
    with pytest.raises(LaunchError, match="KV cache"):
        sequence.launch(_target(control), LaunchSpec(argv=("x",), params=Params()))
    assert control.starts == 1
