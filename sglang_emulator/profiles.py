"""Model profiles the emulator can serve, chosen by `--model-path`.

Each constant says where it comes from.  "Calibrated" means it was fitted so that the emulator
reproduces a published or measured figure (`benchmarks/emulator_calibration.py` prints the fit);
"assumed" means no source was at hand and the value is a physically plausible estimate.
"""

from __future__ import annotations

import json
import os
from dataclasses import fields, is_dataclass, replace
from typing import Any

from .model import Acceptance, DraftTiming, Gpu, MemoryModel, Profile, Timing

__all__ = ["PROFILES", "find_profile", "profile_from_dict", "PROFILE_ENV", "LANDSCAPE_SEED_ENV"]

PROFILE_ENV = "SGLANG_EMULATOR_PROFILE"

# Acceptance by context length, default shape: vLLM #47602 (Qwen3.6-27B with MTP, k = 6) reports
# position-1 acceptance falling from 93.5% to 72.1% as the context grows toward the model's
# limit: logit 2.67 -> 0.95, 1.72 over the ~7 doublings from 1k to 128k tokens, so 0.25 per
# doubling past 1,024 tokens.  No such figure was at hand for EAGLE3 heads: the same is assumed.
CONTEXT_DECAY = 0.25
# Acceptance by kind of text, shifts of logit(q) relative to chat: SPEED-Bench (arXiv 2604.09557)
# measures accept length per category (humaneval 2.62 > gsm8k 2.40 > mtbench 1.95): code highest,
# maths between, multi-turn chat lowest; summarisation copies from its source (assumed +0.3);
# creative writing is the hardest to draft (assumed -0.4).  The code and summarisation values are
# the emulator's earlier keyword shifts, kept so its calibration holds.
CATEGORY_SHIFTS = (("code", 0.5), ("maths", 0.3), ("summarisation", 0.3), ("creative", -0.4))
# A verify's KV read over the one-token decode path's: FlashInfer / FA3 read the KV once for all
# draft tokens (1.0), torch's multi-query SDPA path costs 3.1x at B = 16 over 32k tokens
# (docs/h200-forward-times.md, "Attention over the KV cache"); assumed between the two.
VERIFY_ATTN_FACTOR = 1.5
LANDSCAPE_SEED_ENV = "SGLANG_EMULATOR_LANDSCAPE_SEED"

# NVIDIA RTX PRO 6000 Blackwell (96 GB GDDR7, ~1.79 TB/s, PCIe only): the seed's GPUs.
RTX_PRO_6000 = Gpu(
    name="NVIDIA RTX PRO 6000 Blackwell Workstation Edition",
    total_mib=97_887,  # nvidia-smi's figure for this card
    context_mib=600,  # assumed: CUDA context + NCCL communicators at tp 4
    compute_capability="12.0",
)

# NVIDIA H200 (141 GB HBM3e): the GPU of docs/h200-forward-times.md.
H200 = Gpu(
    name="NVIDIA H200",
    total_mib=143_771,  # the figure docs/sglang-0.5.23.md §2.1 uses
    context_mib=500,  # assumed
    compute_capability="9.0",
)

# The seed: Qwen3.5-122B-A10B (hybrid Gated DeltaNet + gated attention, MoE) with its MTP head,
# tp 4 on RTX PRO 6000.  Seed figures (greedy, ignore_eos, topk 1, default mem fraction):
#   steps 1/2/3 -> single-request decode 123 / 186 / 234 tok/s,
#   max_total_num_tokens 455,357 / 377,207 / 295,931, max_running_requests 26 / 21 / 17.
QWEN35_122B = Profile(
    key="qwen3.5-122b-a10b",
    model_names=("qwen3.5-122b-a10b", "qwen3_5-122b-a10b"),
    architecture="Qwen3_5MoeForConditionalGeneration",
    model_type="qwen3_5_moe",
    context_len=262_144,  # Qwen3.5's native context
    reference_tp=4,
    gpu=RTX_PRO_6000,
    memory=MemoryModel(
        # Calibrated: with the KV cell and state below, these weights put the default
        # mem_fraction_static (0.854) at the seed's KV figures.  122e9 bf16 params / 4 GPUs is
        # 56.8 GiB; the rest is replicated embeddings and the vision tower.
        weights_gib=59.16,
        draft_weights_gib=1.20,  # assumed: one MoE decoder layer (~2.5e9 params) / 4 GPUs
        # Assumed shape: 12 full-attention layers (1 in 4), 2 KV heads x 256, bf16.
        kv_cell_bytes=12 * 2 * 256 * 2 * 2,
        kv_heads=2,
        draft_kv_fraction=1 / 12,  # the MTP layer's attention, folded into the cell
        non_torch_gib=2.0,  # assumed: NCCL + custom all-reduce buffers at tp 4
        activation_mib_per_token=0.35,  # assumed: MoE dispatch buffers per prefill token
        graph_fixed_gib=0.35,  # assumed
        graph_mib_per_token=4.0,  # assumed: fp32 logits over a 248k vocab (~1 MiB) + MoE buffers
        draft_graph_mib_per_token=1.2,  # assumed: MTP layer + logits per draft token
        # Calibrated (joint fit of tokens and max_running_requests at steps 1..3):
        mamba_state_mib=67.05,
        spec_state_share=2.79,
    ),
    timing=Timing(
        # Calibrated to the seed's 123/186/234 tok/s: a ~16 ms step at batch 1 that grows only
        # ~0.4 ms per draft step.  Most of it is per-forward latency: 96 all-reduces over PCIe
        # (no NVLink on this card) and 36 linear-attention layers' kernels.
        fixed_ms=11.8,
        stream_ms=2.8,  # 10e9 active bf16 params / 4 GPUs at 1.79 TB/s
        moe_experts=256,  # assumed
        moe_top_k=8,  # assumed
        moe_full_stream_ms=35.4,  # every expert once: 59 GiB per GPU at 1.79 TB/s
        moe_locality=0.1,  # calibrated: extra draft tokens of one request barely widen experts
        knee_tokens=2000.0,  # assumed: sparse MoE stays memory-bound far longer than dense
        attn_fixed_ms=0.15,
        # 12 full-attention layers x one KV head (256 x K,V bf16) per GPU = 12 KiB per token,
        # read at 1.79 TB/s: 1,024 tokens in 0.007 ms (the KV read runs at bandwidth, as the
        # H200 note's d = 1 column does).
        attn_ms_per_ktoken=0.007,
        verify_attn_factor=VERIFY_ATTN_FACTOR,
        attn_ms_per_request=0.02,  # recurrent-state update of 36 linear-attention layers
        prefill_fixed_ms=12.0,
        prefill_ms_per_token=0.022,  # 2 x 10e9 FLOP/token / 4 GPUs at ~230 TFLOP/s effective
    ),
    draft_timing=DraftTiming(fixed_ms=0.1, stream_ms=0.2),  # calibrated with the seed's steps
    acceptance=Acceptance(
        first=0.90,  # assumed: MTP heads accept ~80-90% of first drafts on chat text
        depth_decay=0.90,  # one MTP layer reused for deeper steps drifts faster than EAGLE
        second_share=0.5,
        degenerate=0.995,  # calibrated: greedy + ignore_eos loops are almost fully predicted
        temperature_slope=0.9,
        prompt_spread=0.4,
        context_decay=CONTEXT_DECAY,  # vLLM #47602 is this family's MTP head
        category_shifts=CATEGORY_SHIFTS,
    ),
    auto_spec=(3, 1, 4),  # _auto_choose_speculative_params: "anything else" -> (3, 1, 4)
    hybrid=True,
    draft_is_target=True,
    is_multimodal=True,
    load_s=80.0,  # the seed: "wait ~100 s for the model to load" (weights + graphs + warm-up)
    graph_capture_s=15.0,
)

# A dense 8B (Llama-3.1-8B-Instruct shape) with an EAGLE3 head on one H200.  Its target forward
# *is* the measured table in docs/h200-forward-times.md (stream 4.60 ms, knee 180),
# attention and draft steps come from the same note.
LLAMA31_8B = Profile(
    key="llama-3.1-8b-instruct",
    model_names=("llama-3.1-8b", "meta-llama-3.1-8b", "llama3.1-8b"),
    architecture="LlamaForCausalLM",
    model_type="llama",
    context_len=131_072,
    reference_tp=1,
    gpu=H200,
    memory=MemoryModel(
        weights_gib=14.96,  # 16.06e9 bytes of bf16 weights (the note's 15.0 GB)
        draft_weights_gib=0.85,  # EAGLE3 head: 1 layer + fc + 32k-vocab lm head
        kv_cell_bytes=32 * 8 * 128 * 2 * 2,  # 32 layers x 8 KV heads x 128 x (K,V) x bf16
        kv_heads=8,
        draft_kv_fraction=1 / 32,
        non_torch_gib=0.6,
        activation_mib_per_token=0.2,
        graph_fixed_gib=0.3,
        graph_mib_per_token=0.55,  # fp32 logits over 128k vocab (0.49 MiB) + hidden
        draft_graph_mib_per_token=0.15,  # 32k draft vocab logits
    ),
    timing=Timing(
        fixed_ms=0.0,
        stream_ms=4.60,  # measured: 15 GB streamed in 4.6 ms
        knee_tokens=180.0,  # measured: the table's knee
        attn_fixed_ms=0.26,  # measured: SDPA - linear at B=1, d=1 over 1,024 tokens
        attn_ms_per_ktoken=0.033,  # measured: (10.71 - 6.56) ms / (128 x 1,024 tokens)
        flashinfer_penalty=1.15,  # assumed: topk > 1 moves Hopper from FA3 to FlashInfer
        verify_attn_factor=VERIFY_ATTN_FACTOR,
        prefill_fixed_ms=5.0,
        prefill_ms_per_token=0.027,  # 2 x 8e9 FLOP/token at ~600 TFLOP/s (the note's slope)
    ),
    draft_timing=DraftTiming(fixed_ms=0.0, stream_ms=0.223),  # measured draft step
    acceptance=Acceptance(
        first=0.80,  # calibrated: EAGLE-3 3/1/4 gives ~2.3x on chat (SGLang doc: 373 vs 158)
        depth_decay=0.94,
        second_share=0.5,
        degenerate=0.97,
        temperature_slope=0.9,
        prompt_spread=0.5,
        context_decay=CONTEXT_DECAY,  # assumed as the MTP report
        category_shifts=CATEGORY_SHIFTS,
    ),
    auto_spec=(5, 4, 8),  # _auto_choose_speculative_params: LlamaForCausalLM -> (5, 4, 8)
    load_s=25.0,
    graph_capture_s=12.0,
)

# NVIDIA H100 80GB HBM3 (SXM): 3.35 TB/s, the same 989 dense bf16 TFLOP/s as the H200.
H100 = Gpu(
    name="NVIDIA H100 80GB HBM3",
    total_mib=81_559,  # nvidia-smi's figure for this card
    context_mib=500,  # assumed, as for the H200
    compute_capability="9.0",
)

# H200 bandwidth over H100 bandwidth: 4.8 / 3.35 TB/s.  Weight streaming and KV reads scale by
# it; compute (the same 989 TFLOP/s) does not, so the knee moves out by the same factor.
_H200_OVER_H100_BW = 4.8 / 3.35

# The same dense 8B with its EAGLE3 head on one H100 80 GB at its full 128k context: the shape
# where wide trees do not fit at the small shapes' memory edge.  topk > 1 moves Hopper from FA3
# to FlashInfer, whose CUDA-graph index buffers scale with max_bs x draft tokens x context_len
# (verify) and steps x max_bs x topk x context_len (draft decode), outside the static pool
# (model.tree_state_gib): at 48 graph batches, 32 draft tokens, topk 8 and 131,072 tokens of
# context that is ~1.9 GiB, ~2.4% of the card, so the widest trees start only ~4 points of
# mem_fraction_static below where chains do.  On the exhaustive front the single-stream end is
# such a tree (+30% over the best chain: at batch 1 an H100 verifies 32 tokens for the price of
# one), the capacity end a chain at the top of the range.
LLAMA31_8B_H100 = Profile(
    key="llama-3.1-8b-h100-128k",
    model_names=(),  # chosen by key only ($SGLANG_EMULATOR_PROFILE {"base": "llama-3.1-8b-h100-128k"})
    architecture="LlamaForCausalLM",
    model_type="llama",
    context_len=131_072,  # Llama-3.1's max_position_embeddings: FlashInfer's max_context_len
    reference_tp=1,
    gpu=H100,
    memory=replace(LLAMA31_8B.memory, flashinfer_tree_state=True),  # same weights, cell and graphs
    timing=replace(
        LLAMA31_8B.timing,
        stream_ms=4.60 * _H200_OVER_H100_BW,  # the measured 4.60 ms at 3.35 instead of 4.8 TB/s
        knee_tokens=180.0 * _H200_OVER_H100_BW,  # same FLOP/s, slower streaming: knee further out
        attn_ms_per_ktoken=0.033 * _H200_OVER_H100_BW,  # KV reads are bandwidth-bound
    ),
    # The measured 0.223 ms draft step is mostly streaming the 0.85 GiB head (0.19 ms at 4.8 TB/s).
    draft_timing=DraftTiming(fixed_ms=0.0, stream_ms=0.223 * _H200_OVER_H100_BW),
    acceptance=LLAMA31_8B.acceptance,  # the same model and head
    auto_spec=(5, 4, 8),  # _auto_choose_speculative_params: LlamaForCausalLM -> (5, 4, 8)
    load_s=30.0,
    graph_capture_s=12.0,
)

PROFILES: dict[str, Profile] = {p.key: p for p in (QWEN35_122B, LLAMA31_8B, LLAMA31_8B_H100)}


def _build(cls: type, data: dict[str, Any], base: Any) -> Any:
    known = {f.name: f for f in fields(cls)}
    unknown = set(data) - set(known)
    if unknown:
        raise ValueError(f"unknown profile keys for {cls.__name__}: {sorted(unknown)}")
    values = {}
    for name, value in data.items():
        current = getattr(base, name) if base is not None else None
        if is_dataclass(current) and isinstance(value, dict):
            value = _build(type(current), value, current)
        elif isinstance(current, tuple) and isinstance(value, list):
            value = tuple(value)
        values[name] = value
    return replace(base, **values) if base is not None else cls(**values)


def profile_from_dict(data: dict[str, Any]) -> Profile:
    """A profile from JSON: `{"base": "<key>", ...overrides}`; nested sections may be partial."""
    data = dict(data)
    base = PROFILES[data.pop("base", "llama-3.1-8b-instruct")]
    return _build(Profile, data, base)


def find_profile(model_path: str) -> Profile | None:
    """The profile for `--model-path`: `$SGLANG_EMULATOR_PROFILE` (a JSON file) wins, then
    `$SGLANG_EMULATOR_LANDSCAPE_SEED` (N: a profile drawn by family.draw_profile; tp4:N: by
    family.draw_tp4_profile, a four-GPU set-up), then names."""
    path = os.environ.get(PROFILE_ENV)
    if path:
        with open(path, encoding="utf-8") as fh:
            profile = profile_from_dict(json.load(fh))
        return replace(profile, model_names=profile.model_names + (model_path.lower(),))
    seed = os.environ.get(LANDSCAPE_SEED_ENV)
    if seed:
        from .family import TP4_PREFIX, draw_profile, draw_tp4_profile  # family imports this module

        kind, _, number = seed.rpartition(":")
        if kind not in ("", TP4_PREFIX) or not number.strip().isdigit():
            raise ValueError(f"{LANDSCAPE_SEED_ENV}={seed!r}: expected a seed N or {TP4_PREFIX}:N")
        profile = draw_tp4_profile(int(number)) if kind else draw_profile(int(number))
        return replace(profile, model_names=profile.model_names + (model_path.lower(),))
    lowered = model_path.lower().rstrip("/")
    for profile in PROFILES.values():
        if any(name in lowered for name in profile.model_names):
            return profile
    return None
