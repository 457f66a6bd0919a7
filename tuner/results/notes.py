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
    lines = [f"## {state}", "", "```", wrapped_command(attrs.get(record.LAUNCH_COMMAND, "(no launch)")), "```", ""]
    if attrs.get(record.DUPLICATE_OF) is not None:
        lines += [f"Same flags as trial {attrs[record.DUPLICATE_OF]}: not relaunched, its values repeated.", ""]
    if values is not None and metric_names:
        lines += ["| objective | value |", "|---|---|"]
        lines += [f"| {n} | {_f(v)} |" for n, v in zip(metric_names, values)]
        lines.append("")
    if record.SINGLE_TPS_CI95 in attrs:
        lo, hi = attrs[record.SINGLE_TPS_CI95]
        runs = ", ".join(_f(x) for x in attrs.get(record.SINGLE_TPS_RUNS, []))
        lines.append(f"- single_tps 95% CI {_f(lo)} … {_f(hi)} over {len(attrs.get(record.SINGLE_TPS_RUNS, []))} passes ({runs})")
    if record.CONCURRENT_TPS_BY_LEVEL in attrs:
        for level, rate in attrs[record.CONCURRENT_TPS_BY_LEVEL].items():
            window = attrs.get(record.CONCURRENT_WINDOW_S, {}).get(level)
            p99 = attrs.get(record.CONCURRENT_P99_ITL_MS, {}).get(level)
            lines.append(f"- concurrent_tps at {level} in flight: {_f(rate)} tok/s (steady window {_f(window)} s, p99 ITL {_f(p99, 2)} ms)")
    for key, label in (("accept_length", "accept length"), ("max_total_num_tokens", "KV pool tokens (max_total_num_tokens)"),
                       ("max_running_requests", "max running requests (effective)"), ("ttft_ms", "TTFT median ms"),
                       ("itl_p99_ms", "ITL p99 ms (single stream)"), ("greedy_inflation", "greedy_inflation"),
                       ("startup_s", "start-up s"), ("sglang_version", "SGLang version")):
        if attrs.get(key) is not None:
            lines.append(f"- {label}: {_f(attrs[key], 2 if key in ('accept_length', 'greedy_inflation') else 1)}")
    if attrs.get(record.SLO_NOTE):
        lines.append(f"- slo_capacity: {attrs[record.SLO_NOTE]} (search over load: {_f(attrs.get(record.SLO_SWEEP_S))} s)")
    if attrs.get(record.REQUEST_TOKENS) is not None:
        how = "measured: the workload's mean prompt + max_tokens" if attrs.get(record.REQUEST_TOKENS_AUTO) else "[bench] request_tokens"
        lines.append(f"- request_tokens (capacity's unit): {_f(attrs[record.REQUEST_TOKENS])} ({how})")
    lines += _class_lines(attrs)
    if attrs.get(record.ACCEPT_LENGTH_SOURCE):
        lines.append(f"- accept length from: {attrs[record.ACCEPT_LENGTH_SOURCE]} (server's folded figure {_f(attrs.get(record.SERVER_ACCEPT_LENGTH), 2)})")
    if attrs.get(record.THINKING_TOKENS) is not None:
        lines.append(f"- thinking tokens: {_f(attrs[record.THINKING_TOKENS])} of {_f(attrs.get(record.COMPLETION_TOKENS))} completion tokens")
    ranks = attrs.get(record.DP_RANKS) or []
    if len(ranks) > 1:
        lines.append("- DP ranks: " + "; ".join(f"rank {i}: {_f(r['max_total_num_tokens'])} KV tokens, {_f(r['max_running_requests'])} running"
                                                for i, r in enumerate(ranks)))
    ran = [f"{label} {attrs[key]}" for key, label in ((record.ATTENTION_BACKEND, "attention backend"), (record.PAGE_SIZE, "page size"),
                                                        (record.SPECULATIVE_ADAPTIVE, "speculative_adaptive")) if attrs.get(key) is not None]
    if ran:
        lines.append("- what ran (read back from /server_info): " + ", ".join(ran))
    if attrs.get(record.FAIL_REASON):
        lines += ["", f"**Why:** {attrs[record.FAIL_REASON]}"]
    if attrs.get(record.LOG_TAIL):
        lines += ["", "Last log lines:", "", "```", attrs[record.LOG_TAIL][-4000:], "```"]
    if attrs.get(record.SERVER_LOG_ARTIFACT):
        lines += ["", "The whole server log is this trial's artifact."]
    return "\n".join(lines) + "\n"


def _class_lines(attrs: dict[str, Any]) -> list[str]:
    """The figures per request class, as a table."""
    classes = attrs.get(record.BY_CLASS) or {}
    if not classes:
        return []
    lines = ["", "| class | share | requests | single_tps (95% CI) | accept | prompt tokens (median) | concurrent_tps |", "|---|---|---|---|---|---|---|"]
    for name, f in classes.items():
        lo, hi = (f.get("single_tps_ci95") or [None, None])[:2]
        lines.append(f"| {name} | {_f(f.get('share'), 2)} | {_f(f.get('requests'))} | {_f(f.get('single_tps'))} ({_f(lo)} … {_f(hi)}) | "
                     f"{_f(f.get('accept_length'), 2)} | {_f(f.get('prompt_tokens_median'), 0)} | {_f(f.get('concurrent_tps'))} |")
    return lines + [""]


def save(trial: optuna.Trial, *, state: str, metric_names: list[str] | None = None, values: list[float] | None = None) -> None:
    from optuna_dashboard import save_note

    save_note(trial, trial_note(state=state, attrs=dict(trial.user_attrs), metric_names=metric_names, values=values))
