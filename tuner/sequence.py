"""The one launch -> ready -> measure sequence.

Every caller that starts a server and measures it -- a study's trial and baselines
(`tuner.trial`), `tuner.bench --flags`, `tuner.best --apply`, `tuner.schedule` and the
benchmarks -- goes through `connected`, `launch` and `measure_server`, so a server is started,
waited for, measured and stopped the same way everywhere.  The connection itself (`Target`,
`connected`) lives with the server, in `tuner/server/connection.py`.
"""

from __future__ import annotations

import time
from typing import Callable

from tuner.config import BenchConfig, Config
from tuner.measure.runner import Measurement, measure
from tuner.measure.workload import Workload
from tuner.errors import ConfigError, LaunchError
from tuner.interrupts import checkpoint
from tuner.server.client import ServerClient, ServerInfo
from tuner.server.connection import Target, connected, refuse_if_answering
from tuner.server.diagnose import classify
from tuner.server.launch import LaunchSpec
from tuner.server.readiness import Ready, wait_ready

__all__ = ["Target", "connected", "launch", "measure_server", "launch_and_measure", "checked", "measure_running", "refuse_if_answering"]

Phase = Callable[[str], None]


# The previous server's processes may still hold its ports for a moment after it stopped
# (utils/network.py · wait_port_available fails the launch with "... is not available in 30
# seconds"): not the configuration's fault, so the launch is retried after they are gone.
PORT_BUSY_RETRIES = 3


def launch(target: Target, spec: LaunchSpec, *, phase: Phase = lambda _: None) -> Ready:
    """Start `spec` (stopping what this control ran before, and waiting until its processes are
    gone) and wait until it is ready, or raise `LaunchError` saying why it never will be."""
    phase = checked(phase)
    cfg = target.config.target
    for attempt in range(PORT_BUSY_RETRIES + 1):
        phase("launching")
        # The server's startup_time is compared with the launch on the same clock only.
        launched_at = None if cfg.is_remote else time.time()
        target.control.start(spec)
        phase("waiting for the server")
        try:
            return wait_ready(target.control, target.client, params=spec.params, timeout_s=cfg.ready_timeout_s,
                              poll_s=cfg.poll_interval_s, url=cfg.url, spec=spec, launched_at=launched_at)
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
    if it fails.  The configured one includes the search over load when an objective needs it."""
    phase = checked(phase)
    m = measure(url=target.config.target.url, bench=bench or target.config.bench, info=info, workload=workload,
                client=target.client, api_key=target.api_key, slo=None if bench else target.config.sweep_slo,
                progress=lambda name, done, total: phase(f"{name} {done}/{total}"))
    _still_running(target)
    return m


def _still_running(target: Target) -> None:
    """The figures are the launched server's only if it still runs: one that died while the
    requests were answered (SGLang's "address already in use" once its weights loaded) was
    not the server measured."""
    status, _ = target.control.poll()
    if status.state in ("exited", "stopped", "failed"):
        failure = classify(target.control.log()[-262144:], status.exit_code, params="")
        raise LaunchError(f"the launched server exited during the benchmark ({failure.reason}), yet requests were answered: "
                          f"another server answers at {target.config.target.url}; stop it or point [target] url at the server "
                          "the tuner launches", kind="fatal", fatal=True, log_tail=target.control.log()[-20000:])


def checked(phase: Phase) -> Phase:
    """`phase`, after `interrupts.checkpoint`: every step of a launch and a benchmark is a point
    where a signal whose KeyboardInterrupt was lost still stops the run."""
    def report(text: str) -> None:
        checkpoint()
        phase(text)
    return report


def launch_and_measure(target: Target, spec: LaunchSpec, workload: Workload, *, phase: Phase = lambda _: None,
                       on_ready: Callable[[Ready], None] = lambda _: None) -> tuple[Ready, Measurement]:
    """The whole sequence for callers with nothing to record in between (`on_ready` is told
    before the benchmark starts); the server is stopped afterwards, measured or not."""
    try:
        ready = launch(target, spec, phase=phase)
        on_ready(ready)
        return ready, measure_server(target, ready.info, workload, phase=phase)
    finally:
        target.control.stop()


def measure_running(config: Config, workload: Workload, *, phase: Phase = lambda _: None) -> Measurement:
    """Measure the server that answers at `[target] url` as it runs now (`tuner.bench` without
    --flags): nothing is launched or stopped; the same benchmark a trial runs."""
    target = config.target
    client = ServerClient(target.url, api_key=target.api_key(), admin_api_key=target.admin_api_key())
    try:
        if client.health_generate(timeout_s=30) != 200:
            raise ConfigError(f"nothing ready answers at {target.url}; start the server, or pass --flags to launch it")
        return measure(url=target.url, bench=config.bench, info=client.server_info(), workload=workload, client=client,
                       api_key=target.api_key(), slo=config.sweep_slo,
                       progress=lambda name, done, total: phase(f"{name} {done}/{total}"))
    finally:
        client.close()
