"""The search space and SGLang's rules on it: one trial's parameters -> `Params`.

SGLang 0.5.23 (speculative_hook.py::_handle_eagle_family):
- topk == 1 forces speculative_num_draft_tokens = steps + 1, so it is not sampled then;
- topk > 1 verifies the best draft_tokens - 1 of topk + (steps - 1) * topk^2 candidates; more
  fails at CUDA-graph capture.  We sample draft tokens in [2, steps * topk + 1], the filter of
  SGLang's own bench_speculative.py, or up to the tree bound when the config opts in;
- the three speculative flags only work together: setting some but not steps is an
  AssertionError, steps without topk a TypeError.  So all three are always passed.
"""

from __future__ import annotations


import optuna

from tuner.config import Choices, FloatRange, IntRange, SpaceConfig
from tuner.sglang_args import Params

__all__ = ["suggest", "draft_token_bounds", "grid", "check_compatible", "DEFAULT_STEPS", "DEFAULT_TOPK"]

# SGLang's auto choice for "anything else" (_auto_choose_speculative_params): (3, 1, 4).
DEFAULT_STEPS = 3
DEFAULT_TOPK = 1


def draft_token_bounds(steps: int, topk: int, bound: str = "sweep") -> tuple[int, int]:
    """Legal speculative_num_draft_tokens for a tree (topk > 1)."""
    if topk == 1:
        return steps + 1, steps + 1
    if bound == "tree":
        return 2, topk + (steps - 1) * topk * topk + 1
    return 2, steps * topk + 1


def _suggest_int(trial: optuna.Trial, name: str, space: IntRange | Choices) -> int:
    if isinstance(space, Choices):
        return int(trial.suggest_categorical(name, list(space.choices)))
    return trial.suggest_int(name, space.low, space.high, step=space.step)


def suggest(trial: optuna.Trial, space: SpaceConfig, base: Params) -> Params:
    """Sample one configuration; keys the space leaves out come from `base` (the command).

    A sampler with `bind_space` (the model sampler) is told the space first, and what it
    predicted for the configuration, or why it fell back, is recorded on the trial."""
    bind = getattr(trial.study.sampler, "bind_space", None)
    if bind is not None:
        bind(space, base)
    params = _suggest(trial, space, base)
    explain = getattr(trial.study.sampler, "explain", None)
    decision = explain(trial.study, trial.number) if explain is not None else None
    if decision is not None:
        from tuner.results import record

        trial.set_user_attr(record.MODEL_NOTE, decision.note)
        if decision.prediction:  # a fallback's fraction may be the memory model's (P(start) only)
            trial.set_user_attr(record.MODEL_PREDICTION, decision.prediction)
    return params


def _suggest(trial: optuna.Trial, space: SpaceConfig, base: Params) -> Params:
    steps = base.speculative_num_steps
    topk = base.speculative_eagle_topk
    draft = base.speculative_num_draft_tokens
    mfs = base.mem_fraction_static
    if space.speculative_num_steps is not None:
        steps = _suggest_int(trial, "speculative_num_steps", space.speculative_num_steps)
    if space.speculative_eagle_topk is not None:
        topk = _suggest_int(trial, "speculative_eagle_topk", space.speculative_eagle_topk)
    if space.mem_fraction_static is not None:
        m = space.mem_fraction_static
        if isinstance(m, Choices):
            mfs = float(trial.suggest_categorical("mem_fraction_static", list(m.choices)))
        else:
            mfs = trial.suggest_float("mem_fraction_static", m.low, m.high, step=m.step)
            if m.step:
                mfs = round(mfs, 6)
    speculative = any(k.startswith("speculative_") for k in space.searched) or base.speculative
    if not speculative:
        return Params(mem_fraction_static=mfs)
    steps = steps if steps is not None else DEFAULT_STEPS
    topk = topk if topk is not None else DEFAULT_TOPK
    if topk == 1:
        draft = steps + 1
    else:
        low, high = draft_token_bounds(steps, topk, space.draft_tokens_bound)
        if space.speculative_num_draft_tokens is not None or space.speculative_eagle_topk is not None:
            # A tree's width is searched with its topk; a [space] range narrows it.
            if space.speculative_num_draft_tokens is not None:
                low = max(low, space.speculative_num_draft_tokens.low)
                high = min(high, space.speculative_num_draft_tokens.high)
                low = min(low, high)
            draft = trial.suggest_int("speculative_num_draft_tokens", low, high)
        elif draft is None or not low <= draft <= high:
            # Not searched: the command's value if SGLang accepts it, else the widest chain.
            draft = min(max(draft or steps + 1, low), high)
    return Params(steps, topk, draft, mfs)


def grid(space: SpaceConfig, base: Params, mfs_values: list[float] | None = None) -> list[Params]:
    """Every configuration of a space (for the sampler benchmark's exhaustive front)."""
    def ints(s: IntRange | Choices | None, fallback: int | None) -> list[int | None]:
        if s is None:
            return [fallback]
        return [int(v) for v in (s.values() if isinstance(s, IntRange) else s.choices)]

    if mfs_values is None:
        m = space.mem_fraction_static
        if m is None:
            mfs_values = [base.mem_fraction_static]
        elif isinstance(m, Choices):
            mfs_values = [float(v) for v in m.choices]
        else:
            step = m.step or (m.high - m.low) / 10
            count = int(round((m.high - m.low) / step)) + 1
            mfs_values = [round(m.low + i * step, 6) for i in range(count)]
    out = []
    for steps in ints(space.speculative_num_steps, base.speculative_num_steps or DEFAULT_STEPS):
        for topk in ints(space.speculative_eagle_topk, base.speculative_eagle_topk or DEFAULT_TOPK):
            if topk == 1:
                drafts = [steps + 1]
            else:
                low, high = draft_token_bounds(steps, topk, space.draft_tokens_bound)
                if space.speculative_num_draft_tokens is not None:
                    low = max(low, space.speculative_num_draft_tokens.low)
                    high = min(high, space.speculative_num_draft_tokens.high)
                drafts = list(range(min(low, high), high + 1))
                if space.speculative_num_draft_tokens is None and space.speculative_eagle_topk is None:
                    fixed = base.speculative_num_draft_tokens or steps + 1
                    drafts = [min(max(fixed, low), high)]
            for draft in drafts:
                for mfs in mfs_values:
                    out.append(Params(steps, topk, draft, mfs))
    return out


def _distribution(name: str, space: IntRange | FloatRange | Choices) -> optuna.distributions.BaseDistribution:
    if isinstance(space, Choices):
        return optuna.distributions.CategoricalDistribution(list(space.choices))
    if isinstance(space, IntRange):
        return optuna.distributions.IntDistribution(space.low, space.high, step=space.step)
    return optuna.distributions.FloatDistribution(space.low, space.high, step=space.step)


def check_compatible(space: SpaceConfig, study: optuna.Study) -> None:
    """Refuse, before any trial, a [space] the study's earlier trials cannot share a parameter
    with (Optuna fixes each parameter's kind, and a categorical's choices, for a study)."""
    from tuner.errors import ConfigError

    wanted = {k: _distribution(k, getattr(space, k)) for k in ("speculative_num_steps", "speculative_eagle_topk", "mem_fraction_static")
              if getattr(space, k) is not None}
    seen: dict[str, optuna.distributions.BaseDistribution] = {}
    for t in study.get_trials(deepcopy=False):
        for name, dist in t.distributions.items():
            seen.setdefault(name, dist)
    for name, dist in wanted.items():
        old = seen.get(name)
        if old is None:
            continue
        same_choices = not isinstance(old, optuna.distributions.CategoricalDistribution) or list(old.choices) == list(dist.choices)
        try:
            optuna.distributions.check_distribution_compatibility(old, dist)
        except ValueError:
            same_choices = False
        if not same_choices:
            raise ConfigError(
                f"[space] {name}: study {study.study_name!r} already samples it as {_describe(old)}, not {_describe(dist)}; "
                "keep that form (a range stays a range, choices stay the same choices) or use another --study-name"
            )


def _describe(dist: optuna.distributions.BaseDistribution) -> str:
    if isinstance(dist, optuna.distributions.CategoricalDistribution):
        return f"choices {list(dist.choices)}"
    return f"a range {dist.low}..{dist.high}"
