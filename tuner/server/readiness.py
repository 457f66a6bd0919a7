"""Wait until a launched server is ready, or say why it never will be.

Three things are watched at once: the process (or unit), its log, and `/health_generate`.
A server that dies is seen at the next poll (`[target] poll_interval_s`, 0.5 s by default),
not at the timeout; a launcher that logs SGLang's terminal lines ("Scheduler hit an
exception", "Received sigquit ...") is classified even before it has exited.
"""

from __future__ import annotations

import math
import time
from typing import Any
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass

from tuner.server.client import ServerClient, ServerInfo
from tuner.server.control.base import ServiceControl
from tuner.server.diagnose import classify, early_failure
from tuner.server.launch import LaunchSpec
from tuner.errors import LaunchError, MeasureError
from tuner.sglang_args import CommandLine, Params

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
    spec: LaunchSpec | None = None,
    launched_at: float | None = None,
) -> Ready:
    """Block until `/health_generate` answers 200, or raise `LaunchError`; then check that the
    server answering is the one launched (`spec`'s command; `params` without one)."""
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
    check_server_args(info, CommandLine.parse(spec.argv) if spec is not None else params, url or client.url,
                      launched_at=launched_at)
    status, _ = control.poll()
    if status.state in ("exited", "stopped", "failed"):  # ours died meanwhile ("address already in use")
        failure = classify(_drain_log(control), status.exit_code, params=at)
        raise LaunchError(failure.reason, kind=failure.kind, fatal=failure.fatal, log_tail=control.log()[-20000:])
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


_IDENTITY = ("speculative_num_steps", "speculative_eagle_topk", "speculative_num_draft_tokens", "mem_fraction_static")
_CLOCK_SLACK_S = 5.0  # the server's startup_time against the tuner's clock, same host


def check_server_args(info: ServerInfo, launched: CommandLine | Params, url: str, *, launched_at: float | None = None) -> None:
    """Refuse to measure a server that is not the one launched (another server on the port).

    What the launch passed is read back from `/server_info` (SGLang 0.5.23 merges the resolved
    server args into it: srt/utils/common.py · build_server_info): the speculative algorithm
    (on or off), steps, topk, draft tokens (not with topk 1, where SGLang forces steps + 1)
    and mem_fraction_static; a field the server does not report is not compared.  With
    `launched_at` (the tuner's wall clock at the launch, same host), a server whose
    `startup_time` is older than the launch is someone else's too."""
    wanted = (launched.params() if isinstance(launched, CommandLine) else launched).as_dict()
    if wanted.get("speculative_eagle_topk") == 1:
        wanted.pop("speculative_num_draft_tokens", None)
    mismatch = [f"{k}={info.args.get(k)}, not the launched {v}" for k, v in wanted.items()
                if k in _IDENTITY and info.args.get(k) is not None and not _same(info.args[k], v)]
    if isinstance(launched, CommandLine) and "speculative_algorithm" in info.args:
        algorithm = info.args["speculative_algorithm"]
        if bool(algorithm) != bool(launched.algorithm):
            mismatch.append(f"speculative_algorithm={algorithm}, not the launched {launched.algorithm}")
    started = info.args.get("startup_time")
    if launched_at is not None and isinstance(started, (int, float)) and 1e9 < started < launched_at - _CLOCK_SLACK_S:
        mismatch.append(f"it started {launched_at - started:.0f} s before this launch")
    if mismatch:
        raise LaunchError(
            f"the server at {url} is not the one launched ({'; '.join(mismatch)}): another server answers at "
            "[target] url; stop it or point url at the server the tuner launches",
            kind="fatal",
            fatal=True,
        )


def _same(got: Any, wanted: Any) -> bool:
    try:
        return math.isclose(float(got), float(wanted), abs_tol=5e-4)
    except (TypeError, ValueError):
        return got == wanted
