"""The optuna-dashboard note each trial carries: how it was launched, what it measured, or why
it failed, so a trial explains itself without anyone reading the tuner's log."""

from __future__ import annotations

import math
import re
from typing import Any

import optuna

from tuner.results import record

__all__ = ["trial_note", "save"]


def _f(value: Any, digits: int = 1) -> str:
    if value is None:
        return "-"
    if isinstance(value, float):
        return "-" if math.isnan(value) else f"{value:,.{digits}f}"
    if isinstance(value, int):
        return f"{value:,}"
    return str(value)


def wrapped_command(command: str) -> str:
    """A launch command one option per line with shell continuations: the dashboard's note pane
    does not wrap a code block, so one 300-character line ran off sideways.  The text is kept
    as recorded (redactions included), so it still pastes into a shell."""
    return re.sub(r" (?=--[A-Za-z])", " \\\n    ", command)


def trial_note(*, state: str, attrs: dict[str, Any], metric_names: list[str] | None = None, values: list[float] | None = None) -> str:
    lines = [f"## {state}", "", "```", wrapped_command(attrs.get("launch_command", "(no launch)")), "```", ""]
    if attrs.get("duplicate_of") is not None:
        lines += [f"Same flags as trial {attrs['duplicate_of']}: not relaunched, its values repeated.", ""]
    if values is not None and metric_names:
        lines += ["| objective | value |", "|---|---|"]
        lines += [f"| {n} | {_f(v)} |" for n, v in zip(metric_names, values)]
        lines.append("")
    if "single_tps_ci95" in attrs:
        lo, hi = attrs["single_tps_ci95"]
        runs = ", ".join(_f(x) for x in attrs.get("single_tps_runs", []))
        lines.append(f"- single_tps 95% CI {_f(lo)} … {_f(hi)} over {len(attrs.get('single_tps_runs', []))} passes ({runs})")
    if "concurrent_tps_by_level" in attrs:
        for level, rate in attrs["concurrent_tps_by_level"].items():
            window = attrs.get("concurrent_window_s", {}).get(level)
            p99 = attrs.get("concurrent_p99_itl_ms", {}).get(level)
            lines.append(f"- concurrent_tps at {level} in flight: {_f(rate)} tok/s (steady window {_f(window)} s, p99 ITL {_f(p99, 2)} ms)")
    for key, label in (("accept_length", "accept length"), ("max_total_num_tokens", "KV pool tokens (max_total_num_tokens)"),
                       ("max_running_requests", "max running requests (effective)"), ("ttft_ms", "TTFT median ms"),
                       ("itl_p99_ms", "ITL p99 ms (single stream)"), ("greedy_inflation", "greedy_inflation"),
                       ("startup_s", "start-up s"), ("sglang_version", "SGLang version")):
        if attrs.get(key) is not None:
            lines.append(f"- {label}: {_f(attrs[key], 2 if key in ('accept_length', 'greedy_inflation') else 1)}")
    if attrs.get(record.ACCEPT_LENGTH_SOURCE):
        lines.append(f"- accept length from: {attrs[record.ACCEPT_LENGTH_SOURCE]} (server's folded figure {_f(attrs.get(record.SERVER_ACCEPT_LENGTH), 2)})")
    if attrs.get(record.THINKING_TOKENS) is not None:
        lines.append(f"- thinking tokens: {_f(attrs[record.THINKING_TOKENS])} of {_f(attrs.get('completion_tokens'))} completion tokens")
    ranks = attrs.get(record.DP_RANKS) or []
    if len(ranks) > 1:
        lines.append("- DP ranks: " + "; ".join(f"rank {i}: {_f(r['max_total_num_tokens'])} KV tokens, {_f(r['max_running_requests'])} running"
                                                for i, r in enumerate(ranks)))
    ran = [f"{label} {attrs[key]}" for key, label in ((record.ATTENTION_BACKEND, "attention backend"), (record.PAGE_SIZE, "page size"),
                                                        (record.SPECULATIVE_ADAPTIVE, "speculative_adaptive")) if attrs.get(key) is not None]
    if ran:
        lines.append("- what ran (read back from /server_info): " + ", ".join(ran))
    if attrs.get("fail_reason"):
        lines += ["", f"**Why:** {attrs['fail_reason']}"]
    if attrs.get("log_tail"):
        lines += ["", "Last log lines:", "", "```", attrs["log_tail"][-4000:], "```"]
    if attrs.get("server_log_artifact"):
        lines += ["", "The whole server log is this trial's artifact."]
    return "\n".join(lines) + "\n"


def save(trial: optuna.Trial, *, state: str, metric_names: list[str] | None = None, values: list[float] | None = None) -> None:
    from optuna_dashboard import save_note

    save_note(trial, trial_note(state=state, attrs=dict(trial.user_attrs), metric_names=metric_names, values=values))
