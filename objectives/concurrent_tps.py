"""Throughput under load: completion tokens per second with `concurrency` requests in flight."""

from tuner.measure import Measurement

name = "concurrent_tps"
direction = "maximize"
unit = "tok/s"
description = "completion tokens per second over the concurrent phase's steady window (first concurrency level)"


def score(m: Measurement, level: int | None = None) -> float:
    """At `level` requests in flight (`concurrent_tps@<level>`), else the first level measured."""
    return m.concurrent_tps_by_level[level] if level is not None else m.concurrent_tps
