"""`python -m tuner.optimize --trials N [--config PATH] ...`: run (or resume) a study.

The only module that prints errors or calls sys.exit.  Exit status: 0 when the run finished
(pruned trials included), 2 with one line naming the fix when the study cannot run, 130 on
Ctrl-C (the running trial is recorded as FAIL "interrupted" and the target restored).
"""

from __future__ import annotations

import argparse
import json
import logging
import sys
import time
from pathlib import Path

import warnings

import optuna
from rich.console import Console
from rich.markup import escape
from rich.progress import BarColumn, MofNCompleteColumn, Progress, SpinnerColumn, TextColumn, TimeElapsedColumn
from rich.text import Text

import tuner.interrupts as interrupts
from tuner.interrupts import Interrupted
from tuner.cli import EXIT_INTERRUPTED, consoles, error, in_config, parser, exit_with
from tuner.config import DEFAULT_CONFIG, apply_overrides, load_config
from tuner.errors import ConfigError, TunerError
from tuner.results import baselines
from tuner.results.baselines import compare
from tuner.results.estimate import Estimate, estimate
from tuner.results.optuna_private import storage_of
from tuner.measure.objectives import load_objectives
from tuner.results.picks import measured_front
from tuner.results.storage import existing_storage
from tuner.search.preview import first_proposals
from tuner.sequence import connected, refuse_if_answering
from tuner.server.launch import command_spec
from tuner.server.preflight import check_model
from tuner.results.terminal import baselines_table, counts_line, pareto_table, trial_line
from tuner.search.samplers import SAMPLERS
from tuner.sglang_args import Params
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
    p.add_argument("--json", action="store_true", help="print the result (the Pareto front and the baselines; with --dry-run the plan) as JSON on stdout")
    p.add_argument("--log-file", help="also write the run's lines and the tuner's own log (INFO) to this file (default: none)")
    p.add_argument("-v", "--verbose", action="store_true", help="log the tuner's own steps on stderr")
    return p


class RichReporter:
    """Progress bar over the run's trials (baselines apart, under their own label), a line per
    finished trial, elapsed and estimated remaining time; every line also to `log` if given."""

    def __init__(self, console: Console, log: logging.Logger | None = None):
        self.console = console
        self.log = log
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
        where = config.storage_url.split("@")[-1]
        self._line(f"study [bold]{escape(study.study_name)}[/bold] in {escape(where)}: {len(study.trials)} earlier trial(s); "
                   f"objectives {', '.join(self.metric_names)}; target {config.target.host} ({config.target.manager})")
        arms = baselines.load(storage_of(study), study.study_name) if config.study.baselines else {}
        self.pending_baselines = len(baselines.missing(arms, config.server.command_line)) if config.study.baselines else 0
        self.estimate = run_estimate(config, study, arms, trials, self.pending_baselines)
        for text in self.estimate.warnings:
            self.warning(text)
        self.task = self.progress.add_task("trials", total=trials, phase="", eta=self._eta())

    def _eta(self) -> str:
        if self.estimate is None:
            return ""
        per_trial = sum(self.durations) / len(self.durations) if self.durations else self.estimate.per_trial_s
        left = per_trial * (self.total - self.done) + self.estimate.complete_s * self.pending_baselines
        left -= time.monotonic() - self.current_started
        return f"~{_clock(max(left, 0))} left"

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


def _clock(seconds: float) -> str:
    seconds = int(round(seconds))
    return f"{seconds // 3600}h{seconds % 3600 // 60:02d}m" if seconds >= 3600 else f"{seconds // 60}m{seconds % 60:02d}s"


def run_estimate(config, study, arms: dict, trials: int, n_baselines: int) -> Estimate:
    """The run's duration and GPU time from the study's history (and its baselines')."""
    hardware = study.user_attrs.get("hardware") if study is not None else None
    gpus = (hardware or {}).get("gpu_count") or _gpus_of(config.server.command_line)
    history = [t for t in (study.get_trials(deepcopy=False) if study is not None else []) if t.state.is_finished()]
    return estimate(history + list(arms.values()), n_trials=trials, n_baselines=n_baselines, gpus=gpus,
                    memory_edge_searched=config.space.mem_fraction_static is not None
                    and (config.study.sampler or "auto") == "auto",
                    emulator="sglang_emulator" in config.server.command_line.prefix)


def _gpus_of(command) -> int:
    return (command.get_int("tp_size") or 1) * (command.get_int("dp_size") or 1)


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
    optuna.logging.set_verbosity(optuna.logging.ERROR)
    for noisy in ("httpx", "httpx2", "httpcore", "openai"):  # -v is the tuner's steps, not a line per HTTP request
        logging.getLogger(noisy).setLevel(logging.WARNING)
    warnings.filterwarnings("ignore", category=optuna.exceptions.ExperimentalWarning)
    out, err = consoles()
    if args.trials < 0:
        return error("--trials must be >= 0")
    interrupts.install()  # SIGTERM unwinds like Ctrl-C; a second signal waits for the bookkeeping
    try:
        log = _logger(args.log_file)
        config = _config(args)
        if args.dry_run:
            return dry_run(config, args, out, err)
        with RichReporter(err, log) as reporter:
            result = run_study(config, trials=args.trials, sampler_name=args.sampler, seed=args.seed,
                               reporter=reporter, timeout_s=args.timeout, patience=args.patience)
    except TunerError as exc:
        return error(in_config(str(exc), args.config))
    except KeyboardInterrupt as exc:
        err.print(str(exc) if isinstance(exc, Interrupted) else interrupts.NOTHING_RAN_LINE, highlight=False, markup=False)
        return EXIT_INTERRUPTED
    _show(result, config, args, out)
    if result.fatal is not None:
        return error(in_config(result.fatal.reason, args.config))
    return 0


# --- --dry-run ---------------------------------------------------------------------------------

PROPOSALS_SHOWN = 3  # later proposals depend on what these measure


def _read_study(config, names: list[str]):
    """The study and its baselines' sibling if they exist, opened without creating anything."""
    path = config.storage_url[len("sqlite:///"):] if config.storage_url.startswith("sqlite:///") else None
    if path is not None and not Path(path).expanduser().exists():
        return None, {}
    storage = existing_storage(config)
    try:
        study = optuna.load_study(study_name=config.study.name, storage=storage)
    except KeyError:
        return None, {}
    if study.metric_names is not None and list(study.metric_names) != names:
        raise ConfigError(f"study {study.study_name!r} in {config.storage_url.split('@')[-1]} records objectives "
                          f"{list(study.metric_names)}, not {names}; use the same [study] objectives or another --study-name")
    return study, baselines.load(storage, study.study_name)


def plan(config, args) -> dict:
    """What a run of `args.trials` trials would launch and cost; connects to the target (SSH,
    unit, URL) but starts nothing and writes nothing."""
    names = [o.name for o in load_objectives(config.study.objectives, config.bench.concurrency_levels)]
    study, arms = _read_study(config, names)
    command = config.server.command_line
    todo = baselines.missing(arms, command) if config.study.baselines and args.trials > 0 else []
    with connected(config, prepare=config.target.manager == "systemd", restore=False) as target:
        refuse_if_answering(target.client, config.target)
        answers = target.client.answers()  # process: never (refused above); systemd: the unit's own server
        model = check_model(target, target.command)
        where = target.control.description
        launches = [{"baseline": kind, "launch_command": command_spec(config.server, baselines.baseline_command(command, kind),
                                                                       api_key=target.api_key).launch_command} for kind in todo]
        proposals = first_proposals(config, study, min(args.trials, PROPOSALS_SHOWN), metric_names=names,
                                    sampler_name=args.sampler, seed=args.seed)
        launches += [{"trial": i, "source": source, "flags": params.as_dict(), "launch_command": target.spec(params).launch_command}
                     for i, (params, source) in enumerate(proposals, start=len(study.trials) if study is not None else 0)]
    est = run_estimate(config, study, arms, args.trials, len(todo))
    return {"study": config.study.name, "storage": config.storage_url.split("@")[-1], "target": where, "url": config.target.url,
            "answers": answers, "model": {"path": model.model, "found": model.found}, "earlier_trials": len(study.trials) if study is not None else 0, "trials": args.trials, "launches": launches,
            "estimate": {"duration_s": round(est.total_s), "gpu_hours": round(est.gpu_hours, 2), "gpus": est.gpus,
                         "per_trial_s": round(est.per_trial_s), "expected_failed_launches": min(est.expected_pruned, args.trials),
                         "from": est.sources},
            "warnings": est.warnings}


def dry_run(config, args, out, err) -> int:
    p = plan(config, args)
    if args.json:
        print(json.dumps(p, indent=2), flush=True)
        return 0
    listening = "a server answers there now (each launch replaces it)" if p["answers"] else "nothing answers there yet"
    out.print(f"dry run of study {p['study']} in {p['storage']}: {p['earlier_trials']} earlier trial(s); "
              f"target {p['target']} reached, {p['url']}: {listening}; nothing started", highlight=False, markup=False)
    for launch in p["launches"]:
        label = f"baseline {launch['baseline'].replace('_', ' ')}" if "baseline" in launch else f"trial {launch['trial']} ({launch['source']})"
        out.print(f"{label}: {launch['launch_command']}", highlight=False, markup=False)
    shown = sum("trial" in launch for launch in p["launches"])
    if args.trials > shown:
        out.print(f"... {args.trials - shown} more trial(s), proposed from what these measure", highlight=False)
    e = p["estimate"]
    out.print(f"estimate: {_clock(e['duration_s'])} for {args.trials} trial(s) and {sum('baseline' in l for l in p['launches'])} baseline(s), "
              f"{e['gpu_hours']:.2f} GPU-hours on {e['gpus']} GPU(s); {'; '.join(e['from'])}", highlight=False, markup=False)
    for text in p["warnings"]:
        err.print(f"[yellow]warning:[/yellow] {escape(text)}", highlight=False)
    return 0


def _show(result, config, args, out) -> None:
    """The run's result: the front and the baselines, as tables or `--json`."""
    study = result.study
    names = [o.name for o in result.objectives]
    if args.json:
        print(json.dumps(result_json(result, config), indent=2), flush=True)
        return
    if args.trials == 0:
        out.print(f"study {study.study_name} in {config.storage_url.split('@')[-1]}: {counts_line(study)}; "
                  "nothing launched (--trials 0)", highlight=False)
    if any(t.state.name == "COMPLETE" for t in study.trials):
        out.print(pareto_table(study, names))
    else:
        out.print(f"no trial completed ({counts_line(study)})", highlight=False)
    if result.baselines:
        out.print(baselines_table(result.baselines, names))
        for comparison in compare(study, result.baselines):
            for line in comparison.lines:
                out.print(line, highlight=False, markup=False)


def result_json(result, config) -> dict:
    """`--json`: the schema the README documents."""
    study = result.study
    names = [o.name for o in result.objectives]
    counts: dict[str, int] = {}
    for t in study.get_trials(deepcopy=False):
        counts[t.state.name.lower()] = counts.get(t.state.name.lower(), 0) + 1
    front = []
    for t in sorted(measured_front(study), key=lambda t: -t.values[0]) if counts.get("complete") else []:
        front.append({"trial": t.number, "flags": t.user_attrs.get("flags") or t.params, "values": dict(zip(names, t.values)),
                      **{k: t.user_attrs.get(k) for k in ("accept_length", "max_running_requests", "max_total_num_tokens", "launch_command")}})
    return {"study": study.study_name, "storage": config.storage_url.split("@")[-1], "objectives": names,
            "trials_run": result.trials_run, "trials": counts, "front": front,
            "baselines": baselines.as_json(result.baselines, names),
            "over_baselines": {c.kind: c.lines[0] for c in compare(study, result.baselines)} if result.baselines else {},
            "error": result.fatal.reason if result.fatal is not None else None}


if __name__ == "__main__":
    exit_with(main())
