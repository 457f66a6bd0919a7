"""The statistics of a measurement: percentiles, a rate's mean with its 95% interval, and the
steady window of a closed-loop phase."""

from __future__ import annotations

import math
import statistics

from scipy import stats

from tuner.measure.result import RequestResult

__all__ = ["percentile", "summarize_rate", "steady_window", "window_tokens", "steady_window_rate"]


def percentile(values: list[float], q: float) -> float:
    if not values:
        return float("nan")
    ordered = sorted(values)
    k = (len(ordered) - 1) * q
    lo, hi = math.floor(k), math.ceil(k)
    return ordered[lo] + (ordered[hi] - ordered[lo]) * (k - lo)


def summarize_rate(samples: list[float]) -> tuple[float, tuple[float, float]]:
    """Mean and Student-t 95% confidence interval."""
    mean = statistics.fmean(samples)
    if len(samples) < 2:
        return mean, (-math.inf, math.inf)
    sem = statistics.stdev(samples) / math.sqrt(len(samples))
    if sem == 0:
        return mean, (mean, mean)
    lo, hi = stats.t.interval(0.95, len(samples) - 1, loc=mean, scale=sem)
    return mean, (float(lo), float(hi))


def steady_window(results: list[RequestResult], concurrency: int) -> tuple[float, float] | None:
    """(opens, closes) of a closed-loop phase's steady window, None when it is too short.

    The window opens when the `concurrency`-th request has its first token (every slot
    decoding) and closes when the first slot finds no request left to send (the drain).
    """
    if not results:
        return None
    firsts = sorted(r.first_token for r in results)
    opens = firsts[min(concurrency, len(firsts)) - 1]
    # Requests are sent in start order; the drain starts when the last request is sent and a
    # slot then falls idle: the first completion after the last start.
    last_start = max(r.start for r in results)
    ends_after = sorted(r.end for r in results if r.end >= last_start)
    closes = ends_after[0] if ends_after else max(r.end for r in results)
    phase_start = min(r.start for r in results)
    phase_end = max(r.end for r in results)
    if closes - opens < 0.25 * (phase_end - phase_start) or closes <= opens:
        return None
    return opens, closes


def window_tokens(results: list[RequestResult], opens: float, closes: float) -> float:
    """Completion tokens inside [opens, closes]: one token at each first-token instant, the
    rest of a request's tokens spread evenly over its decode interval."""
    tokens = 0.0
    for r in results:
        lo, hi = max(r.first_token, opens), min(r.end, closes)
        if hi <= lo:
            continue
        span = r.end - r.first_token
        tokens += (r.completion_tokens - 1) * (hi - lo) / span if span > 0 else 0.0
        if opens <= r.first_token <= closes:
            tokens += 1
    return tokens


def steady_window_rate(results: list[RequestResult], concurrency: int, of: list[RequestResult] | None = None) -> tuple[float, float]:
    """Completion tokens per second while all `concurrency` slots were busy, and the window's
    length; of the requests `of` (a class of them) when given, in the window all of them set.
    Falls back to tokens over the whole phase when the window is too short (few requests)."""
    if not results:
        return 0.0, 0.0
    counted = results if of is None else of
    window = steady_window(results, concurrency)
    if window is None:
        span = max(r.end for r in results) - min(r.start for r in results)
        return sum(r.completion_tokens for r in counted) / max(span, 1e-9), span
    opens, closes = window
    return window_tokens(counted, opens, closes) / (closes - opens), closes - opens
