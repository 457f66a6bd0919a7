"""Ctrl-C and SIGTERM, as every command handles them: the first one stops the run, later ones
wait for its bookkeeping.

The first signal raises `KeyboardInterrupt` wherever the run is (a launch, a poll, a benchmark
phase, the sampler's proposal); from then on the run is only recording what it was doing (the
trial's FAIL with its reason, log tail and server log, the server stopped, the target restored)
and a second signal must not cut that short: it is noted with one line and the bookkeeping
finishes, then the command exits 130 (issue 25: a second Ctrl-C left a FAIL trial with no
`fail_reason`, `log_tail` or server log).  SIGTERM (systemd stop, `kill`) is handled as Ctrl-C,
so the target is restored too.

`quiet_start` turns a Ctrl-C or SIGTERM during the command's imports (a second or so before `main` runs)
into one line instead of a 40-line traceback through pydantic or openai.
"""

from __future__ import annotations

import asyncio
import os
import signal
import sys
import threading
from collections.abc import Callable, Coroutine, Iterator
from contextlib import contextmanager
from types import FrameType
from typing import Any, TypeVar

T = TypeVar("T")

__all__ = ["install", "stopping", "checkpoint", "deferred", "run_async", "through_tell", "after_tell", "end_hold", "quiet_start", "Interrupted", "STARTING_LINE", "AGAIN_LINE", "NOTHING_RAN_LINE"]

STARTING_LINE = "interrupted while starting: nothing was run"
AGAIN_LINE = "interrupted again: finishing the record of what was running first (the server is being stopped), then exiting"
_SIGNALS = (signal.SIGINT, signal.SIGTERM)
_state: dict[str, Any] = {"stopping": False, "deferring": 0, "pending": False, "held": False, "cancel": None}


def _handle(signum: int, frame: FrameType | None) -> None:
    if _state["stopping"]:
        print(AGAIN_LINE, file=sys.stderr, flush=True)
        return
    _state["stopping"] = True
    if _state["deferring"]:
        _state["pending"] = True  # raised when the deferred block ends
        return
    if _state["cancel"] is not None:
        _state["cancel"]()  # inside run_async: its task is cancelled, it raises when its loop has wound down
        return
    raise KeyboardInterrupt


@contextmanager
def deferred() -> Iterator[None]:
    """Hold a first signal until the block ends, then raise it: for a step that must be either
    not done or done and recorded, such as starting a server and writing down its pid.  A
    KeyboardInterrupt raised inside Popen or between the start script and its pid file left a
    server nobody knew about (a fresh-clone suite on a loaded machine: "a server for port ...
    still runs" after exit 130), and each call to the study's database (a KeyboardInterrupt
    inside SQLAlchemy's fetch invalidated the connection mid-read and printed a pool traceback;
    CI, `test_signals[between trials (proposal)]`).  Only with `install`'s handler; the block
    must be short.  Only the main thread defers: signals are handled there, and a block in
    another thread (the heartbeat's storage call) must not hold them."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    _state["deferring"] += 1
    try:
        yield
    finally:
        _state["deferring"] -= 1
        if not _state["deferring"] and _state["pending"]:
            _state["pending"] = False
            raise KeyboardInterrupt


def run_async(coro: Coroutine[Any, Any, T]) -> T:
    """`asyncio.run(coro)` for a step of the run (a benchmark): a first signal cancels the
    coroutine's task instead of raising KeyboardInterrupt inside whatever task the loop was
    running, and KeyboardInterrupt is raised once the loop has wound down.  A KeyboardInterrupt
    raised inside a task is stored as its exception and raised again out of the loop by every
    task that awaits it, so asyncio.run's own clean-up (cancel the tasks, close the async
    generators) was cut short: a Ctrl-C in the concurrent phase left the open streams' generators
    unclosed and printed "ERROR asyncio: Task was destroyed but it is pending! task: <Task
    pending ... async_generator_athrow>" (1 in 8 beside two CPU hogs).  A cancellation goes
    through every await instead, closing each stream.  asyncio.Runner does the same for Ctrl-C
    when Python's default handler is set (runners.py · Runner._on_sigint); ours replaces it, and
    SIGTERM stops a run too."""
    try:
        checkpoint()  # a signal whose KeyboardInterrupt was lost before: nothing starts
    except KeyboardInterrupt:
        coro.close()  # not "coroutine was never awaited"
        raise
    with asyncio.Runner() as runner:
        loop = runner.get_loop()
        task = loop.create_task(coro)
        main = threading.current_thread() is threading.main_thread()
        if main:
            # From the signal handler, between any two bytecodes: only call_soon_threadsafe is
            # safe there, and it wakes a loop waiting in select().
            _state["cancel"] = lambda: loop.call_soon_threadsafe(task.cancel)
        try:
            result = loop.run_until_complete(task)
        except (asyncio.CancelledError, Exception):
            if main and _state["stopping"]:  # what the cancellation ended in (a request cut off) is not news
                raise KeyboardInterrupt from None
            raise
        finally:
            if main:
                _state["cancel"] = None
    checkpoint()  # a signal after the task's last await: the run stops here, not at its next step
    return result


def _unraisable(unraisable: Any) -> None:
    """sys.unraisablehook: the handler's KeyboardInterrupt raised inside a finaliser (an async
    generator's, a socket's `__del__`) cannot propagate, and Python's default hook printed it
    as "Exception ignored in: <async_generator object PoolByteStream.__aiter__ ...>" and a
    traceback on a clean Ctrl-C (a fresh-clone suite beside a benchmark, `test_signals[warm-up]`).
    It is not lost: `checkpoint` raises it again at the run's next step.  Anything else goes to
    the hook that was there before (`install`)."""
    if _state["stopping"] and issubclass(unraisable.exc_type, KeyboardInterrupt):
        return
    _before["unraisablehook"](unraisable)


_before: dict[str, Callable[[Any], None]] = {"unraisablehook": sys.__unraisablehook__}


def install() -> None:
    """From now on a first SIGINT or SIGTERM raises KeyboardInterrupt and later ones are held
    (a command's `main` calls this first).  Only the main thread may set signal handlers."""
    _state.update(stopping=False, deferring=0, pending=False, held=False, cancel=None)
    if threading.current_thread() is threading.main_thread():
        for sig in _SIGNALS:
            signal.signal(sig, _handle)
        if sys.unraisablehook is not _unraisable:  # installed again: keep the first one's predecessor
            _before["unraisablehook"] = sys.unraisablehook
            sys.unraisablehook = _unraisable


def through_tell(objective: Callable[[Any], Any]) -> Callable[[Any], Any]:
    """Optuna's objective, holding a signal from its return until `after_tell` (the study's
    first callback): in between, Optuna writes the trial's state and values (its tell), and a
    KeyboardInterrupt raised there -- at the end of one of the storage's deferred calls --
    escapes Optuna's `except Exception` and its `finally` reads a variable the tell never set:
    `UnboundLocalError: updated_state`, a traceback and exit 1 instead of 130, the trial's
    measurement possibly unwritten (a sampler_live run stopped with SIGTERM, 2026-12-04).  From
    the callback on, the run is between trials and stops there as usual."""
    def call(trial: Any) -> Any:
        try:
            return objective(trial)
        finally:
            if threading.current_thread() is threading.main_thread() and not _state["held"]:
                _state["held"] = True
                _state["deferring"] += 1
    return call


def after_tell(*_: Any) -> None:
    """The study's callback after a trial is told: a signal held since the objective returned is raised now."""
    end_hold(raise_pending=True)


def end_hold(raise_pending: bool = False) -> None:
    """End `through_tell`'s hold (the callbacks never run when Optuna re-raises the objective's
    error; the study's runner then ends it without raising)."""
    if not _state["held"]:
        return
    _state["held"] = False
    _state["deferring"] -= 1
    if raise_pending and not _state["deferring"] and _state["pending"]:
        _state["pending"] = False
        raise KeyboardInterrupt


def stopping() -> bool:
    """A signal arrived: the run is being wound down."""
    return _state["stopping"]


def checkpoint() -> None:
    """Raise the first signal again if the run is still going: for the steps of a launch and a
    benchmark (each phase), which never run once the run is winding down.  The handler's
    KeyboardInterrupt can be lost: raised while Python runs a finaliser or a callback (a socket's
    or a client's `__del__`), it is printed as "Exception ignored" and the code goes on (a fresh-
    clone suite on a loaded machine: a SIGINT at the warm-up printed the handler's traceback and
    the trial measured on for 60 s; `test_signals[warm-up]`).  Inside `run_async` it does
    nothing: a signal cancels the task there, and a KeyboardInterrupt raised inside one of its
    tasks (a progress line's checkpoint) would cut the loop's clean-up short."""
    if (_state["stopping"] and not _state["deferring"] and _state["cancel"] is None
            and threading.current_thread() is threading.main_thread()):
        raise KeyboardInterrupt


def _quiet_hook(kind, value, tb) -> None:
    if issubclass(kind, KeyboardInterrupt):
        print(STARTING_LINE, file=sys.stderr, flush=True)
        os._exit(130)  # what the shell reports for Ctrl-C; nothing was started, nothing to undo
    _default_hook(kind, value, tb)


_default_hook = sys.excepthook


def quiet_start() -> None:
    """A KeyboardInterrupt that reaches the interpreter before `main` handled it (the command's
    imports) is one line and exit 130.  Only for the command-line entry points: `python -m
    tuner...` (while the package is imported for `-m`, argv[0] is "-m") and the installed
    script; a program that imports the tuner keeps its own hook."""
    script = os.path.basename(sys.argv[0]) if sys.argv else ""
    if sys.argv[:1] == ["-m"] or script == "sglang-tuner":
        sys.excepthook = _quiet_hook
        if threading.current_thread() is threading.main_thread():
            # SIGTERM too (systemd stop, kill): its default action killed the process, -15 and
            # no line, where a Ctrl-C at the same moment said what happened (a signal stress
            # run); `install` resets the state and sets it again once `main` runs.
            signal.signal(signal.SIGTERM, _handle)


NOTHING_RAN_LINE = "interrupted before anything was launched; nothing was recorded"


class Interrupted(KeyboardInterrupt):
    """The run was interrupted and wound down; str() is the line saying what it interrupted
    (a trial, a baseline, a schedule launch, or nothing) and that the target was restored."""
