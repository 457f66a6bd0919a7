"""When the measuring client itself could not run.

A streamed request is timed by when the client reads its chunks.  If the client's process is
descheduled (a busy machine: two cores shared with the server's tokenizer, another study, a
build) or its event loop is blocked, the chunks wait in the socket and are read in a burst:
the first token is stamped late, the decode time shrinks to the burst, and one single-stream
request reported 5.6x its true rate (the live sampler benchmark, family:0 seed 4, trial 3:
2,101 tok/s for a shape whose every other measurement was ~390).  That one figure steered the
whole study.  The time a stall adds is the client's, not the server's; a request that spans
one measured the client.

`LoopWatch` is a task that sleeps a few milliseconds at a time and records every wake-up that
came late by more than `late_s` as an interval the client was starved; `starved_s(start, end)`
is how much of a request's life fell in such intervals (a single-stream request starved for
more than 5% of it is sent again: measure/phases.py), and `starved_gaps` which gaps between
its chunks did (left out of its inter-token latencies: one stall puts a gap of its length in
every stream in flight, which would be a concurrency level's p99 ITL and fail an SLO).

Python offers no portable "was this process descheduled" signal (getrusage counts involuntary
switches, not their length, and only per process); a late timer is the same measurement asyncio's own slow-callback debug
check makes, and it sees a blocked loop as well as a descheduled process.
"""

from __future__ import annotations

import asyncio
import time

__all__ = ["LoopWatch", "STALL_SHARE", "stalled"]

# A request re-sent when the client was starved for more than this share of its life (and at
# least MIN_STALL_S): 5% of a decode is below the single-stream target spread.
STALL_SHARE = 0.05
MIN_STALL_S = 0.010


class LoopWatch:
    """Starved intervals of this event loop, from a ticking task (start inside the loop)."""

    def __init__(self, tick_s: float = 0.005, late_s: float = 0.010, keep: int = 4096):
        self.tick_s = tick_s
        self.late_s = late_s
        self.keep = keep
        self.intervals: list[tuple[float, float]] = []  # (from, to): the loop could not run
        self._due: float | None = None  # when the watch's current sleep should end
        self._task: asyncio.Task | None = None

    def start(self) -> None:
        if self._task is None:
            self._task = asyncio.get_running_loop().create_task(self._run(), name="loop-watch")

    async def stop(self) -> None:
        if self._task is not None:
            self._task.cancel()
            try:
                await self._task
            except asyncio.CancelledError:
                pass
            self._task = None

    async def _run(self) -> None:
        while True:
            self._due = due = time.monotonic() + self.tick_s
            await asyncio.sleep(self.tick_s)
            woke = time.monotonic()
            if woke - due > self.late_s:
                self.intervals.append((due, woke))
                del self.intervals[:-self.keep]

    def starved_gaps(self, times: tuple[float, ...]) -> tuple[int, ...]:
        """The gaps between consecutive `times` (index i: times[i] -> times[i + 1]) with more
        than MIN_STALL_S of them starved."""
        if len(times) < 2:
            return ()
        spans = [(a, b) for a, b in self._spans() if b > times[0] and a < times[-1]]
        if not spans:
            return ()
        return tuple(i for i, (t0, t1) in enumerate(zip(times, times[1:])) if _overlap(spans, t0, t1) > MIN_STALL_S)

    def _spans(self) -> list[tuple[float, float]]:
        spans = list(self.intervals)
        now = time.monotonic()
        if self._due is not None and now - self._due > self.late_s:
            spans.append((self._due, now))
        return spans

    def starved_s(self, start: float, end: float) -> float:
        """Seconds of [start, end] the loop could not run.  A stall that has just ended is
        counted before the watch's own late wake-up has run (the request that spanned it may
        be resumed first)."""
        return _overlap(self._spans(), start, end)


def _overlap(spans: list[tuple[float, float]], start: float, end: float) -> float:
    """Seconds of [start, end] inside the spans (which do not overlap each other)."""
    return sum(max(0.0, min(end, b) - max(start, a)) for a, b in spans)


def stalled(starved_s: float, start: float, end: float) -> bool:
    """Whether a request's timing measured the client more than the server."""
    return starved_s > max(MIN_STALL_S, STALL_SHARE * (end - start))
