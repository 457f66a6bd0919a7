"""Service control: `control_for(config, shell)` picks the manager named in `[target] manager`."""

from __future__ import annotations

from tuner.config import Config
from tuner.server.host import Shell
from tuner.server.control.base import ServiceControl, ServiceStatus
from tuner.server.control.process import ProcessControl, state_name

__all__ = ["ServiceControl", "ServiceStatus", "ProcessControl", "control_for"]


def control_for(config: Config, shell: Shell) -> ServiceControl:
    target = config.target
    if target.manager == "systemd":
        from tuner.server.control.systemd import SystemdControl

        return SystemdControl(shell, unit=target.unit, name=config.study.name, stop_timeout_s=target.stop_timeout_s,
                              leave_best=target.leave_best)
    # State per server (host + port), never per study: workers of one study keep apart.
    return ProcessControl(shell, workdir=target.workdir, name=state_name(target.url), stop_timeout_s=target.stop_timeout_s)
