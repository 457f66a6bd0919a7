"""Figures per request class (the user attr `by_class`), and the KV footprint of a request of
this workload (`[bench] request_tokens = "auto"`), from the requests a measurement sent.

A class's `single_tps` is the mean over passes of its single-stream requests' decode rates
(its own 95% interval beside it); its `accept_length` its completion tokens over its verify
steps (`sglext.spec_tokens_details.spec_verify_ct`, per request: docs/sglang-real-server.md);
its `concurrent_tps_by_level` its share of each level's steady-window rate, which is what can be
separated in a phase where the classes share every batch (`concurrent_tps`: the first level's)."""

from __future__ import annotations

import math
import statistics

from tuner.measure.result import ClassFigures, RequestResult
from tuner.measure.stats import steady_window_rate, summarize_rate

__all__ = ["class_figures", "class_accept_length", "auto_request_tokens"]


def class_accept_length(results: list[RequestResult], speculative: bool) -> float | None:
    """Completion tokens per verify step over these requests; None unless every one reported its count."""
    if not speculative:
        return 1.0
    if not results or not all(r.spec_verify_ct for r in results):
        return None
    return sum(r.completion_tokens for r in results) / sum(r.spec_verify_ct for r in results)


def _mean_request_tokens(results: list[RequestResult]) -> float:
    """The mean over the distinct prompts sent (each once, however often a phase repeated it) of
    prompt tokens + max_tokens.  Why once: the single-stream phase runs as many passes over the
    same prompts as its interval needs, so weighting by sends gave each configuration its own
    request size (a study's no-speculation baseline, two passes, 11,662 tokens against its
    trials' five passes, 11,981, on a workload of 300- and 15-30k-token prompts), and capacity
    moved with the passes, not the server."""
    distinct = {r.prompt_key if r.prompt_key is not None else ("request", i): r.prompt_tokens + r.max_tokens
                for i, r in enumerate(results)}
    return statistics.fmean(distinct.values()) if distinct else math.nan


def _level_rates(c: str, levels: dict[int, list[RequestResult]]) -> dict[int, float]:
    """The class's share of each level's steady-window rate; a level none of it was sent to has none."""
    out = {}
    for level, results in levels.items():
        of = [r for r in results if r.request_class == c]
        if of:
            out[level] = steady_window_rate(results, level, of=of)[0]
    return out


def class_figures(mix: dict[str, float], single: list[RequestResult], class_rates: dict[str, list[float]],
                  concurrent: list[RequestResult], levels: dict[int, list[RequestResult]],
                  speculative: bool, accept_fallback: dict[str, float] | None = None) -> dict[str, ClassFigures]:
    """`accept_fallback`: each class's accept length from /generate, for a server whose chat
    stream carries no verify counts (0.5.9: `phases.acceptance`)."""
    out = {}
    first = next(iter(levels), None)
    for c, share in mix.items():
        mine_single = [r for r in single if r.request_class == c]
        mine = mine_single + [r for r in concurrent if r.request_class == c]
        tps, ci = summarize_rate(class_rates[c]) if class_rates.get(c) else (math.nan, (math.nan, math.nan))
        by_level = _level_rates(c, levels)
        out[c] = ClassFigures(
            requests=len(mine),
            single_tps=tps,
            single_tps_ci95=ci,
            accept_length=class_accept_length(mine, speculative) or (accept_fallback or {}).get(c),
            prompt_tokens_median=float(statistics.median(r.prompt_tokens for r in mine)) if mine else math.nan,
            concurrent_tps=by_level.get(first),
            share=share,
            single_s=sum(r.end - r.start for r in mine_single),
            mean_request_tokens=_mean_request_tokens(mine),
            concurrent_tps_by_level=by_level,
        )
    return out


def auto_request_tokens(by_class: dict[str, ClassFigures]) -> int:
    """The workload's own KV footprint of a request: the mean over its requests, in the mix's
    proportions, of prompt tokens (the server's `usage`) + max_tokens, rounded up."""
    known = {c: f for c, f in by_class.items() if not math.isnan(f.mean_request_tokens)}
    total = sum(f.share for f in known.values())
    return max(1, math.ceil(sum(f.share * f.mean_request_tokens for f in known.values()) / total)) if total else 1
