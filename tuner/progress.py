"""What a run tells its user while it works.  `tuner.optimize` implements `Reporter` with rich;
library callers get `SilentReporter`, which only logs warnings."""

from __future__ import annotations

import logging
from typing import Protocol

import optuna

from tuner.config import Config
from tuner.sglang_args import Params

__all__ = ["Reporter", "SilentReporter"]

logger = logging.getLogger("tuner")


class Reporter(Protocol):
    def run_started(self, study: optuna.Study, config: Config, trials: int) -> None: ...
    def trial_started(self, number: int, params: Params, launch_command: str) -> None: ...
    def phase(self, text: str) -> None: ...
    def trial_finished(self, trial: optuna.trial.FrozenTrial) -> None: ...
    def baseline_started(self, kind: str, launch_command: str) -> None: ...
    def baseline_finished(self, trial: optuna.trial.FrozenTrial) -> None: ...  # not a trial of the run's count
    def warning(self, text: str) -> None: ...


class SilentReporter:
    def run_started(self, study, config, trials): pass
    def trial_started(self, number, params, launch_command): pass
    def phase(self, text): pass
    def trial_finished(self, trial): pass
    def baseline_started(self, kind, launch_command): pass
    def baseline_finished(self, trial): pass
    def warning(self, text): logger.warning(text)
