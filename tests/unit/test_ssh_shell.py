"""The SSH shell's reconnect rule, without a network: a command whose session was killed under it
comes back from Fabric with exit -1 (paramiko's "no exit status provided by the server"), and
that must be a lost connection to reopen, never a command that failed."""

from __future__ import annotations

from dataclasses import dataclass

import pytest

from tuner.errors import HostError
from tuner.server.host import Shell


@dataclass
class _Ran:
    stdout: str
    stderr: str
    exited: int


class _Context:
    """Stands in for a fabric.Connection: answers each run from a script of exit codes."""

    def __init__(self, exits: list[int], opened: list["_Context"]):
        self.exits = exits
        self.closed = False
        opened.append(self)

    def run(self, command: str, **kwargs) -> _Ran:
        code = self.exits.pop(0)
        return _Ran("ActiveState=active\n" if code == 0 else "", "", code)

    def close(self) -> None:
        self.closed = True


def _shell(exits: list[int], *, remote: bool = True, retries: int = 5) -> tuple[Shell, list[_Context]]:
    opened: list[_Context] = []
    shell = Shell(lambda: _Context(exits, opened), description="ssh root@host:22", remote=remote,
                  use_sudo=False, retries=retries, backoff_s=0.0)
    return shell, opened


def test_a_command_whose_session_was_killed_is_run_again_on_a_new_connection():
    shell, opened = _shell([-1, 0])
    result = shell.run("systemctl show -p ActiveState sglang")
    assert result.ok and result.stdout == "ActiveState=active\n"
    assert len(opened) == 2 and opened[0].closed  # the dead connection was closed and a new one opened


def test_a_real_non_zero_exit_is_returned_not_retried():
    shell, opened = _shell([3, 0])
    result = shell.run("systemctl is-active sglang")
    assert result.exited == 3 and len(opened) == 1


def test_a_session_that_never_comes_back_is_one_clear_error():
    shell, opened = _shell([-1, -1, -1], retries=3)
    with pytest.raises(HostError, match="ssh root@host:22: SSH failed: .*exit status"):
        shell.run("systemctl show -p ActiveState sglang")
    assert len(opened) == 3


def test_a_local_command_that_exits_minus_one_is_its_own_exit_code():
    # Locally there is no channel to lose; invoke reports what the process returned.
    shell, opened = _shell([-1, 0], remote=False)
    assert shell.run("true").exited == -1 and len(opened) == 1
