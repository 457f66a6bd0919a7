"""Running requests of this workload that the server can hold at once."""

from tuner.measure import Measurement

name = "capacity"
direction = "maximize"
unit = "requests"
description = "min(max_running_requests, max_total_num_tokens // request_tokens), summed over DP ranks"


def score(m: Measurement) -> float:
    # Per rank, then summed: a request cannot span ranks (Measurement.capacity).
    return float(m.capacity)
