"""`python -m tuner.schedule`: a tuned `--speculative-adaptive-config` for SGLang 0.5.23.

    python -m tuner.schedule [--config PATH] [--study-name NAME] [--storage URL]
                             [--levels 1,2,4,8,16,32,64] [--out FILE] [--no-verify] [--apply] [--restore]

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
4. `--apply`: installed as `tuner.best --apply` installs a configuration, the JSON beside the
   drop-in (`/etc/sglang-tuner/<unit>.adaptive.json`) or the process's workdir; `--restore`
   undoes it.
"""

from __future__ import annotations

import argparse
import posixpath
import shlex
import sys
from dataclasses import dataclass, field
from pathlib import Path

import optuna
from optuna_dashboard import save_note

from tuner.cli import guarded, exit_with
from tuner.config import DEFAULT_CONFIG, Config, IntRange, apply_overrides, load_config
from tuner.errors import ConfigError, HostError, LaunchError, MeasureError, TunerError
from tuner.measure.objectives import load_objectives
from tuner.measure.workload import load_workload
from tuner.progress import SilentReporter
from tuner.results import artifacts, baselines
from tuner.results import adaptive_table as sch
from tuner.results import adaptive_reuse as reuse
from tuner.results.optuna_private import storage_of, trial_id_of
from tuner.results.record import SPECULATIVE_ADAPTIVE
from tuner.results.storage import load_existing_study
from tuner.sequence import Target, connected, launch, measure_server, refuse_if_answering
from tuner.sglang_args import ADAPTIVE_ALGORITHMS, SPECULATIVE_SHAPE, CommandLine, Params
from tuner.server.control.process import ProcessControl
from tuner.server.control.systemd import APPLIED_NAME, SystemdControl
from tuner.server.launch import LaunchSpec, command_spec
from tuner.server.readiness import wait_ready
from tuner.trial import TrialRunner

__all__ = ["main", "Plan", "plan_for", "gather", "adaptive_spec", "table_path_on_target"]

DEFAULT_MAX_LEVEL = 64  # when no trial says what the server's running-request cap is
TABLE_DIR = "/etc/sglang-tuner"


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
        reason = trial.user_attrs.get("fail_reason")
        self._say(f"  -> {trial.state.name}" + (f": {reason}" if reason else ""))

    def warning(self, text):
        print(f"warning: {text}", file=sys.stderr, flush=True)

    def _say(self, text):
        if not self.quiet:
            print(text, file=sys.stderr, flush=True)


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
    caps = [t.user_attrs.get("max_running_requests") for t in study.get_trials(deepcopy=False)
            if t.state.name == "COMPLETE" and (t.user_attrs.get("flags") or {}).get("speculative_eagle_topk") == 1]
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
                "prompts": b.prompts, "seed": b.seed}
    sched = config.model_copy(update={"bench": _schedule_bench(config, levels)})
    return Plan(sched, study, levels, steps, workload)


def _sibling(study: optuna.Study) -> optuna.Study | None:
    try:
        return optuna.load_study(study_name=baselines.study_name_for(study.study_name), storage=storage_of(study))
    except KeyError:
        return None


def gather(plan: Plan) -> None:
    """Every reusable measurement of the study and its baselines, into `plan.samples`."""
    hardware = plan.study.user_attrs.get("hardware")
    if plan.config.study.allow_mixed_hardware:
        hardware = None
    samples = sch.samples_from_trials(plan.study.get_trials(deepcopy=False), source="study", hardware=hardware)
    sibling = _sibling(plan.study)
    if sibling is not None:
        trials = sibling.get_trials(deepcopy=False)
        samples += sch.samples_from_trials(trials, source="baselines", hardware=hardware, workload=plan.workload)
        for t in trials:
            role = t.user_attrs.get("schedule") or {}
            if role.get("role") == "static" and t.state.name in ("PRUNED", "FAIL") and role.get("workload") == plan.workload:
                plan.failed[int(role["steps"])] = t.user_attrs.get("fail_reason", t.state.name)
    samples = [s for s in samples if s.steps in plan.steps]
    plan.fraction = reuse.table_fraction(samples, _fallback_fraction(plan))
    plan.samples, dropped = reuse.at_fraction(samples, plan.fraction)
    plan.set_aside = {**reuse.not_reusable(plan.study.get_trials(deepcopy=False), plan.levels), **dropped}


def _fallback_fraction(plan: Plan) -> float | None:
    """With no reusable launch: the command's own fraction, else the one the study's complete
    trials ran at most (a fraction known to start), else SGLang's default (None)."""
    own = plan.config.server.command_line.params().mem_fraction_static
    ran = [(t.user_attrs.get("flags") or {}).get("mem_fraction_static") for t in plan.study.get_trials(deepcopy=False)
           if t.state.name == "COMPLETE"]
    ran = [f for f in ran if isinstance(f, float)]
    return own if own is not None else (max(set(ran), key=ran.count) if ran else None)


def announce(plan: Plan) -> None:
    """Before any launch: what is reused, what is not and why, what is launched, at which
    fraction, and an estimate of the time it takes."""
    todo = [s for s in sch.missing_steps(plan.figs, plan.steps) if s not in plan.failed]
    reused: dict[int, list[str]] = {}
    for s in plan.samples:
        reused.setdefault(s.steps, []).append(s.source)
    cost = reuse.launch_cost(plan.study.get_trials(deepcopy=False), len(plan.config.bench.concurrency_levels) / len(_study_levels(plan)))
    for line in reuse.launch_plan_lines(reused, todo, plan.fraction, cost, plan.set_aside):
        print(line, file=sys.stderr, flush=True)


def open_sibling(plan: Plan, objectives) -> optuna.Study:
    storage = storage_of(plan.study)
    sibling = optuna.create_study(study_name=baselines.study_name_for(plan.study.study_name), storage=storage,
                                  directions=["maximize"] * len(objectives), load_if_exists=True)
    if sibling.metric_names is None:
        sibling.set_metric_names([o.name for o in objectives])
    return sibling


def static_spec(plan: Plan, target: Target, steps: int) -> LaunchSpec:
    """Steps 0: the command without speculation; else topk 1, draft steps + 1, at the table's
    one memory fraction (`plan.fraction`)."""
    command = plan.config.server.command_line
    if steps == 0:
        return command_spec(plan.config.server, command.without_speculation(), api_key=target.api_key)
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
    workload = load_workload(plan.config.bench.prompts, seed=plan.config.bench.seed, base_dir=plan.config.base_dir)
    runner = TrialRunner(config=plan.config, target=target, workload=workload, objectives=objectives,
                         reporter=reporter, store=artifacts.open_store(plan.config))
    return Session(target, runner, open_sibling(plan, objectives))


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
    spec = command_spec(config.server, command.with_args(extra), api_key=target.api_key)
    return spec


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
    by_level = {int(k): float(v) for k, v in (trial.user_attrs.get("concurrent_tps_by_level") or {}).items()}
    why = None
    if trial.state.name != "COMPLETE":
        why = f"the adaptive server did not run: {trial.user_attrs.get('fail_reason', trial.state.name)}"
    elif trial.user_attrs.get(SPECULATIVE_ADAPTIVE) is False:
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
def _applied_control(config: Config):
    def control(shell):
        if config.target.manager == "systemd":
            return SystemdControl(shell, unit=config.target.unit, name=config.study.name, stop_timeout_s=config.target.stop_timeout_s)
        return ProcessControl(shell, workdir=config.target.workdir, name=f"{config.study.name}-best", stop_timeout_s=config.target.stop_timeout_s)
    return control


def apply_table(config: Config, text: str, mem_fraction: float | None) -> None:
    """As `tuner.best --apply`: systemd, the drop-in of its own (50-sglang-tuner-best.conf) with
    the JSON beside it in /etc/sglang-tuner; process, the command left running, the JSON beside
    the workdir.  Waits until the server is ready and says where everything went."""
    with connected(config, control=_applied_control(config), prepare=False, restore=False) as target:
        path = table_path_on_target(config, target.control)
        install_table(target, path, text)
        spec = adaptive_spec(config, target, path, mem_fraction)
        if isinstance(target.control, SystemdControl):
            where = target.control.apply(spec, study=config.study.name)
            ready = wait_ready(target.control, target.client, params=spec.params, timeout_s=config.target.ready_timeout_s,
                               poll_s=config.target.poll_interval_s, url=config.target.url, spec=spec)
        else:
            target.control.prepare()  # the server an earlier --apply left running is ours: stopped first
            refuse_if_answering(target.client, config.target)
            ready = launch(target, spec)
            where = f"{target.control.dir}/server.log"
    adaptive = ready.info.args.get("speculative_adaptive")
    note = "" if adaptive in (True, None) else "; the server reports speculative_adaptive=false: it fell back to static"
    print(f"applied: ready in {ready.startup_s:.0f} s at {config.target.url} ({where}; table {path}){note}", file=sys.stderr)


def restore_applied(config: Config) -> None:
    """Undo `--apply` (or `tuner.best --apply`): systemd, the drop-in and the JSON removed and the
    unit restarted on its own command; process, the applied server stopped and the JSON removed."""
    with connected(config, control=_applied_control(config), prepare=False, restore=False) as target:
        ctl = target.control
        path = table_path_on_target(config, ctl)
        if isinstance(ctl, SystemdControl):
            dropin = f"{ctl.dropin_dir}/{APPLIED_NAME}"
            ctl._run(f"rm -f {shlex.quote(dropin)} {shlex.quote(path)} && systemctl daemon-reload")
            ctl._run(f"systemctl restart {ctl.unit}", check=False)
            where = f"{dropin} and {path} removed, {ctl.unit} restarted on its own command"
        else:
            ctl.stop()
            target.shell.run(f"rm -f {shlex.quote(path)}")
            where = f"the applied server stopped, {path} removed"
    print(f"restored: {where}", file=sys.stderr)


# -- the command -------------------------------------------------------------------------------
def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="python -m tuner.schedule",
                                description="A tuned --speculative-adaptive-config (SGLang 0.5.23) from the study's measurements.")
    p.add_argument("--config", default=DEFAULT_CONFIG, help=f"study config (default {DEFAULT_CONFIG})")
    p.add_argument("--study-name", help="overrides [study] name")
    p.add_argument("--storage", help="overrides [study] storage")
    p.add_argument("--levels", help="requests in flight, e.g. 1,2,4,8,16,32,64 (default: powers of two up to the server's running-request cap)")
    p.add_argument("--out", help="where to write the JSON (default studies/<name>.adaptive.json)")
    p.add_argument("--no-verify", action="store_true", help="write the table from measurements alone; never launch the adaptive server")
    p.add_argument("--apply", action="store_true", help="install the table on the target, as tuner.best --apply does")
    p.add_argument("--restore", action="store_true", help="undo --apply: remove the drop-in and the JSON, put the server back")
    return p


def run(args: argparse.Namespace) -> int:
    config = apply_overrides(load_config(args.config), study_name=args.study_name, storage=args.storage)
    if args.restore:
        restore_applied(config)
        return 0
    try:
        levels = sch.parse_levels(args.levels) if args.levels else None
    except ValueError as exc:
        raise ConfigError(str(exc)) from None
    plan = plan_for(config, load_existing_study(config), levels)
    gather(plan)
    announce(plan)
    reporter = LineReporter()
    out = Path(args.out or f"studies/{config.study.name}.adaptive.json")
    needs_launch = any(s not in plan.failed for s in sch.missing_steps(plan.figs, plan.steps))
    verify = not args.no_verify
    if needs_launch or verify:
        with connected(plan.config) as target:
            session = open_session(plan, target, reporter)
            if needs_launch:
                measure_missing(plan, session)
            cfg = _choose(plan)
            text = write_table(cfg, out)
            _report_table(plan, cfg, text, out)
            if verify:
                verify_table(plan, session, cfg)
    else:
        cfg = _choose(plan)
        text = write_table(cfg, out)
        _report_table(plan, cfg, text, out)
    if args.apply:
        apply_table(config, text, edge_mem_fraction(plan, cfg))
    return 0


def _report_table(plan: Plan, cfg: dict, text: str, out: Path) -> None:
    print_figures(plan, cfg)
    print(f"wrote {out} (load it with --speculative-adaptive --speculative-adaptive-config {out})", file=sys.stderr)
    print(text, end="")


def main(argv: list[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    optuna.logging.set_verbosity(optuna.logging.WARNING)
    return guarded(lambda: run(args), launch_prefix="the scheduled configuration did not come up: ")


if __name__ == "__main__":
    exit_with(main())
