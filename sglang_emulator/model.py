"""The emulator's performance and memory model: pure functions of SGLang's resolved arguments.

Nothing here does I/O, sleeps or keeps state; the server (`engine.py`) asks it three questions:

- `size_memory(profile, args)`: what SGLang 0.5.23 would allocate at start-up
  (`max_total_num_tokens`, the effective `max_running_requests`, CUDA-graph memory), or which
  memory failure it would hit (`MemoryFailure`).
- `step_ms(...)`: how long one decode iteration (draft steps + verify + draft extend) takes for a
  batch, and `prefill_ms(...)` for a prefill batch.
- `acceptance(...)`: the distribution of accepted draft tokens per verify step for one request.

The constants live in `profiles.py`, each with where it comes from.
"""

from __future__ import annotations

import bisect
import math
from dataclasses import dataclass, field
from typing import Callable

__all__ = [
    "GiB",
    "Gpu",
    "Timing",
    "DraftTiming",
    "Acceptance",
    "MemoryModel",
    "Profile",
    "SpecShape",
    "MemoryPlan",
    "MemoryFailure",
    "default_mem_fraction_static",
    "default_graph_settings",
    "size_memory",
    "forward_ms",
    "draft_step_ms",
    "attention_ms",
    "draft_attention_ms",
    "context_shift",
    "prompt_category",
    "category_shift",
    "step_ms",
    "prefill_ms",
    "depth_acceptance",
    "accept_length_distribution",
    "expected_accept_length",
    "tree_pool_size",
    "graph_memory_gib",
    "tree_state_gib",
    "capture_batch_sizes",
]

GiB = float(1 << 30)
MiB = float(1 << 20)

# --- The physical anchor: forward times of an 8B-shaped decoder on one H200 -------------------
# docs/h200-forward-times.md, "Linear layers only": ms per forward by tokens in the
# forward (B x d).  Where several (B, d) share a token count the table agrees within 2%; we keep
# their mean.  Every profile's target forward is this curve, scaled (see `forward_ms`).
_H200_TOKENS = (1, 2, 4, 8, 16, 32, 64, 128, 256, 512, 1024, 2048)
_H200_LINEAR_MS = (4.60, 4.71, 4.75, 4.77, 4.85, 4.95, 5.06, 6.57, 7.99, 14.17, 26.38, 52.34)
_H200_KNEE_TOKENS = 180.0  # 4.6 ms of weight streaming / 25.6 us per token past the knee
_H200_US_PER_TOKEN_PAST_END = 25.6

# Same note, "One draft step": ms by batch (rows) x topk (columns) for an EAGLE3-like head.
_DRAFT_B = (1, 2, 4, 8, 16, 32, 64, 128)
_DRAFT_TOPK = (1, 2, 4, 8)
_DRAFT_MS = (
    (0.223, 0.234, 0.235, 0.239),
    (0.220, 0.234, 0.237, 0.240),
    (0.224, 0.238, 0.243, 0.248),
    (0.234, 0.260, 0.264, 0.271),
    (0.242, 0.300, 0.302, 0.351),
    (0.262, 0.371, 0.421, 0.460),
    (0.303, 0.566, 0.598, 0.827),
    (0.437, 0.889, 1.106, 1.598),
)


def _interp_log2(xs: tuple[float, ...], ys: tuple[float, ...], x: float) -> float:
    """Piecewise-linear interpolation in log2(x); linear extrapolation past the last point."""
    if x <= xs[0]:
        return ys[0]
    if x >= xs[-1]:
        slope = (ys[-1] - ys[-2]) / (xs[-1] - xs[-2])
        return ys[-1] + slope * (x - xs[-1])
    i = bisect.bisect_right(xs, x) - 1
    lx0, lx1 = math.log2(xs[i]), math.log2(xs[i + 1])
    t = (math.log2(x) - lx0) / (lx1 - lx0)
    return ys[i] + t * (ys[i + 1] - ys[i])


def _linear_shape(tokens: float) -> float:
    """The H200 linear-layer curve normalised to 1.0 at one token."""
    return _interp_log2(_H200_TOKENS, _H200_LINEAR_MS, max(tokens, 1.0)) / _H200_LINEAR_MS[0]


def _draft_shape(batch: float, topk: float) -> float:
    """The H200 draft-step table normalised to 1.0 at batch 1, topk 1 (bilinear in log2)."""
    batch = max(batch, 1.0)
    topk = min(max(topk, 1.0), float(_DRAFT_TOPK[-1]))
    # Interpolate along topk within the two bracketing batch rows, then along batch.
    def row(i: int) -> float:
        return _interp_log2(tuple(float(k) for k in _DRAFT_TOPK), _DRAFT_MS[i], topk)

    if batch >= _DRAFT_B[-1]:
        # Past the table: grow with the per-request slope of its last two rows.
        last, prev = row(len(_DRAFT_B) - 1), row(len(_DRAFT_B) - 2)
        per_req = (last - prev) / (_DRAFT_B[-1] - _DRAFT_B[-2])
        return (last + per_req * (batch - _DRAFT_B[-1])) / _DRAFT_MS[0][0]
    column = tuple(row(i) for i in range(len(_DRAFT_B)))
    return _interp_log2(tuple(float(b) for b in _DRAFT_B), column, batch) / _DRAFT_MS[0][0]


# --- Profiles -------------------------------------------------------------------------------


@dataclass(frozen=True)
class Gpu:
    name: str
    total_mib: int  # what nvidia-smi / torch report as the device's capacity
    context_mib: int  # CUDA context, NCCL and allocator state present before weights load
    compute_capability: str  # "9.0" Hopper, "12.0" Blackwell workstation


@dataclass(frozen=True)
class Timing:
    """Target forward time: fixed_ms + stream(N) x shape(N x 180 / knee_tokens).

    `shape` is the measured H200 curve (flat while weight streaming dominates, ~25.6 us/token
    past the knee).  For a MoE, streaming grows with the experts the N tokens touch.
    """

    fixed_ms: float  # per-forward cost independent of size: launches, all-reduces
    stream_ms: float  # weights read for one token
    knee_tokens: float  # tokens per forward where compute starts to bind
    attn_fixed_ms: float
    attn_ms_per_ktoken: float  # attention over the KV cache, per 1,024 context tokens in the batch
    attn_ms_per_request: float = 0.0  # linear-attention (GDN) state update per running request
    moe_experts: int = 0  # 0: dense
    moe_top_k: int = 0
    moe_full_stream_ms: float = 0.0  # reading every expert once
    moe_locality: float = 1.0  # how much a request's extra tokens add distinct experts (0..1)
    iteration_overhead_ms: float = 0.35  # sampling, verify bookkeeping, scheduler
    tree_overhead_ms: float = 0.15  # tree mask + candidate selection when topk > 1
    flashinfer_penalty: float = 1.0  # attention slowdown when topk > 1 moves Hopper off FA3
    # The KV read of a multi-token query (verify over draft tokens) over the one-token decode
    # path's: 1.0 when the kernel reads the KV once for all query tokens, more when its
    # multi-query path is slower (docs/h200-forward-times.md, "Attention over the KV cache").
    verify_attn_factor: float = 1.0
    prefill_fixed_ms: float = 5.0
    prefill_ms_per_token: float = 0.027


@dataclass(frozen=True)
class DraftTiming:
    """One draft forward: fixed_ms + stream_ms x (the H200 draft-step table, normalised)."""

    fixed_ms: float
    stream_ms: float


@dataclass(frozen=True)
class Acceptance:
    """Per-depth probability that the draft's top-1 token is the target's next token.

    `first` is at depth 1 on natural text under greedy sampling; each deeper step multiplies it
    by `depth_decay`.  A tree (topk > 1) also gets the r-th candidate right with the residual
    mass `(1 - q) * second_share * (1 - second_share) ** (r - 2)`.
    """

    first: float
    depth_decay: float
    second_share: float
    degenerate: float  # top-1 acceptance on the repetitive text that follows a natural EOS
    temperature_slope: float  # q(T) = q(0) ** (1 + slope * T_eff)
    prompt_spread: float  # std-dev of the per-prompt shift in logit(q)
    # Acceptance falls as the context grows: logit(q) drops by `context_decay` per doubling of
    # the request's context past `context_ref_tokens` (`context_shift`).
    context_decay: float = 0.0
    context_ref_tokens: int = 1024
    # Shifts of logit(q) by the kind of text asked for (`prompt_category` reads it off the
    # prompt, as a draft model "sees" it): ((category, shift), ...); a category not listed: 0.
    category_shifts: tuple[tuple[str, float], ...] = ()


@dataclass(frozen=True)
class MemoryModel:
    weights_gib: float  # target weights per GPU at the reference tp
    draft_weights_gib: float  # speculative draft head / model per GPU
    kv_cell_bytes: int  # KV bytes per token, all heads (full-attention layers only for hybrids)
    kv_heads: int  # KV heads: split across TP ranks until each holds one, then replicated
    draft_kv_fraction: float  # draft layers / target layers: folded into the cell (EAGLE family)
    non_torch_gib: float  # NCCL buffers, cuBLAS workspaces: outside the static pool
    activation_mib_per_token: float  # prefill activations, per chunked-prefill token
    graph_fixed_gib: float  # graph pool overhead independent of shape
    graph_mib_per_token: float  # target decode/verify graph, per (batch x tokens per request)
    draft_graph_mib_per_token: float  # draft decode graphs, per (batch x topk) per step
    # Hybrid (Gated DeltaNet / Mamba) models only:
    mamba_state_mib: float = 0.0  # per-request recurrent state per GPU
    spec_state_share: float = 0.0  # per-draft-token intermediate state, as a share of the above
    mamba_full_memory_ratio: float = 0.9  # SGLang's --mamba-full-memory-ratio default
    mamba_ratio: int = 3  # MAMBA_CACHE_SIZE_MAX_RUNNING_REQUESTS_RATIO
    # FlashInfer's CUDA-graph index state, paid when topk > 1 moves Hopper from FA3 to
    # FlashInfer (arg_groups/model_override_base.py · get_default_attn_backend): per graph token,
    # context_len x (int32 kv_indices + uint8 custom mask) for the target verify graph and
    # context_len x int32 per (step x topk) for the draft decode graphs.  See `tree_state_gib`.
    flashinfer_tree_state: bool = False
    # Memory the capture needs beyond the graphs it keeps (allocator fragmentation, library
    # workspaces, backend scratch), as a share of the card: freed afterwards, so neither the
    # capture log's "mem usage" nor `memory_usage.startup_available` shows it; only a capture
    # that fails does (family.py draws it; the calibrated profiles have none).
    capture_reserve_frac: float = 0.0


@dataclass(frozen=True)
class Profile:
    key: str
    model_names: tuple[str, ...]  # substrings of --model-path that select this profile
    architecture: str
    model_type: str
    context_len: int
    reference_tp: int
    gpu: Gpu
    memory: MemoryModel
    timing: Timing
    draft_timing: DraftTiming
    acceptance: Acceptance
    auto_spec: tuple[int, int, int]  # _auto_choose_speculative_params for this architecture
    hybrid: bool = False
    draft_is_target: bool = False  # MTP: the draft head ships in the target checkpoint
    is_multimodal: bool = False
    load_s: float = 60.0  # weight load time, seconds
    graph_capture_s: float = 10.0  # target graph capture at the default graph sizes
    notes: tuple[str, ...] = field(default=())


# --- Start-up sizing -------------------------------------------------------------------------


@dataclass(frozen=True)
class SpecShape:
    """The speculative shape after SGLang's resolution (all zero when speculation is off)."""

    algorithm: str | None
    steps: int
    topk: int
    draft_tokens: int

    @property
    def enabled(self) -> bool:
        return self.algorithm is not None and self.draft_tokens > 0

    @property
    def tokens_per_request(self) -> int:
        """Tokens one request puts through the target per iteration."""
        return self.draft_tokens if self.enabled else 1


@dataclass(frozen=True)
class MemoryPlan:
    """What the scheduler reports after sizing its pools and capturing graphs (per GPU)."""

    pre_load_gib: float
    after_load_gib: float
    weights_gib: float
    slack_gib: float
    kv_gib: float
    mamba_gib: float
    max_total_num_tokens: int
    max_running_requests: int
    max_mamba_cache_size: int | None
    graph_gib: dict[str, float]
    capture_bs: tuple[int, ...]
    available_after_capture_gib: float
    warnings: tuple[str, ...]


class MemoryFailure(Exception):
    """SGLang fails at start-up for memory; `phase` is where ("kv" or "graph")."""

    def __init__(self, phase: str, message: str, exc_type: str = "RuntimeError", graphs: dict[str, float] | None = None,
                 free_gib: float = 0.0, avail_gib: float = 0.0):
        super().__init__(message)
        self.phase = phase
        self.message = message
        self.exc_type = exc_type
        self.graphs = graphs or {}  # graph phase: GiB per graph in capture order
        self.free_gib = free_gib  # graph phase: what the slack left for graphs
        self.avail_gib = avail_gib  # graph phase: free memory the capture log shows before the first graph


def default_graph_settings(gpu_mib: int, tp: int) -> tuple[int, int]:
    """(chunked_prefill_size, decode graph max_bs) by GPU size: memory_hook.py's brackets."""
    if gpu_mib < 20 * 1024:
        return 2048, 8
    if gpu_mib < 35 * 1024:
        return 4096, 48 if tp < 4 else 160
    if gpu_mib < 60 * 1024:
        return 4096, 32 if tp < 4 else 160
    if gpu_mib < 160 * 1024:
        return 8192, 256 if tp < 4 else 512
    return 16384, 512


def default_mem_fraction_static(
    *, gpu_mib: int, tp: int, chunked_prefill_size: int, decode_max_bs: int
) -> float:
    """memory_hook.py's non-post-capture formula (0.5.23), without the VLM adjustment."""
    activation_tokens = max(chunked_prefill_size, 2048)
    reserved = 512 + activation_tokens * 1.5 + tp / 8 * 1024 + decode_max_bs * 2
    if gpu_mib > 60 * 1024:
        reserved = max(reserved, 10 * 1024)
    return round((gpu_mib - reserved) / gpu_mib, 3)


def capture_batch_sizes(max_bs: int, speculative: bool) -> tuple[int, ...]:
    """cuda_graph_hook.generate_decode_cuda_graph_batch_sizes, up to max_bs."""
    if speculative:
        sizes = (
            list(range(1, 9))
            + list(range(10, 33, 2))
            + list(range(40, 65, 4))
            + list(range(72, 257, 8))
            + list(range(272, 4097, 16))
        )
    else:
        sizes = [1, 2, 4, 8, 12] + list(range(16, 257, 8)) + list(range(272, 4097, 16))
    chosen = tuple(s for s in sizes if s <= max_bs)
    return chosen or (1,)


def _per_gpu(value: float, profile: Profile, tp: int) -> float:
    return value * profile.reference_tp / tp


def size_memory(
    profile: Profile,
    *,
    tp: int,
    dp: int,
    mem_fraction_static: float,
    spec: SpecShape,
    max_running_requests: int | None,
    max_total_tokens: int | None,
    chunked_prefill_size: int,
    cuda_graph_max_bs: int,
    page_size: int = 1,
    graph_states: Callable[[tuple[int, ...]], tuple[tuple[int, int], ...]] | None = None,
) -> MemoryPlan:
    """Size the pools as SGLang 0.5.23 does, or raise the `MemoryFailure` it would hit.

    Order follows `Scheduler.init_model_worker`: target and draft weights load, the KV (and
    hybrid state) pools take what `mem_fraction_static` leaves, then CUDA graphs and activations
    must fit in the `1 - mem_fraction_static` slack.  `graph_states` (adaptive mode) maps the
    capture sizes to the (steps, largest batch) of every runtime state that captures graphs.
    """
    mem = profile.memory
    warnings: list[str] = []
    gpu_gib = profile.gpu.total_mib / 1024
    pre_load = gpu_gib - profile.gpu.context_mib / 1024
    weights = _per_gpu(mem.weights_gib, profile, tp)
    draft_weights = _per_gpu(mem.draft_weights_gib, profile, tp) if spec.enabled else 0.0
    after_load = pre_load - weights - draft_weights
    slack = pre_load * (1 - mem_fraction_static)
    rest = after_load - slack
    if rest <= 0:
        minimum = 1 - after_load / pre_load
        raise MemoryFailure(
            "kv",
            "Loaded weights leave no GPU memory for the KV cache under "
            f"--mem-fraction-static={mem_fraction_static}. Raise --mem-fraction-static above "
            f"{math.ceil(minimum * 1000) / 1000:.3f} (minimum viable = 1 - available/pre = "
            f"{minimum:.4f}). If using speculative decoding, draft weights are now counted.",
            exc_type="ValueError",
        )

    # A KV head is split across TP ranks until each rank holds one; beyond that it is replicated.
    cell = mem.kv_cell_bytes / mem.kv_heads * math.ceil(mem.kv_heads / tp)
    if spec.enabled and spec.algorithm != "NGRAM":
        cell *= 1 + mem.draft_kv_fraction

    mamba_gib = 0.0
    max_mamba_cache_size: int | None = None
    requested = max_running_requests
    if profile.hybrid:
        # kv_cache_configurator._handle_max_mamba_cache: the recurrent-state budget is a fixed
        # share of what is left, solved jointly with the per-draft-token intermediate state of
        # the requests it can serve.  The intermediate state is reserved before the split, so
        # a longer draft shrinks both the KV pool and the state slots (the seed's observation).
        state = _per_gpu(mem.mamba_state_mib, profile, tp) * MiB / GiB
        ratio = mem.mamba_ratio
        share = mem.mamba_full_memory_ratio / (1 + mem.mamba_full_memory_ratio)
        per_draft = state * mem.spec_state_share * spec.draft_tokens if spec.enabled else 0.0
        slots = rest / state
        if per_draft > 0:
            # rest - per_draft * (K / ratio + 1) = K * state / share, solved for K
            k = (slots - per_draft / state) / (1 / share + per_draft / state / ratio)
            if requested is not None and k / ratio > requested // dp:
                # The request cap binds first: intermediate state for `requested` requests.
                k = (rest - per_draft * (requested // dp + 1)) * share / state
        else:
            k = slots * share
        reserved_requests = k / ratio  # the intermediate state is sized before flooring
        if requested is not None:
            reserved_requests = min(reserved_requests, max(1, requested // dp))
        max_mamba_cache_size = int(math.floor(k))
        if max_mamba_cache_size <= 0:
            raise MemoryFailure(
                "kv",
                "Not enough GPU memory for hybrid (mamba/linear-attention) state cache. "
                f"Computed max_mamba_cache_size={max_mamba_cache_size} "
                f"(total_rest_memory={rest:.2f} GB, mamba_cache_per_req={state * 1024:.2f} MB). "
                "Try: (1) reduce --max-running-requests, (2) increase --mem-fraction-static, "
                "(3) reduce --speculative-num-draft-tokens, or (4) use GPUs with more memory.",
            )
        intermediate = per_draft * (reserved_requests + 1)
        mamba_gib = (max_mamba_cache_size + 1) * state + intermediate
        kv_gib = rest - mamba_gib
    else:
        kv_gib = rest

    tokens = int(kv_gib * GiB // cell)
    if page_size > 1:
        tokens -= tokens % page_size
    if max_total_tokens is not None:
        if max_total_tokens > tokens:
            warnings.append(
                f"max_total_tokens={max_total_tokens} is larger than the profiled value "
                f"{tokens}. Use the profiled value instead."
            )
        tokens = min(tokens, max_total_tokens)
    if tokens <= 0:
        raise MemoryFailure(
            "kv",
            "Not enough memory. Please try to increase --mem-fraction-static. "
            f"Current value: mem_fraction_static={mem_fraction_static}",
        )

    # kv_cache_configurator.resolve_max_num_reqs
    estimated = max(min(int(tokens / profile.context_len * 512), 4096), 2048)
    if requested is not None:
        per_worker = max(1, requested // dp)
        running = min(per_worker, tokens // 2)
    else:
        per_worker = None
        running = min(estimated, tokens // 2)
    capped_by_mamba = False
    if profile.hybrid and max_mamba_cache_size is not None:
        cap = max_mamba_cache_size // mem.mamba_ratio
        if cap < running:
            capped_by_mamba = True
            warnings.append(
                f"max_running_requests is capped to {cap} by the mamba state cache "
                f"(max_mamba_cache_size={max_mamba_cache_size}, {mem.mamba_ratio} state slots "
                "per request). To raise it: increase --mamba-full-memory-ratio or "
                "--max-mamba-cache-size, or halve the state size with --mamba-ssm-dtype bfloat16."
            )
        running = min(running, cap)
        if running <= 0:
            raise MemoryFailure(
                "kv",
                "Hybrid (mamba/linear-attention) state cache is too small to serve any requests. "
                f"max_mamba_cache_size={max_mamba_cache_size}, mamba_ratio={mem.mamba_ratio}, "
                f"resulting max_num_reqs={running}. Try: (1) reduce --max-running-requests, "
                "(2) increase --mem-fraction-static, or (3) use GPUs with more memory.",
            )
    if per_worker is not None and running < per_worker and not capped_by_mamba:
        warnings.append(
            f"max_running_requests was reduced from the requested {per_worker} to {running} "
            "(per dp worker) due to the available KV cache capacity."
        )

    # CUDA graphs: captured up to min(decode max_bs, request slots), out of the slack.
    capture_bs = capture_batch_sizes(min(cuda_graph_max_bs, running), spec.enabled)
    if graph_states is None:
        graphs = graph_memory_gib(profile, spec, capture_bs[-1])
    else:
        # Adaptive mode: one set of graphs per candidate step's runtime state, each over the
        # capture sizes that can reach it; they add up (see adaptive.graph_states).
        graphs = {}
        for i, (steps, top_bs) in enumerate(graph_states(capture_bs)):
            state = SpecShape(spec.algorithm, steps, 1, steps + 1)
            for name, gib in graph_memory_gib(profile, state, top_bs, fixed=i == 0).items():
                graphs[name] = graphs.get(name, 0.0) + gib
    free_for_graphs = slack - mem.non_torch_gib - chunked_prefill_size * mem.activation_mib_per_token / 1024
    needed = sum(graphs.values())
    reserve = mem.capture_reserve_frac * gpu_gib  # needed by the capture, in no figure
    if needed + reserve > free_for_graphs:
        free = max(free_for_graphs, 0.0)
        largest = max(graphs.values())
        raise MemoryFailure(
            "graph",
            f"CUDA out of memory. Tried to allocate {largest:.2f} GiB. GPU 0 has a total "
            f"capacity of {gpu_gib:.2f} GiB of which {free:.2f} GiB is free. Including "
            f"non-PyTorch memory, this process has {gpu_gib - free:.2f} GiB memory in use. Of "
            f"the allocated memory {gpu_gib - free - mem.non_torch_gib:.2f} GiB is allocated by "
            "PyTorch, and 0.00 GiB is reserved by PyTorch but unallocated. If reserved but "
            "unallocated memory is large try setting PYTORCH_CUDA_ALLOC_CONF="
            "expandable_segments:True to avoid fragmentation.  See documentation for Memory "
            "Management  (https://pytorch.org/docs/stable/notes/cuda.html#environment-variables)",
            exc_type="torch.OutOfMemoryError",
            graphs=graphs, free_gib=free_for_graphs - reserve, avail_gib=free_for_graphs + mem.non_torch_gib,
        )
    return MemoryPlan(
        pre_load_gib=pre_load,
        after_load_gib=after_load,
        weights_gib=weights + draft_weights,
        slack_gib=slack,
        kv_gib=tokens * cell / GiB,
        mamba_gib=mamba_gib,
        max_total_num_tokens=tokens,
        max_running_requests=running,
        max_mamba_cache_size=max_mamba_cache_size,
        graph_gib=graphs,
        capture_bs=capture_bs,
        available_after_capture_gib=free_for_graphs - needed + mem.non_torch_gib,
        warnings=tuple(warnings),
    )


def tree_state_gib(profile: Profile, spec: SpecShape, top_bs: int) -> tuple[float, float]:
    """FlashInfer's CUDA-graph index buffers (target verify, draft decode) in GiB, or zeros.

    Paid only when the profile's GPU moves to FlashInfer for trees (`flashinfer_tree_state`)
    and topk > 1.  Sizes from the 0.5.23 source, allocated with torch.zeros outside the graph
    pool, so they scale with context_len and are not shared between graphs:
    - layers/attention/flashinfer_backend.py · FlashInferAttnBackend.init_cuda_graph_state:
      `cuda_graph_kv_indices` int32 and `cuda_graph_custom_mask` uint8, each
      max_num_tokens x max_context_len, where the verify runner's max_num_tokens is
      max_bs x num_draft_tokens (decode_cuda_graph_runner.py, captured_req_width).
    - FlashInferMultiStepDraftBackend.init_cuda_graph_state: int32 (speculative_num_steps,
      draft_kv_indices_buffer_width(max_bs, topk, max_context_len) = max_bs x topk x ctx).
    """
    if not (profile.memory.flashinfer_tree_state and spec.enabled and spec.topk > 1 and top_bs > 0):
        return 0.0, 0.0
    ctx = profile.context_len
    verify = top_bs * spec.draft_tokens * ctx * (4 + 1) / GiB
    draft = spec.steps * top_bs * spec.topk * ctx * 4 / GiB
    return verify, draft


def graph_memory_gib(profile: Profile, spec: SpecShape, top_bs: int, *, fixed: bool = True) -> dict[str, float]:
    """CUDA-graph memory by runner for graphs captured up to `top_bs` (GiB, per GPU).

    Target decode/verify: the shared logits buffer and activations, max_bs x tokens per request
    rows (decode_cuda_graph_runner.py: `get_logits_buffer(vocab_size, rows=max_bs x
    captured_req_width)`).  Draft decode: max_bs x topk tokens per step
    (eagle_draft_cuda_graph_runner.py: `max_num_token = max_bs x captured_req_width`, the width
    being topk).  Draft extend: max_bs x num_draft_tokens.  Plus `tree_state_gib`.
    """
    mem = profile.memory
    if top_bs <= 0:
        return {}
    target = (mem.graph_fixed_gib if fixed else 0.0) + top_bs * spec.tokens_per_request * mem.graph_mib_per_token / 1024
    if not spec.enabled:
        return {"decode": target}
    verify_state, draft_state = tree_state_gib(profile, spec, top_bs)
    return {
        "target_verify": target + verify_state,
        "draft_decode": top_bs * spec.topk * max(spec.steps - 1, 0) * mem.draft_graph_mib_per_token / 1024
        + draft_state,
        "draft_extend": top_bs * spec.draft_tokens * mem.draft_graph_mib_per_token / 1024,
    }


def tree_pool_size(steps: int, topk: int) -> int:
    """Draft candidates EAGLE's organize_draft_results chooses from: topk + (steps-1)*topk^2."""
    return topk + (steps - 1) * topk * topk


# --- Time -----------------------------------------------------------------------------------


def _moe_stream_ms(t: Timing, batch: int, tokens_per_request: int) -> float:
    """Weight streaming of one forward: for a MoE it grows with the distinct experts touched."""
    if not t.moe_experts:
        return t.stream_ms
    effective_tokens = batch * (1 + (tokens_per_request - 1) * t.moe_locality)
    e, k = t.moe_experts, t.moe_top_k
    distinct = e * (1 - (1 - k / e) ** effective_tokens)
    coverage = max(distinct - k, 0.0) / (e - k)
    return t.stream_ms + (t.moe_full_stream_ms - t.stream_ms) * coverage


def forward_ms(profile: Profile, *, batch: int, tokens_per_request: int, tp: int | None = None) -> float:
    """Target forward over batch x tokens_per_request tokens, attention excluded."""
    t = profile.timing
    tp = tp or profile.reference_tp
    tokens = batch * tokens_per_request
    stream = _moe_stream_ms(t, batch, tokens_per_request) * profile.reference_tp / tp
    shape = _linear_shape(tokens * _H200_KNEE_TOKENS / t.knee_tokens)
    return t.fixed_ms + stream * shape


def attention_ms(profile: Profile, *, batch: int, context_tokens: int, tree: bool, query_tokens: int = 1) -> float:
    """Target attention over the KV the batch holds (`context_tokens` in all): the KV read at
    the one-token path's cost, times `verify_attn_factor` for a multi-token (verify) query."""
    t = profile.timing
    kv_read = t.attn_ms_per_ktoken * context_tokens / 1024 * (t.verify_attn_factor if query_tokens > 1 else 1.0)
    ms = t.attn_fixed_ms + kv_read + t.attn_ms_per_request * batch
    return ms * (t.flashinfer_penalty if tree else 1.0)


def draft_attention_ms(profile: Profile, *, context_tokens: int, topk: int) -> float:
    """One draft step's attention over the draft layers' own KV: the target's KV read scaled by
    the draft's share of layers (`draft_kv_fraction`), once per branch (each of the topk
    frontier nodes queries the whole prefix)."""
    t, mem = profile.timing, profile.memory
    return t.attn_ms_per_ktoken * mem.draft_kv_fraction * context_tokens / 1024 * max(topk, 1)


def draft_step_ms(profile: Profile, *, batch: int, topk: int) -> float:
    d = profile.draft_timing
    return d.fixed_ms + d.stream_ms * _draft_shape(batch, topk)


def step_ms(
    profile: Profile,
    *,
    spec: SpecShape,
    batch: int,
    context_tokens: int,
    tp: int | None = None,
    attention_backend_forced: bool = False,
) -> float:
    """One decode iteration for `batch` running requests holding `context_tokens` in all.

    With speculation (spec v2, the only path in 0.5.23): `steps` draft forwards over
    batch x topk tokens, one target verify over batch x draft_tokens, one draft extend over the
    accepted tokens, plus sampling and (for trees) tree bookkeeping.
    """
    if batch <= 0:
        return 0.0
    t = profile.timing
    tree = spec.enabled and spec.topk > 1
    ms = forward_ms(profile, batch=batch, tokens_per_request=spec.tokens_per_request, tp=tp)
    ms += attention_ms(
        profile, batch=batch, context_tokens=context_tokens, tree=tree and not attention_backend_forced,
        query_tokens=spec.tokens_per_request,
    )
    ms += t.iteration_overhead_ms
    if spec.enabled and spec.algorithm != "NGRAM":
        draft_attn = draft_attention_ms(profile, context_tokens=context_tokens, topk=spec.topk)
        ms += spec.steps * (draft_step_ms(profile, batch=batch, topk=spec.topk) + draft_attn)
        ms += draft_step_ms(profile, batch=batch, topk=min(spec.draft_tokens, 8))  # draft extend
    if tree:
        ms += t.tree_overhead_ms
    return ms


def prefill_ms(profile: Profile, *, tokens: int, tp: int | None = None) -> float:
    t = profile.timing
    tp = tp or profile.reference_tp
    return t.prefill_fixed_ms + tokens * t.prefill_ms_per_token * profile.reference_tp / tp


# --- Acceptance -----------------------------------------------------------------------------


def _logit(p: float) -> float:
    p = min(max(p, 1e-6), 1 - 1e-6)
    return math.log(p / (1 - p))


def _sigmoid(x: float) -> float:
    return 1 / (1 + math.exp(-x))


def context_shift(acc: Acceptance, context_tokens: int) -> float:
    """The drop of logit(q) at this context length: `context_decay` per doubling past
    `context_ref_tokens` (profiles.py says where each profile's figure comes from)."""
    if acc.context_decay <= 0 or context_tokens <= acc.context_ref_tokens:
        return 0.0
    return -acc.context_decay * math.log2(context_tokens / acc.context_ref_tokens)


# Checked in this order: a question about a document (even one quoting code or logs) is
# summarisation, not code.
_CATEGORY_MARKS = (
    ("summarisation", ("summar", "tl;dr", "extract", "according to the", "based on this", "using only",
                       "the log above", "below is", "the text above", "the passage")),
    ("code", ("```", "def ", "function", "select ", "class ", "#include", "=>", "import ", "python", "sql",
              "script", "typescript", "javascript", "regular expression", "git ", "bash")),
    ("maths", ("solve", "calculate", "how many", "equation", "probability", "integral", "prove", "compute")),
    ("creative", ("story", "poem", "imagine", "creative", "haiku")),
)


def prompt_category(prompt: str) -> str:
    """The kind of text a prompt asks for, read off its words (a server never sees a label)."""
    lowered = prompt.lower()
    for category, marks in _CATEGORY_MARKS:
        if any(mark in lowered for mark in marks):
            return category
    return "chat"


def category_shift(acc: Acceptance, category: str) -> float:
    return dict(acc.category_shifts).get(category, 0.0)


def depth_acceptance(
    acc: Acceptance,
    *,
    steps: int,
    temperature: float,
    top_p: float = 1.0,
    prompt_shift: float = 0.0,
    degenerate: bool = False,
) -> list[float]:
    """Top-1 acceptance at each depth 1..steps for one request in one regime."""
    t_eff = max(temperature, 0.0) * (0.5 + 0.5 * min(max(top_p, 0.0), 1.0))
    exponent = 1 + acc.temperature_slope * t_eff
    if degenerate:
        # Post-EOS text under ignore_eos loops; sampling noise breaks the loops only slowly.
        return [acc.degenerate ** (1 + 3 * acc.temperature_slope * t_eff)] * steps
    qs = []
    for depth in range(steps):
        q = acc.first * acc.depth_decay**depth
        q = _sigmoid(_logit(q) + prompt_shift)
        qs.append(q**exponent)
    return qs


def accept_length_distribution(
    qs: list[float], *, topk: int, draft_tokens: int, second_share: float
) -> list[float]:
    """P(at least j draft tokens accepted) for j = 1..steps, for the tree SGLang would verify.

    EAGLE grows `topk` children per frontier node per step, keeps the best `topk` as the next
    frontier, then verifies the best `draft_tokens - 1` candidates of the whole pool (by path
    score).  A node is accepted when every node on its path is; nodes at one depth are mutually
    exclusive, so P(accepted >= j) is the summed path probability of the chosen depth-j nodes.
    """
    steps = len(qs)
    if steps == 0 or draft_tokens <= 1:
        return []

    def child_probs(q: float) -> list[float]:
        probs = [q]
        rest = 1 - q
        for _ in range(1, topk):
            probs.append(rest * second_share)
            rest *= 1 - second_share
        return probs

    pool: list[tuple[float, int]] = []  # (path probability, depth)
    frontier = [1.0]
    for depth in range(steps):
        children = [p * c for p in frontier for c in child_probs(qs[depth])]
        pool.extend((c, depth) for c in children)
        frontier = sorted(children, reverse=True)[:topk]
    chosen = sorted(pool, key=lambda node: (-node[0], node[1]))[: draft_tokens - 1]
    mass = [0.0] * steps
    for prob, depth in chosen:
        mass[depth] += prob
    # Trim trailing depths nothing reached.
    while mass and mass[-1] == 0.0:
        mass.pop()
    return mass


def expected_accept_length(
    profile: Profile,
    spec: SpecShape,
    *,
    temperature: float,
    top_p: float = 1.0,
    prompt_shift: float = 0.0,
    degenerate: bool = False,
) -> float:
    """Mean tokens per verify step (1 bonus token + accepted drafts), SGLang's accept length."""
    if not spec.enabled:
        return 1.0
    qs = depth_acceptance(
        profile.acceptance,
        steps=spec.steps,
        temperature=temperature,
        top_p=top_p,
        prompt_shift=prompt_shift,
        degenerate=degenerate,
    )
    mass = accept_length_distribution(
        qs, topk=spec.topk, draft_tokens=spec.draft_tokens, second_share=profile.acceptance.second_share
    )
    return 1 + sum(mass)
