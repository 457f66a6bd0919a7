"""The tuned `--speculative-adaptive-config` of a study (`python -m tuner.schedule` is its command).

1. Figures: concurrent throughput at every level (requests in flight) for every topk-1 steps
   value of the study's range plus 0 (speculation off).  What the study and its baselines
   measured at those levels is reused; each steps value still missing is launched once and
   measured at every level, recorded as a trial of `<name>@baselines` with `schedule` in its
   user attrs.
2. The table (`tuner/results/adaptive_table.py`): per level, one candidate, the measured best within
   the running-request cap the largest candidate leaves every level; written to `--out`
   (default `studies/<name>.adaptive.json`) and printed.
3. Unless `--no-verify`: the adaptive server launched with it and with SGLang's default table,
   every level measured, then a changing-load run.
4. `--apply`: installed as `tuner.best --apply` installs a configuration
   (`tuner/server/control/applied.py`), the JSON beside the drop-in
   (`/etc/sglang-tuner/<unit>.adaptive.json`) or the process's workdir; `--restore` undoes it.
"""

from __future__ import annotations

import posixpath
import shlex
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable

import optuna
from optuna_dashboard import save_note

from tuner.config import Config, IntRange
from tuner.errors import ConfigError, HostError, LaunchError, MeasureError, TunerError
from tuner.measure.objectives import load_objectives
from tuner.measure.workload import bench_workload
from tuner.progress import LineReporter
from tuner.results import artifacts, baselines, record
from tuner.results import adaptive_table as sch
from tuner.results import adaptive_reuse as reuse
from tuner.results.optuna_private import storage_of, trial_id_of
from tuner.results.storage import load_existing_study
from tuner.sequence import Target, connected, launch, measure_server
from tuner.server.connection import refuse_if_answering
from tuner.server.control import applied
from tuner.server.control.systemd import SystemdControl
from tuner.server.launch import LaunchSpec
from tuner.sglang_args import ADAPTIVE_ALGORITHMS, SPECULATIVE_SHAPE, CommandLine, Params
from tuner.trial import TrialRunner

__all__ = ["run", "Plan", "plan_for", "gather", "adaptive_spec", "static_spec", "table_path_on_target",
           "restore_applied", "apply_table", "load_sequence"]

DEFAULT_MAX_LEVEL = 64  # when no trial says what the server's running-request cap is
TABLE_DIR = "/etc/sglang-tuner"


@dataclass
class Plan:
    """What one `tuner.schedule` run works on."""

    config: Config  # with the schedule's [bench]: every level, the study's own first
    study: optuna.Study
    levels: list[int]
    steps: list[int]
    workload: dict
    samples: list[sch.Sample] = field(default_factory=list)
    failed: dict[int, str] = field(default_factory=dict)  # steps -> why its launch failed
    fraction: float | None = None  # the one mem_fraction_static of the table's launches (results/adaptive_reuse.py)
    set_aside: dict[str, str] = field(default_factory=dict)  # "study#3" -> why its figures are not used

    @property
    def figs(self) -> dict[int, dict[int, sch.Figure]]:
        return sch.figures(self.samples, self.levels)


# -- what the table needs ------------------------------------------------------------------
def _check_schedulable(config: Config) -> None:
    command = config.server.command_line
    if command.algorithm not in ADAPTIVE_ALGORITHMS:
        raise ConfigError(
            f"[server] command: --speculative-algorithm {command.algorithm}: SGLang's adaptive mode runs "
            f"{'/'.join(ADAPTIVE_ALGORITHMS)} only (others fall back to static); a schedule cannot be used with it"
        )
    topk = config.space.speculative_eagle_topk
    values = topk.values() if isinstance(topk, IntRange) else (topk.choices if topk else [command.get_int("speculative_eagle_topk", 1)])
    if 1 not in values:
        print("note: the study searches topk > 1 only; SGLang schedules topk-1 chains only (trees cannot be "
              "scheduled), so the table is built from topk-1 launches of its own", file=sys.stderr)


def _default_levels(study: optuna.Study) -> list[int]:
    caps = [t.user_attrs.get(record.MAX_RUNNING_REQUESTS) for t in study.get_trials(deepcopy=False)
            if t.state.name == "COMPLETE" and (t.user_attrs.get(record.FLAGS) or {}).get("speculative_eagle_topk") == 1]
    caps = [c for c in caps if isinstance(c, int) and c > 0]
    return sch.levels_up_to(min(caps) if caps else DEFAULT_MAX_LEVEL)


def _schedule_bench(config: Config, levels: list[int]):
    """The study's [bench] at every level: the study's own levels first (so a launch's
    objective values mean what the study's do), enough requests to hold the largest level."""
    ordered = list(dict.fromkeys([*config.bench.concurrency_levels, *levels]))
    requests = max(config.bench.concurrent_requests, 2 * max(ordered))
    return config.bench.model_copy(update={"concurrency": ordered, "concurrent_requests": requests})


def plan_for(config: Config, study: optuna.Study, levels: list[int] | None) -> Plan:
    _check_schedulable(config)
    levels = levels or _default_levels(study)
    space = config.space.speculative_num_steps
    values = space.values() if isinstance(space, IntRange) else (space.choices if space else None)
    steps = sch.steps_range(values, config.server.command_line.params().speculative_num_steps)
    b = config.bench
    workload = {"temperature": b.temperature, "top_p": b.top_p, "max_tokens": b.max_tokens, "ignore_eos": b.ignore_eos,
                "prompts": b.prompts_json, "seed": b.seed, **({"mix": b.mix} if b.mix else {})}
    sched = config.model_copy(update={"bench": _schedule_bench(config, levels)})
    return Plan(sched, study, levels, steps, workload)


def gather(plan: Plan) -> None:
    """Every reusable measurement of the study and its baselines, into `plan.samples`."""
    hardware = plan.study.user_attrs.get(record.HARDWARE)
    if plan.config.study.allow_mixed_hardware:
        hardware = None
    samples = sch.samples_from_trials(plan.study.get_trials(deepcopy=False), source="study", hardware=hardware)
    sibling = baselines.load_sibling(storage_of(plan.study), plan.study.study_name)
    if sibling is not None:
        trials = sibling.get_trials(deepcopy=False)
        samples += sch.samples_from_trials(trials, source="baselines", hardware=hardware, workload=plan.workload)
        for t in trials:
            role = t.user_attrs.get(record.SCHEDULE) or {}
            if role.get("role") == "static" and t.state.name in ("PRUNED", "FAIL") and role.get("workload") == plan.workload:
                plan.failed[int(role["steps"])] = t.user_attrs.get(record.FAIL_REASON, t.state.name)
    samples = [s for s in samples if s.steps in plan.steps]
    plan.fraction = reuse.table_fraction(samples, _fallback_fraction(plan))
    plan.samples, dropped = reuse.at_fraction(samples, plan.fraction)
    plan.set_aside = {**reuse.not_reusable(plan.study.get_trials(deepcopy=False), plan.levels), **dropped}


def _fallback_fraction(plan: Plan) -> float | None:
    """With no reusable launch: the command's own fraction, else the one the study's complete
    trials ran at most (a fraction known to start), else SGLang's default (None)."""
    own = plan.config.server.command_line.params().mem_fraction_static
    ran = [(t.user_attrs.get(record.FLAGS) or {}).get("mem_fraction_static") for t in plan.study.get_trials(deepcopy=False)
           if t.state.name == "COMPLETE"]
    ran = [f for f in ran if isinstance(f, float)]
    return own if own is not None else (max(set(ran), key=ran.count) if ran else None)


def announce(plan: Plan, say: Callable[[str], None]) -> None:
    """Before any launch: what is reused, what is not and why, what is launched, at which
    fraction, and an estimate of the time it takes."""
    todo = [s for s in sch.missing_steps(plan.figs, plan.steps) if s not in plan.failed]
    reused: dict[int, list[str]] = {}
    for s in plan.samples:
        reused.setdefault(s.steps, []).append(s.source)
    cost = reuse.launch_cost(plan.study.get_trials(deepcopy=False), len(plan.config.bench.concurrency_levels) / len(_study_levels(plan)))
    for line in reuse.launch_plan_lines(reused, todo, plan.fraction, cost, plan.set_aside):
        say(line)


def static_spec(plan: Plan, target: Target, steps: int) -> LaunchSpec:
    """Steps 0: the command without speculation; else topk 1, draft steps + 1, at the table's
    one memory fraction (`plan.fraction`)."""
    command = plan.config.server.command_line
    if steps == 0:
        return target.command_spec(command.without_speculation())
    return target.spec(Params(steps, 1, steps + 1, plan.fraction))


@dataclass
class Session:
    """A connected target with a runner recording launches into `<name>@baselines`."""

    target: Target
    runner: TrialRunner
    sibling: optuna.Study


def open_session(plan: Plan, target: Target, reporter) -> Session:
    refuse_if_answering(target.client, plan.config.target)
    objectives = load_objectives(plan.config.study.objectives, _study_levels(plan))
    workload = bench_workload(plan.config.bench, plan.config.base_dir)
    runner = TrialRunner(config=plan.config, target=target, workload=workload, objectives=objectives,
                         reporter=reporter, store=artifacts.open_store(plan.config))
    sibling = baselines.open_sibling(storage_of(plan.study), plan.study.study_name, [o.name for o in objectives])
    return Session(target, runner, sibling)


def _study_levels(plan: Plan) -> list[int]:
    """The study's own [bench] levels (its objectives' names depend on them)."""
    names = list(plan.study.metric_names or [])
    per_level = [int(n.split("@")[1]) for n in names if "@" in n and n.split("@")[1].isdigit()]
    return per_level or plan.config.bench.concurrency_levels[:1]


def measure_missing(plan: Plan, session: Session) -> None:
    """One launch per steps value that lacks a figure at some level; all levels measured."""
    todo = [s for s in sch.missing_steps(plan.figs, plan.steps) if s not in plan.failed]
    for steps in todo:
        spec = static_spec(plan, session.target, steps)
        attrs = {"role": "static", "steps": steps, "levels": plan.levels, "workload": plan.workload}
        trial = session.runner.run_schedule(session.sibling, spec, attrs, label=f"steps {steps}" if steps else "no speculation")
        session.runner.reporter.trial_finished(trial)
    gather(plan)


# -- the table -------------------------------------------------------------------------------
def _choose(plan: Plan) -> dict:
    figs = plan.figs
    candidates = sch.choose(figs)
    empty = [lvl for lvl in plan.levels if lvl not in candidates]
    if not candidates:
        why = "; ".join(f"steps {s}: {r}" for s, r in plan.failed.items()) or "no launch measured any level"
        raise TunerError(f"no configuration was measured at any of the levels {plan.levels} ({why}); "
                         "check that the server starts with the study's configurations")
    if empty:
        print(f"warning: no figure at level(s) {', '.join(map(str, empty))}; those keys are left out "
              "(their batches use the nearest lower key)", file=sys.stderr)
    return sch.table_for(candidates)


def print_figures(plan: Plan, cfg: dict) -> None:
    figs = plan.figs
    chosen = sch.candidates_of(cfg)
    print("tok/s per level (requests in flight) and steps; * = in candidate_steps, ± = noise", file=sys.stderr)
    for level in plan.levels:
        row = figs.get(level, {})
        cells = [f"{s}:{row[s].tps:,.0f}±{row[s].noise:,.0f}{'*' if s in chosen.get(level, []) else ''}" for s in sorted(row)]
        print(f"  {level:>4}  " + "  ".join(cells), file=sys.stderr)
    for steps, reason in plan.failed.items():
        print(f"  steps {steps} could not be measured: {reason}", file=sys.stderr)


def write_table(cfg: dict, out: Path) -> str:
    text = sch.dumps(cfg)
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = out.with_name(out.name + ".tmp")
    tmp.write_text(text)
    tmp.replace(out)
    return text


# -- the table on the target -----------------------------------------------------------------
def table_path_on_target(config: Config, control, *, role: str = "applied") -> str:
    """systemd: /etc/sglang-tuner/<unit>.adaptive.json (verification: <unit>.<role>.adaptive.json);
    process: beside the workdir, <workdir>/<study>.adaptive.json."""
    if isinstance(control, SystemdControl):
        unit = control.unit.removesuffix(".service")
        return f"{TABLE_DIR}/{unit}.adaptive.json" if role == "applied" else f"{TABLE_DIR}/{unit}.{role}.adaptive.json"
    workdir = posixpath.dirname(control.dir.rstrip("/"))
    name = config.study.name if role == "applied" else f"{config.study.name}.{role}"
    return f"{workdir}/{name}.adaptive.json"


def install_table(target: Target, path: str, text: str) -> None:
    """Write the JSON on the target atomically (sudo for systemd, readable by the unit's user)."""
    sudo = isinstance(target.control, SystemdControl)
    q, tmp = shlex.quote(path), shlex.quote(path + ".tmp")
    result = target.shell.run(f"mkdir -p {shlex.quote(posixpath.dirname(path))} && cat > {tmp} && chmod 644 {tmp} && mv -f {tmp} {q}",
                              sudo=sudo, stdin_text=text)
    if not result.ok:
        raise HostError(f"{target.shell.description}: cannot write {path}: {(result.stderr or result.stdout).strip()[:200]}")


def adaptive_spec(config: Config, target: Target, table_path: str | None, mem_fraction: float | None) -> LaunchSpec:
    """The operator's command with adaptive mode on (SGLang resolves steps to the middle of the
    table's candidates, topk 1, draft steps + 1) at `mem_fraction`; no table = SGLang's default."""
    command: CommandLine = config.server.command_line.without([*SPECULATIVE_SHAPE, "speculative_adaptive", "speculative_adaptive_config"])
    extra = ["--speculative-adaptive"] + (["--speculative-adaptive-config", table_path] if table_path else [])
    if mem_fraction is not None:
        extra += ["--mem-fraction-static", f"{mem_fraction:.6g}"]
    return target.command_spec(command.with_args(extra))


def edge_mem_fraction(plan: Plan, cfg: dict) -> float | None:
    """The memory fraction the largest candidate ran with: adaptive sizes draft buffers for
    max(candidate_steps) + 1, so the adaptive server needs what that static launch needed."""
    largest = max(sch.validate(cfg))
    return sch.launch_mem_fraction(plan.samples, largest, plan.config.server.command_line.params().mem_fraction_static)


# -- verification ----------------------------------------------------------------------------
def _adaptive_launch(plan: Plan, session: Session, cfg: dict | None, mfs: float | None):
    """One adaptive server (the tuned table, or SGLang's default with `cfg` None) measured at
    every level, recorded in `<name>@baselines`; (trial, tok/s by level, why it did not count)."""
    target = session.target
    path = None
    if cfg is not None:
        path = table_path_on_target(plan.config, target.control, role="verify")
        install_table(target, path, sch.dumps(cfg))
    role = "tuned" if cfg is not None else "sglang_default"
    attrs = {"role": role, "table": cfg or sch.DEFAULT_ADAPTIVE_CONFIG, "levels": plan.levels, "workload": plan.workload}
    trial = session.runner.run_schedule(session.sibling, adaptive_spec(plan.config, target, path, mfs), attrs,
                                        label="tuned table" if cfg is not None else "SGLang's default table")
    session.runner.reporter.trial_finished(trial)
    by_level = {int(k): float(v) for k, v in (trial.user_attrs.get(record.CONCURRENT_TPS_BY_LEVEL) or {}).items()}
    why = None
    if trial.state.name != "COMPLETE":
        why = f"the adaptive server did not run: {trial.user_attrs.get(record.FAIL_REASON, trial.state.name)}"
    elif trial.user_attrs.get(record.SPECULATIVE_ADAPTIVE) is False:
        why = "the server reports speculative_adaptive=false in /server_info: it fell back to static speculation"
    return trial, ({} if why else by_level), why


def load_sequence(levels: list[int]) -> list[int]:
    """A changing load over the measured levels, up and down: 1 -> hi/2 -> 4 -> hi -> 2."""
    hi = max(levels)
    return [x for x in dict.fromkeys([1, hi // 2, 4, hi, 2]) if 1 <= x <= hi]


def changing_load(plan: Plan, session: Session, cfg: dict, mfs: float | None, per_level: dict[int, float]) -> str:
    """The tuned server under a load that jumps between levels (each held for the schedule's
    concurrent_requests): no stream may be dropped and no level may collapse (< half its
    steady per-level rate) while the steps switch."""
    target = session.target
    path = table_path_on_target(plan.config, target.control, role="verify")
    seq = load_sequence(plan.levels)
    bench = plan.config.bench.model_copy(update={"concurrency": seq})
    try:
        ready = launch(target, adaptive_spec(plan.config, target, path, mfs), phase=session.runner.reporter.phase)
        m = measure_server(target, ready.info, session.runner.workload, bench=bench, phase=session.runner.reporter.phase)
    except (LaunchError, MeasureError) as exc:
        return f"changing load {' -> '.join(map(str, seq))}: FAILED, {exc}"
    finally:
        target.control.stop()
    collapsed = [f"{lvl} ({m.concurrent_tps_by_level[lvl]:,.0f} vs {per_level[lvl]:,.0f} tok/s)"
                 for lvl in seq if lvl in per_level and m.concurrent_tps_by_level.get(lvl, 0) < 0.5 * per_level[lvl]]
    rates = ", ".join(f"{lvl}: {m.concurrent_tps_by_level.get(lvl, 0):,.0f}" for lvl in seq)
    if collapsed:
        return f"changing load {' -> '.join(map(str, seq))}: no stream dropped, but throughput collapsed at {', '.join(collapsed)}"
    return f"changing load {' -> '.join(map(str, seq))}: no stream dropped, no level collapsed (tok/s {rates})"


def verify_table(plan: Plan, session: Session, cfg: dict) -> None:
    """Launch the tuned table and SGLang's default one, compare per level with the best static
    configuration, run the changing load; print one table and a verdict, note it on the dashboard."""
    mfs = edge_mem_fraction(plan, cfg)
    tuned_trial, tuned, why = _adaptive_launch(plan, session, cfg, mfs)
    if why is not None:
        print(f"verification: {why}. The table is written; verify it on SGLang 0.5.23 or later "
              "(EAGLE/EAGLE3/NEXTN, topk 1, no attention DP).", file=sys.stderr)
        return
    _, default, why_default = _adaptive_launch(plan, session, None, mfs)
    load_line = changing_load(plan, session, cfg, mfs, tuned)
    rows = sch.rows_for(plan.figs, plan.levels, default, tuned)
    table = sch.comparison_markdown(rows, cfg)
    lines = [table, f"verdict: {sch.verdict(rows)}", load_line]
    if why_default:
        lines.append(f"SGLang's default table: {why_default}")
    print("\n".join(lines), file=sys.stderr)
    body = "## Verification of the tuned table\n\n```json\n" + sch.dumps(cfg) + "```\n\n" + "\n\n".join(lines) + "\n"
    try:
        save_note(optuna.Trial(session.sibling, trial_id_of(session.sibling, tuned_trial.number)), body)
    except Exception as exc:  # a note is a convenience
        print(f"warning: could not save the verification's dashboard note: {exc}", file=sys.stderr)


# -- --apply / --restore ----------------------------------------------------------------------
def apply_table(config: Config, text: str, mem_fraction: float | None) -> None:
    """As `tuner.best --apply` (tuner/server/control/applied.py): systemd, the drop-in of its own
    (50-sglang-tuner-best.conf) with the JSON beside it in /etc/sglang-tuner; process, the command
    left running, the JSON beside the workdir.  Waits until the server is ready and says where
    everything went."""
    paths: list[str] = []

    def spec_of(target: Target) -> LaunchSpec:
        paths.append(table_path_on_target(config, target.control))
        install_table(target, paths[0], text)
        return adaptive_spec(config, target, paths[0], mem_fraction)

    done = applied.apply(config, spec_of)
    adaptive = done.ready.info.args.get("speculative_adaptive")
    note = "" if adaptive in (True, None) else "; the server reports speculative_adaptive=false: it fell back to static"
    print(f"applied: ready in {done.ready.startup_s:.0f} s at {config.target.url} ({done.where}; table {paths[0]}){note}", file=sys.stderr)


def restore_applied(config: Config) -> str:
    """Undo `--apply` (or `tuner.best --apply`): systemd, the drop-in and the JSON removed and the
    unit restarted on its own command; process, the applied server stopped and the JSON removed."""
    return applied.restore(config, also_remove=lambda control: [table_path_on_target(config, control)])


# -- the run ------------------------------------------------------------------------------------
def run(config: Config, *, levels: list[int] | None, out: Path, verify: bool, apply: bool,
        on_written: Callable[[Plan, dict, str], None], reporter=None) -> tuple[dict, str]:
    """Measure what the table lacks, choose it, write it to `out` (then `on_written`, which
    shows it), verify it unless not `verify`, install it if `apply`; the table and its text."""
    plan = plan_for(config, load_existing_study(config), levels)
    gather(plan)
    announce(plan, lambda line: print(line, file=sys.stderr, flush=True))
    needs_launch = any(s not in plan.failed for s in sch.missing_steps(plan.figs, plan.steps))
    if needs_launch or verify:
        with connected(plan.config) as target:
            session = open_session(plan, target, reporter or LineReporter())
            if needs_launch:
                measure_missing(plan, session)
            cfg, text = _write(plan, out, on_written)
            if verify:
                verify_table(plan, session, cfg)
    else:
        cfg, text = _write(plan, out, on_written)
    if apply:
        apply_table(config, text, edge_mem_fraction(plan, cfg))
    return cfg, text


def _write(plan: Plan, out: Path, on_written: Callable[[Plan, dict, str], None]) -> tuple[dict, str]:
    cfg = _choose(plan)
    text = write_table(cfg, out)
    on_written(plan, cfg, text)
    return cfg, text
