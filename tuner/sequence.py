"""The one launch -> ready -> measure sequence.

Every caller that starts a server and measures it -- a study's trial and baselines
(`tuner.trial`), `tuner.bench --flags`, `tuner.best --apply`, `tuner.schedule` and the
benchmarks -- goes through `connected`, `launch` and `measure_server`, so a server is started,
waited for, measured and stopped the same way everywhere.
"""

from __future__ import annotations

import shlex
import time
from contextlib import contextmanager, nullcontext
from dataclasses import dataclass
from typing import Callable, Iterator

from tuner.config import BenchConfig, Config
from tuner.measure.runner import Measurement, measure
from tuner.measure.workload import Workload
from tuner.errors import LaunchError
from tuner.sglang_args import CommandLine, Params
from tuner.target.client import ServerClient, ServerInfo
from tuner.target.control import ServiceControl, control_for
from tuner.target.host import Shell, connect
from tuner.target.launch import LaunchSpec, command_spec, launch_spec
from tuner.target.readiness import Ready, wait_ready

__all__ = ["Target", "connected", "launch", "measure_server", "launch_and_measure"]

Phase = Callable[[str], None]


@dataclass
class Target:
    """A connected target: where commands run, what starts the server, its HTTP surface."""

    config: Config
    shell: Shell
    control: ServiceControl
    client: ServerClient
    api_key: str | None
    command: CommandLine  # the operator's command as SGLang will read it (a --config file folded in)

    def spec(self, params: Params, extra: list[str] | None = None) -> LaunchSpec:
        return launch_spec(self.config.server, params, api_key=self.api_key, extra=extra,
                           admin_api_key=self.config.target.admin_api_key(), command=self.command)

    def command_spec(self, command, params: Params | None = None) -> LaunchSpec:
        """A launch of exactly `command` (a baseline, a schedule's adaptive server)."""
        return command_spec(self.config.server, command, api_key=self.api_key, params=params,
                            admin_api_key=self.config.target.admin_api_key())


@contextmanager
def connected(config: Config, *, control: Callable[[Shell], ServiceControl] | None = None,
              prepare: bool = True, restore: bool = True) -> Iterator[Target]:
    """Connect to the target; on leaving, the target is restored (our server stopped, the
    operator's unit put back) and the connections closed, on every path including Ctrl-C.
    `restore=False` leaves what was launched running (`tuner.best --apply`)."""
    shell = connect(config.target)
    api_key = config.target.api_key()
    client = ServerClient(config.target.url, api_key=api_key, admin_api_key=config.target.admin_api_key())
    try:
        ctl = (control or (lambda sh: control_for(config, sh)))(shell)
        with ctl if restore else nullcontext(ctl):
            if prepare:
                ctl.prepare()  # check the target; undo what a killed run left behind
            yield Target(config, shell, ctl, client, api_key, resolved_command(config, shell))
    finally:
        client.close()
        shell.close()


def resolved_command(config: Config, shell: Shell) -> CommandLine:
    """The configured command with a `--config FILE` folded in as SGLang merges it, the file
    read through the target's shell; launches then pass every option inline, so removing the
    speculative ones (the no-speculation baseline) really removes them."""
    command = config.server.command_line

    def read(path: str) -> str:
        result = shell.run(f"cat {shlex.quote(path)}")
        if not result.ok:
            raise OSError(result.stderr.strip() or f"cat exited {result.exited}")
        return result.stdout

    return command.with_config_file(read) if command.has("config") else command


# The previous server's processes may still hold its ports for a moment after it stopped
# (utils/network.py · wait_port_available fails the launch with "... is not available in 30
# seconds"): not the configuration's fault, so the launch is retried after they are gone.
PORT_BUSY_RETRIES = 3


def launch(target: Target, spec: LaunchSpec, *, phase: Phase = lambda _: None) -> Ready:
    """Start `spec` (stopping what this control ran before, and waiting until its processes are
    gone) and wait until it is ready, or raise `LaunchError` saying why it never will be."""
    cfg = target.config.target
    for attempt in range(PORT_BUSY_RETRIES + 1):
        phase("launching")
        target.control.start(spec)
        phase("waiting for the server")
        try:
            return wait_ready(target.control, target.client, params=spec.params, timeout_s=cfg.ready_timeout_s,
                              poll_s=cfg.poll_interval_s, url=cfg.url)
        except LaunchError as exc:
            if exc.kind != "port_busy" or attempt == PORT_BUSY_RETRIES:
                raise
            phase(f"{exc.reason}; launching again ({attempt + 1}/{PORT_BUSY_RETRIES})")
            target.control.stop()  # waits until every process of the group is gone
            time.sleep(2.0 * (attempt + 1))
    raise AssertionError("unreachable")


def measure_server(target: Target, info: ServerInfo, workload: Workload, *, phase: Phase = lambda _: None,
                   bench: BenchConfig | None = None) -> Measurement:
    """Run the configured benchmark (or `bench`) against a ready server; raise `MeasureError`
    if it fails."""
    return measure(url=target.config.target.url, bench=bench or target.config.bench, info=info, workload=workload,
                   client=target.client, api_key=target.api_key,
                   progress=lambda name, done, total: phase(f"{name} {done}/{total}"))


def launch_and_measure(target: Target, spec: LaunchSpec, workload: Workload, *,
                       phase: Phase = lambda _: None) -> tuple[Ready, Measurement]:
    """The whole sequence for callers with nothing to record in between; the server is
    stopped afterwards, measured or not."""
    try:
        ready = launch(target, spec, phase=phase)
        return ready, measure_server(target, ready.info, workload, phase=phase)
    finally:
        target.control.stop()
