"""What a run would launch and cost, asked without starting or writing anything (`--dry-run`).

`plan` connects to the target (SSH, the unit, the URL), lists the launches of the baselines
still to measure and of the first proposals, and estimates the run (`run_estimate`, which the
progress line uses too).  The proposals: the finished trials of the real study (if any) are copied into an in-memory study with the same
sampler; the warm start is queued there as a new study would queue it, and the first proposals
are asked of that copy.  Nothing is written to the real store.  Later proposals depend on what
these measure, so only the first few are meaningful.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import optuna

from tuner.config import Config, sqlite_path
from tuner.errors import ConfigError
from tuner.measure.objectives import load_objectives
from tuner.results import baselines, record
from tuner.results.estimate import Estimate, estimate
from tuner.results.resilient import redacted_url
from tuner.results.storage import existing_storage
from tuner.search.samplers import make_sampler, searches_memory_edge
from tuner.search.space import suggest
from tuner.search.warm_start import warm_start
from tuner.server.connection import connected, refuse_if_answering
from tuner.server.preflight import check_model
from tuner.sglang_args import CommandLine, Params

__all__ = ["first_proposals", "run_estimate", "plan", "DryRunPlan", "clock", "PROPOSALS_SHOWN"]

PROPOSALS_SHOWN = 3  # later proposals depend on what these measure


def first_proposals(config: Config, study: optuna.Study | None, n: int, *, metric_names: list[str],
                    sampler_name: str | None = None, seed: int | None = None) -> list[tuple[Params, str]]:
    """The parameter sets a run would launch first, each with where it comes from: the queued
    ones (warm start, retries) and the sampler's first proposal, at most `n` (what the sampler
    proposes after that depends on what these measure)."""
    sampler = make_sampler(sampler_name or config.study.sampler, seed if seed is not None else config.study.seed,
                           n_objectives=len(metric_names), constraints=config.constraints)
    copy = optuna.create_study(storage=optuna.storages.InMemoryStorage(), sampler=sampler,
                               directions=["maximize"] * len(metric_names))
    copy.set_metric_names(metric_names)
    if study is not None:
        for key, value in study.user_attrs.items():
            copy.set_user_attr(key, value)
        copy.add_trials([t for t in study.get_trials(deepcopy=False) if t.state.is_finished()])
        for t in study.get_trials(deepcopy=False, states=(optuna.trial.TrialState.WAITING,)):
            copy.enqueue_trial(t.params, user_attrs=dict(t.user_attrs))
    if config.study.enqueue_current:
        warm_start(config, copy)
    base = config.server.command_line.params()
    out = []
    for _ in range(n):
        trial = copy.ask()  # left RUNNING: the next proposal treats it as taken, as a run would
        warm = trial.user_attrs.get(record.WARM_START)
        source = warm or ("retry" if trial.user_attrs.get(record.RETRY_OF) is not None else "sampler")
        out.append((suggest(trial, config.space, base), "warm start: " + source if warm is not None else source))
        if source == "sampler":
            break
    return out


def run_estimate(config: Config, study: optuna.Study | None, arms: dict, trials: int, n_baselines: int, *,
                 sampler: str | None = None) -> Estimate:
    """The run's duration and GPU time from the study's history (and its baselines').  The
    memory edge costs launches only with a sampler that searches it (`sampler`: --sampler,
    else [study] sampler)."""
    hardware = study.user_attrs.get(record.HARDWARE) if study is not None else None
    gpus = (hardware or {}).get(record.GPU_COUNT) or _gpus_of(config.server.command_line)
    history = [t for t in (study.get_trials(deepcopy=False) if study is not None else []) if t.state.is_finished()]
    edge = config.space.mem_fraction_static is not None and searches_memory_edge(sampler or config.study.sampler)
    return estimate(history + list(arms.values()), n_trials=trials, n_baselines=n_baselines, gpus=gpus,
                    memory_edge_searched=edge, concurrent_cap_s=config.bench.level_seconds * len(config.bench.concurrency_levels),
                    load_sweep=config.sweep_slo is not None,
                    emulator="sglang_emulator" in config.server.command_line.prefix)


def _gpus_of(command: CommandLine) -> int:
    return (command.get_int("tp_size") or 1) * (command.get_int("dp_size") or 1)


def clock(seconds: float) -> str:
    """A duration as 1h04m or 3m20s."""
    seconds = int(round(seconds))
    return f"{seconds // 3600}h{seconds % 3600 // 60:02d}m" if seconds >= 3600 else f"{seconds // 60}m{seconds % 60:02d}s"


@dataclass
class DryRunPlan:
    """What a run of `trials` trials would launch and cost (`--dry-run`; `as_json` is its `--json`)."""

    study: str
    storage: str  # redacted
    target: str
    url: str
    earlier_trials: int
    trials: int
    answers: bool = False  # something answers at the URL (process targets are refused then: a systemd unit's own server)
    model: dict = field(default_factory=dict)  # {"path", "found"}: server/preflight.py
    launches: list[dict] = field(default_factory=list)  # {"baseline": kind, ...} or {"trial": n, "source": ..., "flags": ...}
    estimate: Estimate | None = None

    @property
    def baselines(self) -> int:
        return sum("baseline" in launch for launch in self.launches)

    @property
    def proposals(self) -> int:
        return sum("trial" in launch for launch in self.launches)

    def as_json(self) -> dict:
        est = self.estimate
        return {"study": self.study, "storage": self.storage, "target": self.target, "url": self.url,
                "answers": self.answers, "model": self.model,
                "earlier_trials": self.earlier_trials, "trials": self.trials, "launches": self.launches,
                "estimate": {"duration_s": round(est.total_s), "gpu_hours": round(est.gpu_hours, 2), "gpus": est.gpus,
                             "per_trial_s": round(est.per_trial_s), "expected_failed_launches": min(est.expected_pruned, self.trials),
                             "from": est.sources},
                "warnings": est.warnings}


def _read_study(config: Config, names: list[str]) -> tuple[optuna.Study | None, dict]:
    """The study and its baselines' sibling if they exist, opened without creating anything."""
    path = sqlite_path(config.storage_url)
    if path is not None and not path.exists():
        return None, {}
    storage = existing_storage(config)
    try:
        study = optuna.load_study(study_name=config.study.name, storage=storage)
    except KeyError:
        return None, {}
    if study.metric_names is not None and list(study.metric_names) != names:
        raise ConfigError(f"study {study.study_name!r} in {redacted_url(config.storage_url)} records objectives "
                          f"{list(study.metric_names)}, not {names}; use the same [study] objectives or another --study-name")
    return study, baselines.load(storage, study.study_name)


def plan(config: Config, trials: int, *, sampler: str | None = None, seed: int | None = None) -> DryRunPlan:
    """What a run of `trials` trials would launch and cost; connects to the target (SSH,
    unit, URL) but starts nothing and writes nothing."""
    names = [o.name for o in load_objectives(config.study.objectives, config.bench.concurrency_levels)]
    study, arms = _read_study(config, names)
    command = config.server.command_line
    todo = baselines.missing(arms, command) if config.study.baselines and trials > 0 else []
    earlier = len(study.trials) if study is not None else 0
    with connected(config, prepare=config.target.manager == "systemd", restore=False) as target:
        refuse_if_answering(target.client, config.target)
        model = check_model(target, target.command)  # a missing model: the real run's error line, now
        result = DryRunPlan(config.study.name, redacted_url(config.storage_url), target.control.description,
                            config.target.url, earlier, trials, answers=target.client.answers(),
                            model={"path": model.model, "found": model.found})
        result.launches = [{"baseline": kind, "launch_command": target.command_spec(baselines.baseline_command(command, kind)).launch_command}
                           for kind in todo]
        proposals = first_proposals(config, study, min(trials, PROPOSALS_SHOWN), metric_names=names, sampler_name=sampler, seed=seed)
        result.launches += [{"trial": i, "source": source, "flags": params.as_dict(), "launch_command": target.spec(params).launch_command}
                            for i, (params, source) in enumerate(proposals, start=earlier)]
    result.estimate = run_estimate(config, study, arms, trials, len(todo), sampler=sampler)
    return result
