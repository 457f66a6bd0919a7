"""SystemdControl: each trial overrides the unit's ExecStart with a drop-in and restarts it.

The unit file is never touched.  Per trial:
  /etc/systemd/system/<unit>.service.d/zz-sglang-tuner.conf  (written atomically)
    [Service]
    ExecStart=
    ExecStart=<base command> <trial flags>
    Environment="K=V" ...
then `systemctl daemon-reload` and a restart (stop, then start, with the journal cursor taken
in between).  Readiness watches
`systemctl show` (ActiveState, SubState, ExecMainStatus, NRestarts: a unit with Restart=always
that keeps dying is a restart loop, not a slow start) and the unit's journal since this
trial's restart (a cursor), next to HTTP.  At the end the drop-in is removed and the unit put
back as it was: running its own command again, or stopped.  The unit's state before the run
is written into the drop-in itself, so a run killed with -9 is undone by the next one.
The tuner driving a unit holds `/run/sglang-tuner/<unit>.owner` (`base.OwnerLock`): a second
tuner on the same unit is refused and touches nothing; one on another unit works beside it.
"""

from __future__ import annotations

import logging
import re
import shlex
import time

from tuner.errors import HostError
from tuner.server.host import Shell
from tuner.server.launch import LaunchSpec
from tuner.server.control.base import LogBuffer, OwnerLock, RestoresOnExit, ServiceStatus

__all__ = ["SystemdControl", "systemd_quote", "render_dropin", "DROPIN_NAME", "APPLIED_NAME"]

logger = logging.getLogger(__name__)

DROPIN_NAME = "zz-sglang-tuner.conf"
APPLIED_NAME = "50-sglang-tuner-best.conf"  # `tuner.best --apply`: kept until the operator removes it
_STATE_MARK = "# sglang-tuner original-state: "
_SIMPLE = re.compile(r"^[A-Za-z0-9_@%+=:,./-]+$")


def systemd_quote(arg: str) -> str:
    """One argument of an ExecStart= line (systemd.syntax: quotes, \\ escapes, %% and $$)."""
    escaped = arg.replace("%", "%%").replace("$", "$$")
    if _SIMPLE.match(arg):
        return escaped
    return '"' + escaped.replace("\\", "\\\\").replace('"', '\\"') + '"'


def render_dropin(spec: LaunchSpec, *, original_state: str | None, study: str) -> str:
    head = (
        [f"# Written by sglang-tuner for study {study}; removed when the run ends.", f"{_STATE_MARK}{original_state}"]
        if original_state is not None
        else [f"# The best configuration of study {study}, applied by `python -m tuner.best --apply`.",
              "# Remove this file and run `systemctl daemon-reload` to go back to the unit's own command."]
    )
    lines = [
        *head,
        "[Service]",
        "ExecStart=",
        "ExecStart=" + " ".join(systemd_quote(a) for a in spec.argv),
    ]
    for key, value in spec.env.items():
        lines.append("Environment=" + systemd_quote(f"{key}={value}"))
    return "\n".join(lines) + "\n"


class SystemdControl(RestoresOnExit):
    def __init__(self, shell: Shell, *, unit: str, name: str, stop_timeout_s: float = 30.0, leave_best: bool = False):
        self.shell = shell
        self.unit = unit if unit.endswith(".service") else unit + ".service"
        self.name = name
        self.stop_timeout_s = stop_timeout_s
        self.leave_best = leave_best
        self.description = f"systemd unit {self.unit} on {shell.description}"
        self.dropin_dir = f"/etc/systemd/system/{self.unit}.d"
        self.dropin = f"{self.dropin_dir}/{DROPIN_NAME}"
        self._original: str | None = None  # "active" or "inactive"
        self._cursor: str | None = None
        self._since: str | None = None  # epoch seconds at this trial's start (no journal yet)
        self._restarts_at_start = 0
        self._buffer = LogBuffer()
        self._started = False
        self.best_spec: LaunchSpec | None = None  # set by the study when leave_best is on
        self.owner_path = f"/run/sglang-tuner/{self.unit}.owner"
        self._lock = OwnerLock(shell, self.owner_path, what=self.description, sudo=True)

    # --- helpers -----------------------------------------------------------------------------

    def _run(self, command: str, *, sudo: bool = True, check: bool = True, stdin_text: str | None = None):
        result = self.shell.run(command, sudo=sudo, stdin_text=stdin_text)
        if check and not result.ok:
            err = (result.stderr or result.stdout).strip().splitlines()
            detail = err[-1] if err else f"exit {result.exited}"
            if "a password is required" in detail or "sudo:" in detail:
                raise HostError(f"{self.shell.description}: sudo refused ({detail}); give the SSH user passwordless sudo for systemctl and /etc/systemd/system")
            raise HostError(f"{self.description}: `{command[:80]}` failed: {detail}")
        return result

    def _show(self) -> dict[str, str]:
        out = self._run(
            f"systemctl show -p ActiveState,SubState,ExecMainStatus,ExecMainCode,NRestarts,MainPID,LoadState {self.unit}",
            sudo=False,
        ).stdout
        return dict(line.split("=", 1) for line in out.splitlines() if "=" in line)

    def _check_unit(self) -> None:
        props = self._show()
        if props.get("LoadState") != "loaded":
            raise HostError(f"{self.description}: no such unit (LoadState={props.get('LoadState')}); set [target] unit to the service's name")

    def _original_state(self) -> str:
        """The unit's state before the tuner touched it (from a leftover drop-in if a run died)."""
        if self._original is None:
            self._check_unit()
            leftover = self._run(f"cat {shlex.quote(self.dropin)} 2>/dev/null || true", sudo=True).stdout
            mark = next((l[len(_STATE_MARK):].strip() for l in leftover.splitlines() if l.startswith(_STATE_MARK)), None)
            if mark:
                logger.warning("%s: found the drop-in of an earlier run that did not finish; the unit was %s before it", self.unit, mark)
                self._original = mark
            else:
                active = self._show().get("ActiveState", "inactive")
                self._original = "active" if active in ("active", "activating", "reloading") else "inactive"
        return self._original

    def _cursor_now(self) -> str | None:
        # The whole journal's newest entry: a unit that never logged has no cursor of its own.
        out = self._run("journalctl -n 0 --show-cursor --no-pager", sudo=True, check=False).stdout
        match = re.search(r"-- cursor: (\S+)", out)
        return match.group(1) if match else None

    # --- interface ---------------------------------------------------------------------------

    def _own(self) -> None:
        if not self._lock.held and self._lock.acquire():
            logger.warning("%s: adopting the unit from a tuner that is gone", self.unit)

    def prepare(self) -> None:
        self._own()
        self._original_state()  # checks the unit; reads a killed run's drop-in

    def start(self, spec: LaunchSpec) -> None:
        self._own()
        original = self._original_state()
        self._install(self.dropin, render_dropin(spec, original_state=original, study=self.name))
        self._restart()
        self._started = True
        logger.info("restarted %s with: %s", self.unit, spec.launch_command)

    def _install(self, path: str, content: str) -> None:
        """Write a drop-in atomically (a half-written file is never loaded) and reload."""
        tmp = f"{path}.tmp"
        self._run(
            f"mkdir -p {shlex.quote(self.dropin_dir)} && cat > {shlex.quote(tmp)} && mv -f {shlex.quote(tmp)} {shlex.quote(path)}",
            stdin_text=content,
        )
        self._run("systemctl daemon-reload")

    def _restart(self) -> None:
        """A restart as stop + start, so the journal cursor sits between the old instance's
        shutdown and the new one's start-up: this launch's log only."""
        self._run(f"systemctl stop {self.unit}", check=False)
        self._run(f"systemctl reset-failed {self.unit}", check=False)
        self._cursor = self._cursor_now()
        self._since = self._run("date +%s", sudo=False).stdout.strip() or "0"
        self._restarts_at_start = int(self._show().get("NRestarts", "0") or 0)
        self._buffer = LogBuffer()
        self._run(f"systemctl start {self.unit}")

    def poll(self) -> tuple[ServiceStatus, str]:
        text = ""
        if self._since is not None:
            where = f"--after-cursor={shlex.quote(self._cursor)}" if self._cursor else f"--since=@{self._since}"
            out = self._run(
                f"journalctl -u {self.unit} {where} -o cat --no-pager --show-cursor",
                sudo=True, check=False,
            ).stdout
            body, sep, cursor_line = out.rpartition("-- cursor: ")
            if sep:
                self._cursor = cursor_line.strip() or self._cursor
                text = body
            else:
                text = out
            if text:
                self._buffer.add(text)
        props = self._show()
        active, sub = props.get("ActiveState", ""), props.get("SubState", "")
        restarts = int(props.get("NRestarts", "0") or 0) - self._restarts_at_start
        code = self._exit_code(props)
        detail = f"ActiveState={active}, SubState={sub}, NRestarts={restarts}"
        if active == "failed":
            return ServiceStatus("failed", code, detail), text
        if restarts > 0 or sub == "auto-restart":
            # Restart=always: systemd brings the dead server back; the trial's server died.
            return ServiceStatus("restarting", code, detail + " (restart loop)"), text
        if active in ("active", "activating", "reloading"):
            return ServiceStatus("running", None, detail), text
        return ServiceStatus("stopped", code, detail), text

    @staticmethod
    def _exit_code(props: dict[str, str]) -> int | None:
        status = props.get("ExecMainStatus")
        if not status or not status.lstrip("-").isdigit():
            return None
        value = int(status)
        # ExecMainCode: 1 exited, 2 killed, 3 dumped (status is the signal then)
        return -value if props.get("ExecMainCode") in ("2", "3") else value

    def log(self) -> str:
        return self._buffer.text()

    def stop(self) -> None:
        if not self._started:
            return
        self._run(f"systemctl stop {self.unit}", check=False)
        deadline = time.monotonic() + self.stop_timeout_s + 10
        while time.monotonic() < deadline:
            if self._show().get("ActiveState") in ("inactive", "failed"):
                break
            time.sleep(0.2)
        self._run(f"systemctl reset-failed {self.unit}", check=False)

    def apply(self, spec: LaunchSpec, *, study: str) -> str:
        """Install `spec` for good (its own drop-in, outside the tuner's run drop-in) and restart."""
        path = f"{self.dropin_dir}/{APPLIED_NAME}"
        self._install(path, render_dropin(spec, original_state=None, study=study))
        self._restart()
        return path

    def unapply(self, also_remove: tuple[str, ...] = ()) -> str:
        """Undo `apply`: its drop-in (and `also_remove`, files installed beside it) removed and
        the unit restarted on its own command; says what it did."""
        path = f"{self.dropin_dir}/{APPLIED_NAME}"
        removed = " ".join(shlex.quote(p) for p in (path, *also_remove))
        self._run(f"rm -f {removed} && systemctl daemon-reload")
        self._run(f"systemctl restart {self.unit}", check=False)
        return f"{' and '.join((path, *also_remove))} removed, {self.unit} restarted on its own command"

    def restore(self) -> None:
        """Remove the drop-in and leave the unit as it was (or running the best configuration)."""
        if not self._lock.held:
            return  # refused (another tuner drives the unit) or never prepared: not ours to touch
        self._restore()  # raising leaves the lock held: a dead owner's unit is adopted later
        self._lock.release()

    def _restore(self) -> None:
        if self._original is None:
            # Nothing started in this run; still undo a drop-in a killed run left.
            leftover = self._run(f"test -f {shlex.quote(self.dropin)} && echo yes || true", sudo=True, check=False).stdout.strip()
            if leftover != "yes":
                return
            self._original_state()
        if self.leave_best and self.best_spec is not None:
            # As `tuner.best --apply` leaves it: the run's drop-in gone, the best configuration
            # in a drop-in of its own, the unit restarted on it.
            self._run(f"rm -f {shlex.quote(self.dropin)} {shlex.quote(self.dropin)}.tmp")
            where = self.apply(self.best_spec, study=self.name)
            logger.warning("%s left running the best configuration (leave_best = true): %s", self.unit, where)
            self._started = False
            return
        self._run(f"systemctl stop {self.unit}", check=False)
        self._run(f"rm -f {shlex.quote(self.dropin)} {shlex.quote(self.dropin)}.tmp && rmdir {shlex.quote(self.dropin_dir)} 2>/dev/null; systemctl daemon-reload")
        self._run(f"systemctl reset-failed {self.unit}", check=False)
        if self._original == "active":
            self._run(f"systemctl start --no-block {self.unit}")
        self._started = False

