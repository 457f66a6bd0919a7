"""Wait until a launched server is ready, or say why it never will be.

Three things are watched at once: the process (or unit), its log, and `/health_generate`.
A server that dies is seen at the next poll (`[target] poll_interval_s`, 0.5 s by default),
not at the timeout; a launcher that logs SGLang's terminal lines ("Scheduler hit an
exception", "Received sigquit ...") is classified even before it has exited.
"""

from __future__ import annotations

import math
import time
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass

from tuner.server.client import ServerClient, ServerInfo
from tuner.server.control.base import ServiceControl
from tuner.server.diagnose import classify, early_failure
from tuner.errors import LaunchError, MeasureError
from tuner.sglang_args import Params

__all__ = ["Ready", "wait_ready", "check_server_args"]

_TERMINAL_GRACE_S = 5.0  # after a terminal log line, how long to wait for the exit status


@dataclass(frozen=True)
class Ready:
    info: ServerInfo
    startup_s: float


def _params_text(params: Params) -> str:
    return ", ".join(f"{k}={v}" for k, v in params.as_dict().items())


def wait_ready(
    control: ServiceControl,
    client: ServerClient,
    *,
    params: Params,
    timeout_s: float,
    poll_s: float = 0.5,
    url: str = "",
) -> Ready:
    """Block until `/health_generate` answers 200, or raise `LaunchError`."""
    started = time.monotonic()
    terminal_since: float | None = None
    pool = ThreadPoolExecutor(max_workers=1, thread_name_prefix="health")
    health: Future | None = None
    at = _params_text(params)
    try:
        while True:
            status, _ = control.poll()
            recent = control.log()[-262144:]
            if status.state in ("exited", "stopped", "failed", "restarting"):
                recent = _drain_log(control)
                failure = classify(recent, status.exit_code, params=at)
                detail = f" [{status.detail}]" if status.detail else ""
                raise LaunchError(failure.reason + detail, kind=failure.kind, fatal=failure.fatal, log_tail=recent[-20000:])
            if early_failure(recent):
                terminal_since = terminal_since or time.monotonic()
                if time.monotonic() - terminal_since > _TERMINAL_GRACE_S:
                    failure = classify(recent, None, params=at)
                    raise LaunchError(failure.reason, kind=failure.kind, fatal=failure.fatal, log_tail=recent[-20000:])
            if health is not None and health.done():
                if health.result() == 200:
                    break
                health = None
            if health is None:
                health = pool.submit(client.health_generate, 30.0)
            elapsed = time.monotonic() - started
            if elapsed > timeout_s:
                raise LaunchError(
                    f"the server did not answer /health_generate within ready_timeout_s={timeout_s:g} s "
                    f"at {at or 'the base command'}; raise [target] ready_timeout_s if it loads slowly",
                    kind="timeout",
                    log_tail=recent[-20000:],
                )
            time.sleep(poll_s)
    finally:
        pool.shutdown(wait=False, cancel_futures=True)
    try:
        info = client.server_info()
    except MeasureError as exc:
        raise LaunchError(f"the server became healthy but /server_info failed: {exc}", kind="exit") from exc
    check_server_args(info, params, url or client.url)
    return Ready(info=info, startup_s=time.monotonic() - started)


def _drain_log(control: ServiceControl, wait_s: float = 3.0) -> str:
    """The log of a server that just died: journald (or a pipe) may still be delivering its
    last lines, and those say why."""
    deadline = time.monotonic() + wait_s
    while time.monotonic() < deadline:
        log = control.log()
        if early_failure(log[-262144:]):
            break
        _, new = control.poll()
        if not new:
            time.sleep(0.3)
    return control.log()[-262144:]


def check_server_args(info: ServerInfo, params: Params, url: str) -> None:
    """Refuse to measure a server that does not run the trial's flags (another server on the port).

    Only the shape's identity (steps, topk) is compared: a server may round the mem fraction or
    resolve draft tokens its own way without being someone else's."""
    for key, wanted in params.as_dict().items():
        if key not in ("speculative_num_steps", "speculative_eagle_topk"):
            continue
        got = info.args.get(key)
        if got is None:
            continue  # a server that does not report the field: nothing to compare
        same = math.isclose(float(got), float(wanted), abs_tol=1e-6) if isinstance(wanted, float) else got == wanted
        if not same:
            raise LaunchError(
                f"the server at {url} runs {key}={got}, not the trial's {wanted}: another server "
                "answers at [target] url; stop it or point url at the server the tuner launches",
                kind="fatal",
                fatal=True,
            )
