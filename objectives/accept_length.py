"""Tokens per verify step: how well the draft predicts the target on this workload."""

from tuner.errors import MeasureError
from tuner.measure import Measurement

name = "accept_length"
direction = "maximize"
unit = "tokens/step"
description = "completion tokens per verify step over the measured requests (1.0 without speculation)"


def score(m: Measurement, request_class: str | None = None) -> float:
    """Over every measured request, or one request class's (`accept_length:<class>`)."""
    if request_class is not None:
        figures = m.by_class.get(request_class)
        if figures is None or figures.accept_length is None:
            raise MeasureError(f"the measurement has no accept length for request class {request_class!r}")
        return figures.accept_length
    if m.accept_length is None:
        # Never a silent 1.0: the trial fails with this reason instead.
        raise MeasureError("the server reports no per-request speculation figures (spec_verify_ct), so accept_length is unknown; "
                           "drop accept_length from [study] objectives for this server")
    return m.accept_length
