"""ProcessControl: the tuner runs the launch command itself, here or over SSH.

The server runs as `nohup setsid sh -c '<env> <command>; echo $? > exit_code'` in a state
directory of its own server (`[target] workdir`/<url host>-<port>, never per study: two
workers of one study on one host, two ports, keep apart): its own session and process group (so stopping it
takes every child, as SGLang's scheduler processes must go too), its output in `server.log`,
its pid in `server.pid`, its exit status in `exit_code`, and `SGLANG_TUNER_STATE=<that
directory>` in its environment.  A pid file found at start is a server an earlier (killed) run
left behind; it is stopped first, but only if a process of that group carries the marker: a
reused pid belongs to someone else.  The tuner driving the server holds the directory's
`owner` lock (`base.OwnerLock`): a second tuner pointed at the same server is refused, and a
leftover is adopted (stopped) only when its owner is dead.
"""

from __future__ import annotations

import logging
import re
import shlex
import time
import uuid
from urllib.parse import urlsplit

from tuner.interrupts import deferred
from tuner.errors import HostError
from tuner.server.host import Shell
from tuner.server.launch import LaunchSpec
from tuner.server.control.base import LogBuffer, OwnerLock, RestoresOnExit, ServiceStatus

__all__ = ["ProcessControl", "state_name"]

logger = logging.getLogger(__name__)

_CHUNK = 1 << 20
MARKER = "SGLANG_TUNER_STATE"  # set in the server's environment: which state directory owns it


def state_name(url: str) -> str:
    """The state directory's name for the server at `url`: its host and port."""
    parts = urlsplit(url)
    port = parts.port or (443 if parts.scheme == "https" else 80)
    return re.sub(r"[^A-Za-z0-9._-]", "_", f"{parts.hostname}-{port}")


class ProcessControl(RestoresOnExit):
    def __init__(self, shell: Shell, *, workdir: str, name: str, stop_timeout_s: float = 30.0):
        self.shell = shell
        self.name = name
        self.stop_timeout_s = stop_timeout_s
        self.description = f"process on {shell.description}"
        self._workdir = workdir
        self._dir: str | None = None
        self._offset = 0
        self._buffer = LogBuffer()
        self._spec: LaunchSpec | None = None
        self._lock: OwnerLock | None = None

    # --- paths -------------------------------------------------------------------------------

    @property
    def dir(self) -> str:
        if self._dir is None:
            base = self._workdir
            if base.startswith("~"):
                home = self.shell.run("printf %s \"$HOME\"").stdout.strip() or "/tmp"
                base = home + base[1:]
            self._dir = f"{base.rstrip('/')}/{self.name}"
            made = self.shell.run(f"mkdir -p {shlex.quote(self._dir)}")
            if not made.ok:
                raise HostError(f"{self.shell.description}: cannot create {self._dir}: {made.stderr.strip()}; fix [target] workdir")
        return self._dir

    @property
    def owner_path(self) -> str:
        return f"{self.dir}/owner"

    def _q(self, leaf: str) -> str:
        return shlex.quote(f"{self.dir}/{leaf}")

    # --- interface ---------------------------------------------------------------------------

    def _own(self) -> None:
        """Hold the server's lock (refused while another live tuner drives it)."""
        if self._lock is None:
            self._lock = OwnerLock(self.shell, self.owner_path, what=f"the server in {self.dir} ({self.shell.description})")
        if not self._lock.held:
            dead = self._lock.acquire()
            if dead:
                logger.warning("adopting %s from a tuner that is gone (%s)", self.dir, dead)

    def prepare(self) -> None:
        self._own()
        self.stop()  # a server a killed run left behind

    def start(self, spec: LaunchSpec) -> None:
        self._own()
        self.stop()  # ours from the previous trial, or one a killed run left behind
        # The marker variable tells our processes from any other that reuses the pid later.
        env_vars = {**spec.env, MARKER: self.dir}
        env = " ".join(shlex.quote(f"{k}={v}") for k, v in env_vars.items())
        inner = f"cd {self._q('')} && exec env {env} {spec.shell_command()}"
        # The wrapper shell waits for the server and records how it ended.
        wrapper = f"sh -c {shlex.quote(inner)}; echo $? > {self._q('exit_code')}"
        # Once per launch: an SSH session killed under this command returns no exit status, and
        # Shell.run sends it again on a new connection; the server it had started already must
        # not get a twin (the first would hold the port and answer for the second).
        launch_id = uuid.uuid4().hex
        script = (
            f"[ \"$(cat {self._q('launch_id')} 2>/dev/null)\" = {launch_id} ] || "
            f"{{ rm -f {self._q('exit_code')} && : > {self._q('server.log')} && "
            f"(nohup setsid sh -c {shlex.quote(wrapper)} > {self._q('server.log')} 2>&1 < /dev/null & "
            f"echo $! > {self._q('server.pid')}; echo {launch_id} > {self._q('launch_id')}); }}"
        )
        # The launching shell itself carries the marker, so every process of the server's group
        # has it from its fork on: a stop right after the start (a signal at "launching") found
        # only processes that had not yet exec'd `env` and took the group for someone else's.
        # Deferred: a signal during the start is raised once the pid file is written and known.
        with deferred():
            result = self.shell.run(f"env {shlex.quote(f'{MARKER}={self.dir}')} sh -c {shlex.quote(script)}")
            if result.ok:
                self._spec = spec
        if not result.ok:
            raise HostError(f"{self.shell.description}: cannot start the server: {result.stderr.strip()[:200]}")
        self._offset = 0
        self._buffer = LogBuffer()
        logger.info("started server: %s", spec.launch_command)

    def poll(self) -> tuple[ServiceStatus, str]:
        d = self.dir
        off = self._offset
        script = (
            f"pid=$(cat {self._q('server.pid')} 2>/dev/null || true); "
            f"if [ -f {self._q('exit_code')} ]; then st=\"exited $(cat {self._q('exit_code')})\"; "
            'elif [ -n "$pid" ] && kill -0 "$pid" 2>/dev/null; then st=running; else st=stopped; fi; '
            f"size=$(wc -c < {self._q('server.log')} 2>/dev/null || echo 0); "
            'echo "$st $size"; '
            f"if [ \"$size\" -gt {off} ]; then tail -c +{off + 1} {self._q('server.log')} | head -c {_CHUNK}; fi"
        )
        result = self.shell.run(script)
        first, _, text = result.stdout.partition("\n")
        parts = first.split()
        if not parts:
            raise HostError(f"{self.shell.description}: cannot read the server's state in {d}")
        size = int(parts[-1]) if parts[-1].isdigit() else off
        self._offset = min(size, off + _CHUNK)
        if text:
            self._buffer.add(text)
        if parts[0] == "exited":
            code = int(parts[1]) if len(parts) > 2 and parts[1].lstrip("-").isdigit() else None
            if code is not None and code > 128:
                code = -(code - 128)  # the shell's 128+N for "killed by signal N"
            return ServiceStatus("exited", code), text
        return ServiceStatus(parts[0]), text

    def log(self) -> str:
        return self._buffer.text()

    def stop(self) -> None:
        """SIGTERM the server's process group, SIGKILL it after the grace period."""
        pid_file = self._q("server.pid")
        mark = shlex.quote(f"{MARKER}={self.dir}")
        check = (
            f"pid=$(cat {pid_file} 2>/dev/null || true); "
            # The group is ours only if one of its processes carries our marker in its
            # environment: a pid (and group id) reused by someone else must never be signalled.
            'if [ -n "$pid" ] && kill -0 -"$pid" 2>/dev/null; then '
            'for p in $(pgrep -g "$pid" 2>/dev/null); do '
            f'if tr "\\0" "\\n" < /proc/"$p"/environ 2>/dev/null | grep -qxF {mark}; then echo "$pid"; break; fi; '
            "done; fi"
        )
        pid = self.shell.run(check).stdout.strip()
        if not pid.isdigit():
            self.shell.run(f"rm -f {pid_file}")
            return
        if self._spec is None:
            logger.warning("stopping a server an earlier run left behind (process group %s)", pid)
        self.shell.run(f"kill -TERM -{pid} 2>/dev/null || true")
        deadline = time.monotonic() + self.stop_timeout_s
        while time.monotonic() < deadline:
            if not self.shell.run(f"kill -0 -{pid} 2>/dev/null").ok:
                break
            time.sleep(0.2)
        else:
            logger.warning("server did not stop within %.0f s of SIGTERM; sending SIGKILL", self.stop_timeout_s)
            self.shell.run(f"kill -KILL -{pid} 2>/dev/null || true")
            for _ in range(50):
                if not self.shell.run(f"kill -0 -{pid} 2>/dev/null").ok:
                    break
                time.sleep(0.1)
        self.shell.run(f"rm -f {pid_file}")

    def apply(self, spec: LaunchSpec, *, study: str) -> str:
        """Start `spec` to be left running (`tuner.best --apply`); where its log goes."""
        self.start(spec)
        return f"{self.dir}/server.log"

    def unapply(self, also_remove: tuple[str, ...] = ()) -> str:
        """Undo `apply`: the applied server stopped (and `also_remove` removed); says what it did."""
        self.stop()
        if also_remove:
            self.shell.run("rm -f " + " ".join(shlex.quote(p) for p in also_remove))
        return ", ".join(["the applied server stopped", *(f"{p} removed" for p in also_remove)])

    def restore(self) -> None:
        if self._lock is not None and self._lock.held:  # never stop a server another tuner drives
            self.stop()
        self._spec = None
        if self._lock is not None:
            self._lock.release()

