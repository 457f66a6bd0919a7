"""SGLang 0.5.23's command line and the part of its argument resolution the emulator models.

The parser is built from `sglang_0_5_23_flags.json`, the full option table of the real
`sglang serve` parser, so abbreviations, aliases and errors behave as they do there (`--tp`
is an abbreviation of `--tp-size`; `--cuda-graph-max-bs` is ambiguous).  Resolution follows
`srt/arg_groups/pipeline.py`'s order: GPU memory settings, then the speculative hook; its
messages are SGLang's, verbatim.
"""

from __future__ import annotations

import argparse
import json
import logging
from dataclasses import dataclass, field
from importlib import resources
from typing import Any

from .adaptive import (
    DEFAULT_ADAPTIVE_CONFIG,
    DISABLED_LOG,
    AdaptiveTable,
    adaptive_unsupported_reason,
    hook_logger,
    load_adaptive_config,
    resolve_adaptive_steps,
)
from .model import Profile, SpecShape, default_graph_settings, default_mem_fraction_static

__all__ = ["build_parser", "parse_args", "Resolved", "resolve", "model_not_found"]

logger = logging.getLogger("sglang.srt.arg_groups")

# Algorithms whose spec shape the emulator models; the rest of 0.5.23's registry is refused.
_EAGLE_FAMILY = ("EAGLE", "EAGLE3", "STANDALONE")
_KNOWN = _EAGLE_FAMILY + ("NGRAM", "DFLASH", "DSPARK", "UNO", "FROZEN_KV_MTP")
_ALIASES = {"NEXTN": "EAGLE"}

# speculative/adaptive_spec_params.py DEFAULT_ADAPTIVE_CONFIG: batch-size key -> candidate steps
# (kept for existing importers; adaptive.py holds the full config).
ADAPTIVE_CANDIDATES: tuple[tuple[int, tuple[int, ...]], ...] = tuple(
    (int(k), tuple(v["candidate_steps"])) for k, v in DEFAULT_ADAPTIVE_CONFIG.items()
)


def _flag_table() -> list[dict[str, Any]]:
    text = resources.files(__package__).joinpath("sglang_0_5_23_flags.json").read_text()
    return json.loads(text)["flags"]


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="sglang serve")
    types = {"int": int, "float": float, "str": str, None: None}
    for flag in _flag_table():
        kwargs: dict[str, Any] = {"dest": flag["dest"], "default": flag["default"]}
        if flag["action"] == "store_true":
            kwargs["action"] = "store_true"
        elif flag["action"] == "boolean_optional":
            kwargs["action"] = argparse.BooleanOptionalAction
            options = [o for o in flag["options"] if not o.startswith("--no-")]
            parser.add_argument(*options, **kwargs)
            continue
        else:
            kwargs["type"] = types[flag["type"]]
            if flag["nargs"]:
                kwargs["nargs"] = flag["nargs"]
            if flag["choices"]:
                kwargs["choices"] = flag["choices"]
            if flag.get("required"):
                kwargs["required"] = True
                del kwargs["default"]
        parser.add_argument(*flag["options"], **kwargs)
    return parser


def parse_args(argv: list[str]) -> argparse.Namespace:
    """Parse like `sglang serve` (argparse errors exit 2 with its usage line)."""
    return build_parser().parse_args(argv)


def model_not_found(model_path: str) -> OSError:
    """What transformers raises for a model path that is neither a folder nor a hub id."""
    return OSError(
        f"{model_path} is not a local folder and is not a valid model identifier listed on "
        "'https://huggingface.co/models'\nIf this is a private repository, make sure to pass "
        "a token having permission to this repo either by logging in with `hf auth login` "
        "or by passing `token=<your_token>`"
    )


@dataclass
class Resolved:
    """The resolved server arguments the emulator acts on (plus every raw flag, for
    /server_info)."""

    raw: dict[str, Any]
    profile: Profile
    tp: int
    dp: int
    spec: SpecShape
    mem_fraction_static: float
    max_running_requests: int | None
    chunked_prefill_size: int
    cuda_graph_max_bs: int
    page_size: int
    attention_backend_set: bool
    adaptive: bool = False
    adaptive_max_steps: int = 0
    adaptive_table: AdaptiveTable | None = None  # the loaded --speculative-adaptive-config
    draft_missing_error: str | None = None
    warnings: list[str] = field(default_factory=list)

    def as_dict(self) -> dict[str, Any]:
        """`server_args.resolved_dict()`: every argument with resolution applied."""
        out = dict(self.raw)
        out.update(
            tp_size=self.tp,
            dp_size=self.dp,
            mem_fraction_static=self.mem_fraction_static,
            max_running_requests=self.max_running_requests,
            chunked_prefill_size=self.chunked_prefill_size,
            cuda_graph_max_bs_decode=self.cuda_graph_max_bs,
            page_size=self.page_size,
            speculative_algorithm=self.spec.algorithm,
            speculative_num_steps=self.spec.steps if self.spec.enabled else None,
            speculative_eagle_topk=self.spec.topk if self.spec.enabled else None,
            speculative_num_draft_tokens=self.spec.draft_tokens if self.spec.enabled else None,
            speculative_adaptive=self.adaptive,
        )
        if out.get("served_model_name") is None:
            out["served_model_name"] = out["model_path"]
        if out.get("api_key"):
            out["api_key"] = "<redacted>"
        return out


def _warn(resolved_warnings: list[str], message: str, log: logging.Logger = logger) -> None:
    resolved_warnings.append(message)
    log.warning(message)


def resolve(ns: argparse.Namespace, profile: Profile) -> Resolved:
    """Resolve like 0.5.23: raise the same exceptions, log the same warnings."""
    raw = vars(ns).copy()
    warnings: list[str] = []
    tp, dp = ns.tp_size, ns.dp_size
    if tp is None or tp < 1:
        raise ValueError(f"tp_size must be a positive integer, got {tp}")

    # memory_hook.handle_gpu_memory_settings
    default_chunk, default_max_bs = default_graph_settings(profile.gpu.total_mib, tp)
    chunked = ns.chunked_prefill_size if ns.chunked_prefill_size is not None else default_chunk
    max_bs = ns.cuda_graph_max_bs_decode
    if max_bs is None:
        max_bs = default_max_bs
        if ns.max_running_requests is not None and max_bs > ns.max_running_requests:
            max_bs = ns.max_running_requests
    mfs = ns.mem_fraction_static
    if mfs is None:
        mfs = default_mem_fraction_static(
            gpu_mib=profile.gpu.total_mib, tp=tp, chunked_prefill_size=chunked, decode_max_bs=max_bs
        )

    running = ns.max_running_requests
    page_size = ns.page_size or 1
    spec = SpecShape(None, 0, 0, 0)
    adaptive = False
    adaptive_max = 0
    adaptive_table: AdaptiveTable | None = None
    draft_error = None

    algorithm = ns.speculative_algorithm
    if algorithm is not None:
        algorithm = _ALIASES.get(algorithm.upper(), algorithm.upper())
        if algorithm not in _KNOWN:
            raise ValueError(f"Unknown speculative algorithm name: {ns.speculative_algorithm}")
        if algorithm not in _EAGLE_FAMILY + ("NGRAM",):
            raise NotImplementedError(
                f"sglang emulator: speculative algorithm {algorithm} is not emulated; "
                "use EAGLE, EAGLE3, NEXTN, STANDALONE or NGRAM"
            )
        if running is None:
            running = 48
            _warn(
                warnings,
                "Max running requests is reset to 48 for speculative decoding. You can override "
                "this by explicitly setting --max-running-requests.",
            )
        steps, topk, draft = (
            ns.speculative_num_steps,
            ns.speculative_eagle_topk,
            ns.speculative_num_draft_tokens,
        )
        if algorithm == "NGRAM":
            topk = ns.speculative_ngram_max_bfs_breadth
            if draft is None:
                draft = 12
                _warn(
                    warnings,
                    "speculative_num_draft_tokens is set to 12 by default for ngram speculative "
                    "decoding. You can override this by explicitly setting "
                    "--speculative-num-draft-tokens.",
                )
            if steps is None:
                steps = draft // topk
            spec = SpecShape(algorithm, max(steps, 1), topk, draft)
            if ns.speculative_adaptive:
                # handle_speculative_decoding runs _maybe_disable_adaptive for every algorithm.
                reason = adaptive_unsupported_reason(algorithm=algorithm, topk=topk)
                _warn(warnings, DISABLED_LOG.format(reason=reason), hook_logger)
        else:
            if algorithm == "STANDALONE" and ns.enable_dp_attention:
                raise ValueError(
                    "Currently standalone speculative decoding does not support dp attention."
                )
            if ns.speculative_adaptive:
                # speculative_hook.handle_speculative_decoding: after the family handler (which
                # skipped the auto shape because adaptive was on), _maybe_disable_adaptive may
                # fall back silently, else _init_adaptive_speculative_params loads the config.
                reason = adaptive_unsupported_reason(
                    algorithm=algorithm,
                    topk=topk,
                    enable_dp_attention=bool(ns.enable_dp_attention),
                    enable_multi_layer_eagle=bool(getattr(ns, "enable_multi_layer_eagle", False)),
                    enable_two_batch_overlap=bool(getattr(ns, "enable_two_batch_overlap", False)),
                    enable_pdmux=bool(getattr(ns, "enable_pdmux", False)),
                )
                if reason is not None:
                    _warn(warnings, DISABLED_LOG.format(reason=reason), hook_logger)
                else:
                    adaptive_table = load_adaptive_config(ns.speculative_adaptive_config)
                    adaptive = True
                    steps = resolve_adaptive_steps(adaptive_table, steps)
                    topk, draft = 1, steps + 1
                    adaptive_max = max(adaptive_table.candidate_steps)
            if not adaptive and steps is None:
                assert topk is None and draft is None
                steps, topk, draft = (3, 1, 4) if algorithm == "STANDALONE" else profile.auto_spec
            if ns.attention_backend == "trtllm_mha" and topk > 1:
                raise ValueError("trtllm_mha backend only supports topk = 1 for speculative decoding.")
            if topk == 1 and draft != steps + 1:
                _warn(
                    warnings,
                    "speculative_num_draft_tokens is adjusted to speculative_num_steps + 1 when "
                    "speculative_eagle_topk == 1",
                )
                draft = steps + 1
            backends = ("flashinfer", "fa3", "triton")
            if topk > 1 and page_size > 1 and ns.attention_backend not in backends:
                raise ValueError(
                    f"speculative_eagle_topk > 1 with page_size > 1 is only supported on "
                    f"{backends}; got attention_backend={ns.attention_backend!r}. Use "
                    "page_size == 1 or one of those backends."
                )
            if draft is None:
                # Resolution lets topk > 1 without draft tokens through; the scheduler's pool
                # sizing is where it breaks.
                draft_error = "unsupported operand type(s) for *: 'int' and 'NoneType'"
                draft = 0
            spec = SpecShape(algorithm, steps, topk, draft)

    return Resolved(
        raw=raw,
        profile=profile,
        tp=tp,
        dp=dp,
        spec=spec,
        mem_fraction_static=mfs,
        max_running_requests=running,
        chunked_prefill_size=chunked,
        cuda_graph_max_bs=max_bs,
        page_size=page_size,
        attention_backend_set=ns.attention_backend is not None,
        adaptive=adaptive,
        adaptive_max_steps=adaptive_max,
        adaptive_table=adaptive_table,
        draft_missing_error=draft_error,
        warnings=warnings,
    )
