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
import os
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

__all__ = ["build_parser", "parse_args", "Resolved", "resolve", "model_not_found", "emulated_version", "VERSION_ENV"]

VERSION_ENV = "SGLANG_EMULATOR_VERSION"
_VERSIONS = ("0.5.23", "0.5.9")


def emulated_version() -> str:
    """The SGLang release the emulator plays: 0.5.23 unless `SGLANG_EMULATOR_VERSION=0.5.9`."""
    version = os.environ.get(VERSION_ENV, "0.5.23")
    return version if version in _VERSIONS else "0.5.23"


def is_059() -> bool:
    return emulated_version() == "0.5.9"

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
    """The option table of the emulated release (`sglang_0_5_9_flags.json` is extracted the same
    way from the 0.5.9 wheel: its `source` field says how)."""
    name = f"sglang_{emulated_version().replace('.', '_')}_flags.json"
    text = resources.files(__package__).joinpath(name).read_text()
    return json.loads(text)["flags"]


# 0.5.9's ServerArgs.from_cli_args renames the long-form destinations.
_059_RENAMES = {
    "tensor_parallel_size": "tp_size",
    "pipeline_parallel_size": "pp_size",
    "data_parallel_size": "dp_size",
    "expert_parallel_size": "ep_size",
}


def human_readable_int(value: str | int | None) -> int | None:
    """utils/common.py · human_readable_int, the type of --context-length, --max-total-tokens and
    --max-prefill-tokens (0.5.23's option table says str: its type_parser is this): SI (k, M, G, T;
    decimals allowed) and IEC (Ki, Mi, Gi, Ti) suffixes."""
    if value is None or isinstance(value, int):
        return value
    import re
    from decimal import Decimal

    match = re.fullmatch(r"(\d+(?:\.\d+)?)(Ki|Mi|Gi|Ti|k|M|G|T)", value.strip())
    if not match:
        return int(value)
    number, suffix = match.groups()
    iec = {"Ki": 2**10, "Mi": 2**20, "Gi": 2**30, "Ti": 2**40}
    if suffix in iec:
        return int(number) * iec[suffix]
    return int(Decimal(number) * {"k": 10**3, "M": 10**6, "G": 10**9, "T": 10**12}[suffix])


# 0.5.23's fields parsed by human_readable_int (arg_groups/fields: model.py, schedule.py, exec_.py);
# the extracted table records them as str.  0.5.9 declares them int, which this also reads.
_HUMAN_READABLE = {"context_length", "max_total_tokens", "max_prefill_tokens", "cuda_graph_prefill_max_context"}


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
            kwargs["type"] = human_readable_int if flag["dest"] in _HUMAN_READABLE else types.get(flag["type"], str)
            if flag["nargs"]:
                kwargs["nargs"] = flag["nargs"]
            if flag["choices"]:
                kwargs["choices"] = flag["choices"]
            if flag.get("required"):
                kwargs["required"] = True
                del kwargs["default"]
        parser.add_argument(*flag["options"], **kwargs)
    return parser


def merge_config(parser: argparse.ArgumentParser, argv: list[str]) -> list[str]:
    """`--config file.yaml` as `server_args.py · prepare_server_args` merges it
    (`utils/server_args_config_parser.py · ConfigArgumentMerger.merge_config_with_args`): the
    YAML's keys become flags placed *before* the command line, so the command line wins; a
    store_true key adds its flag only when true, a list becomes several values, a dict JSON."""
    if "--config" not in argv:
        return argv
    indices = [i for i, arg in enumerate(argv) if arg == "--config"]
    if len(indices) > 1:
        raise ValueError("Multiple config files specified! Only one allowed.")
    at = indices[0]
    if at == len(argv) - 1:
        raise ValueError("No config file specified after --config flag!")
    path = argv[at + 1]
    suffix = os.path.splitext(path)[1]
    if suffix.lower() not in (".yaml", ".yml"):
        raise ValueError(f"Config file must be YAML format, got: {suffix}")
    if not os.path.exists(path):
        raise ValueError(f"Config file not found: {path}")
    import yaml  # only a --config launch needs it

    with open(path) as fh:
        data = yaml.safe_load(fh) or {}
    if not isinstance(data, dict):
        raise ValueError("Config file must contain a dictionary at root level")
    store_true = {
        key
        for action in parser._actions
        if isinstance(action, argparse._StoreTrueAction)
        for key in {action.dest} | {o[2:].replace("-", "_") for o in action.option_strings if o.startswith("--")}
    }
    merged: list[str] = []
    for key, value in data.items():
        if isinstance(value, bool):
            if key.replace("-", "_") in store_true:
                if value:
                    merged.append(f"--{key}")
            else:
                merged += [f"--{key}", str(value).lower()]
        elif isinstance(value, list):
            if value:
                merged += [f"--{key}", *(str(v) for v in value)]
        elif isinstance(value, dict):
            merged += [f"--{key}", json.dumps(value)]
        else:
            merged += [f"--{key}", str(value)]
    return merged + argv[:at] + argv[at + 2 :]


def parse_args(argv: list[str]) -> argparse.Namespace:
    """Parse like `sglang serve` (argparse errors exit 2 with its usage line)."""
    parser = build_parser()
    ns = parser.parse_args(merge_config(parser, argv))
    for old, new in _059_RENAMES.items():
        if hasattr(ns, old):
            setattr(ns, new, getattr(ns, old))
            delattr(ns, old)
    return ns


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
    attention_backend: str | None = None  # resolved (overrides.py · _attention_backend_default)
    dp_attention: bool = False  # --enable-dp-attention with dp > 1
    version: str = "0.5.23"

    @property
    def attn_dp_size(self) -> int:
        """Ranks a global --max-running-requests is split over (resolve_max_num_reqs)."""
        return self.dp if self.dp_attention else 1

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
            attention_backend=self.attention_backend,
        )
        if self.version != "0.5.9":
            out["speculative_adaptive"] = self.adaptive
        if out.get("served_model_name") is None:
            out["served_model_name"] = out["model_path"]
        if out.get("api_key"):
            out["api_key"] = "<redacted>"
        return out


def _warn(resolved_warnings: list[str], message: str, log: logging.Logger = logger) -> None:
    resolved_warnings.append(message)
    log.warning(message)


def default_attention_backend(profile: Profile, topk: int | None, page_size: int | None) -> str:
    """`arg_groups/model_override_base.py · get_default_attn_backend` for the MHA models the
    profiles serve: FA3 on Hopper only while `utils/common.py · is_no_spec_infer_or_topk_one`
    holds (no topk, or topk 1 with page size 1), else FlashInfer; SM100 gets trtllm_mha;
    everything else (SM120 included) FlashInfer."""
    no_tree = topk is None or (topk == 1 and (page_size == 1 or page_size is None))
    if profile.gpu.compute_capability == "9.0" and no_tree:
        return "fa3"
    if profile.gpu.compute_capability in ("10.0", "10.3") and no_tree:
        return "trtllm_mha"
    return "flashinfer"


@dataclass
class _Speculation:
    """What the speculative hook resolved: the shape, adaptive mode, the running-request cap."""

    spec: SpecShape
    running: int | None
    adaptive: bool = False
    adaptive_max: int = 0
    adaptive_table: AdaptiveTable | None = None
    draft_error: str | None = None


def resolve(ns: argparse.Namespace, profile: Profile) -> Resolved:
    """Resolve like 0.5.23 (or 0.5.9): raise the same exceptions, log the same warnings."""
    raw = vars(ns).copy()
    old = is_059()
    warnings: list[str] = []
    tp, dp = ns.tp_size, ns.dp_size
    if tp is None or tp < 1:
        raise ValueError(f"tp_size must be a positive integer, got {tp}")
    dp = dp or 1
    dp_attention = bool(getattr(ns, "enable_dp_attention", False)) and dp > 1
    chunked, max_bs, mfs = _memory_settings(ns, profile, tp, old)
    page_size = ns.page_size or 1
    sp = _speculation(ns, profile, warnings, old, page_size)

    # overrides.py · _attention_backend_default, after the speculative hook resolved topk.
    backend = ns.attention_backend
    if backend is None:
        backend = default_attention_backend(profile, sp.spec.topk if sp.spec.enabled else None, page_size)
        logger.info(f"Attention backend not specified. Use {backend} backend by default.")

    return Resolved(
        raw=raw,
        profile=profile,
        tp=tp,
        dp=dp,
        spec=sp.spec,
        mem_fraction_static=mfs,
        max_running_requests=sp.running,
        chunked_prefill_size=chunked,
        cuda_graph_max_bs=max_bs,
        page_size=page_size,
        attention_backend_set=ns.attention_backend is not None,
        adaptive=sp.adaptive,
        adaptive_max_steps=sp.adaptive_max,
        adaptive_table=sp.adaptive_table,
        draft_missing_error=sp.draft_error,
        warnings=warnings,
        attention_backend=backend,
        dp_attention=dp_attention,
        version=emulated_version(),
    )


def _memory_settings(ns: argparse.Namespace, profile: Profile, tp: int, old: bool) -> tuple[int, int, float]:
    """memory_hook.handle_gpu_memory_settings: chunked prefill, the decode graph batch, the fraction."""
    default_chunk, default_max_bs = default_graph_settings(profile.gpu.total_mib, tp)
    chunked = ns.chunked_prefill_size if ns.chunked_prefill_size is not None else default_chunk
    max_bs = getattr(ns, "cuda_graph_max_bs_decode", None) if not old else getattr(ns, "cuda_graph_max_bs", None)
    if max_bs is None:
        max_bs = default_max_bs
        if ns.max_running_requests is not None and max_bs > ns.max_running_requests:
            max_bs = ns.max_running_requests
    mfs = ns.mem_fraction_static
    if mfs is None:
        mfs = default_mem_fraction_static(
            gpu_mib=profile.gpu.total_mib, tp=tp, chunked_prefill_size=chunked, decode_max_bs=max_bs
        )
    return chunked, max_bs, mfs


def _speculation(ns: argparse.Namespace, profile: Profile, warnings: list[str], old: bool, page_size: int) -> _Speculation:
    """speculative_hook.handle_speculative_decoding: the algorithm's family handler."""
    running = ns.max_running_requests
    algorithm = ns.speculative_algorithm
    if algorithm is None:
        return _Speculation(SpecShape(None, 0, 0, 0), running)
    algorithm = _ALIASES.get(algorithm.upper(), algorithm.upper())
    if algorithm not in _KNOWN:
        raise ValueError(f"Unknown speculative algorithm name: {ns.speculative_algorithm}")
    if algorithm not in _EAGLE_FAMILY + ("NGRAM", "DFLASH", "DSPARK"):
        raise NotImplementedError(
            f"sglang emulator: speculative algorithm {algorithm} is not emulated; "
            "use EAGLE, EAGLE3, NEXTN, STANDALONE, NGRAM, DFLASH or DSPARK"
        )
    if running is None:
        running = 48
        _warn(
            warnings,
            "Max running requests is reset to 48 for speculative decoding. You can override "
            "this by explicitly setting --max-running-requests.",
        )
    if algorithm == "NGRAM":
        return _Speculation(_ngram(ns, warnings, old, page_size), running)
    if algorithm in ("DFLASH", "DSPARK"):
        return _Speculation(_dflash(ns, warnings, algorithm), running)
    sp = _eagle(ns, profile, warnings, old, page_size, algorithm)
    sp.running = running
    return sp


def _ngram(ns: argparse.Namespace, warnings: list[str], old: bool, page_size: int) -> SpecShape:
    """speculative_hook.py · _handle_ngram: topk is always the BFS breadth."""
    steps, draft = ns.speculative_num_steps, ns.speculative_num_draft_tokens
    topk = ns.speculative_ngram_max_bfs_breadth
    if old and topk > 1 and page_size > 1 and ns.attention_backend != "flashinfer":
        raise ValueError(
            f"speculative_eagle_topk({topk}) > 1 with page_size({page_size}) > 1 is unstable "
            "and produces incorrect results for paged attention backends. This combination "
            "is only supported for the 'flashinfer' backend."
        )
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
    if getattr(ns, "speculative_adaptive", False):
        # handle_speculative_decoding runs _maybe_disable_adaptive for every algorithm.
        reason = adaptive_unsupported_reason(algorithm="NGRAM", topk=topk)
        _warn(warnings, DISABLED_LOG.format(reason=reason), hook_logger)
    return SpecShape("NGRAM", max(steps, 1), topk, draft)


def _dflash(ns: argparse.Namespace, warnings: list[str], algorithm: str) -> SpecShape:
    """speculative_hook.py · _handle_dflash / _handle_dspark: steps and topk forced to 1."""
    steps, topk, draft = ns.speculative_num_steps, ns.speculative_eagle_topk, ns.speculative_num_draft_tokens
    name = "DFLASH" if algorithm == "DFLASH" else "DSpark"
    if algorithm == "DFLASH" and ns.speculative_draft_model_path is None:
        raise ValueError(
            "DFLASH speculative decoding requires setting --speculative-draft-model-path."
        )
    for field_name, value in (("speculative_num_steps", steps), ("speculative_eagle_topk", topk)):
        if value is not None and int(value) != 1:
            _warn(warnings, f"{name} only supports {field_name} == 1; overriding {field_name}={value} to 1.")
    block = getattr(ns, "speculative_dflash_block_size", None)
    if draft is None:
        draft = int(block) if block else 16
        _warn(warnings, f"speculative_num_draft_tokens is not set; defaulting to {draft} for {algorithm}.")
    if getattr(ns, "speculative_adaptive", False):
        # handle_speculative_decoding runs _maybe_disable_adaptive for every algorithm.
        reason = adaptive_unsupported_reason(algorithm=algorithm, topk=topk)
        _warn(warnings, DISABLED_LOG.format(reason=reason), hook_logger)
    return SpecShape(algorithm, 1, 1, draft)


def _eagle(ns: argparse.Namespace, profile: Profile, warnings: list[str], old: bool, page_size: int, algorithm: str) -> _Speculation:
    """The EAGLE family (EAGLE, EAGLE3, NEXTN, STANDALONE): adaptive mode, the auto shape,
    topk 1 forcing draft = steps + 1, the paged-attention rules."""
    steps, topk, draft = ns.speculative_num_steps, ns.speculative_eagle_topk, ns.speculative_num_draft_tokens
    if algorithm == "STANDALONE" and getattr(ns, "enable_dp_attention", False):
        raise ValueError(
            "Currently standalone speculative decoding does not support dp attention."
        )
    if old and os.environ.get("SGLANG_ENABLE_SPEC_V2", "").lower() in ("1", "true"):
        # 0.5.9 server_args.py · _handle_speculative_decoding
        if topk is not None and topk > 1:
            raise ValueError("Spec v2 currently only supports topk = 1 for speculative decoding.")
    out = _Speculation(SpecShape(None, 0, 0, 0), None)
    if getattr(ns, "speculative_adaptive", False):
        steps, topk, draft = _adaptive(ns, warnings, algorithm, out, steps, topk, draft)
    if not out.adaptive and steps is None:
        assert topk is None and draft is None
        steps, topk, draft = (3, 1, 4) if algorithm == "STANDALONE" else auto_speculative_params(profile.architecture)
    if ns.attention_backend == "trtllm_mha" and topk > 1:
        raise ValueError("trtllm_mha backend only supports topk = 1 for speculative decoding.")
    if topk == 1 and draft != steps + 1:
        _warn(
            warnings,
            "speculative_num_draft_tokens is adjusted to speculative_num_steps + 1 when "
            "speculative_eagle_topk == 1",
        )
        draft = steps + 1
    _check_paged_tree(ns, old, page_size, topk)
    if draft is None:
        # Resolution lets topk > 1 without draft tokens through; the scheduler's pool
        # sizing is where it breaks.
        out.draft_error = "unsupported operand type(s) for *: 'int' and 'NoneType'"
        draft = 0
    out.spec = SpecShape(algorithm, steps, topk, draft)
    return out


def _adaptive(ns: argparse.Namespace, warnings: list[str], algorithm: str, out: _Speculation, steps, topk, draft):
    """speculative_hook.handle_speculative_decoding: after the family handler (which skipped the
    auto shape because adaptive was on), _maybe_disable_adaptive may fall back silently, else
    _init_adaptive_speculative_params loads the config.  Sets `out`'s adaptive fields."""
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
        return steps, topk, draft
    out.adaptive_table = load_adaptive_config(ns.speculative_adaptive_config)
    out.adaptive = True
    steps = resolve_adaptive_steps(out.adaptive_table, steps)
    out.adaptive_max = max(out.adaptive_table.candidate_steps)
    return steps, 1, steps + 1


def _check_paged_tree(ns: argparse.Namespace, old: bool, page_size: int, topk: int) -> None:
    """A tree (topk > 1) over pages larger than one token: only some backends handle it."""
    if old:
        if topk > 1 and page_size > 1 and ns.attention_backend not in ("flashinfer", "fa3"):
            raise ValueError(
                "speculative_eagle_topk > 1 with page_size > 1 is unstable and produces "
                "incorrect results for paged attention backends. This combination is only "
                "supported for the 'flashinfer' backend."
            )
        return
    backends = ("flashinfer", "fa3", "triton")
    if topk > 1 and page_size > 1 and ns.attention_backend not in backends:
        raise ValueError(
            f"speculative_eagle_topk > 1 with page_size > 1 is only supported on "
            f"{backends}; got attention_backend={ns.attention_backend!r}. Use "
            "page_size == 1 or one of those backends."
        )


def auto_speculative_params(architecture: str) -> tuple[int, int, int]:
    """`speculative_hook.py · _auto_choose_speculative_params`, keyed on architectures[0]."""
    if architecture in ("LlamaForCausalLM", "Grok1ForCausalLM", "Grok1VForCausalLM"):
        return (5, 4, 8)
    return (3, 1, 4)
