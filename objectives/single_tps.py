"""Decode speed of one request alone: what a single user sees once tokens flow."""

from tuner.measure import Measurement

name = "single_tps"
direction = "maximize"
unit = "tok/s"
description = "completion tokens after the first / time from first to last token, one request alone (mean over repeats)"


def score(m: Measurement) -> float:
    return m.single_tps
