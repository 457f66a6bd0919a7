"""Where commands run: this machine (Invoke) or an SSH host (Fabric), behind one verb.

`connect(target)` gives a `Shell`; the service controls only call `shell.run(...)`.  SSH host
keys are verified against known_hosts (Fabric's default would add unknown keys silently);
paramiko and socket errors become `HostError` here and nowhere else.  A dropped connection is
re-opened with backoff before a command fails.
"""

from __future__ import annotations

import getpass
import io
import logging
import os
import socket
import time
from dataclasses import dataclass
from typing import Callable

import invoke
import paramiko

from tuner.config import TargetConfig
from tuner.errors import HostError

__all__ = ["Shell", "Result", "connect", "parse_destination"]

logger = logging.getLogger(__name__)


@dataclass(frozen=True)
class Result:
    stdout: str
    stderr: str
    exited: int

    @property
    def ok(self) -> bool:
        return self.exited == 0


class _LocalRunner(invoke.Local):
    """Invoke's local runner, except that a Ctrl-C (or SIGTERM, raised as KeyboardInterrupt)
    arriving while a command runs is not lost.  Invoke forwards it to the command and goes on
    waiting, then returns as if nothing happened (invoke/runners.py · Runner._finish catches
    KeyboardInterrupt around wait() and calls send_interrupt, which only writes ``\\x03`` to
    the command's stdin); a run interrupted during one of the many short polls of a launch went
    on with its study (issue 25: still running 60 s after SIGINT).  Here the command is let
    finish (ours are short shell one-liners; stopping one midway could leave a pid file
    unwritten) and the interrupt is raised as soon as it has, as Fabric's Remote raises it
    at once when there is no pty (fabric/runners.py · Remote.send_interrupt)."""

    def send_interrupt(self, interrupt: KeyboardInterrupt) -> None:
        self.interrupted = interrupt

    def stop(self) -> None:
        # Invoke's run() calls stop() in a `finally`, and Local.stop reads `using_pty`, which
        # _setup only sets part-way through: a signal arriving before then turned the
        # KeyboardInterrupt into AttributeError and the run exited 1, not 130 (a fresh-clone CI
        # run, tests/e2e/test_signals.py · second launch).  Before setup there is no pty.
        if not hasattr(self, "using_pty"):
            self.using_pty = False
        super().stop()

    def run(self, command: str, **kwargs):  # type: ignore[override]
        self.interrupted: KeyboardInterrupt | None = None
        try:
            return super().run(command, **kwargs)
        finally:
            if self.interrupted is not None:
                raise self.interrupted


def _local_context() -> invoke.Context:
    return invoke.Context(config=invoke.Config(overrides={"runners": {"local": _LocalRunner}}))


def parse_destination(host: str) -> tuple[str | None, str, int]:
    user, _, rest = host.rpartition("@")
    hostname, _, port = rest.partition(":")
    return (user or None), hostname, int(port or 22)


_TRANSPORT_ERRORS = (paramiko.SSHException, EOFError, OSError, socket.timeout)

# A session killed while its command runs (sshd restarted, a network drop, `pkill sshd: root@`)
# often raises nothing: paramiko's Channel.recv_exit_status returns -1 "if no exit status is
# provided by the server" and Fabric's Remote.returncode passes it on.  A shell exit code is
# 0-255, so -1 from a remote command means the connection was lost; it is retried like one
# (a CI run failed a study on `systemctl show ... failed: exit -1` after such a drop).
_NO_EXIT_STATUS = -1


class Shell:
    """Runs shell commands on the target; `sudo=True` prefixes `sudo -n` for non-root users."""

    def __init__(
        self,
        context_factory: Callable[[], invoke.Context],
        *,
        description: str,
        remote: bool,
        use_sudo: bool,
        retries: int = 5,
        backoff_s: float = 1.0,
    ):
        self._factory = context_factory
        self._context: invoke.Context | None = None
        self.description = description
        self.remote = remote
        self.use_sudo = use_sudo
        self.retries = retries
        self.backoff_s = backoff_s

    @property
    def context(self) -> invoke.Context:
        if self._context is None:
            self._context = self._factory()
        return self._context

    def run(
        self,
        command: str,
        *,
        sudo: bool = False,
        stdin_text: str | None = None,
        timeout: float | None = None,
        retry: bool = True,
    ) -> Result:
        """Run `command` with sh; never raises for a non-zero exit (see Result.exited)."""
        if sudo and self.use_sudo:
            command = "sudo -n sh -c " + _quote(command)
        attempts = self.retries if (retry and self.remote) else 1
        delay = self.backoff_s
        for attempt in range(1, attempts + 1):
            try:
                result = self.context.run(
                    command,
                    hide=True,
                    warn=True,
                    in_stream=io.StringIO(stdin_text) if stdin_text is not None else False,
                    timeout=timeout,
                )
                if self.remote and result.exited == _NO_EXIT_STATUS:
                    raise EOFError("the channel closed before the command's exit status arrived")
                return Result(result.stdout, result.stderr, result.exited)
            except invoke.CommandTimedOut as exc:
                raise HostError(f"{self.description}: command timed out after {timeout} s: {command[:80]}") from exc
            except _TRANSPORT_ERRORS as exc:
                if not self.remote or attempt == attempts:
                    raise _translate(exc, self.description) from exc
                logger.warning("%s: connection lost (%s); reconnecting in %.0f s", self.description, exc, delay)
                self.close()
                time.sleep(delay)
                delay = min(delay * 2, 30)
        raise AssertionError("unreachable")

    def close(self) -> None:
        if self._context is not None and hasattr(self._context, "close"):
            try:
                self._context.close()
            except Exception:  # closing a dead transport may raise; nothing to recover
                pass
        self._context = None


def _quote(command: str) -> str:
    import shlex

    return shlex.quote(command)


def _translate(exc: BaseException, where: str) -> HostError:
    if isinstance(exc, paramiko.BadHostKeyException):
        return HostError(
            f"{where}: the host key does not match known_hosts (possible man-in-the-middle); "
            "if the host was reinstalled, remove its old line from known_hosts"
        )
    if isinstance(exc, paramiko.AuthenticationException):
        return HostError(f"{where}: SSH authentication failed; set [target] identity_file to a key the host accepts")
    if isinstance(exc, paramiko.SSHException) and "not found in known_hosts" in str(exc):
        return HostError(
            f"{where}: unknown SSH host key; add the host to known_hosts (ssh-keyscan) or set "
            "[target] accept_unknown_host = true"
        )
    if isinstance(exc, (socket.timeout, TimeoutError)):
        return HostError(f"{where}: SSH connection timed out; check [target] host and that the host is up")
    if isinstance(exc, (ConnectionRefusedError, paramiko.ssh_exception.NoValidConnectionsError)):
        return HostError(f"{where}: connection refused; check [target] host (and its port) and that sshd runs")
    if isinstance(exc, socket.gaierror):
        return HostError(f"{where}: cannot resolve the host name; check [target] host")
    return HostError(f"{where}: SSH failed: {exc}; check the connection and [target] host")


def connect(target: TargetConfig, *, connect_timeout: float = 10.0) -> Shell:
    """A Shell for the target; SSH connects now, so a bad host fails before any trial."""
    if not target.is_remote:
        use_sudo = target.sudo if target.sudo is not None else os.geteuid() != 0
        return Shell(_local_context, description="local", remote=False, use_sudo=use_sudo)

    import fabric

    user, hostname, port = parse_destination(target.host)
    user = user or getpass.getuser()

    def factory() -> invoke.Context:
        connect_kwargs: dict[str, object] = {"allow_agent": True, "look_for_keys": target.identity_file is None}
        if target.identity_file:
            connect_kwargs["key_filename"] = os.path.expanduser(target.identity_file)
        conn = fabric.Connection(
            hostname, user=user, port=port, connect_timeout=int(connect_timeout), connect_kwargs=connect_kwargs
        )
        if target.accept_unknown_host:
            logger.warning("accepting unknown SSH host keys for %s (accept_unknown_host = true)", target.host)
            conn.client.set_missing_host_key_policy(paramiko.AutoAddPolicy())
        else:
            conn.client.set_missing_host_key_policy(paramiko.RejectPolicy())
        known = os.path.expanduser(target.known_hosts or "~/.ssh/known_hosts")
        if os.path.exists(known):
            conn.client.load_host_keys(known)
        conn.open()
        return conn

    use_sudo = target.sudo if target.sudo is not None else user != "root"
    shell = Shell(factory, description=f"ssh {user}@{hostname}:{port}", remote=True, use_sudo=use_sudo)
    try:
        shell.context  # connect now: a bad host is a config problem, found before trial 0
    except _TRANSPORT_ERRORS as exc:
        raise _translate(exc, shell.description) from exc
    return shell
