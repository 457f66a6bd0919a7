"""The report's schedule section: the latest tuned `--speculative-adaptive-config` that
`tuner.schedule` verified (a trial of `<name>@baselines` with `schedule.role == "tuned"`), its
table and the per-level comparison with SGLang's default table and the best static figures."""

from __future__ import annotations

from dataclasses import dataclass

import optuna
from optuna.trial import FrozenTrial, TrialState

from tuner.results import record
from tuner.results import adaptive_table as sch
from tuner.results.baselines import load_sibling
from tuner.results.optuna_private import storage_of
from tuner.results.report.contents import Table

__all__ = ["ScheduleSection", "schedule_for"]


@dataclass
class ScheduleSection:
    trial: int  # the tuned launch's number in <name>@baselines
    table_json: str
    comparison: Table
    verdict: str
    note: str | None  # e.g. the server fell back to static


def _role(t: FrozenTrial) -> str | None:
    attrs = t.user_attrs.get(record.SCHEDULE)
    return attrs.get("role") if isinstance(attrs, dict) else None


def _by_level(t: FrozenTrial | None) -> dict[int, float]:
    if t is None or t.state != TrialState.COMPLETE or t.user_attrs.get(record.SPECULATIVE_ADAPTIVE) is False:
        return {}
    raw = t.user_attrs.get(record.CONCURRENT_TPS_BY_LEVEL) or {}
    return {int(k): float(v) for k, v in raw.items() if str(k).isdigit()}


def _comparison(rows: list[sch.Row], cfg: dict) -> Table:
    slots = sch.candidates_of(cfg)
    out = []
    for r in rows:
        b = r.best_static
        key = max((k for k in slots if k <= r.level), default=min(slots))
        out.append([str(r.level), "-" if b is None else f"{b.tps:,.0f} ±{b.noise:,.0f} ({b.steps})",
                    "-" if r.default is None else f"{r.default:,.0f}", "-" if r.tuned is None else f"{r.tuned:,.0f}",
                    str(slots[key]), "-" if r.tuned_vs_default is None else f"{r.tuned_vs_default:+.1%}"])
    return Table(["in flight", "best static (steps)", "SGLang default table", "tuned table", "tuned candidates", "tuned vs default"], out)


def schedule_for(study: optuna.Study) -> ScheduleSection | None:
    """The latest tuned table of `study`'s schedule launches, or None when it has none."""
    sibling = load_sibling(storage_of(study), study.study_name)
    if sibling is None:
        return None
    trials = sorted(sibling.get_trials(deepcopy=False), key=lambda t: t.number)
    tuned = [t for t in trials if _role(t) == "tuned" and t.state.is_finished()]
    if not tuned:
        return None
    last = tuned[-1]
    attrs = last.user_attrs[record.SCHEDULE]
    cfg, levels, workload = attrs.get("table") or {}, attrs.get("levels") or [], attrs.get("workload")
    try:
        sch.validate(cfg)
    except (ValueError, AttributeError):
        return None
    default = next((t for t in trials if t.number > last.number and _role(t) == "sglang_default"), None)
    hardware = study.user_attrs.get(record.HARDWARE)
    samples = sch.samples_from_trials(study.get_trials(deepcopy=False), source="study", hardware=hardware)
    samples += sch.samples_from_trials(trials, source="baselines", hardware=hardware, workload=workload)
    rows = sch.rows_for(sch.figures(samples, levels), levels, _by_level(default), _by_level(last))
    note = None
    if last.state != TrialState.COMPLETE:
        note = f"the tuned server did not run: {last.user_attrs.get(record.FAIL_REASON, last.state.name)}"
    elif last.user_attrs.get(record.SPECULATIVE_ADAPTIVE) is False:
        note = "the server reported speculative_adaptive=false: it fell back to static speculation"
    return ScheduleSection(last.number, sch.dumps(cfg), _comparison(rows, cfg), sch.verdict(rows), note)
