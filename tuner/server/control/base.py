"""Service control: the one small interface between the study and the server's process.

Two implementations: `ProcessControl` runs the command itself (nohup + setsid, its own process
group, a log file and a pid file); `SystemdControl` overrides a unit's ExecStart with a drop-in
and restarts it.  Both run every command through a `host.Shell`, so the same code works on
this machine and over SSH.  Both are context managers: leaving the `with` restores the target
(stops our server, or puts the operator's unit back), on every path including Ctrl-C.
"""

from __future__ import annotations

import os
import shlex
import socket
from dataclasses import dataclass
from typing import Protocol

from tuner.errors import HostError
from tuner.server.host import Shell
from tuner.server.launch import LaunchSpec

__all__ = ["ServiceStatus", "ServiceControl", "RestoresOnExit", "LOG_LIMIT_BYTES", "OwnerLock", "TUNER_ID"]

LOG_LIMIT_BYTES = 4 << 20  # a trial's log kept in memory: the head and the newest lines


@dataclass(frozen=True)
class ServiceStatus:
    state: str  # "running" | "exited" | "stopped" | "restarting"
    exit_code: int | None = None  # Popen convention: -9 for SIGKILL
    detail: str = ""

    @property
    def running(self) -> bool:
        return self.state == "running"


class ServiceControl(Protocol):
    description: str

    def prepare(self) -> None:
        """Before the first trial: check the target, undo what a killed run left behind."""

    def start(self, spec: LaunchSpec) -> None:
        """Stop whatever server this control left before, then launch `spec`."""

    def poll(self) -> tuple[ServiceStatus, str]:
        """The server's state now, and the log text written since the last poll."""

    def log(self) -> str:
        """The whole log of the current launch (bounded)."""

    def stop(self) -> None:
        """Stop the server (SIGTERM, then SIGKILL after the grace period). Idempotent."""

    def restore(self) -> None:
        """Leave the target as the operator had it before the run."""

    def apply(self, spec: LaunchSpec, *, study: str) -> str:
        """Start `spec` to stay after the tuner exits (`tuner.best --apply`); where it went."""

    def unapply(self, also_remove: tuple[str, ...] = ()) -> str:
        """Undo `apply`, removing `also_remove` (files installed with it); what it did."""

    def __enter__(self) -> "ServiceControl": ...

    def __exit__(self, *exc: object) -> None: ...


class RestoresOnExit:
    """A control as a context manager: the target is restored on leaving, on every path.  A
    second Ctrl-C / SIGTERM that lands while restoring finishes the restore before it is
    raised, so the operator's server is never left half put back."""

    def __enter__(self):
        return self

    def __exit__(self, *exc: object) -> None:
        try:
            self.restore()
        except KeyboardInterrupt:
            self.restore()
            raise


class LogBuffer:
    """A launch's log: all of it while small, then its head and its newest part."""

    def __init__(self, limit: int = LOG_LIMIT_BYTES):
        self.limit = limit
        self.head = ""
        self.tail = ""
        self.dropped = False

    def add(self, text: str) -> None:
        if not self.dropped and len(self.head) + len(text) <= self.limit // 2:
            self.head += text
            return
        self.tail += text
        if len(self.tail) > self.limit // 2:
            self.tail = self.tail[-self.limit // 2 :]
            self.dropped = True

    def text(self) -> str:
        if self.dropped:
            return self.head + "\n[... log truncated ...]\n" + self.tail
        return self.head + self.tail

    def recent(self, chars: int = 65536) -> str:
        return self.text()[-chars:]


def _start_time(pid: int) -> str:
    """A process's start time (clock ticks since boot): a pid reused later has another one."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[19]
    except (OSError, IndexError):
        return "0"


TUNER_ID = f"{socket.gethostname()}:{os.getpid()}:{_start_time(os.getpid())}"  # this tuner process


def pid_alive(pid: int) -> bool:
    """Whether process `pid` exists on this machine (another user's process counts)."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def _owner_alive(owner: str) -> bool:
    """Whether the tuner named `host:pid:start` still runs.  A tuner on another machine cannot
    be checked from here, so it counts as alive (the refusal says how to clear it)."""
    host, _, rest = owner.partition(":")
    pid, _, start = rest.partition(":")
    if host != socket.gethostname() or not pid.isdigit():
        return host != socket.gethostname()
    return pid_alive(int(pid)) and (_start_time(int(pid)) == start or start == "")


class OwnerLock:
    """Which tuner drives a server: `<host>:<pid>:<start>` in a file on the target, changed only
    by compare-and-swap under `flock`, so two tuners that look at once cannot both take it.
    A second tuner is refused while the owner lives; a dead owner's server is adopted."""

    def __init__(self, shell: Shell, path: str, *, what: str, sudo: bool = False):
        self.shell, self.path, self.what, self.sudo = shell, path, what, sudo
        self.held = False

    def _swap(self, expected: str, new: str) -> bool:
        body = ('cur=$(cat "$1" 2>/dev/null || true); [ "$cur" = "$2" ] || exit 0; '
                'if [ -n "$3" ]; then printf %s "$3" > "$1.tmp" && mv -f "$1.tmp" "$1"; else rm -f "$1"; fi; echo swapped')
        q = shlex.quote
        cmd = (f"mkdir -p {q(os.path.dirname(self.path))} && flock {q(self.path + '.lock')} "
               f"sh -c {q(body)} sh {q(self.path)} {q(expected)} {q(new)}")
        result = self.shell.run(cmd, sudo=self.sudo)
        if not result.ok:
            raise HostError(f"{self.shell.description}: cannot lock {self.path}: {(result.stderr or result.stdout).strip()[:200]}")
        return result.stdout.strip() == "swapped"

    def acquire(self) -> str | None:
        """Take the server; the dead owner whose leftovers are now ours, if any."""
        for _ in range(5):
            owner = self.shell.run(f"cat {shlex.quote(self.path)} 2>/dev/null || true", sudo=self.sudo).stdout.strip()
            if owner and owner != TUNER_ID and _owner_alive(owner):
                host, _, rest = owner.partition(":")
                raise HostError(
                    f"{self.what} is driven by another tuner (host {host}, pid {rest.partition(':')[0]}); "
                    f"stop that one or point this one at another server (if it is gone, remove {self.path})")
            if self._swap(owner, TUNER_ID):
                self.held = True
                return owner if owner and owner != TUNER_ID else None
        raise HostError(f"{self.what}: could not take {self.path}: other tuners keep changing it")

    def release(self) -> None:
        if self.held:
            self._swap(TUNER_ID, "")
            self.held = False
