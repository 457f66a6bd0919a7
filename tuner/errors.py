"""The tuner's errors: expected failures carry one line that names the fix.

    TunerError            anything the CLI reports as "error: ..." (exit 2), never a traceback
    ├── ConfigError       the study config or the command line is wrong
    ├── HostError         the target cannot be reached or controlled (SSH, sudo, systemd)
    ├── LaunchError       the server did not become ready; `fatal` when no searched
    │                     parameter can fix it (bad flag, missing model, port taken)
    └── MeasureError      the server failed or died while being measured

`study.py` keeps Optuna's split: a non-fatal LaunchError prunes the trial, a fatal one ends
the study, a MeasureError fails the trial and the study goes on.
"""

from __future__ import annotations

__all__ = ["TunerError", "ConfigError", "HostError", "LaunchError", "MeasureError"]


class TunerError(Exception):
    """An expected failure; str(error) is the one line the user sees."""


class ConfigError(TunerError):
    pass


class HostError(TunerError):
    pass


class LaunchError(TunerError):
    """The server did not come up.

    kind: "memory_kv" | "memory_graph" | "invalid" (parameters SGLang rejects) | "timeout" |
          "exit" (died for another reason) | "fatal" (no searched parameter can fix it)
    """

    def __init__(self, reason: str, *, kind: str, fatal: bool = False, log_tail: str = ""):
        super().__init__(reason)
        self.reason = reason
        self.kind = kind
        self.fatal = fatal
        self.log_tail = log_tail


class MeasureError(TunerError):
    pass
