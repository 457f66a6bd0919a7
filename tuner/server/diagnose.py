"""Why a server did not come up: a pure table from SGLang's log lines and exit status to a
one-line reason and what the study does about it (prune the trial, or stop the study).

The messages are SGLang 0.5.9 to 0.5.23's (docs/sglang-0.5.23.md §4, docs/sglang-real-server.md); none are the
emulator's own.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

__all__ = ["Failure", "classify", "early_failure", "runtime_memory_failure", "capture_memory", "TERMINAL_MARKERS", "GPU_OOM"]


@dataclass(frozen=True)
class Failure:
    kind: str  # memory_kv | memory_graph | invalid | port_busy | exit | fatal
    reason: str
    fatal: bool = False

    @property
    def prunes(self) -> bool:
        """A PRUNED trial: the server cannot start with these parameters."""
        return not self.fatal and self.kind in ("memory_kv", "memory_graph", "invalid")


# Lines after which the launcher is certainly going down (it SIGKILLs itself next).
TERMINAL_MARKERS = (
    "Received sigquit from a child process",
    "Scheduler hit an exception",
    "Initialization failed.",
    "scheduler died during initialization",
)

_ARGPARSE = (
    (re.compile(r"error: unrecognized arguments: (.+)"), "the server rejects argument(s) {0}; remove them from [server] command"),
    (re.compile(r"error: ambiguous option: (--[\w-]+)(?: could match (.+))?"), "the server finds {0} ambiguous (it could be {1}); spell the flag out in [server] command"),
    (re.compile(r"error: the following arguments are required: (.+)"), "the server needs {0}; add it to [server] command"),
    (re.compile(r"error: argument ([^:]+): (.+)"), "the server rejects {0}: {1}; fix it in [server] command"),
)
_FATAL = (
    (re.compile(r"(\S+) is not a local folder and is not a valid model identifier"), "model {0} does not exist on the target; fix --model-path in [server] command"),
    (re.compile(r"error while attempting to bind on address .*address already in use|\[Errno 98\]", re.I), "the server's port is already in use on the target; stop whatever listens there or change --port and [target] url"),
    (re.compile(r"Unknown speculative algorithm name: (\S+)"), "the server does not know --speculative-algorithm {0}; fix it in [server] command"),
)

# A GPU allocation that failed, in every wording SGLang's stack uses (sglang-real-server.md
# row 2): torch's "CUDA out of memory", the driver's "CUDA error: out of memory", cuBLAS and
# the runtime API's codes, NCCL's allocation failures.  Not the KV pool running short.
GPU_OOM = re.compile(
    r"CUDA out of memory|CUDA error: out of memory|OutOfMemoryError|CUBLAS_STATUS_ALLOC_FAILED|cudaErrorMemoryAllocation"
    r"|NCCL (?:WARN|error).*(?:out of memory|Failed to CUDA calloc|cudaMalloc)|Cuda failure (?:\d+ )?'out of memory'",
    re.I,
)
# "Capture cuda graph failed: {e}" (decode and EAGLE draft runners), "Capture prefill CUDA graph
# failed", "Capture frozen-KV MTP cuda graph failed".
_GRAPH_CAPTURE = re.compile(r"Capture (?:prefill |frozen-KV MTP )?cuda graph failed:?\s*(.*)", re.I)
# KV pool or request slots short under load (mem_cache/allocation.py, scheduler retraction):
# normal, never a reason to lower the memory fraction (row 13).
_KV_PRESSURE = re.compile(r"Prefill out of memory|Decode out of memory happened|alloc_req_slots runs out of memory", re.I)
# utils/network.py · wait_port_available: the previous server's processes still hold a port.
_PORT_BUSY = re.compile(r"(\S+ at \d+) is not available in \d+ seconds")

_MEMORY_KV = (
    re.compile(r"Not enough memory\. Please try to increase --mem-fraction-static"),
    re.compile(r"Loaded weights leave no GPU memory for the KV cache"),
    re.compile(r"Not enough GPU memory for hybrid \(mamba/linear-attention\) state cache"),
    re.compile(r"Hybrid \(mamba/linear-attention\) state cache is too small"),
    re.compile(r"SWA pool \(\d+ tokens\) cannot hold even one request"),
)

# Validation errors caused by the speculative parameters (raised at resolution, exit 1).
_INVALID = (
    re.compile(r"(speculative_eagle_topk.*?only supported on .*?)$", re.M),
    re.compile(r"(trtllm_mha backend only supports topk = 1.*?)$", re.M),
    re.compile(r"(--speculative-num-steps=\d+ is not in the adaptive config.*?)$", re.M),
    re.compile(r"(--speculative-use-rejection-sampling requires.*?)$", re.M),
    # A bare assert (mamba_hook.py · validate_mamba_extra_buffer): the traceback's source line.
    # Anchored on it: the log's server_args=ServerArgs(...) line names both fields too.
    re.compile(r"^\s*(assert \S*mamba_track_interval\s*>=\s*\S*speculative_num_draft_tokens.*?)$", re.M),
    # 0.5.9's wordings of the same rules (server_args.py of that release)
    re.compile(r"(.*?only supported for the 'flashinfer' backend.*?)$", re.M),
    re.compile(r"(Spec v2 currently only supports topk = 1.*?)$", re.M),
)


def _last_exception_line(log: str) -> str | None:
    """The last 'SomeError: message' line of a Python traceback in the log."""
    matches = re.findall(r"^(?:[\w.]+\.)?(\w*(?:Error|Exception|Exit))(?:: ?(.*))?$", log, re.M)
    for name, message in reversed(matches):
        if name not in ("HTTPError",):
            return f"{name}: {message}".strip().rstrip(":") if message else name
    return None


def _shorten(text: str, limit: int = 220) -> str:
    text = " ".join(text.split())
    return text if len(text) <= limit else text[: limit - 3] + "..."


def _match(table, log: str) -> str | None:
    for pattern, template in table:
        match = pattern.search(log)
        if match:
            groups = [g if g is not None else "?" for g in match.groups()] or [""]
            return template.format(*[_shorten(g, 80) for g in groups])
    return None


def _missing_program(log: str, exit_code: int | None, exception: str | None) -> Failure | None:
    """The launch command cannot run on the target: no such program, or a Python without SGLang."""
    if exit_code == 127 or re.search(r"^(?:sh|bash|env): .*(?:not found|No such file or directory)", log, re.M):
        line = re.search(r"^(?:sh|bash|env): (.*)$", log, re.M)
        what = _shorten(line.group(1), 100) if line else "the command"
        return Failure("fatal", f"the target cannot run the launch command ({what}); fix [server] command", fatal=True)
    spec_error = re.search(r"Error while finding module specification for '([\w.]+)' \((\w+Error: [^)]*)\)", log)
    if spec_error:
        return Failure("fatal", f"the target's Python cannot import {spec_error.group(1)} ({spec_error.group(2)}); install it there or fix the interpreter in [server] command", fatal=True)
    # `python -m pkg` with pkg missing prints only "<interpreter>: No module named pkg" (runpy),
    # no traceback: the interpreter in [server] command is not the one SGLang is installed in.
    runpy_missing = re.search(r"^(\S*python[\w.]*): No module named ([\w.]+)\s*$", log, re.M)
    if runpy_missing:
        return Failure("fatal", f"{runpy_missing.group(1)} has no module {runpy_missing.group(2)}; install it there or fix the interpreter in [server] command", fatal=True)
    if exception and exception.startswith("ModuleNotFoundError"):
        return Failure("fatal", f"the target's Python lacks a module ({_shorten(exception, 100)}); install SGLang there or fix the interpreter in [server] command", fatal=True)
    return None


def classify(log: str, exit_code: int | None, *, params: str = "") -> Failure:
    """Classify a server that exited (or logged a terminal failure) before it was ready.

    Memory failures are checked first: their messages are specific, while a log can carry
    incidental warnings (an optional module missing) that must not stop a study.
    `params` is appended to memory reasons ("at mem_fraction_static=0.95, ...").
    """
    at = f" at {params}" if params else ""
    port = _PORT_BUSY.search(log)
    if port:
        return Failure("port_busy", f"the previous server still holds a port ({port.group(1)} is not available)")
    graph = _GRAPH_CAPTURE.search(log)
    if graph:
        if GPU_OOM.search(log):
            return Failure("memory_graph", f"CUDA graph capture ran out of memory{at}")
        cause = _shorten(graph.group(1)) if graph.group(1) else "unknown error"
        if "selected index k out of range" in cause:
            return Failure("invalid", f"CUDA graph capture failed: the draft tree is wider than EAGLE's candidate pool{at} ({cause})")
        return Failure("invalid", f"CUDA graph capture failed{at}: {cause}")
    for pattern in _MEMORY_KV:
        if pattern.search(log):
            what = "the hybrid state cache does not fit" if "mamba" in pattern.pattern else "the KV cache does not fit"
            return Failure("memory_kv", f"{what} in mem_fraction_static{at}")
    if GPU_OOM.search(log):
        return Failure("memory_graph", f"the server ran out of GPU memory while starting{at}")
    if exit_code == 2 or "usage: " in log:
        reason = _match(_ARGPARSE, log)
        if reason:
            return Failure("fatal", reason, fatal=True)
    reason = _match(_FATAL, log)
    if reason:
        return Failure("fatal", reason, fatal=True)
    exception = _last_exception_line(log)
    missing = _missing_program(log, exit_code, exception)
    if missing is not None:
        return missing
    for pattern in _INVALID:
        match = pattern.search(log)
        if match:
            return Failure("invalid", f"SGLang rejects these parameters: {_shorten(match.group(1))}")
    if exit_code == 2:
        return Failure("fatal", "the server rejected its command line (exit 2); fix [server] command", fatal=True)
    if exit_code == 1 and exception and exception.split(":")[0] in ("AssertionError", "TypeError"):
        # Resolution asserts on partial speculative settings: a parameter problem.
        return Failure("invalid", f"SGLang rejects these parameters{at}: {_shorten(exception)}")
    code = "" if exit_code is None else f" (exit {exit_code})"
    if exception:
        return Failure("exit", f"the server exited{code} before it was ready: {_shorten(exception)}")
    tail = [line for line in log.strip().splitlines() if line.strip()][-1:] or ["no output"]
    return Failure("exit", f"the server exited{code} before it was ready; last log line: {_shorten(tail[0])}")


def runtime_memory_failure(log: str) -> bool:
    """A GPU out-of-memory while serving (not the KV pool running short, which SGLang handles
    by retraction and is normal under load)."""
    return any(GPU_OOM.search(line) and not _KV_PRESSURE.search(line) for line in log.splitlines())


def early_failure(log: str) -> bool:
    """True once the log shows the launcher is going down, before the process has exited."""
    return any(marker in log for marker in TERMINAL_MARKERS)


# --- what the capture log says about memory -----------------------------------------------------
# Each graph runner logs the free memory before and after its capture.  0.5.23
# (model_runner_components/cuda_graph_setup.py · capture_decode_graph, capture_prefill_graph;
# speculative/eagle_worker_v2.py for the draft runners):
#   "Capture target verify CUDA graph begin. backend=full, num_tokens_per_req=8, avail mem=9.87 GB"
#   "Capture target verify CUDA graph end. bs=[1, 2, 4], elapsed=3.10 s, mem usage=1.23 GB, avail mem=8.64 GB."
#   "Capture draft decode CUDA graph begin. backend=full, num_tokens_per_req=4, bs=[1, 2], avail mem=8.64 GB"
# 0.5.9 (model_executor/model_runner.py · init_device_graphs, speculative/eagle_worker.py):
#   "Capture cuda graph begin. This can take up to several minutes. avail mem=9.87 GB"
#   "Capture cuda graph end. Time elapsed: 3.10 s. mem usage=1.23 GB. avail mem=8.64 GB."
#   "Capture draft cuda graph begin. ...", "Capture draft extend cuda graph end. ...",
#   and cuda_graph_runner.py's "Capture cuda graph bs [1, 2, 4]".
_CAPTURE_LINE = re.compile(r"Capture (?P<name>[\w -]*?) ?(?:CUDA|cuda) graph (?P<edge>begin|end)\.(?P<rest>.*)$", re.M)
_CAPTURE_BS = re.compile(r"Capture cuda graph bs \[([\d, ]*)\]")
_RUNNERS = {"": "target", "target verify": "target_verify", "target decode": "decode", "draft": "draft_decode",
            "draft decode": "draft_decode", "draft extend": "draft_extend", "target prefill": "prefill",
            "draft prefill": "prefill"}


def _gb(pattern: str, text: str) -> float | None:
    match = re.search(pattern + r"=\s*([\d.]+) GB", text)
    return float(match.group(1)) if match else None


def capture_memory(log: str) -> dict | None:
    """What the capture log says about memory, also for a launch that failed (GiB):
    {"free_before": free memory before the first graph, "runners": {runner: {"avail_before",
    "usage", "avail_after"}}, "failed_runner": the runner that began and never ended (None if
    all ended), "cuda_graph_max_bs": the largest batch captured}.  None when nothing was logged.
    Runner names are memory_usage.graph's (target_verify, decode, draft_decode, draft_extend, prefill)."""
    runners: dict[str, dict] = {}
    order: list[str] = []
    sizes: list[int] = []
    for match in _CAPTURE_LINE.finditer(log):
        name = _RUNNERS.get(match.group("name").strip().lower(), match.group("name").strip().lower().replace(" ", "_"))
        rest = match.group("rest")
        bs = re.search(r"bs=\[([\d, ]*)\]", rest)
        if bs:
            sizes += [int(x) for x in bs.group(1).split(",") if x.strip()]
        if match.group("edge") == "begin":
            runners[name] = {"avail_before": _gb("avail mem", rest)}
            order.append(name)
        elif name in runners:
            runners[name].update(usage=_gb("mem usage", rest), avail_after=_gb("avail mem", rest))
    for match in _CAPTURE_BS.finditer(log):
        sizes += [int(x) for x in match.group(1).split(",") if x.strip()]
    if not order:
        return None
    failed = next((n for n in reversed(order) if "usage" not in runners[n]), None)
    return {"free_before": runners[order[0]]["avail_before"], "runners": runners, "failed_runner": failed,
            "cuda_graph_max_bs": max(sizes) if sizes else None}
