"""Objectives by name: `[study] objectives` -> the modules in `objectives/` -> values.

`concurrent_tps` expands to one column per level when `[bench] concurrency` is a list
(`concurrent_tps@1`, `concurrent_tps@8`, ...), so each load level is its own objective.
`<objective>:<class>` (`single_tps:long_context`) scores one request class of the workload,
for objectives whose `score` takes `request_class`.
"""

from __future__ import annotations

import inspect
from dataclasses import dataclass
from types import ModuleType
from typing import NamedTuple

from tuner.errors import ConfigError
from tuner.measure.runner import Measurement

__all__ = ["Objective", "ObjectiveName", "split_name", "available", "load_objectives", "check_classes", "score"]


class ObjectiveName(NamedTuple):
    base: str  # the module: single_tps, concurrent_tps, ...
    level: str  # after '@': the concurrency level, "" for none
    request_class: str  # after ':': the request class, "" for none


def split_name(name: str) -> ObjectiveName:
    """`concurrent_tps@16:long_context` -> (concurrent_tps, 16, long_context): the one reading of
    an objective's name (load_objectives checks what it names; the search reads what it scores)."""
    head, _, request_class = name.partition(":")
    base, _, level = head.partition("@")
    return ObjectiveName(base, level, request_class)


@dataclass(frozen=True)
class Objective:
    name: str  # the Optuna metric name
    module: ModuleType
    level: int | None = None
    request_class: str | None = None

    @property
    def unit(self) -> str:
        return getattr(self.module, "unit", "")

    @property
    def description(self) -> str:
        return getattr(self.module, "description", (self.module.__doc__ or "").strip())

    def __call__(self, m: Measurement) -> float:
        given = {"level": self.level, "request_class": self.request_class}
        return float(self.module.score(m, **{k: v for k, v in given.items() if v is not None}))


def available() -> list[str]:
    import objectives  # the registry (objectives/__init__.py): one module per objective

    return objectives.names()


def _module(name: str) -> ModuleType:
    import objectives

    if name not in available():
        raise ConfigError(f"[study] objectives: unknown objective {name!r}; available: {', '.join(available())}")
    module = objectives.module(name)
    if getattr(module, "direction", "maximize") != "maximize":
        raise ConfigError(f"objectives/{name}.py: every objective is maximised; return the negated value instead")
    return module


def load_objectives(names: list[str], concurrency_levels: list[int]) -> list[Objective]:
    out: list[Objective] = []
    for name in names:
        base, level, request_class = split_name(name)
        if request_class:
            out.append(_per_class(name, base, level, request_class, concurrency_levels))
            continue
        module = _module(base)
        takes_level = "level" in inspect.signature(module.score).parameters
        if level:
            if not takes_level or not level.isdigit():
                raise ConfigError(f"[study] objectives: {name!r}: only a per-level objective takes '@<concurrency>'")
            if int(level) not in concurrency_levels:
                raise ConfigError(f"[study] objectives: {name!r} names a level that [bench] concurrency does not measure ({concurrency_levels})")
            out.append(Objective(name, module, int(level)))
        elif takes_level and len(concurrency_levels) > 1:
            out += [Objective(f"{base}@{lvl}", module, lvl) for lvl in concurrency_levels]
        else:
            out.append(Objective(name, module))
    return out


def _per_class(name: str, base: str, level: str, request_class: str, concurrency_levels: list[int]) -> Objective:
    module = _module(base)
    parameters = inspect.signature(module.score).parameters
    if "request_class" not in parameters:
        raise ConfigError(f"[study] objectives: {name!r}: ':<class>' goes with single_tps, concurrent_tps or accept_length")
    if level:
        if "level" not in parameters or not level.isdigit():
            raise ConfigError(f"[study] objectives: {name!r}: only concurrent_tps takes '@<concurrency>' before ':<class>'")
        if int(level) not in concurrency_levels:
            raise ConfigError(f"[study] objectives: {name!r} names a level that [bench] concurrency does not measure ({concurrency_levels})")
    return Objective(name, module, int(level) if level else None, request_class=request_class)


def check_classes(objectives: list[Objective], classes: list[str]) -> None:
    """Every per-class objective names a class the workload measures (`[bench] prompts`, `mix`)."""
    for o in objectives:
        if o.request_class is not None and o.request_class not in classes:
            raise ConfigError(f"[study] objectives: {o.name!r} names request class {o.request_class!r}, which the workload does not measure; "
                              f"its classes are {', '.join(classes)}")


def score(objectives: list[Objective], m: Measurement) -> list[float]:
    return [objective(m) for objective in objectives]
