"""Find the best speculative-decoding configuration of an SGLang server with an Optuna study.

Public API (pinned by tests/unit/test_public_api.py):
    load_config(path) -> Config        run_study(config, trials=N) -> RunResult
    Config, TunerError and its subclasses

Imports are lazy so that `python -m sglang_emulator` on a test host needs only the emulator's
own dependencies.
"""

from __future__ import annotations

import importlib
from typing import Any

from tuner.interrupts import quiet_start

quiet_start()  # `python -m tuner.<command>`: a Ctrl-C during its imports is one line, not a traceback

__all__ = ["load_config", "run_study", "Config", "TunerError", "ConfigError", "HostError", "LaunchError", "MeasureError"]
__version__ = "0.1.0"

_HOMES = {
    "load_config": "tuner.config",
    "Config": "tuner.config",
    "run_study": "tuner.study",
    "TunerError": "tuner.errors",
    "ConfigError": "tuner.errors",
    "HostError": "tuner.errors",
    "LaunchError": "tuner.errors",
    "MeasureError": "tuner.errors",
}


def __getattr__(name: str) -> Any:
    if name in _HOMES:
        return getattr(importlib.import_module(_HOMES[name]), name)
    raise AttributeError(f"module 'tuner' has no attribute {name!r}")
