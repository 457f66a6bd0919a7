"""One study run: config -> space -> launch -> readiness -> measure -> score -> Optuna.

`run_study` opens (or resumes) the Optuna study, connects to the target, and runs trials with
`study.optimize`.  Optuna's states carry the outcome: COMPLETE (measured), PRUNED (the server
could not start with these parameters), FAIL (anything else, the study goes on).  A launch
error no parameter can fix ends the study after that first trial.  The target is restored
(our server stopped, the operator's unit put back) on every way out.
"""

from __future__ import annotations

import logging
import os
import re
import socket
import time
from dataclasses import dataclass, field
from typing import Any, Callable, Protocol

import optuna

from . import artifacts, baselines, history, hypervolume, notes
from .client import ServerClient
from .config import Choices, Config
from .control import control_for
from .errors import ConfigError, HostError, LaunchError, MeasureError
from .host import connect
from .launch import command_spec, launch_spec, redact
from .measure import Measurement, measure
from .readiness import wait_ready
from .samplers import make_sampler
from .score import Objective, load_objectives, score
from .space import Params, check_compatible, draft_token_bounds, params_from_argv, suggest
from .storage import open_storage
from .workload import Workload, load_workload

__all__ = ["Reporter", "RunResult", "run_study", "record_measurement", "SilentReporter"]

logger = logging.getLogger(__name__)

LOG_TAIL_LINES = 40
WORKER = f"{socket.gethostname()}:{os.getpid()}"  # which tuner process runs a trial
IGNORE_EOS_WARNING = (
    "[bench] ignore_eos = true: past a prompt's natural end the text loops and drafts are "
    "accepted far more often than on real traffic, so speeds are inflated; each trial records "
    "greedy_inflation (single_tps over a pass that stops at EOS). Set ignore_eos = false to tune for real traffic."
)


class Reporter(Protocol):
    """What a run tells its user; `optimize.py` implements it with rich."""

    def run_started(self, study: optuna.Study, config: Config, trials: int) -> None: ...
    def trial_started(self, number: int, params: Params, launch_command: str) -> None: ...
    def phase(self, text: str) -> None: ...
    def trial_finished(self, trial: optuna.trial.FrozenTrial) -> None: ...
    def warning(self, text: str) -> None: ...


class SilentReporter:
    def run_started(self, study, config, trials): pass
    def trial_started(self, number, params, launch_command): pass
    def phase(self, text): pass
    def trial_finished(self, trial): pass
    def warning(self, text): logger.warning(text)


@dataclass
class RunResult:
    study: optuna.Study
    objectives: list[Objective]
    fatal: LaunchError | None = None
    trials_run: int = 0
    baselines: dict = field(default_factory=dict)
    notes: list[str] = field(default_factory=list)


def _tail(text: str, secrets: tuple[str, ...], lines: int = LOG_TAIL_LINES) -> str:
    kept = [line[:400] for line in text.rstrip().splitlines()[-lines:]]
    return redact("\n".join(kept), secrets)


def record_measurement(trial: optuna.Trial, m: Measurement) -> None:
    """The contract's user attrs, plus the spread and latency figures behind them."""
    attrs: dict[str, Any] = {
        "max_total_num_tokens": m.max_total_num_tokens,
        "max_running_requests": m.max_running_requests,
        "accept_length": m.accept_length,
        "ttft_ms": round(m.ttft_ms, 2),
        "ttft_p90_ms": round(m.ttft_p90_ms, 2),
        "ttft_p99_ms": round(m.ttft_p99_ms, 2),
        "itl_ms": round(m.itl_ms, 3),
        "itl_p90_ms": round(m.itl_p90_ms, 3),
        "itl_p99_ms": round(m.itl_p99_ms, 3),
        "e2e_ms": round(m.e2e_ms, 1),
        "e2e_p90_ms": round(m.e2e_p90_ms, 1),
        "e2e_p99_ms": round(m.e2e_p99_ms, 1),
        "single_tps_runs": [round(x, 2) for x in m.single_runs],
        "single_tps_ci95": [round(x, 2) for x in m.single_ci95],
        "single_tps_spread": round(m.single_spread, 4),
        "concurrent_tps_by_level": {str(k): round(v, 2) for k, v in m.concurrent_tps_by_level.items()},
        "concurrent_window_s": {str(k): round(v, 2) for k, v in m.concurrent_window_s.items()},
        "concurrent_p99_itl_ms": {str(k): round(v, 3) for k, v in m.concurrent_p99_itl_ms.items()},
        "concurrent_p99_ttft_ms": {str(k): round(v, 1) for k, v in m.concurrent_p99_ttft_ms.items()},
        "measure_s": round(m.duration_s, 1),
        "greedy_inflation": round(m.greedy_inflation, 3) if m.greedy_inflation else None,
        "concurrent_ttft_p99_ms": round(m.concurrent_ttft_p99_ms, 1),
        "completion_tokens": m.completion_tokens,
        "ignore_eos": m.ignore_eos,
    }
    for key, value in attrs.items():
        trial.set_user_attr(key, value)


class _TrialRunner:
    """The objective function Optuna calls once per trial."""

    def __init__(self, *, config: Config, control, client: ServerClient, workload: Workload,
                 objectives: list[Objective], reporter: Reporter, api_key: str | None, store):
        self.config = config
        self.control = control
        self.client = client
        self.workload = workload
        self.objectives = objectives
        self.reporter = reporter
        self.api_key = api_key
        self.store = store
        self.base = params_from_argv(config.server.argv)
        self.fatal: LaunchError | None = None
        self.hardware_checked = False  # this worker's GPUs match the study's (after its first launch)

    def __call__(self, trial: optuna.Trial) -> list[float]:
        cfg = self.config
        params = suggest(trial, cfg.space, self.base)
        spec = launch_spec(cfg.server, params, api_key=self.api_key)
        trial.set_user_attr("launch_command", spec.launch_command)
        trial.set_user_attr("flags", params.as_dict())
        trial.set_user_attr("target", cfg.target.host)
        trial.set_user_attr("url", cfg.target.url)
        trial.set_user_attr("worker", WORKER)
        self.reporter.trial_started(trial.number, params, spec.launch_command)
        verdict = self._wait_if_running_elsewhere(trial, params)
        if verdict is not None:
            return self._settled(trial, verdict)
        try:
            return self._run(trial, params, spec)
        except KeyboardInterrupt:
            trial.set_user_attr("fail_reason", "interrupted")
            self._save_log(trial, spec)
            self._note(trial, "FAIL")
            raise
        except HostError as exc:
            trial.set_user_attr("fail_reason", redact(str(exc), spec.secrets))
            raise

    def _check_hardware(self, trial: optuna.Trial, info) -> None:
        """Results from different GPUs must not be mixed silently: the study remembers the
        hardware of its first measured trial, and a worker on other hardware refuses to join."""
        if not info.accelerator:
            return
        mine = {"accelerator": info.accelerator, "gpu_count": info.gpu_count}
        study = trial.study
        recorded = study.user_attrs.get("hardware")
        if recorded is None:
            study.set_user_attr("hardware", {**mine, "first_target": self.config.target.host})
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
                recover_stale_trials(trial.study, self.reporter)
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
            trial.set_user_attr("duplicate_of", earlier.number)
            for key, value in earlier.user_attrs.items():
                if key not in ("flags", "launch_command", "target", "server_log_artifact", "worker") and key not in trial.user_attrs:
                    trial.set_user_attr(key, value)
            self._record_hypervolume(trial, list(earlier.values))
            self._note(trial, "COMPLETE (duplicate)", list(earlier.values))
            return list(earlier.values)
        trial.set_user_attr("ruled_out_by", earlier.number)
        trial.set_user_attr("failure_kind", earlier.user_attrs.get("failure_kind"))
        trial.set_user_attr("fail_reason", verdict.reason)
        self._note(trial, "PRUNED without a launch")
        raise optuna.TrialPruned(verdict.reason)

    def _note(self, trial: optuna.Trial, state: str, values: list[float] | None = None) -> None:
        try:
            notes.save(trial, state=state, metric_names=[o.name for o in self.objectives], values=values)
        except Exception as exc:  # a note is a convenience: it must never cost the trial
            self.reporter.warning(f"trial {trial.number}: could not save its dashboard note: {exc}")

    def _run(self, trial: optuna.Trial, params: Params, spec) -> list[float]:
        cfg = self.config
        self.reporter.phase("launching")
        self.control.start(spec)
        self.reporter.phase("waiting for the server")
        try:
            ready = wait_ready(
                self.control, self.client, params=params, timeout_s=cfg.target.ready_timeout_s,
                poll_s=cfg.target.poll_interval_s, url=cfg.target.url,
            )
        except LaunchError as exc:
            trial.set_user_attr("fail_reason", redact(exc.reason, spec.secrets))
            trial.set_user_attr("failure_kind", exc.kind)
            trial.set_user_attr("log_tail", _tail(exc.log_tail or self.control.log(), spec.secrets))
            self._save_log(trial, spec)
            self.control.stop()
            self._note(trial, "FAIL" if exc.fatal else "PRUNED")
            if exc.fatal:
                self.fatal = exc
                raise
            raise optuna.TrialPruned(exc.reason) from None
        info = ready.info
        try:
            self._check_hardware(trial, info)
        except LaunchError as exc:
            trial.set_user_attr("fail_reason", exc.reason)
            self.control.stop()
            self._note(trial, "FAIL")
            self.fatal = exc
            raise
        trial.set_user_attr("startup_s", round(ready.startup_s, 1))
        if info.args.get("mem_fraction_static") is not None:
            trial.set_user_attr("server_mem_fraction_static", info.args.get("mem_fraction_static"))
        trial.set_user_attr("max_total_num_tokens", info.max_total_num_tokens)
        trial.set_user_attr("max_running_requests", info.max_running_requests)
        if info.version:
            trial.set_user_attr("sglang_version", info.version)
        if info.accelerator:
            trial.set_user_attr("accelerator", info.accelerator)
        if info.gpu_count:
            trial.set_user_attr("gpu_count", info.gpu_count)
        try:
            m = measure(
                url=cfg.target.url, bench=cfg.bench, info=info, workload=self.workload, client=self.client,
                api_key=self.api_key, progress=lambda phase, done, total: self.reporter.phase(f"{phase} {done}/{total}"),
            )
        except MeasureError as exc:
            status, _ = self.control.poll()
            reason = str(exc)
            if not status.running:
                reason += f"; the server exited ({status.exit_code})" if status.exit_code is not None else "; the server is gone"
            trial.set_user_attr("fail_reason", redact(reason, spec.secrets))
            log = self.control.log()
            trial.set_user_attr("log_tail", _tail(log, spec.secrets))
            if re.search(r"out of memory|OutOfMemoryError", log[-200000:], re.I):
                trial.set_user_attr("failure_kind", "memory_runtime")  # the sampler caps the mem fraction below it
            self._save_log(trial, spec)
            self.control.stop()
            self._note(trial, "FAIL")
            raise MeasureError(reason) from None
        record_measurement(trial, m)
        c = cfg.constraints
        if c.p99_itl_ms is not None or c.ttft_ms is not None:
            trial.set_user_attr("constraints", m.slo_values(p99_itl_ms=c.p99_itl_ms, ttft_ms=c.ttft_ms))
        self.control.poll()  # collect the rest of the log
        self._save_log(trial, spec)
        self.control.stop()
        values = score(self.objectives, m)
        self._record_hypervolume(trial, values)
        self._note(trial, "COMPLETE", values)
        return values

    def run_baseline(self, study: optuna.Study, kind: str, argv: list[str]) -> optuna.trial.FrozenTrial:
        """Measure one baseline like a trial, into the sibling study; never stops the run."""
        spec = command_spec(self.config.server, argv, api_key=self.api_key)
        trial = study.ask()
        trial.set_user_attr("baseline", kind)
        trial.set_user_attr("launch_command", spec.launch_command)
        trial.set_user_attr("target", self.config.target.host)
        trial.set_user_attr("url", self.config.target.url)
        trial.set_user_attr("worker", WORKER)
        self.reporter.trial_started(trial.number, Params(), spec.launch_command)
        self.reporter.phase(f"baseline: {kind.replace('_', ' ')}")
        try:
            values = self._run(trial, Params(), spec)
        except optuna.TrialPruned:
            return study.tell(trial, state=optuna.trial.TrialState.PRUNED)
        except (LaunchError, MeasureError) as exc:
            self.fatal = None  # a baseline SGLang cannot run is noted, not a reason to stop
            trial.set_user_attr("fail_reason", trial.user_attrs.get("fail_reason") or str(exc))
            return study.tell(trial, state=optuna.trial.TrialState.FAIL)
        except BaseException:
            study.tell(trial, state=optuna.trial.TrialState.FAIL)
            raise
        return study.tell(trial, values)

    def _record_hypervolume(self, trial: optuna.Trial, values: list[float]) -> None:
        """The front's normalised hypervolume with this trial in it (the history a study keeps)."""
        done = [list(t.values) for t in trial.study.get_trials(deepcopy=False, states=(optuna.trial.TrialState.COMPLETE,))]
        series = hypervolume.history(done + [values])
        trial.set_user_attr("hypervolume", round(series[-1], 4))

    def _save_log(self, trial: optuna.Trial, spec) -> None:
        if self.store is None:
            return
        try:
            artifacts.save_log(self.store, trial, redact(self.control.log(), spec.secrets))
        except Exception as exc:  # a full disk must not lose the trial's result
            self.reporter.warning(f"trial {trial.number}: could not store the server log: {exc}")


def _check_study(study: optuna.Study, names: list[str], config: Config) -> None:
    existing = study.metric_names
    if existing is not None and list(existing) != names:
        raise ConfigError(
            f"study {study.study_name!r} in {config.storage_url} records objectives {list(existing)}, "
            f"not {names}; use the same [study] objectives or another --study-name"
        )


def _pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def _heartbeat_stale_ids(study: optuna.Study) -> set[int]:
    """Trials whose worker stopped sending Optuna heartbeats (any machine)."""
    from optuna.storages._heartbeat import BaseHeartbeat, is_heartbeat_enabled

    storage = study._storage
    if not isinstance(storage, BaseHeartbeat) or not is_heartbeat_enabled(storage):
        return set()
    return set(storage._get_stale_trial_ids(study._study_id))


def recover_stale_trials(study: optuna.Study, reporter: "Reporter") -> list[int]:
    """RUNNING trials whose tuner is gone: killed on this machine (its pid is dead), or silent
    elsewhere (no heartbeat for the grace period).  They are marked FAIL with a fail_reason and
    their parameters queued again, so no measurement is lost and nothing stays RUNNING.

    Runs before Optuna's own stale-trial check (which would fail them without a reason)."""
    retried = []
    host = socket.gethostname()
    stale = _heartbeat_stale_ids(study)
    for t in study.get_trials(deepcopy=False, states=(optuna.trial.TrialState.RUNNING,)):
        worker = t.user_attrs.get("worker", "")
        name, _, pid = worker.rpartition(":")
        if t._trial_id in stale:
            reason = f"interrupted: its worker {worker or '?'} stopped sending heartbeats; retried"
        elif name == host and pid.isdigit() and int(pid) != os.getpid() and not _pid_alive(int(pid)):
            reason = f"interrupted: the tuner running it (pid {pid}) is gone; retried"
        else:
            continue
        storage = study._storage
        try:
            storage.set_trial_user_attr(t._trial_id, "fail_reason", reason)
            if not storage.set_trial_state_values(t._trial_id, optuna.trial.TrialState.FAIL):
                continue
        except (optuna.exceptions.UpdateFinishedTrialError, RuntimeError):
            continue  # another worker got there first
        study.enqueue_trial(t.params, user_attrs={"retry_of": t.number}, skip_if_exists=False)
        retried.append(t.number)
        reporter.warning(f"trial {t.number} was left RUNNING ({reason}): marked FAIL and queued again")
    return retried


def open_study(config: Config, *, sampler_name: str | None = None, seed: int | None = None,
               objectives: list[Objective] | None = None) -> tuple[optuna.Study, list[Objective]]:
    objectives = objectives or load_objectives(config.study.objectives, config.bench.concurrency_levels)
    names = [o.name for o in objectives]
    storage = open_storage(config)
    sampler = make_sampler(sampler_name or config.study.sampler, seed if seed is not None else config.study.seed,
                           n_objectives=len(names), constraints=config.constraints)
    try:
        study = optuna.create_study(
            study_name=config.study.name,
            storage=storage,
            sampler=sampler,
            directions=["maximize"] * len(names),
            load_if_exists=True,
        )
    except ValueError as exc:
        raise ConfigError(f"study {config.study.name!r} in {config.storage_url}: {exc}; use another --study-name") from None
    _check_study(study, names, config)
    if study.metric_names is None:
        study.set_metric_names(names)
    return study, objectives


def _measure_baselines(config: Config, runner: "_TrialRunner", study: optuna.Study, reporter: Reporter) -> dict:
    """The baselines this study has not measured yet (once per study)."""
    have = baselines.load(study._storage, study.study_name)
    missing = [k for k in baselines.KINDS if k not in have or have[k].state != optuna.trial.TrialState.COMPLETE]
    argvs = {k: baselines.baseline_argv(config.server.argv, k) for k in missing}
    todo = [k for k in missing if argvs[k] is not None and k not in have]
    if not todo:
        return have
    bstudy = optuna.create_study(study_name=baselines.study_name_for(study.study_name), storage=study._storage,
                                 directions=["maximize"] * len(runner.objectives), load_if_exists=True)
    if bstudy.metric_names is None:
        bstudy.set_metric_names([o.name for o in runner.objectives])
    for kind in todo:
        finished = runner.run_baseline(bstudy, kind, argvs[kind])
        reporter.trial_finished(finished)
    return baselines.load(study._storage, study.study_name)


def _fit(value, space, *, integer: bool):
    """A value moved into a [space] entry: clipped to a range, or the nearest choice."""
    if value is None:
        return None
    if isinstance(space, Choices):
        return min(space.choices, key=lambda c: abs(float(c) - float(value)))
    lo, hi = space.low, space.high
    value = min(max(value, lo), hi)
    if integer:
        return int(round(value))
    if space.step:
        value = lo + round((value - lo) / space.step) * space.step
    return round(value, 6)


def warm_start(config: Config, study: optuna.Study) -> list[dict]:
    """Enqueue, on a new study, the operator's current speculative shape and SGLang's own
    default for the model family, so the first trials already say how good the status quo is."""
    if study.trials:
        return []
    space = config.space
    argv = config.server.argv
    current = params_from_argv(argv)
    steps, topk, draft = baselines.family_default(argv)
    # Shapes only: the default sampler puts mem_fraction_static at the memory edge itself, and
    # pinning it here measurably hurts (benchmarks/results/sampler_benchmark.md).
    candidates = []
    if current.speculative_num_steps is not None:
        candidates.append(("current", Params(current.speculative_num_steps, current.speculative_eagle_topk,
                                             current.speculative_num_draft_tokens, None)))
    candidates.append(("sglang_default", Params(steps, topk, draft, None)))
    queued = []
    for label, p in candidates:
        params: dict = {}
        if space.speculative_num_steps is not None:
            params["speculative_num_steps"] = _fit(p.speculative_num_steps, space.speculative_num_steps, integer=True)
        if space.speculative_eagle_topk is not None:
            params["speculative_eagle_topk"] = _fit(p.speculative_eagle_topk or 1, space.speculative_eagle_topk, integer=True)
        topk_value = params.get("speculative_eagle_topk", p.speculative_eagle_topk or 1)
        steps_value = params.get("speculative_num_steps", p.speculative_num_steps or 3)
        if topk_value and topk_value > 1 and p.speculative_num_draft_tokens and (space.speculative_eagle_topk or space.speculative_num_draft_tokens):
            low, high = draft_token_bounds(steps_value, topk_value, space.draft_tokens_bound)
            params["speculative_num_draft_tokens"] = min(max(p.speculative_num_draft_tokens, low), high)
        if space.mem_fraction_static is not None and p.mem_fraction_static is not None:
            params["mem_fraction_static"] = _fit(p.mem_fraction_static, space.mem_fraction_static, integer=False)
        params = {k: v for k, v in params.items() if v is not None}
        if params and params not in queued:
            study.enqueue_trial(params, user_attrs={"warm_start": label}, skip_if_exists=True)
            queued.append(params)
    return queued


def _stop_rule(patience: int | None, reporter: Reporter) -> Callable[[optuna.Study, optuna.trial.FrozenTrial], None]:
    def callback(study: optuna.Study, trial: optuna.trial.FrozenTrial) -> None:
        recover_stale_trials(study, reporter)  # a same-host worker that died since
        if patience and hypervolume.stalled(study, patience):
            reporter.warning(f"the last {patience} trials grew the front's hypervolume by under 1%: stopping (--patience {patience})")
            study.stop()

    return callback


def run_study(
    config: Config,
    *,
    trials: int,
    sampler_name: str | None = None,
    seed: int | None = None,
    reporter: Reporter | None = None,
    timeout_s: float | None = None,
    patience: int | None = None,
) -> RunResult:
    """Run `trials` trials of the config's study (resuming it if it exists)."""
    reporter = reporter or SilentReporter()
    study, objectives = open_study(config, sampler_name=sampler_name, seed=seed)
    check_compatible(config.space, study)
    study.set_user_attr("sampler", sampler_name or config.study.sampler)
    recover_stale_trials(study, reporter)
    workload = load_workload(config.bench.prompts, seed=config.bench.seed, base_dir=config.base_dir)
    api_key = os.environ.get(config.target.api_key_env) if config.target.api_key_env else None
    store = artifacts.open_store(config)
    result = RunResult(study=study, objectives=objectives)
    shell = connect(config.target)
    client = ServerClient(config.target.url, api_key=api_key)
    try:
        with control_for(config, shell) as control:
            control.prepare()  # check the target; undo what a killed run left behind
            if config.target.manager == "process" and client.answers():
                raise HostError(
                    f"something already answers at {config.target.url} that the tuner did not start; "
                    "stop it or point [target] url (and --port) elsewhere"
                )
            runner = _TrialRunner(config=config, control=control, client=client, workload=workload,
                                  objectives=objectives, reporter=reporter, api_key=api_key, store=store)
            reporter.run_started(study, config, trials)
            if config.bench.ignore_eos:
                reporter.warning(IGNORE_EOS_WARNING)
            known = _measure_baselines(config, runner, study, reporter) if config.study.baselines else {}
            if config.study.enqueue_current:
                warm_start(config, study)
            result.baselines = known
            before = len(study.trials)
            try:
                study.optimize(
                    runner,
                    n_trials=trials,
                    timeout=timeout_s,
                    catch=(MeasureError,),
                    callbacks=[lambda s, t: reporter.trial_finished(t), _stop_rule(patience, reporter)],
                    gc_after_trial=False,
                )
            except LaunchError as exc:
                if not exc.fatal:
                    raise
                result.fatal = exc
            result.trials_run = len(study.trials) - before
    finally:
        client.close()
        shell.close()
    return result
