"""The configuration left running for good: `tuner.best --apply` / `--restore` and
`tuner.schedule --apply` / `--restore` go through here, so both install and undo the same way.

systemd: a drop-in of its own (`50-sglang-tuner-best.conf`, `SystemdControl.apply`) that stays
until `--restore` removes it and restarts the unit on its own command; process: the command
started in `<workdir>/<study>-best` and left running until `--restore` stops it.  Neither takes
the owner lock of a tuning run: the applied server is the operator's, not a run's.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Callable, Sequence

from tuner.config import Config
from tuner.server.connection import Target, connected, refuse_if_answering
from tuner.server.control.base import ServiceControl
from tuner.server.control.process import ProcessControl
from tuner.server.control.systemd import SystemdControl
from tuner.server.host import Shell
from tuner.server.launch import LaunchSpec
from tuner.server.readiness import Ready, wait_ready

__all__ = ["applied_control", "apply", "restore", "Applied"]


def applied_control(config: Config) -> Callable[[Shell], ServiceControl]:
    """The control that applies a configuration: the study's unit, or a process of its own
    (`<study>-best`, apart from the state directory tuning runs use)."""
    target = config.target

    def control(shell: Shell) -> ServiceControl:
        if target.manager == "systemd":
            return SystemdControl(shell, unit=target.unit, name=config.study.name, stop_timeout_s=target.stop_timeout_s)
        return ProcessControl(shell, workdir=target.workdir, name=f"{config.study.name}-best", stop_timeout_s=target.stop_timeout_s)

    return control


@dataclass(frozen=True)
class Applied:
    ready: Ready
    where: str  # the drop-in, or the log of the process left running
    spec: LaunchSpec


def apply(config: Config, spec_of: Callable[[Target], LaunchSpec]) -> Applied:
    """Install the launch `spec_of(target)` builds (it may install files first: a schedule's
    table) and wait until the server is ready on it; it stays when the tuner exits."""
    with connected(config, control=applied_control(config), prepare=False, restore=False) as target:
        spec = spec_of(target)
        if isinstance(target.control, ProcessControl):
            target.control.stop()  # the server an earlier --apply left running is ours: stopped first
            refuse_if_answering(target.client, config.target)  # anything else on the port is not
        launched_at = None if config.target.is_remote else time.time()  # startup_time, same clock only
        where = target.control.apply(spec, study=config.study.name)
        ready = wait_ready(target.control, target.client, params=spec.params, timeout_s=config.target.ready_timeout_s,
                           poll_s=config.target.poll_interval_s, url=config.target.url, spec=spec, launched_at=launched_at)
    return Applied(ready, where, spec)


def restore(config: Config, also_remove: Callable[[ServiceControl], Sequence[str]] = lambda control: ()) -> str:
    """Undo `apply`: systemd, the drop-in removed and the unit restarted on its own command;
    process, the applied server stopped.  `also_remove` names files installed with it."""
    with connected(config, control=applied_control(config), prepare=False, restore=False) as target:
        return target.control.unapply(tuple(also_remove(target.control)))
