"""The first trials of a new study: the operator's current speculative shape and SGLang's own
default for the model family, so the study says early how good the status quo is."""

from __future__ import annotations

import optuna

from tuner.config import Choices, Config
from tuner.results import record
from tuner.search.space import draft_token_bounds
from tuner.sglang_args import CommandLine, Params, family_default

__all__ = ["warm_start", "architecture_guess", "family_default_from_server"]


def architecture_guess(model_path: str) -> str | None:
    """Before any server answered, the architecture a model path suggests; the study replaces
    it with `/model_info.architectures[0]` once a server did (tuner.trial)."""
    return "LlamaForCausalLM" if "llama" in model_path.lower() and "llama-4" not in model_path.lower() else None


def _fit(value, space, *, integer: bool):
    """A value moved into a [space] entry: clipped to a range, or the nearest choice."""
    if value is None:
        return None
    if isinstance(space, Choices):
        return min(space.choices, key=lambda c: abs(float(c) - float(value)))
    lo, hi = space.low, space.high
    value = min(max(value, lo), hi)
    if integer:
        return int(round(value))
    if space.step:
        value = lo + round((value - lo) / space.step) * space.step
    return round(value, 6)


def _in_space(config: Config, p: Params) -> dict:
    """`p`'s shape moved into the [space]: shapes only (the default sampler puts
    mem_fraction_static at the memory edge itself, and pinning it measurably hurts:
    benchmarks/results/sampler_benchmark.md)."""
    space = config.space
    params: dict = {}
    if space.speculative_num_steps is not None:
        params["speculative_num_steps"] = _fit(p.speculative_num_steps, space.speculative_num_steps, integer=True)
    if space.speculative_eagle_topk is not None:
        params["speculative_eagle_topk"] = _fit(p.speculative_eagle_topk or 1, space.speculative_eagle_topk, integer=True)
    topk = params.get("speculative_eagle_topk", p.speculative_eagle_topk or 1)
    steps = params.get("speculative_num_steps", p.speculative_num_steps or 3)
    if topk and topk > 1 and p.speculative_num_draft_tokens and (space.speculative_eagle_topk or space.speculative_num_draft_tokens):
        low, high = draft_token_bounds(steps, topk, space.draft_tokens_bound)
        params["speculative_num_draft_tokens"] = min(max(p.speculative_num_draft_tokens, low), high)
    return {k: v for k, v in params.items() if v is not None}


def warm_start(config: Config, study: optuna.Study, architecture: str | None = None,
               command: CommandLine | None = None) -> list[dict]:
    """Enqueue, on a new study, the current shape and SGLang's family default; what was queued."""
    if study.trials:
        return []
    command = command or config.server.command_line
    current = command.params()
    architecture = architecture or architecture_guess(command.model_path)
    steps, topk, draft = family_default(architecture, command.algorithm)
    candidates = []
    if current.speculative_num_steps is not None:
        candidates.append(("current", current))
    candidates.append(("sglang_default", Params(steps, topk, draft, None)))
    queued: list[dict] = []
    for label, p in candidates:
        params = _in_space(config, p)
        if params and params not in queued:
            study.enqueue_trial(params, user_attrs={record.WARM_START: label}, skip_if_exists=True)
            queued.append(params)
    return queued


def family_default_from_server(config: Config, study: optuna.Study, architecture: str | None,
                               command: CommandLine | None = None) -> dict | None:
    """Once a server has said what it is (`/model_info.architectures[0]`), queue SGLang's real
    default for that architecture if the warm start guessed another from the model path.
    Recorded on the study so it happens once; returns what was queued."""
    if not architecture or study.user_attrs.get(record.ARCHITECTURE):
        return None
    study.set_user_attr(record.ARCHITECTURE, architecture)
    command = command or config.server.command_line
    guessed = family_default(architecture_guess(command.model_path), command.algorithm)
    actual = family_default(architecture, command.algorithm)
    if actual == guessed:
        return None
    params = _in_space(config, Params(*actual, None))
    if params:
        study.enqueue_trial(params, user_attrs={record.WARM_START: "sglang_default"}, skip_if_exists=True)
    return params or None
