"""How a real server fails around memory and ports, in SGLang's words.

* CUDA-graph OOM wordings: which runner runs out first decides the wording
  (`model_executor/runner/decode_cuda_graph_runner.py`, `speculative/eagle_draft_cuda_graph_runner.py`
  and `eagle_draft_extend_cuda_graph_runner.py` wrap a `RuntimeError` as
  "Capture cuda graph failed: {e}"; `prefill_cuda_graph_runner.py` says "Capture prefill CUDA
  graph failed: {e}"; `speculative/frozen_kv_mtp_cuda_graph_runner.py` "Capture frozen-KV MTP cuda
  graph failed: {e}").  The inner `{e}` is what torch, the driver, cuBLAS or NCCL raised.
* Ports still held by a previous server: `utils/network.py · wait_port_available`, called by
  `server_args.py · PortArgs.init_new` for the ports DP attention derives from `--port`.
"""

from __future__ import annotations

import logging
import os
import signal
import socket
import time
from dataclasses import dataclass

from . import model as m

__all__ = [
    "OOM_WORDING_ENV",
    "LINGER_ENV",
    "OOM_WORDINGS",
    "graph_oom",
    "derived_ports",
    "wait_ports_available",
    "start_port_holder",
]

OOM_WORDING_ENV = "SGLANG_EMULATOR_OOM_WORDING"
LINGER_ENV = "SGLANG_EMULATOR_LINGER_S"

# model_executor/runner_backend_utils/__init__.py (0.5.23) and cuda_graph_runner.py (0.5.9)
CUDA_GRAPH_CAPTURE_FAILED_MSG = (
    "Possible solutions:\n"
    "1. set --mem-fraction-static to a smaller value (e.g., 0.8 or 0.7)\n"
    "2. set --cuda-graph-max-bs-decode to a smaller value (e.g., 16)\n"
    "3. disable decode CUDA graph by --cuda-graph-backend-decode=disabled. "
    "(Not recommended. Huge performance loss)\n"
    "Open an issue on GitHub https://github.com/sgl-project/sglang/issues/new/choose \n"
)
CUDA_GRAPH_CAPTURE_FAILED_MSG_059 = (
    "Possible solutions:\n"
    "1. set --mem-fraction-static to a smaller value (e.g., 0.8 or 0.7)\n"
    "2. set --cuda-graph-max-bs to a smaller value (e.g., 16)\n"
    "3. disable torch compile by not using --enable-torch-compile\n"
    "4. disable CUDA graph by --disable-cuda-graph. (Not recommended. Huge performance loss)\n"
    "Open an issue on GitHub https://github.com/sgl-project/sglang/issues/new/choose \n"
)
# prefill_cuda_graph_runner.py · prefill_failure_msg (tc_piecewise hint, context_manager.py)
PREFILL_FAILED_MSG = (
    "Fail when using backend: tc_piecewise for prefill runner.\n"
    "Possible suggestions:\n"
    "1. change to breakable by --cuda-graph-backend-prefill=breakable\n"
    "2. disable the prefill CUDA graph by --cuda-graph-backend-prefill=disabled\n"
    "3. if it is an OOM problem, set --mem-fraction-static to a smaller value "
    "(e.g., 0.8 or 0.7) or set --cuda-graph-max-bs-prefill to a smaller value "
    "(e.g., 2048)\n"
    "Open an issue on GitHub https://github.com/sgl-project/sglang/issues/new/choose \n"
)
# c10/cuda/CUDAException: torch's text for a driver-level CUDA error.
_CUDA_ERROR_TAIL = (
    "CUDA kernel errors might be asynchronously reported at some other API call, so the "
    "stacktrace below might be incorrect.\nFor debugging consider passing CUDA_LAUNCH_BLOCKING=1\n"
    "Compile with `TORCH_USE_CUDA_DSA` to enable device-side assertions.\n"
)

OOM_WORDINGS = ("torch_oom", "cuda_error", "cublas", "cuda_malloc", "nccl", "prefill", "frozen_kv_mtp")


@dataclass(frozen=True)
class GraphOom:
    """Which runner ran out (`runner`: target, draft_decode, draft_extend, prefill, frozen_kv_mtp)
    and the exception text the scheduler's traceback ends with."""

    wording: str
    runner: str
    message: str


def _pick_wording(failure: m.MemoryFailure, tp: int) -> tuple[str, str]:
    """Deterministic from the situation: graphs are captured target first, then the draft
    decode and draft extend runners, so the first cumulative overflow names the runner.

    * the slack does not even cover the non-torch buffers (more than 0.5 GiB short): NCCL's
      lazily created communicator buffers fail first (tp > 1; at tp 1 the driver);
    * nothing left for graphs at all: the graph pool's own cudaMalloc fails, driver-level
      "CUDA error: out of memory";
    * the target graph does not fit: torch's caching allocator message;
    * the draft decode graph tips it over: the draft runner's first GEMM on its own stream
      creates a cuBLAS handle and workspace: CUBLAS_STATUS_ALLOC_FAILED;
    * the draft extend graph tips it over: a kernel library's own allocation,
      cudaErrorMemoryAllocation.
    """
    free = failure.free_gib
    graphs = list(failure.graphs.items())
    if free <= -0.5 and tp > 1:
        return "nccl", "target"
    if free <= 0 or not graphs:
        return "cuda_error", "target"
    total = 0.0
    for name, gib in graphs:
        total += gib
        if total > free:
            if name in ("decode", "target_verify"):
                return "torch_oom", "target"
            if name == "draft_decode":
                return "cublas", "draft_decode"
            return "cuda_malloc", "draft_extend"
    return "torch_oom", "target"


def graph_oom(failure: m.MemoryFailure, *, tp: int, version: str, gpu_gib: float) -> GraphOom:
    """The graph-capture memory failure in the wording SGLang would print.

    `SGLANG_EMULATOR_OOM_WORDING=<one of OOM_WORDINGS>` forces a wording (tests)."""
    forced = os.environ.get(OOM_WORDING_ENV)
    if forced in OOM_WORDINGS:
        wording = forced
        runner = {"prefill": "prefill", "frozen_kv_mtp": "frozen_kv_mtp", "cublas": "draft_decode",
                  "cuda_malloc": "draft_extend"}.get(forced, "target")
    else:
        wording, runner = _pick_wording(failure, tp)
    inner = {
        "torch_oom": failure.message,
        "cuda_error": "CUDA error: out of memory\n" + _CUDA_ERROR_TAIL,
        "cublas": "CUDA error: CUBLAS_STATUS_ALLOC_FAILED when calling `cublasCreate(handle)`",
        # Composed from cudaGetErrorName/cudaGetErrorString as kernel libraries report it.
        "cuda_malloc": "CUDA error: cudaErrorMemoryAllocation: out of memory",
        # torch.distributed.DistBackendError (a RuntimeError) from ProcessGroupNCCL.
        "nccl": (
            "NCCL error in: /pytorch/torch/csrc/distributed/c10d/NCCLUtils.cpp:77, unhandled cuda "
            "error (run with NCCL_DEBUG=INFO for details), NCCL version 2.27.3\n"
            "ncclUnhandledCudaError: Call to CUDA function failed.\nLast error:\n"
            "Cuda failure 2 'out of memory'"
        ),
        "prefill": failure.message,
        "frozen_kv_mtp": failure.message,
    }[wording]
    hint = CUDA_GRAPH_CAPTURE_FAILED_MSG_059 if version == "0.5.9" else CUDA_GRAPH_CAPTURE_FAILED_MSG
    if wording == "prefill":
        message = f"Capture prefill CUDA graph failed: {inner}\n{PREFILL_FAILED_MSG}"
    elif wording == "frozen_kv_mtp":
        message = f"Capture frozen-KV MTP cuda graph failed: {inner}\n{hint}"
    else:
        message = f"Capture cuda graph failed: {inner}\n{hint}"
    return GraphOom(wording, runner, message)


# --- ports ----------------------------------------------------------------------------------

ZMQ_TCP_PORT_DELTA = 233  # server_args.py


def derived_ports(port: int, nccl_port: int | None) -> list[tuple[str, int]]:
    """`PortArgs.init_new` under DP attention on one node: dist_init_port = port + 233, then
    port_base, detokenizer, (nccl), rpc, metrics and scheduler_input ports, in check order."""
    dist_init = port + ZMQ_TCP_PORT_DELTA
    base = dist_init + 1
    ports = [("dist_init_port", dist_init), ("port_base", base), ("detokenizer_port", base + 1)]
    if nccl_port is not None:
        ports.append(("nccl_port", nccl_port))
    ports += [("rpc_port", base + 2), ("metrics_port", base + 3), ("scheduler_input_port", base + 4)]
    return ports


def _is_port_available(port: int) -> bool:
    """utils/network.py · is_port_available: bind with SO_REUSEADDR."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            sock.bind(("", port))
        except OSError:
            return False
    return True


def wait_ports_available(ports: list[tuple[str, int]], time_scale: float, log: logging.Logger) -> None:
    """utils/network.py · wait_port_available for each port in turn: up to 30 one-second
    polls (scaled), then `ValueError("<name> at <port> is not available in 30 seconds. ...")`,
    which `PortArgs.init_new` logs with "Port is already in use." and re-raises."""
    timeout_s = int(os.environ.get("SGLANG_WAIT_PORT_TIMEOUT", "30"))
    for name, port in ports:
        for _ in range(timeout_s):
            if _is_port_available(port):
                break
            time.sleep(1.0 * time_scale)
        else:
            named = dict(ports)
            log.error(
                f"Port is already in use. dist_init_port={named.get('dist_init_port')} "
                f"port_base={named.get('port_base')} detokenizer_port={named.get('detokenizer_port')} "
                f"nccl_port={named.get('nccl_port')} scheduler_input_port={named.get('scheduler_input_port')}"
            )
            raise ValueError(f"{name} at {port} is not available in {timeout_s} seconds. {name} at {port} is not available")


def _listening(port: int) -> bool:
    """Whether some socket listens on `port`, read from /proc/net/tcp* (no probe bind that
    could race the launcher's own)."""
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        try:
            with open(table) as fh:
                next(fh)
                for line in fh:
                    cols = line.split()
                    if cols[3] == "0A" and int(cols[1].rsplit(":", 1)[1], 16) == port:
                        return True
        except (OSError, StopIteration, ValueError, IndexError):
            continue
    return False


def _bind(port: int) -> socket.socket | None:
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    try:
        sock.bind(("", port))
        sock.listen(1)
        return sock
    except OSError:
        sock.close()
        return None


def start_port_holder(*, http_port: int, internal: list[int], linger_s: float) -> int | None:
    """Fork the process that, like a real server's scheduler/detokenizer children during GPU
    teardown, keeps the server's ports for `linger_s` after the launcher is stopped.

    It holds `internal` (DP attention's derived ports) for the server's life; when the launcher
    is gone (SIGKILL) or a SIGTERM reaches it (the group was stopped), it also takes the HTTP port
    as soon as the launcher releases it, and exits `linger_s` later.  Same process group, session
    and environment as the launcher (a plain fork); a SIGKILL of the group ends it at once."""
    if linger_s <= 0 and not internal:
        return None
    parent = os.getpid()
    pid = os.fork()
    if pid:
        return pid
    try:
        stopping = {"at": None}

        def on_term(signum, frame):
            stopping["at"] = stopping["at"] or time.monotonic()

        signal.signal(signal.SIGTERM, on_term)
        signal.signal(signal.SIGINT, signal.SIG_IGN)
        signal.signal(signal.SIGQUIT, signal.SIG_IGN)
        held = [s for s in (_bind(p) for p in internal) if s is not None]
        served = False  # only a server that had bound its HTTP port keeps it
        polls = 0
        while stopping["at"] is None and os.getppid() == parent:
            if not served and polls % 5 == 0:
                served = _listening(http_port)
            polls += 1
            time.sleep(0.05)
        start = stopping["at"] or time.monotonic()
        while time.monotonic() - start < linger_s:
            if served and not any(s.getsockname()[1] == http_port for s in held):
                sock = _bind(http_port)
                if sock is not None:
                    held.append(sock)
            time.sleep(0.02)
    finally:
        os._exit(0)
