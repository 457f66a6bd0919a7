"""Running requests of this workload that the server can hold at once."""

from tuner.measure import Measurement

name = "capacity"
direction = "maximize"
unit = "requests"
description = "min(max_running_requests, max_total_num_tokens // request_tokens)"


def score(m: Measurement) -> float:
    return float(min(m.max_running_requests, m.max_total_num_tokens // m.request_tokens))
