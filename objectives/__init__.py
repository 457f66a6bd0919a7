"""Objectives: one module each, with `name`, `direction`, `unit`, `description` and a pure
`score(m: tuner.measure.Measurement) -> float`.  A module's name is the name used in
`[study] objectives` and Optuna's metric name.  Every objective is maximised."""

from __future__ import annotations

import importlib
import pkgutil
from types import ModuleType

__all__ = ["names", "module"]


def names() -> list[str]:
    """Every objective module of this folder (a new file is a new objective: no list to edit)."""
    return sorted(info.name for info in pkgutil.iter_modules(__path__) if not info.name.startswith("_"))


def module(name: str) -> ModuleType:
    """The objective module `name` (one of `names()`); the only place objectives are imported by name."""
    if name not in names():
        raise KeyError(name)
    return importlib.import_module(f"{__name__}.{name}")
