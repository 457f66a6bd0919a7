"""What a measurement's own figures say about how far to trust it, each with the fix: a
single-stream spread above the target, a concurrency level too short for a steady state,
speeds inflated by ignore_eos.  `tuner.bench` prints them under its figures."""

from __future__ import annotations

import math

from tuner.config import BenchConfig
from tuner.measure.result import Measurement

__all__ = ["caveats"]


def caveats(m: Measurement, bench: BenchConfig) -> list[str]:
    out = []
    if m.single_spread > bench.single_target_ci and math.isfinite(m.single_spread):
        out.append(
            f"single_tps spread ±{m.single_spread * 100:.1f}% after {len(m.single_runs)} passes is above "
            f"single_target_ci ({bench.single_target_ci * 100:.0f}%): raise [bench] single_max_passes, or measure on a quieter machine"
        )
    for level in bench.concurrency_levels:
        if bench.level_requests(level) < 3 * level:
            out.append(
                f"concurrency {level} with {bench.level_requests(level)} requests barely reaches a steady state: "
                f"raise [bench] concurrent_requests to at least {3 * level}"
            )
    if m.client_stall_kept:
        out.append(
            f"{m.client_stall_kept} single-stream request(s) were timed while this client was starved of CPU "
            f"(sent {m.client_stall_resent} time(s) again): single_tps may be off; measure on a quieter machine"
        )
    if m.ignore_eos:
        out.append("ignore_eos is on: these speeds are inflated (see greedy_inflation); set [bench] ignore_eos = false for real traffic")
    return out
