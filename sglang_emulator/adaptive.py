"""SGLang 0.5.23's adaptive speculative decoding (`--speculative-adaptive`), mechanics only.

A pure mirror of `srt/speculative/adaptive_spec_params.py` (config loading, per-batch-size
slots, the EMA step policy), `srt/speculative/adaptive_runtime_state.py · AdaptiveController`
(which runtime state is active) and the parts of `srt/arg_groups/speculative_hook.py`
(`_maybe_disable_adaptive`, `_init_adaptive_speculative_params`) that resolve the flags.  No
I/O except reading the config file, no clocks: the engine (`engine.py`) drives it once per
decode batch, the offline helpers (`landscape.py`) read the tables.

How 0.5.23 runs it, per decode batch (`eagle_worker_v2.py · forward_batch_generation`,
`batch_result_processor.py`):

1. `activate_step_by_batch(len(batch))`: the batch size is padded up to the next CUDA-graph
   batch size, mapped to the nearest lower batch-size key of the config, and that slot's
   current steps become active (logging "Switch adaptive runtime state: ..." on a change).
2. The batch decodes with those steps; steps 0 verifies only the bonus token through the
   TARGET_VERIFY graph captured at one draft token, and the draft extend still runs "keeping
   draft KV warm for when the batch shrinks".
3. `on_verify_complete(num_correct_drafts_per_req, batch_size=len(batch.reqs))`: the slot's EMA
   of accepted drafts moves; after `warmup_batches`, every `update_interval` batches the slot
   recomputes its steps with hysteresis ("Adaptive spec params updated: ...").
"""

from __future__ import annotations

import bisect
import json
import logging
import math
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Mapping

__all__ = [
    "DEFAULT_ADAPTIVE_CONFIG",
    "SlotConfig",
    "AdaptiveTable",
    "load_adaptive_config",
    "table_from_steps",
    "AdaptiveStepSlot",
    "AdaptiveSpeculativeParams",
    "adaptive_unsupported_reason",
    "resolve_adaptive_steps",
    "graph_states",
    "UPDATED_LOG",
    "SWITCH_LOG",
    "INITIALIZED_LOG",
    "DISABLED_LOG",
    "BUILT_LOG",
]

# The loggers SGLang logs these lines under (module names).
params_logger = logging.getLogger("sglang.srt.speculative.adaptive_spec_params")
worker_logger = logging.getLogger("sglang.srt.speculative.eagle_worker_v2")
hook_logger = logging.getLogger("sglang.srt.arg_groups.speculative_hook")

# Exact format strings (0.5.23).
# adaptive_spec_params.py · AdaptiveStepSlot._apply_target_steps
UPDATED_LOG = "Adaptive spec params updated: steps {old} -> {new} (ema_accept_len={ema:.2f})"
# eagle_worker_v2.py · EAGLEWorkerV2.apply_runtime_state
SWITCH_LOG = (
    "Switch adaptive runtime state: steps {old} -> {new}, draft_tokens {old_draft} -> {new_draft}"
)
# adaptive_spec_params.py · AdaptiveSpeculativeParams.__init__
INITIALIZED_LOG = "AdaptiveSpeculativeParams initialized: steps={steps}, candidate_steps={candidates}"
# eagle_worker_v2.py · EAGLEWorkerV2.build_adaptive_runtime_state
BUILT_LOG = "Built adaptive runtime state steps={steps}: elapsed={elapsed:.2f}s, mem={mem:.2f}GB"
# speculative_hook.py · _maybe_disable_adaptive (logger.warning)
DISABLED_LOG = "speculative_adaptive disabled: {reason}. Falling back to static speculative params."

# adaptive_spec_params.py · DEFAULT_ADAPTIVE_CONFIG, verbatim.  Used only when no
# --speculative-adaptive-config is given: a config file replaces it, it is not merged with it.
DEFAULT_ADAPTIVE_CONFIG: dict[str, dict[str, Any]] = {
    "1": {"candidate_steps": [1, 3, 5, 7], "up_hysteresis": 0.0, "down_hysteresis": -0.25, "ceiling_coeff": 0},
    "8": {"candidate_steps": [0, 1, 3], "up_hysteresis": 0.0, "down_hysteresis": 0.0, "ceiling_coeff": 0},
    "32": {"candidate_steps": [0, 1], "up_hysteresis": 0.0, "down_hysteresis": 0.0, "ceiling_coeff": 0},
    "64": {"candidate_steps": [0], "up_hysteresis": 0.0, "down_hysteresis": 0.0, "ceiling_coeff": 0},
}


@dataclass(frozen=True)
class SlotConfig:
    """One batch-size slot after SGLang's merge `{**cfg, **entry}` (the entry wins over the
    file's top level, absent keys take `AdaptiveStepSlot.__init__`'s `cfg.get` defaults)."""

    candidate_steps: tuple[int, ...]  # sorted, deduplicated (AdaptiveStepSlot: sorted(set(...)))
    ema_alpha: float = 0.2
    update_interval: int = 5
    warmup_batches: int = 10
    down_hysteresis: float = -0.25
    up_hysteresis: float = 0.0
    ceiling_coeff: float = 0

    @classmethod
    def from_merged(cls, merged: Mapping[str, Any]) -> "SlotConfig":
        """adaptive_spec_params.py · AdaptiveStepSlot.__init__: the `cfg.get(key, default)` reads."""
        return cls(
            candidate_steps=tuple(sorted(set(merged["candidate_steps"]))),
            ema_alpha=merged.get("ema_alpha", 0.2),
            update_interval=merged.get("update_interval", 5),
            warmup_batches=merged.get("warmup_batches", 10),
            down_hysteresis=merged.get("down_hysteresis", -0.25),
            up_hysteresis=merged.get("up_hysteresis", 0.0),
            ceiling_coeff=merged.get("ceiling_coeff", 0),
        )


@dataclass(frozen=True)
class AdaptiveTable:
    """A loaded adaptive config: batch-size key -> slot, sorted by key."""

    slots: tuple[tuple[int, SlotConfig], ...]

    @property
    def keys(self) -> tuple[int, ...]:
        return tuple(k for k, _ in self.slots)

    @property
    def candidate_steps(self) -> tuple[int, ...]:
        """resolve_candidate_steps_from_config: the union of every slot's candidates."""
        return tuple(sorted({s for _, slot in self.slots for s in slot.candidate_steps}))

    @property
    def max_draft_tokens(self) -> int:
        """Draft buffers are sized for the largest candidate: max(candidate_steps) + 1
        (model_runner.py · max_decode_logits_rows, runtime_context.max_speculative_num_draft_tokens)."""
        return max(self.candidate_steps) + 1

    def slot_key(self, batch_size: int, cuda_graph_bs: tuple[int, ...] | None = None) -> int:
        """AdaptiveSpeculativeParams._route: pad to the CUDA-graph batch size, then the nearest
        lower key (the smallest key when the batch is below every key)."""
        return _find_closest_bs(self.keys, _pad_to_cuda_graph_bs(cuda_graph_bs, batch_size))

    def slot_for(self, batch_size: int, cuda_graph_bs: tuple[int, ...] | None = None) -> SlotConfig:
        return dict(self.slots)[self.slot_key(batch_size, cuda_graph_bs)]

    def to_json(self) -> dict[str, Any]:
        """A config file SGLang would load into this table (every key explicit)."""
        return {
            str(k): {
                "candidate_steps": list(s.candidate_steps),
                "ema_alpha": s.ema_alpha,
                "update_interval": s.update_interval,
                "warmup_batches": s.warmup_batches,
                "up_hysteresis": s.up_hysteresis,
                "down_hysteresis": s.down_hysteresis,
                "ceiling_coeff": s.ceiling_coeff,
            }
            for k, s in self.slots
        }


def _pad_to_cuda_graph_bs(cuda_graph_bs: tuple[int, ...] | None, batch_size: int) -> int:
    """AdaptiveSpeculativeParams._pad_to_cuda_graph_bs: the smallest captured size >= batch
    (the batch itself past the largest, or with graphs disabled)."""
    if not cuda_graph_bs:
        return batch_size
    graph_bs = sorted(cuda_graph_bs)
    idx = bisect.bisect_left(graph_bs, batch_size)
    return graph_bs[idx] if idx < len(graph_bs) else batch_size


def _find_closest_bs(keys: tuple[int, ...], target: int) -> int:
    """AdaptiveSpeculativeParams._find_closest_bs: bisect_right - 1, floored at the first key."""
    idx = bisect.bisect_right(keys, target) - 1
    return keys[max(0, idx)]


def load_adaptive_config(source: str | Path | Mapping[str, Any] | None = None) -> AdaptiveTable:
    """adaptive_spec_params.py · _load_adaptive_config, with its exact ValueErrors.

    `source` is the --speculative-adaptive-config path (None: DEFAULT_ADAPTIVE_CONFIG) or an
    already parsed mapping.  Keys that are not digit strings are skipped as slots (`ema_alpha`,
    `update_interval`, `warmup_batches` and any other top-level key are merged into every slot
    instead; 0.5.23 reads no `strategy` key).  A missing file or bad JSON raises what `open` /
    `json.load` raise, before any validation.
    """
    if source is None:
        cfg: Mapping[str, Any] = DEFAULT_ADAPTIVE_CONFIG
    elif isinstance(source, Mapping):
        cfg = source
    else:
        with open(source) as f:
            cfg = json.load(f)

    entries: dict[int, Mapping[str, Any]] = {}
    for key, entry in cfg.items():
        if not key.isdigit():
            continue
        steps = entry.get("candidate_steps")
        # isinstance(True, int) holds in Python, so SGLang accepts booleans here too.
        if not isinstance(steps, list) or not steps or not all(isinstance(s, int) and s >= 0 for s in steps):
            raise ValueError(f"BS {key}: candidate_steps must be a list of non-negative ints, got {steps!r}")
        entries[int(key)] = entry
    if not entries:
        raise ValueError(
            "speculative_adaptive_config must contain at least one integer-string "
            'BS key, e.g. {"1": {"candidate_steps": [1,3,7]}}. '
            f"Got keys: {list(cfg.keys())}"
        )
    # AdaptiveSpeculativeParams.__init__: AdaptiveStepSlot(cfg={**cfg, **entry}).  Note the
    # merge also carries the other BS entries along; they are never read as slot keys.
    return AdaptiveTable(tuple((k, SlotConfig.from_merged({**cfg, **entries[k]})) for k in sorted(entries)))


def table_from_steps(steps_by_bs: Mapping[int, int | tuple[int, ...] | list[int]], **knobs: Any) -> AdaptiveTable:
    """A table from {batch-size key: steps or candidate list}; a single candidate pins the steps
    for that range (a static per-batch-size schedule).  `knobs` set SlotConfig fields."""
    slots = []
    for k in sorted(steps_by_bs):
        v = steps_by_bs[k]
        cands = (v,) if isinstance(v, int) else tuple(v)
        slots.append((int(k), SlotConfig(candidate_steps=tuple(sorted(set(cands))), **knobs)))
    return AdaptiveTable(tuple(slots))


class AdaptiveStepSlot:
    """adaptive_spec_params.py · AdaptiveStepSlot, line for line.

    target_steps = the candidate reached by walking down while ema <= prev - 0.5 +
    down_hysteresis (0.5 + down_hysteresis when prev is 0), else up while ema > current - 0.5 +
    up_hysteresis; i.e. about round(ema) + 1 limited to the candidates.  From steps 0 it always
    probes the next candidate up.
    """

    def __init__(self, initial_steps: int, cfg: SlotConfig, *, quiet: bool = False):
        self.cfg = cfg
        self.quiet = quiet  # offline replays (landscape.adaptive_level) log nothing
        self.candidate_steps = list(cfg.candidate_steps)
        assert len(self.candidate_steps) >= 1, "candidate_steps must have at least 1 value"
        if initial_steps in self.candidate_steps:
            self.current_steps = initial_steps
        else:
            self.current_steps = self.candidate_steps[len(self.candidate_steps) // 2]
        # "Initialize EMA at current steps - 1 (neutral starting point)"
        self.ema_accept_len = float(self.current_steps - 1)
        self._batch_count = 0

    def update(self, num_correct_drafts_per_req: list[int]) -> bool:
        if not num_correct_drafts_per_req:
            return False
        if self.current_steps > 0:
            batch_avg = sum(num_correct_drafts_per_req) / len(num_correct_drafts_per_req)
            self.ema_accept_len = (1 - self.cfg.ema_alpha) * self.ema_accept_len + self.cfg.ema_alpha * batch_avg
        self._batch_count += 1
        if self._batch_count <= self.cfg.warmup_batches:
            return False
        if (self._batch_count - self.cfg.warmup_batches) % self.cfg.update_interval != 0:
            return False
        return self._recompute_params()

    def _recompute_params(self) -> bool:
        old_steps = self.current_steps
        current_idx = self.candidate_steps.index(old_steps)
        old_idx = current_idx
        if old_steps == 0:
            # "Probe the smallest positive step after a zero-step nospec interval."
            current_idx = min(current_idx + 1, len(self.candidate_steps) - 1)
            target = self.candidate_steps[current_idx]
            if target > 0 and self.ema_accept_len < 0:
                self.ema_accept_len = float(target - 1)
            return self._apply_target_steps(old_steps, target)
        while current_idx > 0:
            prev_step = self.candidate_steps[current_idx - 1]
            drop_threshold = 0.5 if prev_step == 0 else prev_step - 0.5
            drop_threshold += self.cfg.down_hysteresis
            if self.ema_accept_len <= drop_threshold:
                current_idx -= 1
            else:
                break
        if not current_idx < old_idx:
            while current_idx < len(self.candidate_steps) - 1:
                rise_threshold = self.candidate_steps[current_idx] - 0.5 + self.cfg.up_hysteresis
                if self.ema_accept_len > rise_threshold:
                    current_idx += 1
                else:
                    break
        target = self.candidate_steps[current_idx]
        if self.cfg.ceiling_coeff > 0:
            # "EMA ceiling: only caps downward -- never blocks step-ups"
            ceiling = max(1, math.ceil(self.ema_accept_len * self.cfg.ceiling_coeff))
            if target > ceiling and target <= old_steps:
                while current_idx > 0 and self.candidate_steps[current_idx] > ceiling:
                    current_idx -= 1
                target = self.candidate_steps[current_idx]
        return self._apply_target_steps(old_steps, target)

    def _apply_target_steps(self, old_steps: int, target: int) -> bool:
        if target != old_steps:
            self.current_steps = target
            if not self.quiet:
                params_logger.info(UPDATED_LOG.format(old=old_steps, new=target, ema=self.ema_accept_len))
            return True
        return False


class AdaptiveSpeculativeParams:
    """adaptive_spec_params.py · AdaptiveSpeculativeParams plus AdaptiveController's notion of the
    active runtime state (`active_steps`), which logs SWITCH_LOG when it changes."""

    def __init__(
        self,
        initial_steps: int,
        table: AdaptiveTable,
        cuda_graph_bs: tuple[int, ...] | None = None,
        *,
        announce: bool = True,
        quiet: bool = False,
    ):
        self.table = table
        self.quiet = quiet
        self._slots = {k: AdaptiveStepSlot(initial_steps, cfg, quiet=quiet) for k, cfg in table.slots}
        self._cuda_graph_bs = tuple(sorted(cuda_graph_bs)) if cuda_graph_bs else None
        first = self._slots[table.keys[0]]
        if announce and not quiet:  # the engine builds a second, silent copy after start-up logged this one
            params_logger.info(INITIALIZED_LOG.format(steps=first.current_steps, candidates=first.candidate_steps))
        # AdaptiveController.init_states ends with _activate(worker.speculative_num_steps).
        self.active_steps = initial_steps

    @property
    def candidate_steps(self) -> tuple[int, ...]:
        return self.table.candidate_steps

    def slot(self, batch_size: int) -> AdaptiveStepSlot:
        return self._slots[self.table.slot_key(batch_size, self._cuda_graph_bs)]

    def get_steps_for_batch(self, batch_size: int) -> int:
        return self.slot(batch_size).current_steps

    def activate_step_by_batch(self, batch_size: int) -> int:
        """AdaptiveController.activate_step_by_batch; returns the steps this batch runs with."""
        self._activate(self.get_steps_for_batch(batch_size))
        return self.active_steps

    def on_verify_complete(self, num_correct_drafts_per_req: list[int], batch_size: int) -> int | None:
        """AdaptiveController.on_verify_complete: feed the routed slot, switch if it moved."""
        slot = self.slot(batch_size)
        if slot.update(num_correct_drafts_per_req):
            self._activate(slot.current_steps)
            return slot.current_steps
        return None

    def _activate(self, steps: int) -> None:
        # EAGLEWorkerV2.apply_runtime_state returns early when the steps are already active.
        if steps == self.active_steps:
            return
        if not self.quiet:
            worker_logger.info(
                SWITCH_LOG.format(old=self.active_steps, new=steps, old_draft=self.active_steps + 1, new_draft=steps + 1)
            )
        self.active_steps = steps


def adaptive_unsupported_reason(
    *,
    algorithm: str | None,
    topk: int | None,
    enable_dp_attention: bool = False,
    enable_multi_layer_eagle: bool = False,
    enable_two_batch_overlap: bool = False,
    enable_pdmux: bool = False,
) -> str | None:
    """adaptive_spec_params.py · adaptive_unsupported_reason, same order, same wording.

    The platform-worker check (out-of-tree platforms serving EAGLE with their own worker) never
    fires on CUDA, so it is left out.
    """
    if algorithm not in ("EAGLE", "EAGLE3"):
        return f"speculative_algorithm={algorithm} (only EAGLE/EAGLE3 are supported)"
    if topk is not None and topk != 1:
        return f"speculative_eagle_topk={topk} (only topk=1 is supported)"
    if enable_dp_attention:
        return "attention DP is not supported (adaptive tier decisions are not synchronized across DP ranks)"
    if enable_multi_layer_eagle:
        return "enable_multi_layer_eagle=True is not supported (MultiLayerEagleWorkerV2 does not implement adaptive)"
    if enable_two_batch_overlap:
        return "enable_two_batch_overlap=True is not supported (adaptive state swap would discard the TboAttnBackend wrapper)"
    if enable_pdmux:
        return "enable_pdmux=True is not supported (adaptive state swap does not update decode_attn_backend_group)"
    return None


def resolve_adaptive_steps(table: AdaptiveTable, steps: int | None) -> int:
    """speculative_hook.py · _init_adaptive_speculative_params: the start-up steps (topk is
    forced to 1 and draft tokens to steps + 1 by the caller)."""
    candidates = list(table.candidate_steps)
    if steps is None:
        steps = candidates[len(candidates) // 2]
    if steps not in candidates:
        raise ValueError(
            f"--speculative-num-steps={steps} is not in the adaptive config candidate_steps {candidates}. "
            "Pass one of those values."
        )
    return steps


def graph_states(table: AdaptiveTable, initial_steps: int, capture_bs: tuple[int, ...]) -> tuple[tuple[int, int], ...]:
    """(steps, largest captured batch) of every runtime state adaptive mode captures graphs for.

    AdaptiveController.init_states registers the start-up state (captured by the ordinary
    runners over every capture size), then builds one state per other candidate with
    `cuda_graph_bs_for_step(steps)`: only the capture sizes whose slot lists that step.  Each
    state gets its own attention backend and graph runners (EAGLEWorkerV2.
    build_adaptive_runtime_state adds each to `_additional_graph_memory_usage`), so their memory
    adds up.  A state whose pruned list is empty captures nothing (largest batch 0).
    """
    out = [(initial_steps, max(capture_bs))]
    for steps in table.candidate_steps:
        if steps == initial_steps:
            continue
        reach = [bs for bs in capture_bs if steps in table.slot_for(bs).candidate_steps]
        out.append((steps, max(reach, default=0)))
    return tuple(out)
