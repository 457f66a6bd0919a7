"""Service control: the one small interface between the study and the server's process.

Two implementations: `ProcessControl` runs the command itself (nohup + setsid, its own process
group, a log file and a pid file); `SystemdControl` overrides a unit's ExecStart with a drop-in
and restarts it.  Both run every command through a `host.Shell`, so the same code works on
this machine and over SSH.  Both are context managers: leaving the `with` restores the target
(stops our server, or puts the operator's unit back), on every path including Ctrl-C.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Protocol

from tuner.target.launch import LaunchSpec

__all__ = ["ServiceStatus", "ServiceControl", "LOG_LIMIT_BYTES"]

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

    def __enter__(self) -> "ServiceControl": ...

    def __exit__(self, *exc: object) -> None: ...


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
