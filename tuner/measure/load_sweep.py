"""The load a configuration holds within its SLO: a search over concurrency, per trial.

What `[slo]` promises (tuner/config.py · SloConfig) is judged at a load (requests in flight, a
closed loop as the concurrent phase runs it) over that load's requests:
- every promise over the requests pooled: the percentile of all their inter-token latencies
  (each chunk gap spread over its tokens, `RequestResult.itl_s`), the percentile of their TTFTs;
- goodput (DistServe, Zhong et al. 2024, §2.2; AIPerf's goodput): a request is good when its
  TTFT is within every TTFT promise and its time per output token (its mean inter-token latency)
  within every ITL promise, and the load holds only if at least `attainment` of the requests are
  good.

The search (AIPerf's max-concurrency-under-sla recipe: bracketing, isotonic denoising, a root
find) starts from the loads the trial already measured (one stream: the single-stream phase;
`[bench] concurrency`: the concurrent phase), brackets upward (the crossing extrapolated from
the two highest loads, 1.5x to 8x the largest load that holds) up to the server's
running-request cap (`max_running_requests`: past it requests only queue), then finds the root
between the largest load that holds and the smallest that does not (`_next_load`: regula falsi,
tempered toward the log-space midpoint), until they are within `precision` of each other (or
one request apart), at most `max_points` new loads.  With `arrival = "poisson"` the load is a
request rate (`sweep`, `open_loop`).  Every decision is taken on the
curve smoothed to be monotone (isotonic regression: latencies cannot fall and attainment cannot
rise with load on one server; a noisy point must not flip a bracket), so a load holds only if
every lower load does.

A point's first `load` requests (the ramp-up burst, every slot prefilling at once) are not
judged when the point has at least twice as many; the rest are what steady traffic meets.  A new
load judges `rounds` x load requests, at least `MIN_JUDGED` (a share of fewer requests moves in
steps too coarse for a 95% attainment).
"""

from __future__ import annotations

import asyncio
import math
from dataclasses import dataclass, field
from typing import Awaitable, Callable

import numpy as np
from scipy.optimize import isotonic_regression

from tuner.config import SloConfig
from tuner.measure.phases import closed_loop
from tuner.measure.result import RequestResult
from tuner.measure.stats import percentile

__all__ = ["LoadPoint", "LoadCurve", "point_of", "search", "smoothed", "PERCENTILES"]

PERCENTILES = (50, 90, 95, 99)
MIN_JUDGED = 20
_RATE_FLOOR = 0.01  # req/s: below it a Poisson search stops looking for a rate that holds


@dataclass(frozen=True)
class LoadPoint:
    """One load's figures: latency percentiles over its judged requests, and goodput."""

    load: float  # requests in flight (closed loop), or requests per second (arrival = "poisson")
    requests: int  # judged (the ramp-up excluded)
    itl_ms: dict[int, float]  # percentile -> ms, over every token of the judged requests
    ttft_ms: dict[int, float]
    attainment: float  # share of judged requests meeting every promise
    goodput_rps: float  # good requests per second over the point's span
    tps: float  # completion tokens per second over the point's span
    source: str = "sweep"  # "single" | "concurrent" (reused from the trial's phases) | "sweep"
    seconds: float = 0.0  # wall time of the point

    def as_record(self) -> dict:
        return {"load": self.load, "requests": self.requests, "source": self.source, "seconds": round(self.seconds, 2),
                **{f"p{q}_itl_ms": round(v, 3) for q, v in self.itl_ms.items()},
                **{f"p{q}_ttft_ms": round(v, 1) for q, v in self.ttft_ms.items()},
                "attainment": round(self.attainment, 4), "goodput_rps": round(self.goodput_rps, 3), "tps": round(self.tps, 1)}


@dataclass(frozen=True)
class LoadCurve:
    points: tuple[LoadPoint, ...]  # by load
    slo_capacity: float  # requests in flight, or req/s with arrival = "poisson"
    cap: float  # the running-request cap (or the rate cap) the search stopped at
    note: str  # how the search ended; the reason when slo_capacity is 0
    sweep_s: float  # seconds the search's own points took (the trial's extra cost)
    holds: dict[float, bool] = field(default_factory=dict)  # load -> the smoothed verdict
    promise: dict = field(default_factory=dict)  # the [slo] keys judged: {"p95_itl_ms": 50, ..., "attainment": 0.95}


def _good(r: RequestResult, slo: SloConfig) -> bool:
    """DistServe's (and AIPerf's goodput's) per-request test: its TTFT within every TTFT promise,
    its time per output token (the mean of its inter-token latencies) within every ITL promise."""
    tpot_ms = r.decode_s / (r.completion_tokens - 1) * 1000 if r.completion_tokens >= 2 else 0.0
    return all((r.ttft_s * 1000 if metric == "ttft" else tpot_ms) <= limit for metric, _, limit in slo.promises)


def point_of(results: list[RequestResult], load: float, slo: SloConfig, *, source: str = "sweep",
             ramp: int | None = None) -> LoadPoint:
    """A load's figures from its requests; the first `ramp` (default: `load`, the closed loop's
    ramp-up) left out when there are at least twice as many."""
    ordered = sorted(results, key=lambda r: r.start)
    ramp = int(load) if ramp is None else ramp
    judged = ordered[ramp:] if len(ordered) >= 2 * ramp else ordered
    itls = [x * 1000 for r in judged for x in r.itl_s()]
    ttfts = [r.ttft_s * 1000 for r in judged]
    span = max(r.end for r in ordered) - min(r.start for r in ordered) if ordered else 0.0
    judged_span = max(r.end for r in judged) - min(r.start for r in judged) if judged else 0.0
    good = sum(_good(r, slo) for r in judged)
    return LoadPoint(
        load=load, requests=len(judged),
        itl_ms={q: percentile(itls, q / 100) if itls else 0.0 for q in PERCENTILES},
        ttft_ms={q: percentile(ttfts, q / 100) for q in PERCENTILES},
        attainment=good / len(judged) if judged else 0.0,
        goodput_rps=good / judged_span if judged_span > 0 else 0.0,
        tps=sum(r.completion_tokens for r in ordered) / span if span > 0 else 0.0,
        source=source, seconds=span,
    )


def _monotone(values: list[float], *, increasing: bool) -> list[float]:
    """Isotonic regression (scipy's pool-adjacent-violators, already a dependency)."""
    if len(values) < 2:
        return list(values)
    return list(isotonic_regression(np.asarray(values, dtype=float), increasing=increasing).x)


def smoothed(points: list[LoadPoint], slo: SloConfig) -> dict[int, tuple[float, list[str]]]:
    """Per load (ascending): the worst promise's smoothed value over its limit (<= 1 holds), and
    the promises the monotone curve breaks there (empty: it holds)."""
    points = sorted(points, key=lambda p: p.load)
    out: dict[int, tuple[float, list[str]]] = {p.load: (0.0, []) for p in points}

    def judge(p: LoadPoint, ratio: float, why: str) -> None:
        margin, broken = out[p.load]
        out[p.load] = (max(margin, ratio), broken + [why] if ratio > 1 else broken)

    for metric, q, limit in slo.promises:
        raw = [(p.itl_ms if metric == "itl" else p.ttft_ms)[q] for p in points]
        for p, value in zip(points, _monotone(raw, increasing=True)):
            judge(p, value / limit, f"p{q} {metric.upper()} {value:.1f} ms > {limit:g} ms")
    for p, value in zip(points, _monotone([p.attainment for p in points], increasing=False)):
        # Counted only once it breaks: a share of 100% says nothing about how near the edge is.
        judge(p, slo.attainment / max(value, 0.01) if value < slo.attainment else 0.0, f"{value:.0%} of requests good < {slo.attainment:.0%}")
    return out


def _bracket(verdicts: dict[int, tuple[float, list[str]]]) -> tuple[int, int | None]:
    """(largest load that holds with every lower load holding, or 0; the next load, which breaks)."""
    lo = 0
    for load in sorted(verdicts):
        if verdicts[load][1]:
            return lo, load
        lo = load
    return lo, None


def _crossing(a: tuple[int, float], b: tuple[int, float]) -> float | None:
    """Where the line through two (load, margin) points reaches margin 1 (the root find)."""
    (x0, y0), (x1, y1) = a, b
    return x0 + (1 - y0) * (x1 - x0) / (y1 - y0) if y1 > y0 and x1 != x0 else None


def _next_load(verdicts: dict[float, tuple[float, list[str]]], cap: float, precision: float, bisect: bool,
               integer: bool = True) -> float | None:
    """The next load to measure, or None when the bracket is within `precision`.

    Above every load that holds: the crossing extrapolated from the two highest loads (a
    little past it), else 4x; at least 1.5x, at most 8x and the cap.  Inside a bracket: the crossing
    interpolated between its ends (regula falsi), kept off both ends by half the precision so
    a good guess closes the bracket on its next point; with `bisect` (the bracket moved from the
    same end twice) or ends more than 2x apart, half-way in log space between that crossing and
    the midpoint.  A rate that breaks with nothing below it is halved (a closed loop cannot
    offer less than one stream)."""
    lo, hi = _bracket(verdicts)
    margin = {load: v[0] for load, v in verdicts.items()}
    step = 1 if integer else 0.0
    if hi is None:
        if lo >= cap:
            return None
        below = sorted(load for load in margin if load < lo)
        guess = _crossing((below[-1], margin[below[-1]]), (lo, margin[lo])) if below and lo else None
        aim = guess * (1 + precision / 2) if guess else 4 * max(lo, 1)
        aim = min(cap, 8 * max(lo, 1), max(1.5 * lo, lo + step, aim))
        return int(round(aim)) if integer else aim
    if lo == 0:
        # Nothing holds: one stream is the least a closed loop can offer; a rate can go lower.
        return None if integer or hi <= _RATE_FLOOR else hi / 2
    width = max(1.0, precision * lo) if integer else precision * lo
    if hi - lo <= width:
        return None
    guess = _crossing((lo, margin[lo]), (hi, margin[hi]))
    mid = math.sqrt(lo * hi)
    # A curve bent like queueing delay makes plain regula falsi creep up from one end: once the
    # bracket moved from the same end twice, half-way (in log space) to the midpoint (Illinois-like).
    # A line through ends more than 2x apart says little about the middle: the same compromise.
    aim = mid if guess is None or guess <= 0 else (math.sqrt(guess * mid) if bisect or hi > 2 * lo else guess)
    if not integer:
        return float(min(max(aim, lo + width / 2), hi - width / 2))
    edge = max(1, math.ceil(width / 2))
    return int(min(max(round(aim), lo + edge), hi - edge)) if hi - lo > 2 * edge else lo + (hi - lo) // 2


async def search(measure: Callable[[float], Awaitable[LoadPoint]], known: list[LoadPoint], *, cap: float,
                 slo: SloConfig, start: float | None = None) -> LoadCurve:
    """Bracket, then root-find; `measure(load)` runs one new point, the first at `start` when
    nothing is known.  Reused points above the cap are left out: past it requests only queue.
    Loads are integers (requests in flight) unless `[slo] arrival = "poisson"` (req/s)."""
    integer = slo.arrival == "closed"
    points = {p.load: p for p in known if 0 < p.load <= cap}
    added, sides = 0, []
    while True:
        verdicts = smoothed(list(points.values()), slo)
        lo, hi = _bracket(verdicts)
        bisect = len(sides) >= 2 and sides[-1] == sides[-2]
        nxt = _next_load(verdicts, cap, slo.precision, bisect, integer) if points or start is None else start
        if nxt is None or nxt in points or added >= slo.max_points:
            break
        points[nxt] = await measure(nxt)
        added += 1
        sides.append(not smoothed(list(points.values()), slo)[nxt][1])
    return _curve(points, lo, hi, cap, slo, added, stopped=nxt is not None and nxt not in points)


def _fmt(load: float, slo: SloConfig) -> str:
    return f"{load:g} request(s) in flight" if slo.arrival == "closed" else f"{load:.3g} req/s"


def _curve(points: dict[float, LoadPoint], lo: float, hi: float | None, cap: float, slo: SloConfig, added: int,
           *, stopped: bool) -> LoadCurve:
    broken = {load: v[1] for load, v in smoothed(list(points.values()), slo).items()}
    ordered = tuple(points[k] for k in sorted(points))
    sweep_s = sum(p.seconds for p in ordered if p.source == "sweep")
    cap_name = "running-request cap" if slo.arrival == "closed" else "rate cap (twice the fastest measured)"
    cap_text = f"{cap:g}" if slo.arrival == "closed" else f"{cap:.3g} req/s"
    if lo == 0:
        first = min(broken) if broken else 1
        note = (f"no load holds the SLO ({slo.describe()}): at {_fmt(first, slo)} "
                f"{'; '.join(broken.get(first, [])) or 'nothing was measured'}")
    elif hi is None and lo >= cap:
        note = f"holds up to the {cap_name} ({cap_text}) with {added} load point(s) added"
    elif hi is None:
        note = (f"holds at every load measured, up to {_fmt(lo, slo)}; stopped at [slo] max_points = {slo.max_points} "
                f"below the {cap_name} ({cap_text})")
    else:
        note = f"holds at {_fmt(lo, slo)}, breaks at {_fmt(hi, slo)} ({'; '.join(broken[hi])}) with {added} load point(s) added"
        if stopped:
            note += f"; stopped at [slo] max_points = {slo.max_points} before the {slo.precision:.0%} precision"
    promise = {f"p{q}_{metric}_ms": limit for metric, q, limit in slo.promises} | {"attainment": slo.attainment,
                                                                                    "arrival": slo.arrival}
    value = lo if slo.arrival == "closed" else round(lo, 3)
    return LoadCurve(ordered, value, cap, note, sweep_s, {k: not v for k, v in broken.items()}, promise)


async def open_loop(runner, prompts: list, rate: float, seed: int, progress=None) -> list[RequestResult]:
    """Requests sent at Poisson arrivals of `rate` per second, whatever is in flight (an open
    loop: a server slower than the rate falls behind and its queue grows, as real traffic's)."""
    import random

    rng = random.Random(seed)
    tasks: list[asyncio.Task] = []
    try:
        for i, prompt in enumerate(prompts):
            tasks.append(asyncio.create_task(runner.one(prompt, runner.bench.max_tokens)))
            if progress:
                progress(f"slo rate {rate:.3g}/s", i + 1, len(prompts))
            if i + 1 < len(prompts):
                await asyncio.sleep(rng.expovariate(rate))
        return list(await asyncio.gather(*tasks))
    except BaseException:
        for t in tasks:
            t.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        raise


async def sweep(runner, slo: SloConfig, workload, *, cap: int, single: list[RequestResult],
                levels: dict[int, list[RequestResult]], progress=None, seed: int = 0) -> LoadCurve:
    """The search on a live server through `runner` (wire.StreamClient).

    Closed loop (default): the single-stream requests are load 1, each concurrent level its load;
    a new load runs a closed loop of load + max(rounds x load, MIN_JUDGED) requests, the first
    `load` the ramp-up (not judged).  `arrival = "poisson"`: the load is a request rate; nothing
    measured is a rate point, so the search starts at the rate one stream completes (1 / its
    mean end-to-end time), is capped at twice the fastest request rate the concurrent phase
    completed, and a rate runs MIN_JUDGED + max(5, rounds x rate x that time) requests, the
    first fifth not judged."""
    if slo.arrival == "poisson":
        e2e = sum(r.end - r.start for r in single) / len(single) if single else 1.0
        rates = [len(rs) / (max(r.end for r in rs) - min(r.start for r in rs)) for rs in levels.values() if len(rs) > 1]
        rate_cap = 2 * max(rates + [1 / e2e])

        async def measure_rate(rate: float) -> LoadPoint:
            n = MIN_JUDGED + max(5, math.ceil(slo.rounds * rate * e2e))
            results = await open_loop(runner, workload.for_phase("concurrent", n), rate, seed, progress)
            return point_of(results, rate, slo, ramp=n // 5)

        return await search(measure_rate, [], cap=rate_cap, slo=slo, start=1 / e2e)

    known = [point_of(single, 1, slo, source="single")] if single else []
    known += [point_of(results, level, slo, source="concurrent") for level, results in levels.items() if results]

    async def measure(load: int) -> LoadPoint:
        prompts = workload.for_phase("concurrent", load + max(slo.rounds * load, MIN_JUDGED))
        return point_of(await closed_loop(runner, prompts, load, progress, f"slo load {load}"), load, slo)

    return await search(measure, known, cap=max(cap, 1), slo=slo)
