"""Samplers by name (`--sampler`, `[study] sampler`).  The default, "auto", is chosen from the
benchmark in benchmarks/sampler_benchmark.py (see its output in benchmarks/results/)."""

from __future__ import annotations

from typing import Sequence

import optuna

from .config import ConstraintsConfig
from .errors import ConfigError

__all__ = ["make_sampler", "SAMPLERS", "constraints_func"]

SAMPLERS = ("auto", "tpe", "nsga2", "gp", "random")


def constraints_func(constraints: ConstraintsConfig):
    """Optuna's constraint values (<= 0 is feasible) from the user attrs a trial recorded."""
    if constraints.p99_itl_ms is None and constraints.ttft_ms is None:
        return None

    count = (constraints.p99_itl_ms is not None) + (constraints.ttft_ms is not None)

    def values(trial: optuna.trial.FrozenTrial) -> Sequence[float]:
        # A trial that measured nothing (pruned, failed) counts as violating every SLO.
        return trial.user_attrs.get("constraints") or [1e9] * count

    return values


def make_sampler(name: str, seed: int | None, *, n_objectives: int, constraints: ConstraintsConfig | None = None) -> optuna.samplers.BaseSampler:
    name = (name or "auto").lower()
    cfunc = constraints_func(constraints) if constraints is not None else None
    if name in ("auto", "tpe"):
        return optuna.samplers.TPESampler(seed=seed, multivariate=True, n_startup_trials=6, constant_liar=True, constraints_func=cfunc)
    if name == "nsga2":
        return optuna.samplers.NSGAIISampler(seed=seed, population_size=8, constraints_func=cfunc)
    if name == "gp":
        return optuna.samplers.GPSampler(seed=seed, n_startup_trials=6, constraints_func=cfunc)
    if name == "random":
        return optuna.samplers.RandomSampler(seed=seed)
    raise ConfigError(f"--sampler {name!r}: unknown sampler; available: {', '.join(SAMPLERS)}")
