"""One trial: the objective function Optuna calls.

    propose (search) -> settled by history? -> launch -> ready -> measure -> score -> record

Outcomes map onto Optuna's states: COMPLETE (measured), PRUNED (the server cannot start with
these parameters, raised as `optuna.TrialPruned`), FAIL (anything else: `MeasureError` is
caught by `study.optimize`; a fatal `LaunchError` stops the study).  Whatever the outcome, the
bookkeeping happens once, in `_failed`: reason and kind recorded, log saved, server stopped,
dashboard note written.
"""

from __future__ import annotations

import os
import socket
import time

import optuna

from tuner.config import Config
from tuner.errors import ConfigError, HostError, LaunchError, MeasureError
from tuner.measure.objectives import Objective, score
from tuner.measure.runner import Measurement
from tuner.measure.workload import Workload
from tuner.progress import Reporter
from tuner.results import artifacts, hypervolume, notes, record
from tuner.search import history
from tuner.search.recovery import recover_stale_trials
from tuner.search.space import suggest
from tuner.search.warm_start import family_default_from_server
from tuner.sequence import Target, launch, measure_server
from tuner.sglang_args import Params, redact
from tuner.server.client import ServerInfo
from tuner.server.diagnose import runtime_memory_failure
from tuner.server.launch import LaunchSpec

__all__ = ["TrialRunner", "THIS_TUNER"]

LOG_TAIL_LINES = 40
THIS_TUNER = f"{socket.gethostname()}:{os.getpid()}"  # this tuner process, recorded as record.WORKER of its trials


def _tail(text: str, secrets: tuple[str, ...], lines: int = LOG_TAIL_LINES) -> str:
    kept = [line[:400] for line in text.rstrip().splitlines()[-lines:]]
    return redact("\n".join(kept), secrets)


class TrialRunner:
    """Runs trials (and baselines) of one study on one connected target."""

    def __init__(self, *, config: Config, target: Target, workload: Workload, objectives: list[Objective],
                 reporter: Reporter, store):
        self.config = config
        self.target = target
        self.workload = workload
        self.objectives = objectives
        self.reporter = reporter
        self.store = store
        self.base = target.command.params()
        self.fatal: LaunchError | None = None
        self.hardware_checked = False  # this worker's GPUs match the study's (after its first launch)

    # -- Optuna's objective ---------------------------------------------------------------
    def __call__(self, trial: optuna.Trial) -> list[float]:
        try:
            return self._propose_and_run(trial)
        except KeyboardInterrupt:  # before the launch (the proposal, a wait): the reason all the same
            if record.FAIL_REASON not in trial.user_attrs:
                record.record_failure(trial, record.INTERRUPTED)
            raise

    def _propose_and_run(self, trial: optuna.Trial) -> list[float]:
        params = suggest(trial, self.config.space, self.base)
        spec = self.target.spec(params)
        self._record_launch(trial, spec, flags=params.as_dict())
        self.reporter.trial_started(trial.number, params, spec.launch_command)
        verdict = self._wait_if_running_elsewhere(trial, params)
        if verdict is not None:
            return self._settled(trial, verdict)
        return self.run(trial, spec)

    def run_baseline(self, study: optuna.Study, kind: str, command) -> optuna.trial.FrozenTrial:
        """Measure one baseline like a trial, into the sibling study.  One SGLang cannot run
        is recorded FAIL with its reason (measured again next run); a fatal launch error (the
        port taken, a bad flag) stops the run as in a trial -- except the adaptive arm on an
        SGLang without --speculative-adaptive, which is "not available", not an error."""
        spec = self.target.command_spec(command)
        trial = study.ask()
        trial.set_user_attr(record.BASELINE, kind)
        self._record_launch(trial, spec, flags=None)
        self.reporter.baseline_started(kind, spec.launch_command)
        return self._run_sibling(study, trial, spec, stop_on_fatal=True)

    def run_schedule(self, study: optuna.Study, spec: LaunchSpec, schedule: dict, *, label: str) -> optuna.trial.FrozenTrial:
        """Measure one launch `tuner.schedule` needs (a static configuration at every level, or an
        adaptive server), as a trial of the sibling study `<name>@baselines` with `schedule` in
        its user attrs; a launch that fails is recorded, never a reason to stop."""
        trial = study.ask()
        trial.set_user_attr(record.SCHEDULE, schedule)
        self._record_launch(trial, spec, flags=spec.params.as_dict())
        self.reporter.trial_started(trial.number, spec.params, spec.launch_command)
        self.reporter.phase(f"schedule: {label}")
        return self._run_sibling(study, trial, spec, stop_on_fatal=False)

    def _run_sibling(self, study: optuna.Study, trial: optuna.Trial, spec: LaunchSpec, *,
                     stop_on_fatal: bool) -> optuna.trial.FrozenTrial:
        try:
            values = self.run(trial, spec)
        except optuna.TrialPruned:
            return study.tell(trial, state=optuna.trial.TrialState.PRUNED)
        except (LaunchError, MeasureError) as exc:
            reason = trial.user_attrs.get(record.FAIL_REASON) or str(exc)
            unavailable = "--speculative-adaptive" in reason and "unrecognized" in (trial.user_attrs.get(record.LOG_TAIL) or reason)
            if unavailable:
                reason = "not available on this SGLang (it has no --speculative-adaptive; 0.5.23 has)"
            trial.set_user_attr(record.FAIL_REASON, reason)
            frozen = study.tell(trial, state=optuna.trial.TrialState.FAIL)
            if stop_on_fatal and isinstance(exc, LaunchError) and exc.fatal and not unavailable:
                raise
            self.fatal = None
            return frozen
        except BaseException as exc:
            if record.FAIL_REASON not in trial.user_attrs:
                reason = record.INTERRUPTED if isinstance(exc, KeyboardInterrupt) else (str(exc) or type(exc).__name__)
                record.record_failure(trial, redact(reason, spec.secrets))
            study.tell(trial, state=optuna.trial.TrialState.FAIL)
            raise
        return study.tell(trial, values)

    # -- the launch -> ready -> measure sequence, recorded ------------------------------------
    def run(self, trial: optuna.Trial, spec: LaunchSpec) -> list[float]:
        """Launch, measure, score and record one trial.  A Ctrl-C or SIGTERM at any moment of it
        (the launch, the benchmark, the bookkeeping of its outcome) ends it FAIL "interrupted"
        with its log tail and server log, the server stopped; a second signal waits for that
        (`tuner.interrupts`)."""
        try:
            return self._run(trial, spec)
        except KeyboardInterrupt:
            self._failed(trial, spec, record.INTERRUPTED, state="FAIL")
            raise

    def _run(self, trial: optuna.Trial, spec: LaunchSpec) -> list[float]:
        phase = self.reporter.phase
        try:
            ready = launch(self.target, spec, phase=phase)
            self._check_hardware(trial, ready.info)
            record.record_server(trial, ready.info, ready.startup_s)
            if self.config.study.enqueue_current and trial.study.study_name == self.config.study.name:
                family_default_from_server(self.config, trial.study, ready.info.architecture, self.target.command)
            m = measure_server(self.target, ready.info, self.workload, phase=phase)
        except HostError as exc:
            record.record_failure(trial, redact(str(exc), spec.secrets))
            raise
        except ConfigError as exc:  # the workload cannot be sent (a prompt beyond the context): the run stops
            self._failed(trial, spec, str(exc), state="FAIL")
            raise
        except LaunchError as exc:
            prunes = not exc.fatal and exc.kind != "port_busy"  # a held port is not these parameters' fault
            self._failed(trial, spec, exc.reason, kind=exc.kind, log=exc.log_tail, state="PRUNED" if prunes else "FAIL")
            if exc.fatal:
                self.fatal = exc
                raise
            if not prunes:
                raise MeasureError(exc.reason) from None
            raise optuna.TrialPruned(exc.reason) from None
        except MeasureError as exc:
            reason = self._measure_failure(str(exc))
            log = self.target.control.log()
            kind = "memory_runtime" if runtime_memory_failure(log[-200000:]) else None  # the sampler caps the fraction below it
            self._failed(trial, spec, reason, kind=kind, log=log, state="FAIL")
            raise MeasureError(reason) from None
        return self._completed(trial, spec, m)

    def _completed(self, trial: optuna.Trial, spec: LaunchSpec, m: Measurement) -> list[float]:
        self.target.control.poll()  # collect the rest of the log
        self.target.control.stop()  # before any write: a server never waits on the database
        log = self._server_log(trial)
        record.record_measurement(trial, m)
        # A started launch's capture too (#23): on 0.5.9, whose memory_usage has no
        # startup_available, the last runner's "avail mem" is the only figure of what was left.
        record.record_capture_memory(trial, log)
        c = self.config.constraints
        if c.p99_itl_ms is not None or c.ttft_ms is not None:
            trial.set_user_attr(record.CONSTRAINTS, m.slo_values(p99_itl_ms=c.p99_itl_ms, ttft_ms=c.ttft_ms))
        try:
            values = score(self.objectives, m)
        except MeasureError as exc:  # an objective the server cannot supply (accept length unknown)
            self._failed(trial, spec, str(exc), state="FAIL", log=log)
            raise
        self._save_log(trial, spec, log)
        self._record_hypervolume(trial, values)
        self._note(trial, "COMPLETE", values)
        return values

    def _failed(self, trial: optuna.Trial, spec: LaunchSpec, reason: str, *, state: str,
                kind: str | None = None, log: str | None = None) -> None:
        """The one place a failed trial is written down: reason, kind, log tail and the whole
        log stored, the server stopped, the dashboard note."""
        full = log or self.target.control.log()
        tail = _tail(full, spec.secrets)
        self.target.control.stop()  # before any write: a server never waits on the database
        record.record_failure(trial, redact(reason, spec.secrets), kind=kind, log_tail=tail)
        record.record_capture_memory(trial, full)  # what was free when the capture failed (#23)
        self._save_log(trial, spec)  # the whole log: `log` may be a launch error's tail
        self._note(trial, state)

    def _measure_failure(self, reason: str) -> str:
        status, _ = self.target.control.poll()
        if not status.running:
            reason += f"; the server exited ({status.exit_code})" if status.exit_code is not None else "; the server is gone"
        return reason

    # -- what a trial learns from the study ---------------------------------------------------
    def _check_hardware(self, trial: optuna.Trial, info: ServerInfo) -> None:
        """Results from different GPUs must not be mixed silently: the study remembers the
        hardware of its first measured trial, and a worker on other hardware refuses to join."""
        if not info.accelerator:
            return
        mine = {"accelerator": info.accelerator, "gpu_count": info.gpu_count}
        study = trial.study
        recorded = study.user_attrs.get(record.HARDWARE)
        if recorded is None:
            study.set_user_attr(record.HARDWARE, {**mine, "first_target": self.config.target.host})
        elif not self.config.study.allow_mixed_hardware and (
            recorded.get("accelerator") != mine["accelerator"] or recorded.get("gpu_count") != mine["gpu_count"]
        ):
            raise LaunchError(
                f"this target runs {mine['gpu_count']}x {mine['accelerator']}, but study {study.study_name!r} was measured on "
                f"{recorded.get('gpu_count')}x {recorded.get('accelerator')} ({recorded.get('first_target')}): results from "
                "different hardware must not be mixed; use another --study-name, or pass --allow-mixed-hardware",
                kind="fatal",
                fatal=True,
            )
        self.hardware_checked = True

    def _wait_if_running_elsewhere(self, trial: optuna.Trial, params: Params) -> history.Verdict | None:
        """Another worker measures the same flags now: wait for its result rather than
        measure them twice at once (the sampler's constant liar makes this rare)."""
        waited = False
        deadline = time.monotonic() + self.config.target.ready_timeout_s + 3600
        while True:
            if waited:
                # The other worker may be dead: let the heartbeat (or our pid check) fail its trial.
                optuna.storages.fail_stale_trials(trial.study)
                recover_stale_trials(trial.study, self.reporter.warning)
            same_hardware_known = self.hardware_checked and not self.config.study.allow_mixed_hardware
            verdict = history.check(params, history.relevant(trial.study), current=trial.number,
                                    target=None if same_hardware_known else f"{self.config.target.host} {self.config.target.url}")
            if verdict is None or verdict.kind != "running" or time.monotonic() > deadline:
                return None if verdict is not None and verdict.kind == "running" else verdict
            if not waited:
                self.reporter.phase(f"waiting: {verdict.reason}")
                waited = True
            time.sleep(2.0)

    def _settled(self, trial: optuna.Trial, verdict: history.Verdict) -> list[float]:
        """A proposal an earlier trial already answers: no restart."""
        earlier = verdict.trial
        if verdict.kind == "duplicate":
            trial.set_user_attr(record.DUPLICATE_OF, earlier.number)
            for key, value in earlier.user_attrs.items():
                if key not in record.SETTLED_COPY_SKIPS and key not in trial.user_attrs:
                    trial.set_user_attr(key, value)
            self._record_hypervolume(trial, list(earlier.values))
            self._note(trial, "COMPLETE (duplicate)", list(earlier.values))
            return list(earlier.values)
        trial.set_user_attr(record.RULED_OUT_BY, earlier.number)
        record.record_failure(trial, verdict.reason, kind=earlier.user_attrs.get(record.FAILURE_KIND))
        self._note(trial, "PRUNED without a launch")
        raise optuna.TrialPruned(verdict.reason)

    # -- records that must never cost the trial -----------------------------------------------
    def _record_launch(self, trial: optuna.Trial, spec: LaunchSpec, *, flags: dict | None) -> None:
        record.record_launch(trial, launch_command=spec.launch_command, flags=flags,
                             target=self.config.target.host, url=self.config.target.url, worker=THIS_TUNER)

    def _record_hypervolume(self, trial: optuna.Trial, values: list[float]) -> None:
        """The front's normalised hypervolume with this trial in it (the history a study keeps)."""
        done = [list(t.values) for t in trial.study.get_trials(deepcopy=False, states=(optuna.trial.TrialState.COMPLETE,))]
        series = hypervolume.history(done + [values])
        trial.set_user_attr(record.HYPERVOLUME, round(series[-1], 4))

    def _note(self, trial: optuna.Trial, state: str, values: list[float] | None = None) -> None:
        try:
            notes.save(trial, state=state, metric_names=[o.name for o in self.objectives], values=values)
        except Exception as exc:  # a note is a convenience: it must never cost the trial
            self.reporter.warning(f"trial {trial.number}: could not save its dashboard note: {exc}")

    def _server_log(self, trial: optuna.Trial) -> str | None:
        """The server's log, or None (said as a warning) when the host cannot give it: a log
        must never cost a measured trial."""
        try:
            return self.target.control.log()
        except Exception as exc:
            self.reporter.warning(f"trial {trial.number}: could not read the server log: {exc}")
            return None

    def _save_log(self, trial: optuna.Trial, spec: LaunchSpec, log: str | None = None) -> None:
        if self.store is None:
            return
        try:
            artifacts.save_log(self.store, trial, redact(self.target.control.log() if log is None else log, spec.secrets))
        except Exception as exc:  # a full disk must not lose the trial's result
            self.reporter.warning(f"trial {trial.number}: could not store the server log: {exc}")
