"""Decode speed of one request alone: what a single user sees once tokens flow."""

from tuner.errors import MeasureError
from tuner.measure import Measurement

name = "single_tps"
direction = "maximize"
unit = "tok/s"
description = ("completion tokens after the first / time from first to last token, one request alone "
               "(mean over repeats, weighted by the [bench] mix of request classes)")


def score(m: Measurement, request_class: str | None = None) -> float:
    """The mix-weighted rate, or one request class's (`single_tps:<class>`)."""
    if request_class is None:
        return m.single_tps
    if request_class not in m.by_class:
        raise MeasureError(f"the measurement has no request class {request_class!r}")
    return m.by_class[request_class].single_tps
