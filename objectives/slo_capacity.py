"""The load a configuration holds within its latency promise ([slo])."""

from tuner.errors import MeasureError
from tuner.measure import Measurement

name = "slo_capacity"
direction = "maximize"
unit = "requests"  # in flight; requests per second with [slo] arrival = "poisson"
description = ("the largest concurrency (or, with [slo] arrival = \"poisson\", request rate) at which every "
               "promise of [slo] holds (search over load, capped by max_running_requests); 0 when none does")


def score(m: Measurement) -> float:
    if m.load_curve is None:
        raise MeasureError("slo_capacity: this measurement has no search over load; add an [slo] section")
    return float(m.load_curve.slo_capacity)
