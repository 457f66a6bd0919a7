"""One study run: config -> space -> launch -> measure -> score -> study.

`run_study` opens (or resumes) the Optuna study, connects to the target, measures the
baselines the study lacks, warm-starts a new study, and runs trials (`tuner.trial`) with
`study.optimize`.  A launch error no parameter can fix ends the study after that first trial,
and so do history.SAME_FAILURE_LIMIT launches in a row that failed alike for no reason the flags explain.
The target is restored (our server stopped, the operator's unit put back) on every way out.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Callable

import optuna

from tuner.config import Config
from tuner.errors import ConfigError, LaunchError, MeasureError
from tuner.measure.objectives import Objective, check_classes, load_objectives
from tuner.measure.workload import bench_workload
from tuner.progress import Reporter, SilentReporter
from tuner.results import artifacts, baselines, hypervolume, record, resilient
from tuner.results.optuna_private import storage_of
from tuner.results.picks import pick
from tuner.results.storage import open_storage
from tuner.results.record import params_of
from tuner.search import history
from tuner.search.recovery import fail_interrupted, recover_stale_trials
from tuner.search.samplers import make_sampler
from tuner.search.space import check_compatible
from tuner.search.warm_start import warm_start
import tuner.interrupts as interrupts
from tuner.interrupts import Interrupted, stopping
from tuner.results.terminal import interrupted_line
from tuner.sequence import connected
from tuner.server.connection import refuse_if_answering
from tuner.trial import TrialRunner

__all__ = ["RunResult", "run_study", "open_study", "IGNORE_EOS_WARNING"]

IGNORE_EOS_WARNING = (
    "[bench] ignore_eos = true: past a prompt's natural end the text loops and drafts are "
    "accepted far more often than on real traffic, so speeds are inflated; each trial records "
    "greedy_inflation (single_tps over a pass that stops at EOS). Set ignore_eos = false to tune for real traffic."
)


@dataclass
class RunResult:
    study: optuna.Study
    objectives: list[Objective]
    fatal: LaunchError | None = None
    trials_run: int = 0
    baselines: dict = field(default_factory=dict)
    notes: list[str] = field(default_factory=list)


def open_study(config: Config, *, sampler_name: str | None = None, seed: int | None = None,
               objectives: list[Objective] | None = None) -> tuple[optuna.Study, list[Objective]]:
    """Create or load the config's study, checking that it records the same objectives."""
    objectives = objectives or load_objectives(config.study.objectives, config.bench.concurrency_levels)
    names = [o.name for o in objectives]
    sampler = make_sampler(sampler_name or config.study.sampler, seed if seed is not None else config.study.seed,
                           n_objectives=len(names), constraints=config.constraints)
    try:
        study = optuna.create_study(study_name=config.study.name, storage=open_storage(config), sampler=sampler,
                                    directions=["maximize"] * len(names), load_if_exists=True)
    except ValueError as exc:
        raise ConfigError(f"study {config.study.name!r} in {config.storage_url}: {exc}; use another --study-name") from None
    if study.metric_names is not None and list(study.metric_names) != names:
        raise ConfigError(
            f"study {study.study_name!r} in {config.storage_url} records objectives {list(study.metric_names)}, "
            f"not {names}; use the same [study] objectives or another --study-name"
        )
    if study.metric_names is None:
        study.set_metric_names(names)
    return study, objectives


def _measure_baselines(config: Config, runner: TrialRunner, study: optuna.Study, reporter: Reporter) -> dict:
    """The baselines this study has not measured yet, or whose last try failed or was
    interrupted; a fatal launch error propagates (the run stops as after a trial's)."""
    storage = storage_of(study)
    have = baselines.load(storage, study.study_name)
    command = runner.target.command
    todo = baselines.missing(have, command)
    if not todo:
        return have
    bstudy = baselines.open_sibling(storage, study.study_name, [o.name for o in runner.objectives])
    recover_stale_trials(bstudy, reporter.warning)  # a baseline a killed tuner left RUNNING gets its reason
    for kind in todo:
        reporter.baseline_finished(runner.run_baseline(bstudy, kind, baselines.baseline_command(command, kind)))
    return baselines.load(storage, study.study_name)


def _stop_rule(patience: int | None, reporter: Reporter) -> Callable[[optuna.Study, optuna.trial.FrozenTrial], None]:
    def callback(study: optuna.Study, trial: optuna.trial.FrozenTrial) -> None:
        recover_stale_trials(study, reporter.warning)  # a same-host worker that died since
        reason = history.same_failure(study)
        if reason is not None:  # ends the run as a fatal launch error does (_run_on_target)
            raise LaunchError(f"the last {history.SAME_FAILURE_LIMIT} launches failed alike: {reason}; nothing the search varies "
                              "explains it: fix the target or [server] command, then run again", kind="fatal", fatal=True)
        if patience and hypervolume.stalled(study, patience):
            reporter.warning(f"the last {patience} trials grew the front's hypervolume by under 1%: stopping (--patience {patience})")
            study.stop()

    return callback


def run_study(config: Config, *, trials: int, sampler_name: str | None = None, seed: int | None = None,
              reporter: Reporter | None = None, timeout_s: float | None = None, patience: int | None = None) -> RunResult:
    """Run `trials` trials of the config's study (resuming it if it exists).  A Ctrl-C or
    SIGTERM raises `Interrupted` once the target is restored, saying what it interrupted."""
    reporter = reporter or SilentReporter()
    study, objectives = open_study(config, sampler_name=sampler_name, seed=seed)
    check_compatible(config.space, study)
    resilient.watch(study, reporter.phase)  # "waiting for the study's database ..." while it is away
    resilient.settle(study, reporter.warning)  # what an earlier run kept through an outage, first
    study.set_user_attr(record.SAMPLER, sampler_name or config.study.sampler)
    recover_stale_trials(study, reporter.warning)
    workload = bench_workload(config.bench, config.base_dir)
    check_classes(objectives, workload.classes)
    result = RunResult(study=study, objectives=objectives)
    if trials == 0:  # shows the study: nothing is launched, not even a baseline
        result.baselines = baselines.load(storage_of(study), study.study_name) if config.study.baselines else {}
        return result
    try:
        with connected(config) as target:
            _run_on_target(config, target, result, workload, trials=trials, reporter=reporter,
                           timeout_s=timeout_s, patience=patience)
    except KeyboardInterrupt:
        raise Interrupted(interrupted_line(fail_interrupted(study))) from None
    except resilient.StorageOutage as exc:
        if not stopping():
            raise
        raise Interrupted(f"interrupted while {exc}; the target was restored") from None
    _note_baselines(study, result.baselines, reporter)
    return result


def _run_on_target(config: Config, target, result: RunResult, workload, *, trials: int, reporter: Reporter,
                   timeout_s: float | None, patience: int | None) -> None:
    """Baselines, warm start and trials on the connected target, into `result`."""
    study = result.study
    refuse_if_answering(target.client, config.target)
    runner = TrialRunner(config=config, target=target, workload=workload, objectives=result.objectives,
                         reporter=reporter, store=artifacts.open_store(config))
    reporter.run_started(study, config, trials)
    if config.bench.ignore_eos:
        reporter.warning(IGNORE_EOS_WARNING)
    try:
        result.baselines = _measure_baselines(config, runner, study, reporter) if config.study.baselines else {}
    except LaunchError as exc:
        if not exc.fatal:
            raise
        result.fatal = exc
        result.baselines = baselines.load(storage_of(study), study.study_name)
        return
    if config.study.enqueue_current:
        warm_start(config, study, command=target.command)
    before = _started(study)
    try:
        optimize(study, runner, trials=trials, timeout_s=timeout_s, report=lambda s, t: reporter.trial_finished(t),
                 callbacks=[_stop_rule(patience, reporter)])
    except LaunchError as exc:
        if not exc.fatal:
            raise
        result.fatal = exc
    except Exception:
        resilient.reraise_outage(study)  # the database stayed away: one line, not Optuna's traceback
        raise
    result.trials_run = _started(study) - before
    if config.target.leave_best and result.fatal is None:
        _leave_best(study, target, reporter)


def optimize(study: optuna.Study, objective, *, trials: int, timeout_s: float | None, report, callbacks: list) -> None:
    """`study.optimize` with the tuner's objective: a MeasureError is a FAIL trial and the run
    goes on; `report` prints each told trial; a signal that lands while Optuna tells a trial is
    raised once it is told and reported, between trials (`interrupts.through_tell`), before
    `callbacks` run."""
    try:
        study.optimize(interrupts.through_tell(objective), n_trials=trials, timeout=timeout_s, catch=(MeasureError,),
                       gc_after_trial=False, callbacks=[report, interrupts.after_tell, *callbacks])
    finally:
        interrupts.end_hold()


def _note_baselines(study: optuna.Study, arms: dict, reporter: Reporter) -> None:
    """The study's dashboard note: the baseline arms and what tuning adds over them."""
    if not arms:
        return
    try:
        baselines.save_study_note(study, arms)
    except Exception as exc:  # a note is a convenience: it must never cost the run
        reporter.warning(f"could not save the study's dashboard note: {exc}")


def _started(study: optuna.Study) -> int:
    """Trials that ran (a warm start's queued trials are not among them until they do)."""
    return sum(1 for t in study.get_trials(deepcopy=False) if t.state != optuna.trial.TrialState.WAITING)


def _leave_best(study: optuna.Study, target, reporter: Reporter) -> None:
    """`[target] leave_best`: the study's balanced pick stays applied when the control
    restores the target (systemd: its own drop-in, as `tuner.best --apply` leaves it)."""
    try:
        choice = pick(study, "balanced")
    except ValueError:
        reporter.warning("leave_best: no trial completed, so the unit is put back as it was")
        return
    target.control.best_spec = target.spec(params_of(choice.trial))
    reporter.warning(f"leave_best: trial {choice.trial.number} ({choice.reason}) stays applied")
