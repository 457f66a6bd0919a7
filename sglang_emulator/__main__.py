"""`python -m sglang_emulator <sglang serve flags>`: an SGLang 0.5.23 server without a GPU.

The launcher behaves like `sglang.launch_server`: argparse errors exit 2; resolution errors
print a traceback and exit 1; a scheduler process loads the (simulated) weights, sizes the KV
pool and captures CUDA graphs while the HTTP port stays closed, and on a failure logs
"Scheduler hit an exception", SIGQUITs the launcher, which logs "Received sigquit from a child
process" and SIGKILLs itself (exit -9).  Then uvicorn serves, a warm-up request runs, and
"The server is fired up and ready to roll!" is logged.

Environment knobs (emulator only, never read by the tuner):
  SGLANG_EMULATOR_TIME_SCALE   multiplies every simulated duration (default 1.0)
  SGLANG_EMULATOR_LOAD_SCALE   multiplies start-up durations on top of it (default 1.0)
  SGLANG_EMULATOR_SEED         seeds step-time noise and sampled acceptance
  SGLANG_EMULATOR_NOISE        relative std-dev of a decode step's time (default 0.02)
  SGLANG_EMULATOR_FAULT        crash_after_tokens=N | hang_after_tokens=N | exit_after_tokens=N |
                               nccl_at_init (every launch dies in distributed init, whatever its flags)
  SGLANG_EMULATOR_PROFILE      a JSON profile (see profiles.py) instead of the built-in ones
  SGLANG_EMULATOR_VERSION      0.5.23 (default) or 0.5.9: flag table, /server_info.version,
                               wordings, /v1/loads fields and chat extensions of that release
  SGLANG_EMULATOR_LINGER_S     seconds (x TIME_SCALE) a stopped server's child keeps its ports
                               (default 2; 0 = none); see failures.start_port_holder
  SGLANG_EMULATOR_OOM_WORDING  force a CUDA-graph OOM wording: torch_oom | cuda_error | cublas |
                               cuda_malloc | nccl | prefill | frozen_kv_mtp (see failures.py)
  SGLANG_EMULATOR_KIND=1       the emulator's older, friendlier behaviour where it differed from
                               SGLang: accept-length counters fold in every decode iteration
                               instead of every --decode-log-interval; DP ranks get identical
                               pools instead of rank 0 being ~3% short
  SGLANG_WAIT_PORT_TIMEOUT     SGLang's own knob: polls of wait_port_available (default 30)
  SGLANG_EMULATOR_LANDSCAPE_SEED  N: serve the profile family.draw_profile(N) draws (any model path);
                                  tp4:N: family.draw_tp4_profile(N), a four-GPU set-up (launch with --tp 4)
"""

from __future__ import annotations

import asyncio
import ctypes
import dataclasses
import logging
import os
import select
import shlex
import signal
import sys
import time
import traceback

from . import failures
from .capture_log import capture_lines
from . import model as m
from .adaptive import BUILT_LOG, AdaptiveSpeculativeParams, graph_states
from .adaptive import worker_logger as adaptive_logger
from .args import Resolved, human_readable_int, model_not_found, parse_args, resolve
from .profiles import find_profile

DATEFMT = "%Y-%m-%d %H:%M:%S"

logger = logging.getLogger("sglang.launch_server")
sched_logger = logging.getLogger("sglang.srt.managers.scheduler")


class _Formatter(logging.Formatter):
    """SGLang's "[time] msg", with " TP0" for scheduler-process records."""

    def __init__(self, rank_prefix: str, every_record: bool):
        super().__init__("[%(asctime)s%(rank)s] %(message)s", DATEFMT)
        self.rank_prefix = rank_prefix
        self.every_record = every_record

    def format(self, record: logging.LogRecord) -> str:
        scheduler_side = self.every_record or record.name.startswith(("sglang.srt.managers", "sglang.srt.model", "sglang.srt.speculative"))
        record.rank = self.rank_prefix if scheduler_side else ""
        return super().format(record)


def _configure_logging(level: str, *, scheduler_process: bool = False) -> None:
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(_Formatter(" TP0", scheduler_process))
    logging.basicConfig(level=getattr(logging, level.upper(), logging.INFO), handlers=[handler], force=True)
    for noisy in ("httpx", "httpcore"):  # SGLang quiets these in every process too
        logging.getLogger(noisy).setLevel(logging.WARNING)


def _scale(name: str, default: float = 1.0) -> float:
    try:
        return float(os.environ.get(name, default))
    except ValueError:
        return default


def _die_with_parent() -> None:
    """The scheduler dies with the launcher (SGLang: kill_itself_when_parent_died)."""
    try:
        libc = ctypes.CDLL("libc.so.6", use_errno=True)
        libc.prctl(1, signal.SIGKILL)  # PR_SET_PDEATHSIG
    except OSError:
        pass


def _memory_spec(resolved: Resolved) -> m.SpecShape:
    """Adaptive mode sizes draft buffers for its largest candidate."""
    if resolved.adaptive:
        steps = resolved.adaptive_max_steps
        return m.SpecShape(resolved.spec.algorithm, steps, 1, steps + 1)
    return resolved.spec


def _graph_states(resolved: Resolved):
    """Adaptive mode captures one set of graphs per candidate step (adaptive.graph_states)."""
    table = resolved.adaptive_table
    if not resolved.adaptive or table is None:
        return None
    return lambda capture_bs: graph_states(table, resolved.spec.steps, capture_bs)


def plan_memory(resolved: Resolved) -> m.MemoryPlan:
    return m.size_memory(
        resolved.profile,
        tp=resolved.tp,
        dp=resolved.attn_dp_size,
        mem_fraction_static=resolved.mem_fraction_static,
        spec=_memory_spec(resolved),
        max_running_requests=resolved.max_running_requests,
        # resolve_max_num_reqs splits a global value over attention-DP ranks only; a plain DP
        # rank is a full replica that gets the whole argument.
        max_total_tokens=human_readable_int(resolved.raw.get("max_total_tokens")),
        chunked_prefill_size=resolved.chunked_prefill_size,
        cuda_graph_max_bs=resolved.cuda_graph_max_bs,
        page_size=resolved.page_size,
        graph_states=_graph_states(resolved),
    )


def kind() -> bool:
    """SGLANG_EMULATOR_KIND=1: the older, friendlier behaviour (see the module docstring)."""
    return os.environ.get("SGLANG_EMULATOR_KIND", "") not in ("", "0")


def rank_plan(plan: m.MemoryPlan, rank: int, dp: int, page_size: int = 1) -> m.MemoryPlan:
    """DP rank `rank`'s own pools.  Real ranks profile their own free memory: rank 0's GPU also
    carries the launcher-side context, so it ends up ~3% short of the others, and the rest
    differ by a few tenths of a percent.  `/server_info.max_total_num_tokens` is rank 0's
    (data_parallel_controller.py · _record_scheduler_init_infos, infos[0])."""
    if dp <= 1 or kind():
        return plan
    factor = 0.97 if rank == 0 else 1.0 - 0.002 * ((rank * 7) % 5)
    tokens = int(plan.max_total_num_tokens * factor)
    tokens -= tokens % max(page_size, 1)
    running = min(plan.max_running_requests, max(tokens // 2, 1))
    return dataclasses.replace(plan, max_total_num_tokens=tokens, kv_gib=plan.kv_gib * factor, max_running_requests=running)


def _run_scheduler(resolved: Resolved, write_fd: int, parent: int, load_scale: float) -> None:
    """The scheduler process: load, size pools, capture graphs; report or SIGQUIT the parent."""
    _die_with_parent()
    _configure_logging(resolved.raw.get("log_level") or "info", scheduler_process=True)
    log = logging.getLogger("sglang.srt.model_executor.model_runner")
    try:
        plan, plan_error = _load_weights(resolved, log, load_scale)
        avail = _allocate_pools(resolved, log, plan, plan_error)
        plan, graph_total = _capture_graphs(resolved, log, plan, plan_error, avail, load_scale)
        if resolved.adaptive and resolved.adaptive_table is not None:
            _log_adaptive_states(resolved, plan, avail - graph_total, load_scale)
        sched_logger.info(
            f"max_total_num_tokens={plan.max_total_num_tokens}, chunked_prefill_size={resolved.chunked_prefill_size}, "
            f"max_prefill_tokens={resolved.raw.get('max_prefill_tokens') or 16384}, "
            f"max_running_requests={plan.max_running_requests}, context_len={resolved.raw.get('context_length') or resolved.profile.context_len}, "
            f"available_gpu_mem={plan.available_after_capture_gib:.2f} GB"
        )
        os.write(write_fd, b"ok\n")
    except Exception:
        sched_logger.error(f"Scheduler hit an exception: {traceback.format_exc()}")
        os.kill(parent, signal.SIGQUIT)
    # The scheduler's event loop: idle until the launcher kills the tree or dies.
    while True:
        time.sleep(3600)


class DistBackendError(RuntimeError):
    """torch.distributed's NCCL failure, as a scheduler's traceback names it."""


DistBackendError.__module__ = "torch.distributed"


def _load_weights(resolved: Resolved, log: logging.Logger, load_scale: float) -> tuple[m.MemoryPlan | None, Exception | None]:
    """Distributed init and the weights (target, then draft), logged as model_runner.py does;
    the memory plan (or why it fails) is worked out while they load."""
    profile = resolved.profile
    spec = resolved.spec
    pre = profile.gpu.total_mib / 1024 - profile.gpu.context_mib / 1024
    log.info("Init torch distributed begin.")
    time.sleep(1.5 * load_scale)
    if os.environ.get("SGLANG_EMULATOR_FAULT") == "nccl_at_init":  # whatever the flags: a host's fault
        raise DistBackendError("NCCL error in: ../torch/csrc/distributed/c10d/ProcessGroupNCCL.cpp:1970, unhandled system "
                               "error (run with NCCL_DEBUG=INFO for details), NCCL version 2.21.5")
    log.info(f"Init torch distributed ends. elapsed={1.5 * load_scale:.2f} s, mem usage={profile.gpu.context_mib / 1024:.2f} GB")
    log.info(f"Load weight begin. avail mem={pre:.2f} GB")
    time.sleep(profile.load_s * load_scale)
    plan_error: Exception | None = None
    try:
        plan = plan_memory(resolved)
    except m.MemoryFailure as failure:
        plan, plan_error = None, failure
    weights = m._per_gpu(profile.memory.weights_gib, profile, resolved.tp)
    log.info(
        f"Load weight end. elapsed={profile.load_s * load_scale:.2f} s, type={profile.architecture}, "
        f"avail mem={pre - weights:.2f} GB, mem usage={weights:.2f} GB."
    )
    if spec.enabled and spec.algorithm != "NGRAM":
        draft = m._per_gpu(profile.memory.draft_weights_gib, profile, resolved.tp)
        time.sleep(0.1 * profile.load_s * load_scale)
        draft_arch = profile.architecture.replace("ForConditionalGeneration", "ForCausalLM") + ("MTP" if profile.draft_is_target else "Eagle3")
        log.info(
            f"Load weight end. elapsed={0.1 * profile.load_s * load_scale:.2f} s, type={draft_arch}, "
            f"avail mem={pre - weights - draft:.2f} GB, mem usage={draft:.2f} GB."
        )
    return plan, plan_error


def _allocate_pools(resolved: Resolved, log: logging.Logger, plan: m.MemoryPlan | None, plan_error: Exception | None) -> float:
    """The KV (and Mamba) pools, or the exception SGLang raises sizing them; the GiB left."""
    profile = resolved.profile
    pre = profile.gpu.total_mib / 1024 - profile.gpu.context_mib / 1024
    if resolved.draft_missing_error:
        raise TypeError(resolved.draft_missing_error)
    if plan_error is not None and plan_error.phase == "kv":
        exc_type = RuntimeError if plan_error.exc_type == "RuntimeError" else ValueError
        raise exc_type(plan_error.message)
    for warning in plan.warnings if plan else ():
        logging.getLogger("sglang.srt.mem_cache").warning(warning)
    if plan is not None:
        if profile.hybrid:
            log.info(
                f"Mamba Cache is allocated. max_mamba_cache_size: {plan.max_mamba_cache_size}, "
                f"conv_state size: {plan.mamba_gib * 0.1:.2f}GB, ssm_state size: {plan.mamba_gib * 0.9:.2f}GB "
            )
        half = plan.kv_gib / 2
        log.info(
            f"KV Cache is allocated. dtype: torch.bfloat16, #tokens: {plan.max_total_num_tokens}, "
            f"K size: {half:.2f} GB, V size: {half:.2f} GB"
        )
        log.info(f"Memory pool end. avail mem={plan.slack_gib:.2f} GB")
    # Free memory before the first graph: what the KV pool and activations left (the capture
    # log's "avail mem"; after the last graph it is startup_available).
    if plan is not None:
        return plan.available_after_capture_gib + sum(plan.graph_gib.values())
    if plan_error is not None and plan_error.phase == "graph":
        return plan_error.avail_gib
    return pre * (1 - resolved.mem_fraction_static)


def _capture_graphs(resolved: Resolved, log: logging.Logger, plan: m.MemoryPlan | None, plan_error: Exception | None,
                    avail: float, load_scale: float) -> tuple[m.MemoryPlan, float]:
    """CUDA graph capture (target verify/decode, then the draft's), runner by runner in SGLang's
    wording (capture_log.py), or its failure; the plan and the graphs' GiB."""
    spec = resolved.spec
    elapsed = resolved.profile.graph_capture_s * load_scale
    time.sleep(elapsed)
    if spec.enabled and spec.topk > 1 and spec.draft_tokens - 1 > m.tree_pool_size(spec.steps, spec.topk):
        # organize_draft_results: torch.topk(score_list, num_draft_token - 1) over a pool of
        # topk + (steps - 1) * topk^2 candidates.
        log.info(capture_lines(spec, {}, (), avail, failed_runner="target_verify", version=resolved.version, elapsed_s=elapsed)[-1])
        raise Exception(f"Capture cuda graph failed: selected index k out of range\n{failures.CUDA_GRAPH_CAPTURE_FAILED_MSG}")
    if plan_error is not None:
        _raise_graph_oom(resolved, log, plan_error, avail, elapsed)
    assert plan is not None
    for line in capture_lines(spec, plan.graph_gib, plan.capture_bs, avail, failed_runner=None, version=resolved.version, elapsed_s=elapsed):
        log.info(line)
    return plan, sum(plan.graph_gib.values())


def _raise_graph_oom(resolved: Resolved, log: logging.Logger, plan_error, avail: float, elapsed: float) -> None:
    """A capture that runs out of memory, in the runner and wording SGLang's would (failures.py):
    the runners captured before it, its begin line, then the exception."""
    spec = resolved.spec
    oom = failures.graph_oom(plan_error, tp=resolved.tp, version=resolved.version, gpu_gib=resolved.profile.gpu.total_mib / 1024)
    runner = oom.runner if oom.runner in ("draft_decode", "draft_extend") else ("target_verify" if spec.enabled else "decode")
    for line in capture_lines(spec, plan_error.graphs, (), avail, failed_runner=runner, version=resolved.version, elapsed_s=elapsed):
        log.info(line)
    if oom.wording == "prefill":
        raise RuntimeError(oom.message)
    raise Exception(oom.message)


def _log_adaptive_states(resolved: Resolved, plan: m.MemoryPlan, avail: float, load_scale: float) -> None:
    """eagle_worker_v2.py: the worker announces its policy, then AdaptiveController.init_states
    builds one runtime state per other candidate step ("Built adaptive runtime state ...")."""
    table = resolved.adaptive_table
    assert table is not None
    AdaptiveSpeculativeParams(resolved.spec.steps, table, plan.capture_bs)
    for steps, top_bs in graph_states(table, resolved.spec.steps, plan.capture_bs)[1:]:
        shape = m.SpecShape(resolved.spec.algorithm, steps, 1, steps + 1)
        mem = sum(m.graph_memory_gib(resolved.profile, shape, top_bs, fixed=False).values())
        elapsed = 0.2 * resolved.profile.graph_capture_s * load_scale if top_bs else 0.0
        adaptive_logger.info(BUILT_LOG.format(steps=steps, elapsed=elapsed, mem=mem))


def _kill_process_tree_and_self(children: list[int]) -> None:
    for pid in children:
        try:
            os.kill(pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
    os.kill(os.getpid(), signal.SIGKILL)


def _wait_for_scheduler(read_fd: int, child: int) -> None:
    while True:
        ready, _, _ = select.select([read_fd], [], [], 0.2)
        if ready:
            data = os.read(read_fd, 64)
            if data.startswith(b"ok"):
                return
        done, status = os.waitpid(child, os.WNOHANG)
        if done:
            code = os.waitstatus_to_exitcode(status)
            raise RuntimeError(
                f"Rank 0 scheduler died during initialization (exit code: {code}). If exit code is -9 "
                "(SIGKILL), a common cause is the OS OOM killer. Run `dmesg -T | grep -i oom` to check."
            )


def _install_fault(engines, spec: str, children: list[int]) -> None:
    """Test hook: make the server crash, hang or exit after N generated tokens."""
    kind, _, value = spec.partition("=")
    limit = int(value or 0)

    def observe(event: str, **_: object) -> None:
        total = sum(e.total_generation_tokens for e in engines)
        if total < limit:
            return
        if kind == "crash_after_tokens":
            sched_logger.error(
                "Scheduler hit an exception: Traceback (most recent call last):\n"
                '  File "scheduler.py", line 6352, in run_scheduler_process\n'
                "RuntimeError: CUDA error: an illegal memory access was encountered\n"
            )
            logger.error("Received sigquit from a child process. It usually means the child failed.")
            _kill_process_tree_and_self(children)
        elif kind == "hang_after_tokens":
            for e in engines:
                e.hung = True
        elif kind == "exit_after_tokens":
            os._exit(1)

    for e in engines:
        e.observers.append(observe)


async def _serve(resolved: Resolved, plan: m.MemoryPlan, time_scale: float, children: list[int]) -> None:
    import httpx
    import uvicorn

    from .engine import Engine
    from .server import ServerState, build_app

    seed_env = os.environ.get("SGLANG_EMULATOR_SEED")
    seed = int(seed_env) if seed_env else None
    noise = _scale("SGLANG_EMULATOR_NOISE", 0.02)
    engines = [
        Engine(resolved, rank_plan(plan, rank, resolved.dp, resolved.page_size), dp_rank=rank, time_scale=time_scale, step_noise=noise, seed=None if seed is None else seed + rank)
        for rank in range(resolved.dp)
    ]
    state = ServerState(resolved, plan, engines, time_scale)
    state.launch_command = shlex.join([sys.executable, "-m", "sglang_emulator", *sys.argv[1:]])
    fault = os.environ.get("SGLANG_EMULATOR_FAULT")
    if fault:
        _install_fault(engines, fault, children)
    app = build_app(state)
    host, port = resolved.raw["host"], resolved.raw["port"]
    log_config = {
        "version": 1,
        "disable_existing_loggers": False,
        "formatters": {"default": {"()": "uvicorn.logging.DefaultFormatter", "fmt": "[%(asctime)s] %(levelprefix)s %(message)s", "datefmt": DATEFMT, "use_colors": False}},
        "handlers": {"default": {"formatter": "default", "class": "logging.StreamHandler", "stream": "ext://sys.stderr"}},
        "loggers": {"uvicorn": {"handlers": ["default"], "level": "INFO", "propagate": False}, "uvicorn.error": {"level": "INFO"}},
    }
    config = uvicorn.Config(app, host=host, port=port, log_config=log_config, access_log=False, timeout_keep_alive=5, timeout_graceful_shutdown=2)
    server = uvicorn.Server(config)
    tasks = [asyncio.create_task(e.run()) for e in engines]

    async def warmup() -> None:
        while not server.started:
            if server.should_exit:
                return
            await asyncio.sleep(0.05)
        url = f"http://{'127.0.0.1' if host in ('0.0.0.0', '') else host}:{port}"
        headers = {"Authorization": f"Bearer {state.api_key}"} if state.api_key else {}
        async with httpx.AsyncClient(timeout=600) as client:
            await asyncio.sleep(1.0 * time_scale)
            res = await client.get(url + "/model_info", headers=headers)
            res.raise_for_status()
            res = await client.post(
                url + "/generate",
                json={"text": "The capital city of France is", "sampling_params": {"temperature": 0, "max_new_tokens": 8}},
                headers=headers,
            )
            res.raise_for_status()
        for e in engines:
            e.flush_cache()  # warm-up traffic does not count in the accept-length average
        state.status = "Up"
        logger.info("The server is fired up and ready to roll!")

    warm = asyncio.create_task(warmup())
    try:
        await server.serve()
    finally:
        state.gracefully_exit = True
        warm.cancel()
        for t in tasks:
            t.cancel()
    if not server.started:
        # uvicorn could not bind (address in use): SGLang exits non-zero with the scheduler killed.
        for pid in children:
            os.kill(pid, signal.SIGKILL)
        sys.exit(1)


def main(argv: list[str] | None = None) -> None:
    argv = sys.argv[1:] if argv is None else argv
    ns = parse_args(argv)
    _configure_logging(ns.log_level or "info")
    time_scale = _scale("SGLANG_EMULATOR_TIME_SCALE")
    load_scale = time_scale * _scale("SGLANG_EMULATOR_LOAD_SCALE")
    profile = find_profile(ns.model_path)
    if profile is None:
        raise model_not_found(ns.model_path)
    resolved = resolve(ns, profile)
    logger.info("server_args=ServerArgs(" + ", ".join(f"{k}={v!r}" for k, v in resolved.as_dict().items()) + ")")

    def launch_phase_sigquit_handler(signum, frame):
        logger.error("Received sigquit from a child process. It usually means the child failed.")
        _kill_process_tree_and_self(children)

    children: list[int] = []
    internal: list[int] = []
    if resolved.dp_attention:
        # PortArgs.init_new: DP attention talks over TCP ports derived from --port.
        ports = failures.derived_ports(resolved.raw["port"], resolved.raw.get("nccl_port"))
        failures.wait_ports_available(ports, time_scale, logging.getLogger("sglang.srt.server_args"))
        internal = [p for _, p in ports]
    linger = _scale(failures.LINGER_ENV, 2.0) * time_scale
    sys.stderr.flush()
    failures.start_port_holder(http_port=resolved.raw["port"], internal=internal, linger_s=linger)
    signal.signal(signal.SIGQUIT, launch_phase_sigquit_handler)
    read_fd, write_fd = os.pipe()
    sys.stderr.flush()
    child = os.fork()
    if child == 0:
        os.close(read_fd)
        try:
            _run_scheduler(resolved, write_fd, os.getppid(), load_scale)
        finally:
            os._exit(1)
    children.append(child)
    os.close(write_fd)
    _wait_for_scheduler(read_fd, child)
    plan = plan_memory(resolved)
    asyncio.run(_serve(resolved, plan, time_scale, children))
    for pid in children:
        try:
            os.kill(pid, signal.SIGKILL)
        except ProcessLookupError:
            pass


if __name__ == "__main__":
    main()
