"""Tokens per verify step: how well the draft predicts the target on this workload."""

from tuner.measure import Measurement

name = "accept_length"
direction = "maximize"
unit = "tokens/step"
description = "the server's avg_spec_accept_length over the measured phases (1.0 without speculation)"


def score(m: Measurement) -> float:
    return m.accept_length if m.accept_length is not None else 1.0
