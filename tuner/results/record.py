"""One record schema: the user attrs a trial stores, named once.

The contract (`docs/contract.md`) fixes `launch_command`, `max_total_num_tokens`,
`max_running_requests`, `accept_length`, `ttft_ms` and `fail_reason`; the rest are this
tuner's.  Every module that writes or reads a trial's attrs uses these names, and every write
goes through the `record_*` functions below, so a record has one shape wherever it was made
(a trial, a baseline, a settled duplicate, a schedule launch).
"""

from __future__ import annotations

from typing import Any

from tuner.measure.runner import Measurement
from tuner.sglang_args import SEARCHED, Params
from tuner.server.client import ServerInfo
from tuner.server.diagnose import capture_memory

__all__ = [
    "LAUNCH_COMMAND", "FLAGS", "TARGET", "URL", "WORKER", "FAIL_REASON", "FAILURE_KIND", "LOG_TAIL",
    "MAX_TOTAL_NUM_TOKENS", "MAX_RUNNING_REQUESTS", "ACCEPT_LENGTH", "TTFT_MS", "STARTUP_S",
    "SGLANG_VERSION", "ACCELERATOR", "GPU_COUNT", "SERVER_MEM_FRACTION_STATIC", "HYPERVOLUME",
    "ATTENTION_BACKEND", "PAGE_SIZE", "SPECULATIVE_ADAPTIVE", "ARCHITECTURE", "DP_RANKS", "ACCEPT_LENGTH_SOURCE",
    "SERVER_ACCEPT_LENGTH", "DECLARED_MAX_RUNNING", "ACCEPT_HISTOGRAM", "REQUEST_TOKENS", "REQUEST_TOKENS_AUTO", "CLIENT_STALL_RESENT", "CLIENT_STALL_KEPT", "BY_CLASS", "by_class_of", "MEMORY_USAGE", "CAPTURE_MEMORY", "MODEL_PREDICTION", "MODEL_NOTE", "THINKING_TOKENS", "DUPLICATE_OF", "RULED_OUT_BY", "RETRY_OF", "WARM_START", "BASELINE", "CONSTRAINTS",
    "SERVER_LOG_ARTIFACT", "SINGLE_TPS_SPREAD", "SINGLE_TPS_CI95", "INTERRUPTED", "SCHEDULE",
    "SLO_CURVE", "SLO_NOTE", "SLO_SWEEP_S", "SLO_PROMISE", "SLO_CAPACITY", "slo_curve_of", "slo_first_broken",
    "SINGLE_TPS_RUNS", "CONCURRENT_TPS_BY_LEVEL", "CONCURRENT_WINDOW_S", "CONCURRENT_P99_ITL_MS", "CONCURRENT_P99_TTFT_MS",
    "COMPLETION_TOKENS", "MEASURE_S", "HARDWARE", "SAMPLER", "record_log_artifact",
    "params_of", "record_launch", "record_server", "record_measurement", "record_failure", "record_capture_memory",
    "SETTLED_COPY_SKIPS",
]

# -- the launch ------------------------------------------------------------------------------
LAUNCH_COMMAND = "launch_command"  # contract: the full command, secrets redacted
FLAGS = "flags"  # the searched flags this trial passed (also for settled trials)
TARGET = "target"  # [target] host
URL = "url"  # [target] url
WORKER = "worker"  # "<hostname>:<pid>" of the tuner process that ran it
WARM_START = "warm_start"  # "current" | "sglang_default": why the warm start queued it
RETRY_OF = "retry_of"  # the interrupted trial this one measures again
BASELINE = "baseline"  # in <name>@baselines: "no_speculation" | "adaptive"
# in <name>@baselines, a launch of `tuner.schedule`: {"role": "static", "steps": N, "levels": [...],
# "workload": {...}} for a static configuration the table needs, or {"role": "tuned" | "sglang_default",
# "table": {...}, ...} for an adaptive server it verifies with
SCHEDULE = "schedule"

# -- what the server reported once ready -----------------------------------------------------
STARTUP_S = "startup_s"
MAX_TOTAL_NUM_TOKENS = "max_total_num_tokens"  # contract
MAX_RUNNING_REQUESTS = "max_running_requests"  # contract: the effective value
DECLARED_MAX_RUNNING = "declared_max_running_requests"  # the server's argument (48 under speculation)
SGLANG_VERSION = "sglang_version"
ACCELERATOR = "accelerator"
GPU_COUNT = "gpu_count"
SERVER_MEM_FRACTION_STATIC = "server_mem_fraction_static"
# What actually ran, read back (topk > 1 silently switches fa3 to flashinfer on Hopper; SGLang
# falls back from adaptive to static silently): it confounds the searched flags.
ATTENTION_BACKEND = "attention_backend"
PAGE_SIZE = "page_size"
SPECULATIVE_ADAPTIVE = "speculative_adaptive"
ARCHITECTURE = "architecture"
DP_RANKS = "dp_ranks"  # [{"max_total_num_tokens": .., "max_running_requests": ..}, ...] per DP rank

# -- the measurement -------------------------------------------------------------------------
ACCEPT_LENGTH = "accept_length"  # contract
TTFT_MS = "ttft_ms"  # contract
ACCEPT_LENGTH_SOURCE = "accept_length_source"  # "sglext" | "generate" | "no speculation" | "unknown"
SERVER_ACCEPT_LENGTH = "server_accept_length"  # avg_spec_accept_length: a cross-check only
THINKING_TOKENS = "thinking_tokens"  # completion tokens that were thinking
SINGLE_TPS_SPREAD = "single_tps_spread"
SINGLE_TPS_CI95 = "single_tps_ci95"
SINGLE_TPS_RUNS = "single_tps_runs"  # tok/s of each single-stream pass
CONCURRENT_TPS_BY_LEVEL = "concurrent_tps_by_level"  # {"<level>": tok/s}
CONCURRENT_WINDOW_S = "concurrent_window_s"  # {"<level>": seconds of steady state}
CONCURRENT_P99_ITL_MS = "concurrent_p99_itl_ms"  # {"<level>": ms}
CONCURRENT_P99_TTFT_MS = "concurrent_p99_ttft_ms"  # {"<level>": ms}
COMPLETION_TOKENS = "completion_tokens"
MEASURE_S = "measure_s"  # the measurement's wall time
CONSTRAINTS = "constraints"
HYPERVOLUME = "hypervolume"  # the front's normalised hypervolume with this trial in it
# What the model sampler (tuner/search/model.py) fits on:
ACCEPT_HISTOGRAM = "accept_histogram"  # [n0, n1, ...]: verify steps that accepted k drafts (depth probe)
REQUEST_TOKENS = "request_tokens"  # contract: [bench] request_tokens, or the measured footprint ("auto"): capacity's unit
REQUEST_TOKENS_AUTO = "request_tokens_auto"  # true when request_tokens was measured from the workload
# Single-stream requests sent again because the tuner was starved of CPU during them, and
# those starved on every send (tuner/measure/stalls.py); recorded only when nonzero.
CLIENT_STALL_RESENT = "client_stall_resent"
CLIENT_STALL_KEPT = "client_stall_kept"
# contract: per request class {"requests", "single_tps", "single_tps_ci95", "accept_length",
# "prompt_tokens_median", "concurrent_tps", "share", "single_s"} (tuner/measure/by_class.py)
BY_CLASS = "by_class"
# internal_states[0].memory_usage of /server_info: weight, kvcache, graph ({runner: GiB}),
# token_capacity, startup_available (GiB left after CUDA-graph capture: the graph-OOM margin)
MEMORY_USAGE = "memory_usage"
# What the capture log said about memory, kept for failed launches too (server/diagnose.py ·
# capture_memory): {"free_before", "runners": {runner: {"avail_before", "usage", "avail_after"}},
# "failed_runner", "cuda_graph_max_bs"}; a failed capture bounds its shape's need by what was free.
CAPTURE_MEMORY = "capture_memory"
# Written by the model sampler through space.suggest: what it predicted for this trial
# ({"single_tps": [lo, mid, hi], ..., "p_start": p}) and why it chose it, or why it fell back.
MODEL_PREDICTION = "model_prediction"
MODEL_NOTE = "model_note"

# The search over load behind slo_capacity (tuner/measure/load_sweep.py), when [slo] is needed:
SLO_CURVE = "slo_curve"  # [{"load", "requests", "source", "seconds", "p50_itl_ms".."p99_ttft_ms", "attainment", "goodput_rps", "tps", "holds"}] by load
SLO_NOTE = "slo_note"  # how the search ended; why slo_capacity is 0 when it is
SLO_SWEEP_S = "slo_sweep_s"  # seconds the search's own load points took: the trial's extra cost
SLO_PROMISE = "slo_promise"  # {"p95_itl_ms": 50, ..., "attainment": 0.95}: what was promised
SLO_CAPACITY = "slo_capacity"  # the objective's value again, also for the baselines whose objectives differ

# -- outcomes --------------------------------------------------------------------------------
FAIL_REASON = "fail_reason"  # contract: one line, what failed and why
FAILURE_KIND = "failure_kind"  # diagnose's kind: memory_kv | memory_graph | memory_runtime | invalid | timeout | fatal ...
LOG_TAIL = "log_tail"
SERVER_LOG_ARTIFACT = "server_log_artifact"
DUPLICATE_OF = "duplicate_of"
RULED_OUT_BY = "ruled_out_by"
INTERRUPTED = "interrupted"

# -- the study's own attrs (study.user_attrs, not a trial's) ----------------------------------
HARDWARE = "hardware"  # {"accelerator": ..., "gpu_count": ..., "first_target": ...}: what the study measured on
SAMPLER = "sampler"  # the sampler name of the latest run

# A settled duplicate copies its twin's figures, not the twin's launch identity.
SETTLED_COPY_SKIPS = (FLAGS, LAUNCH_COMMAND, TARGET, SERVER_LOG_ARTIFACT, WORKER)


def params_of(trial) -> Params | None:
    """The searched flags a trial passed (its `flags` attr), also for settled trials."""
    flags = trial.user_attrs.get(FLAGS)
    if not isinstance(flags, dict):
        return None
    return Params(**{k: flags.get(k) for k in SEARCHED})


def record_launch(trial, *, launch_command: str, flags: dict | None, target: str, url: str, worker: str) -> None:
    trial.set_user_attr(LAUNCH_COMMAND, launch_command)
    if flags is not None:
        trial.set_user_attr(FLAGS, flags)
    trial.set_user_attr(TARGET, target)
    trial.set_user_attr(URL, url)
    trial.set_user_attr(WORKER, worker)


def record_server(trial, info: ServerInfo, startup_s: float) -> None:
    """What the server says about itself once ready (read back, not assumed)."""
    trial.set_user_attr(STARTUP_S, round(startup_s, 1))
    if info.args.get("mem_fraction_static") is not None:
        trial.set_user_attr(SERVER_MEM_FRACTION_STATIC, info.args.get("mem_fraction_static"))
    trial.set_user_attr(MAX_TOTAL_NUM_TOKENS, info.max_total_num_tokens)
    trial.set_user_attr(MAX_RUNNING_REQUESTS, info.max_running_requests)
    trial.set_user_attr(DP_RANKS, [{"max_total_num_tokens": r.max_total_num_tokens, "max_running_requests": r.max_running_requests}
                                   for r in info.ranks])
    for key, value in ((SGLANG_VERSION, info.version), (ACCELERATOR, info.accelerator), (GPU_COUNT, info.gpu_count),
                       (ATTENTION_BACKEND, info.attention_backend), (PAGE_SIZE, info.page_size),
                       (SPECULATIVE_ADAPTIVE, info.speculative_adaptive), (ARCHITECTURE, info.architecture)):
        if value is not None:
            trial.set_user_attr(key, value)
    if info.args.get("max_running_requests") is not None:
        trial.set_user_attr(DECLARED_MAX_RUNNING, info.args.get("max_running_requests"))
    usage = memory_usage(info.args)
    if usage:
        trial.set_user_attr(MEMORY_USAGE, usage)


def memory_usage(server_info: dict) -> dict | None:
    """Rank 0's `memory_usage` from a /server_info body, the fields the model reads (GiB)."""
    states = server_info.get("internal_states") or []
    usage = (states[0].get("memory_usage") if states and isinstance(states[0], dict) else None) or {}
    keep = {k: usage[k] for k in ("weight", "kvcache", "graph", "token_capacity", "startup_available") if usage.get(k) is not None}
    if isinstance(keep.get("graph"), (int, float)):  # 0.5.9: one figure for all graphs
        keep["graph"] = {"all": keep["graph"]}
    if keep and server_info.get("cuda_graph_max_bs") is not None:  # the largest graph batch it may capture
        keep["cuda_graph_max_bs"] = server_info["cuda_graph_max_bs"]
    return keep or None


def record_capture_memory(trial, log: str | None) -> None:
    """The capture log's memory figures of a launch (failed ones too), when it logged any."""
    found = capture_memory(log or "")
    if found is not None:
        trial.set_user_attr(CAPTURE_MEMORY, found)


def record_measurement(trial, m: Measurement) -> None:
    """The contract's user attrs, plus the spread and latency figures behind them."""
    attrs: dict[str, Any] = {
        MAX_TOTAL_NUM_TOKENS: m.max_total_num_tokens,
        MAX_RUNNING_REQUESTS: m.max_running_requests,
        ACCEPT_LENGTH: round(m.accept_length, 4) if m.accept_length is not None else None,
        ACCEPT_LENGTH_SOURCE: m.accept_length_source,
        SERVER_ACCEPT_LENGTH: round(m.server_accept_length, 4) if m.server_accept_length is not None else None,
        THINKING_TOKENS: m.thinking_tokens,
        TTFT_MS: round(m.ttft_ms, 2),
        "ttft_p90_ms": round(m.ttft_p90_ms, 2),
        "ttft_p99_ms": round(m.ttft_p99_ms, 2),
        "itl_ms": round(m.itl_ms, 3),
        "itl_p90_ms": round(m.itl_p90_ms, 3),
        "itl_p99_ms": round(m.itl_p99_ms, 3),
        "e2e_ms": round(m.e2e_ms, 1),
        "e2e_p90_ms": round(m.e2e_p90_ms, 1),
        "e2e_p99_ms": round(m.e2e_p99_ms, 1),
        SINGLE_TPS_RUNS: [round(x, 2) for x in m.single_runs],
        SINGLE_TPS_CI95: [round(x, 2) for x in m.single_ci95],
        SINGLE_TPS_SPREAD: round(m.single_spread, 4),
        CONCURRENT_TPS_BY_LEVEL: {str(k): round(v, 2) for k, v in m.concurrent_tps_by_level.items()},
        CONCURRENT_WINDOW_S: {str(k): round(v, 2) for k, v in m.concurrent_window_s.items()},
        CONCURRENT_P99_ITL_MS: {str(k): round(v, 3) for k, v in m.concurrent_p99_itl_ms.items()},
        CONCURRENT_P99_TTFT_MS: {str(k): round(v, 1) for k, v in m.concurrent_p99_ttft_ms.items()},
        MEASURE_S: round(m.duration_s, 1),
        "greedy_inflation": round(m.greedy_inflation, 3) if m.greedy_inflation else None,
        "concurrent_ttft_p99_ms": round(m.concurrent_ttft_p99_ms, 1),
        COMPLETION_TOKENS: m.completion_tokens,
        "ignore_eos": m.ignore_eos,
        REQUEST_TOKENS: m.request_tokens,
    }
    if m.accept_histogram:
        attrs[ACCEPT_HISTOGRAM] = list(m.accept_histogram)
    if m.client_stall_resent or m.client_stall_kept:
        attrs[CLIENT_STALL_RESENT] = m.client_stall_resent
        attrs[CLIENT_STALL_KEPT] = m.client_stall_kept
    attrs.update(_slo_attrs(m))
    attrs[REQUEST_TOKENS_AUTO] = m.request_tokens_auto
    attrs[BY_CLASS] = {c: _class_attrs(f) for c, f in m.by_class.items()}
    for key, value in attrs.items():
        trial.set_user_attr(key, value)


def _slo_attrs(m: Measurement) -> dict[str, Any]:
    curve = m.load_curve
    if curve is None:
        return {}
    return {
        SLO_CURVE: [{**p.as_record(), "holds": curve.holds.get(p.load, False)} for p in curve.points],
        SLO_NOTE: curve.note,
        SLO_SWEEP_S: round(curve.sweep_s, 1),
        SLO_PROMISE: curve.promise,
        SLO_CAPACITY: curve.slo_capacity,
    }


def slo_curve_of(trial) -> list[dict]:
    """A trial's load curve (empty without one), for the report and the dashboard note."""
    curve = trial.user_attrs.get(SLO_CURVE) if hasattr(trial, "user_attrs") else trial.get(SLO_CURVE)
    return [p for p in curve if isinstance(p, dict) and "load" in p] if isinstance(curve, list) else []


def slo_first_broken(trial) -> int | None:
    """The smallest load of a trial's curve that breaks the SLO above its slo_capacity (None: none measured)."""
    broken = [p["load"] for p in slo_curve_of(trial) if not p.get("holds", True)]
    return min(broken) if broken else None
def _round(value: float | None, digits: int) -> float | None:
    return None if value is None or value != value else round(value, digits)  # NaN is not JSON


def _class_attrs(f) -> dict[str, Any]:
    return {
        "requests": f.requests,
        "single_tps": _round(f.single_tps, 2),
        "single_tps_ci95": [_round(x, 2) for x in f.single_tps_ci95],
        "accept_length": _round(f.accept_length, 4),
        "prompt_tokens_median": _round(f.prompt_tokens_median, 1),
        "concurrent_tps": _round(f.concurrent_tps, 2),
        "concurrent_tps_by_level": {str(level): _round(v, 2) for level, v in f.concurrent_tps_by_level.items()},
        "share": round(f.share, 4),
        "single_s": round(f.single_s, 2),
    }


def by_class_of(trial) -> dict[str, dict[str, Any]]:
    """A trial's figures per request class (empty for trials recorded before classes)."""
    value = trial.user_attrs.get(BY_CLASS)
    return value if isinstance(value, dict) else {}


def record_log_artifact(trial, artifact_id: str) -> None:
    """The Optuna artifact holding the launch's server log (tuner/results/artifacts.py)."""
    trial.set_user_attr(SERVER_LOG_ARTIFACT, artifact_id)


def record_failure(trial, reason: str, *, kind: str | None = None, log_tail: str | None = None) -> None:
    """Why a trial did not complete: `fail_reason` always, the kind and log tail when known."""
    trial.set_user_attr(FAIL_REASON, reason)
    if kind is not None:
        trial.set_user_attr(FAILURE_KIND, kind)
    if log_tail is not None:
        trial.set_user_attr(LOG_TAIL, log_tail)
