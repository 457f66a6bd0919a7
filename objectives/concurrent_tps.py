"""Throughput under load: completion tokens per second with `concurrency` requests in flight."""

from tuner.errors import MeasureError
from tuner.measure import Measurement

name = "concurrent_tps"
direction = "maximize"
unit = "tok/s"
description = "completion tokens per second over the concurrent phase's steady window (first concurrency level)"


def score(m: Measurement, level: int | None = None, request_class: str | None = None) -> float:
    """At `level` requests in flight (`concurrent_tps@<level>`), else the first level measured;
    `concurrent_tps:<class>` (`concurrent_tps@<level>:<class>`): that class's share of the first
    level's (that level's) rate."""
    if request_class is not None:
        figures = m.by_class.get(request_class)
        value = None if figures is None else figures.concurrent_tps if level is None else figures.concurrent_tps_by_level.get(level)
        if value is None:
            at = f" at concurrency {level}" if level is not None else ""
            raise MeasureError(f"the measurement has no concurrent figure for request class {request_class!r}{at}")
        return value
    return m.concurrent_tps_by_level[level] if level is not None else m.concurrent_tps
