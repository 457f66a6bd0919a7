"""`python -m tuner.optimize --trials N [--config PATH] ...`: run (or resume) a study.

The only module that prints errors or calls sys.exit.  Exit status: 0 when the run finished
(pruned trials included), 2 with one line naming the fix when the study cannot run, 130 on
Ctrl-C (the running trial is recorded as FAIL "interrupted" and the target restored).
"""

from __future__ import annotations

import argparse
import logging
import signal
import sys
import time

import warnings

import optuna
from rich.console import Console
from rich.markup import escape
from rich.progress import BarColumn, MofNCompleteColumn, Progress, SpinnerColumn, TextColumn, TimeElapsedColumn

from tuner.cli import EXIT_INTERRUPTED, consoles, error
from tuner.config import DEFAULT_CONFIG, apply_overrides, load_config
from tuner.errors import TunerError
from tuner.results.baselines import compare
from tuner.results.terminal import baselines_table, counts_line, pareto_table, trial_line
from tuner.search.samplers import SAMPLERS
from tuner.sglang_args import Params
from tuner.study import run_study

__all__ = ["main", "build_parser"]


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="python -m tuner.optimize",
        description="Tune SGLang's speculative-decoding flags with an Optuna study.",
    )
    p.add_argument("--trials", type=int, required=True, help="trials this run adds to the study")
    p.add_argument("--config", default=DEFAULT_CONFIG, help=f"study config (default {DEFAULT_CONFIG})")
    p.add_argument("--study-name", help="overrides [study] name")
    p.add_argument("--storage", help="overrides [study] storage, e.g. sqlite:///studies/x.db or postgresql://...")
    p.add_argument("--sampler", choices=SAMPLERS, help="overrides [study] sampler (default auto)")
    p.add_argument("--seed", type=int, help="sampler seed")
    p.add_argument("--timeout", type=float, help="stop starting new trials after this many seconds")
    p.add_argument("--patience", type=int, help="stop when the last N trials grew the front's hypervolume by under 1%%")
    p.add_argument("--allow-mixed-hardware", action="store_true", help="join a study measured on other GPUs ([study] allow_mixed_hardware)")
    p.add_argument("-v", "--verbose", action="store_true", help="log the tuner's own steps")
    return p


class RichReporter:
    """Progress bar over the run's trials, a line per finished trial."""

    def __init__(self, console: Console):
        self.console = console
        self.progress = Progress(
            SpinnerColumn(),
            TextColumn("[bold]{task.description}"),
            BarColumn(),
            MofNCompleteColumn(),
            TimeElapsedColumn(),
            TextColumn("{task.fields[phase]}"),
            console=console,
            transient=True,
        )
        self.task = None
        self.metric_names: list[str] = []
        self.started = 0.0

    def __enter__(self) -> "RichReporter":
        self.progress.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.progress.stop()

    def run_started(self, study, config, trials):
        self.metric_names = list(study.metric_names or [])
        self.started = time.monotonic()
        done = len(study.trials)
        where = config.storage_url.split("@")[-1]
        self.console.print(
            soft_wrap=True, highlight=False,
            *[f"study [bold]{study.study_name}[/bold] in {where}: {done} earlier trial(s); "
            f"objectives {', '.join(self.metric_names)}; target {config.target.host} ({config.target.manager})"]
        )
        self.task = self.progress.add_task("trials", total=trials, phase="")

    def trial_started(self, number: int, params: Params, launch_command: str):
        if self.task is not None:
            self.progress.update(self.task, description=f"trial {number}", phase="launching")

    def phase(self, text: str):
        if self.task is not None:
            self.progress.update(self.task, phase=text)

    def trial_finished(self, trial):
        self.console.print(trial_line(trial, self.metric_names), highlight=False, soft_wrap=True)
        if self.task is not None:
            self.progress.advance(self.task)

    def warning(self, text: str):
        self.console.print(f"[yellow]warning:[/yellow] {escape(text)}", highlight=False, soft_wrap=True)


def _interrupt(signum: int, frame: object) -> None:
    raise KeyboardInterrupt


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    logging.basicConfig(level=logging.INFO if args.verbose else logging.WARNING, format="%(levelname)s %(name)s: %(message)s")
    optuna.logging.set_verbosity(optuna.logging.ERROR)
    warnings.filterwarnings("ignore", category=optuna.exceptions.ExperimentalWarning)
    out, err = consoles()
    if args.trials < 0:
        return error("--trials must be >= 0")
    # SIGTERM (systemd stop, kill) unwinds like Ctrl-C, so the target is restored.
    signal.signal(signal.SIGTERM, _interrupt)
    try:
        config = apply_overrides(load_config(args.config), study_name=args.study_name, storage=args.storage)
        if args.allow_mixed_hardware:
            config = config.model_copy(update={"study": config.study.model_copy(update={"allow_mixed_hardware": True})})
        with RichReporter(err) as reporter:
            result = run_study(config, trials=args.trials, sampler_name=args.sampler, seed=args.seed,
                               reporter=reporter, timeout_s=args.timeout, patience=args.patience)
    except TunerError as exc:
        return error(str(exc))
    except KeyboardInterrupt:
        err.print("interrupted: the running trial is recorded as FAIL (interrupted); the target was restored", highlight=False)
        return EXIT_INTERRUPTED
    study = result.study
    names = [o.name for o in result.objectives]
    if any(t.state.name == "COMPLETE" for t in study.trials):
        out.print(pareto_table(study, names))
        if result.baselines:
            out.print(baselines_table(result.baselines, names))
            for comparison in compare(study, result.baselines):
                for line in comparison.lines:
                    out.print(line, highlight=False, soft_wrap=True)
    else:
        out.print(f"no trial completed ({counts_line(study)})", highlight=False)
    if result.fatal is not None:
        return error(result.fatal.reason)
    return 0


if __name__ == "__main__":
    sys.exit(main())
