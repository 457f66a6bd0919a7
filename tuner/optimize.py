"""`python -m tuner.optimize --trials N [--config PATH] ...`: run (or resume) a study.

Parses, calls `tuner.study.run_study` (or `tuner.search.preview.plan` with --dry-run) and
prints through `tuner.output`.  Exit status (`tuner.cli`): 0 when the run finished (pruned
trials included), 2 with one line naming the fix when the study cannot run, 130 on Ctrl-C or
SIGTERM (the running trial is recorded as FAIL "interrupted" and the target restored).
"""

from __future__ import annotations

import argparse
import logging
import warnings

import optuna
from rich.markup import escape

from tuner import output
import tuner.interrupts as interrupts
from tuner.cli import EXIT_INTERRUPTED, consoles, error, exit_with, in_config, parser
from tuner.config import DEFAULT_CONFIG, apply_overrides, load_config
from tuner.errors import ConfigError, TunerError
from tuner.progress import RichReporter
from tuner.search.preview import plan
from tuner.search.samplers import SAMPLERS
from tuner.study import run_study

__all__ = ["main", "build_parser"]


def build_parser() -> argparse.ArgumentParser:
    p = parser("tuner.optimize", "Tune SGLang's speculative-decoding flags with an Optuna study: run (or resume) it for --trials more trials.")
    p.add_argument("--trials", type=int, required=True,
                   help="trials this run adds to the study (Optuna's n_trials); 0 launches nothing and shows the study")
    p.add_argument("--config", default=DEFAULT_CONFIG, help="study config (TOML)")
    p.add_argument("--study-name", help="overrides [study] name (default: the config's)")
    p.add_argument("--storage", help="overrides [study] storage, e.g. sqlite:///studies/x.db or postgresql://user@host/db (default: the config's)")
    p.add_argument("--sampler", choices=SAMPLERS, help="overrides [study] sampler (default: the config's, auto)")
    p.add_argument("--seed", type=int, help="sampler seed (default: [study] seed, else random)")
    p.add_argument("--timeout", type=float, help="stop starting new trials after this many seconds (default: no limit)")
    p.add_argument("--patience", type=int, help="stop when the last N trials grew the front's hypervolume by under 1%% (default: off)")
    p.add_argument("--allow-mixed-hardware", action="store_true", help="join a study measured on other GPUs ([study] allow_mixed_hardware)")
    p.add_argument("--dry-run", action="store_true",
                   help="resolve the config, check the target without starting anything, print the first launch commands and an estimate of the run; writes nothing")
    output.add_format_flags(p, "the result (the Pareto front and the baselines; with --dry-run the plan)")
    p.add_argument("--log-file", help="also write the run's lines and the tuner's own log (INFO) to this file (default: none)")
    p.add_argument("-v", "--verbose", action="store_true", help="log the tuner's own steps on stderr")
    return p


def _logger(path: str | None) -> logging.Logger | None:
    """`--log-file`: the run's lines and the tuner's own INFO log, appended to a file."""
    if not path:
        return None
    try:
        handler = logging.FileHandler(path, encoding="utf-8")
    except OSError as exc:
        raise ConfigError(f"--log-file {path}: cannot write it ({exc.strerror or exc}); pass a writable path") from None
    handler.setFormatter(logging.Formatter("%(asctime)s %(levelname)s %(name)s: %(message)s"))
    handler.setLevel(logging.INFO)
    for name in ("tuner", "tuner.run"):
        logging.getLogger(name).addHandler(handler)
        logging.getLogger(name).setLevel(logging.INFO)
    run = logging.getLogger("tuner.run")
    run.propagate = False  # the run's lines are on the console already, and once in the file
    return run


def _config(args):
    config = apply_overrides(load_config(args.config), study_name=args.study_name, storage=args.storage)
    if args.allow_mixed_hardware:
        config = config.model_copy(update={"study": config.study.model_copy(update={"allow_mixed_hardware": True})})
    return config


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    logging.basicConfig(level=logging.INFO if args.verbose else logging.WARNING, format="%(levelname)s %(name)s: %(message)s")
    for handler in logging.getLogger().handlers:  # --log-file sets the tuner's loggers to INFO: stderr keeps -v's level
        handler.setLevel(logging.INFO if args.verbose else logging.WARNING)
    for noisy in ("httpx", "httpx2", "httpcore", "openai"):  # -v is the tuner's steps, not a line per HTTP request
        logging.getLogger(noisy).setLevel(logging.WARNING)
    optuna.logging.set_verbosity(optuna.logging.ERROR)
    warnings.filterwarnings("ignore", category=optuna.exceptions.ExperimentalWarning)
    out, err = consoles()
    if args.trials < 0:
        return error("--trials must be >= 0")
    interrupts.install()  # SIGTERM unwinds like Ctrl-C; a second signal waits for the bookkeeping
    try:
        log = _logger(args.log_file)
        config = _config(args)
        if args.dry_run:
            return _dry_run(config, args, out, err)
        with RichReporter(err, log, sampler=args.sampler) as reporter:
            result = run_study(config, trials=args.trials, sampler_name=args.sampler, seed=args.seed,
                               reporter=reporter, timeout_s=args.timeout, patience=args.patience)
    except TunerError as exc:
        return error(in_config(str(exc), args.config))
    except KeyboardInterrupt as exc:
        err.print(str(exc) if isinstance(exc, interrupts.Interrupted) else interrupts.NOTHING_RAN_LINE, highlight=False, markup=False)
        return EXIT_INTERRUPTED
    output.show(output.study_view(result, config, args.trials), output.format_of(args), out)
    if result.fatal is not None:
        return error(in_config(result.fatal.reason, args.config))
    return 0


def _dry_run(config, args, out, err) -> int:
    p = plan(config, args.trials, sampler=args.sampler, seed=args.seed)
    output.show(output.plan_view(p), output.format_of(args), out)
    if not args.json:
        for text in p.estimate.warnings:
            err.print(f"[yellow]warning:[/yellow] {escape(text)}", highlight=False)
    return 0


if __name__ == "__main__":
    exit_with(main())
