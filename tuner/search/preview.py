"""What a run would launch first, asked of the study's sampler without telling the study.

The finished trials of the real study (if any) are copied into an in-memory study with the same
sampler; the warm start is queued there as a new study would queue it, and the first proposals
are asked of that copy.  Nothing is written to the real store.  Later proposals depend on what
these measure, so only the first few are meaningful.
"""

from __future__ import annotations

import optuna

from tuner.config import Config
from tuner.search.samplers import make_sampler
from tuner.search.space import suggest
from tuner.search.warm_start import warm_start
from tuner.sglang_args import Params

__all__ = ["first_proposals"]


def first_proposals(config: Config, study: optuna.Study | None, n: int, *, metric_names: list[str],
                    sampler_name: str | None = None, seed: int | None = None) -> list[tuple[Params, str]]:
    """The parameter sets a run would launch first, each with where it comes from: the queued
    ones (warm start, retries) and the sampler's first proposal, at most `n` (what the sampler
    proposes after that depends on what these measure)."""
    sampler = make_sampler(sampler_name or config.study.sampler, seed if seed is not None else config.study.seed,
                           n_objectives=len(metric_names), constraints=config.constraints)
    copy = optuna.create_study(storage=optuna.storages.InMemoryStorage(), sampler=sampler,
                               directions=["maximize"] * len(metric_names))
    copy.set_metric_names(metric_names)
    if study is not None:
        for key, value in study.user_attrs.items():
            copy.set_user_attr(key, value)
        copy.add_trials([t for t in study.get_trials(deepcopy=False) if t.state.is_finished()])
        for t in study.get_trials(deepcopy=False, states=(optuna.trial.TrialState.WAITING,)):
            copy.enqueue_trial(t.params, user_attrs=dict(t.user_attrs))
    if config.study.enqueue_current:
        warm_start(config, copy)
    base = config.server.command_line.params()
    out = []
    for _ in range(n):
        trial = copy.ask()  # left RUNNING: the next proposal treats it as taken, as a run would
        source = trial.user_attrs.get("warm_start") or ("retry" if trial.user_attrs.get("retry_of") is not None else "sampler")
        out.append((suggest(trial, config.space, base), "warm start: " + source if "warm_start" in trial.user_attrs else source))
        if source == "sampler":
            break
    return out
