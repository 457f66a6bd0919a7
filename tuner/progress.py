"""What a run tells its user while it works: the `Reporter` interface and its three forms.

`SilentReporter` (library callers: warnings to the log only), `RichReporter` (`tuner.optimize`:
a progress bar over the run's trials, a line per finished one, the estimated time left) and
`LineReporter` (`tuner.schedule`: one line per launch and phase, its launches are few)."""

from __future__ import annotations

import logging
import sys
import time
from typing import Protocol

import optuna
from rich.console import Console
from rich.markup import escape
from rich.progress import BarColumn, MofNCompleteColumn, Progress, SpinnerColumn, TextColumn, TimeElapsedColumn
from rich.text import Text

from tuner.config import Config
from tuner.results import baselines, record
from tuner.results.estimate import Estimate
from tuner.results.optuna_private import storage_of
from tuner.results.resilient import redacted_url
from tuner.results.terminal import trial_line
from tuner.search.preview import clock, run_estimate
from tuner.sglang_args import Params

__all__ = ["Reporter", "SilentReporter", "RichReporter", "LineReporter"]

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


class RichReporter:
    """Progress bar over the run's trials (baselines apart, under their own label), a line per
    finished trial, elapsed and estimated remaining time; every line also to `log` if given."""

    def __init__(self, console: Console, log: logging.Logger | None = None, *, sampler: str | None = None):
        self.console = console
        self.log = log
        self.sampler = sampler  # --sampler: whether the memory edge costs launches depends on it
        self.progress = Progress(
            SpinnerColumn(),
            TextColumn("[bold]{task.description}"),
            BarColumn(),
            MofNCompleteColumn(),
            TimeElapsedColumn(),
            TextColumn("{task.fields[eta]}"),
            TextColumn("{task.fields[phase]}"),
            console=console,
            transient=True,
        )
        self.task = None
        self.metric_names: list[str] = []
        self.total = 0
        self.done = 0
        self.pending_baselines = 0
        self.estimate: Estimate | None = None
        self.durations: list[float] = []
        self.current_started = time.monotonic()

    def __enter__(self) -> "RichReporter":
        if self.console.is_terminal:  # piped: the lines only, no live display (nor its blank line)
            self.progress.start()
        return self

    def __exit__(self, *exc: object) -> None:
        if self.console.is_terminal:
            self.progress.stop()

    def _line(self, text: str) -> None:
        self.console.print(text, highlight=False, soft_wrap=True)
        if self.log is not None:
            self.log.info(Text.from_markup(text).plain)

    def run_started(self, study, config, trials):
        self.metric_names = list(study.metric_names or [])
        self.total = trials
        where = redacted_url(config.storage_url)
        self._line(f"study [bold]{escape(study.study_name)}[/bold] in {escape(where)}: {len(study.trials)} earlier trial(s); "
                   f"objectives {', '.join(self.metric_names)}; target {config.target.host} ({config.target.manager})")
        arms = baselines.load(storage_of(study), study.study_name) if config.study.baselines else {}
        self.pending_baselines = len(baselines.missing(arms, config.server.command_line)) if config.study.baselines else 0
        self.estimate = run_estimate(config, study, arms, trials, self.pending_baselines, sampler=self.sampler)
        for text in self.estimate.warnings:
            self.warning(text)
        self.task = self.progress.add_task("trials", total=trials, phase="", eta=self._eta())

    def _eta(self) -> str:
        if self.estimate is None:
            return ""
        per_trial = sum(self.durations) / len(self.durations) if self.durations else self.estimate.per_trial_s
        left = per_trial * (self.total - self.done) + self.estimate.complete_s * self.pending_baselines
        left -= time.monotonic() - self.current_started
        return f"~{clock(max(left, 0))} left"

    def trial_started(self, number: int, params: Params, launch_command: str):
        self.current_started = time.monotonic()
        if self.task is not None:
            self.progress.update(self.task, description=f"trial {number}", phase="launching", eta=self._eta())

    def baseline_started(self, kind: str, launch_command: str):
        self.current_started = time.monotonic()
        if self.task is not None:
            self.progress.update(self.task, description=f"baseline {kind.replace('_', ' ')}", phase="launching", eta=self._eta())

    def phase(self, text: str):
        if self.log is not None:  # the log file shows where the run is (a test waits for a moment by it)
            self.log.info("phase: %s", text)
        if self.task is not None:
            self.progress.update(self.task, phase=escape(text), eta=self._eta())  # a reason may say "[server]"

    def trial_finished(self, trial):
        self.durations.append(time.monotonic() - self.current_started)
        self.done += 1
        self.current_started = time.monotonic()
        self._line(trial_line(trial, self.metric_names))
        if self.task is not None:
            self.progress.update(self.task, advance=1, eta=self._eta())

    def baseline_finished(self, trial):
        self.pending_baselines = max(self.pending_baselines - 1, 0)
        self.current_started = time.monotonic()
        self._line(trial_line(trial, self.metric_names))  # "baseline  ...": not counted as a trial

    def warning(self, text: str):
        self._line(f"[yellow]warning:[/yellow] {escape(text)}")


class LineReporter(SilentReporter):
    """One line per launch and phase change on stderr (no progress bar: launches are few)."""

    def __init__(self, quiet: bool = False):
        self.quiet = quiet
        self._last = ""

    def trial_started(self, number, params, launch_command):
        self._say(f"launch ({number}): {launch_command}")

    def phase(self, text):
        head = text.split(" ")[0]
        if head != self._last:
            self._last = head
            self._say(f"  {text}")

    def trial_finished(self, trial):
        reason = trial.user_attrs.get(record.FAIL_REASON)
        self._say(f"  -> {trial.state.name}" + (f": {reason}" if reason else ""))

    def warning(self, text):
        print(f"warning: {text}", file=sys.stderr, flush=True)

    def _say(self, text):
        if not self.quiet:
            print(text, file=sys.stderr, flush=True)
