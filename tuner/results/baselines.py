"""What static tuning is compared with: the same server with no speculation, and with SGLang
0.5.23's own `--speculative-adaptive` (runtime step switching by batch size, topk 1 only).

Baselines are measured like trials, into a sibling study `<name>@baselines` (same
objectives), so the sampler never sees them as part of the search space.  A baseline counts
as done only when COMPLETE: one that failed or was interrupted is measured again on the next
run.  `compare` says what the front adds over each, or that it adds nothing within measurement
noise; `study_note` writes both as the study's optuna-dashboard note.
"""

from __future__ import annotations

from dataclasses import dataclass

import optuna
from optuna.trial import FrozenTrial, TrialState

from tuner.results import record
from tuner.results.picks import DEFAULT_NOISE, measured_front
from tuner.sglang_args import ADAPTIVE_ALGORITHMS, SPECULATIVE_SHAPE, CommandLine

__all__ = ["KINDS", "baseline_argv", "study_name_for", "load", "load_sibling", "open_sibling", "compare", "Comparison", "baseline_command", "missing",
           "study_note", "save_study_note", "as_json"]

KINDS = ("no_speculation", "adaptive")
SUFFIX = "@baselines"


def study_name_for(name: str) -> str:
    return name + SUFFIX


def baseline_command(command: CommandLine, kind: str) -> CommandLine | None:
    """The operator's command turned into a baseline; None when SGLang cannot run it."""
    if kind == "no_speculation":
        return command.without_speculation()
    if command.algorithm not in ADAPTIVE_ALGORITHMS:
        return None  # SGLang switches adaptive off for other algorithms
    return command.without([*SPECULATIVE_SHAPE, "speculative_adaptive"]).with_args(["--speculative-adaptive"])


def baseline_argv(argv: list[str], kind: str) -> list[str] | None:
    command = baseline_command(CommandLine.parse(argv), kind)
    return command.argv() if command is not None else None


def load_sibling(storage, name: str) -> optuna.Study | None:
    """The `<name>@baselines` study if it exists (never created: see `open_sibling`)."""
    try:
        return optuna.load_study(study_name=study_name_for(name), storage=storage)
    except KeyError:
        return None


def load(storage, name: str) -> dict[str, FrozenTrial]:
    """The baseline trials of a study, by kind: the newest COMPLETE one, else the newest
    finished one (which says why it was not measured)."""
    study = load_sibling(storage, name)
    if study is None:
        return {}
    out: dict[str, FrozenTrial] = {}
    for t in study.get_trials(deepcopy=False):
        kind = t.user_attrs.get(record.BASELINE)
        if not kind or not t.state.is_finished():
            continue
        if t.state == TrialState.COMPLETE or out.get(kind) is None or out[kind].state != TrialState.COMPLETE:
            out[kind] = t
    return out


def missing(have: dict[str, FrozenTrial], command: CommandLine) -> list[str]:
    """The kinds to measure (again): every one SGLang can run that has no COMPLETE trial."""
    return [k for k in KINDS if baseline_command(command, k) is not None
            and (have.get(k) is None or have[k].state != TrialState.COMPLETE)]


def open_sibling(storage, name: str, metric_names: list[str]) -> optuna.Study:
    """The `<name>@baselines` study, created if missing (baselines and schedule launches)."""
    study = optuna.create_study(study_name=study_name_for(name), storage=storage,
                                directions=["maximize"] * len(metric_names), load_if_exists=True)
    if study.metric_names is None:
        study.set_metric_names(metric_names)
    return study


@dataclass(frozen=True)
class Comparison:
    kind: str
    lines: list[str]
    adds_nothing: bool


def _caps(front: list[FrozenTrial], base: FrozenTrial) -> str:
    """The running-request cap each arm ran with: speculation defaults to 48, no speculation to
    thousands (docs/sglang-real-server.md row 14), so the arms differ unless set explicitly."""
    tuned = sorted({t.user_attrs.get(record.MAX_RUNNING_REQUESTS) for t in front} - {None})
    mine = base.user_attrs.get(record.MAX_RUNNING_REQUESTS)
    if not tuned or mine is None:
        return ""
    return f" (max_running_requests: tuned {'/'.join(map(str, tuned))}, this arm {mine})"


def compare(study: optuna.Study, baselines: dict[str, FrozenTrial]) -> list[Comparison]:
    names = list(study.metric_names or [])
    front = measured_front(study)
    out = []
    for kind in KINDS:
        base = baselines.get(kind)
        if base is None:
            continue
        if base.state != TrialState.COMPLETE:
            why = base.user_attrs.get(record.FAIL_REASON, base.state.name)
            out.append(Comparison(kind, [f"{kind.replace('_', ' ')}: not measured ({why}); measured again on the next run"], False))
            continue
        if not front:
            out.append(Comparison(kind, [f"over {kind.replace('_', ' ')}: no trial completed yet"], False))
            continue
        lines, gains = [], []
        for i, name in enumerate(names):
            best = max((t.values[i] for t in front), default=0.0)
            ref = base.values[i]
            gain = (best - ref) / ref if ref else float("inf")
            gains.append(gain)
            lines.append(f"{name} {best:,.1f} vs {ref:,.1f} ({gain:+.0%})")
        nothing = all(g <= DEFAULT_NOISE for g in gains)
        label = kind.replace('_', ' ')
        if kind == "adaptive" and base.user_attrs.get(record.SPECULATIVE_ADAPTIVE) is False:
            label += " (SGLang fell back to static steps: speculative_adaptive is false)"
        head = f"over {label}: " + ("static tuning adds nothing beyond measurement noise; " if nothing else "")
        out.append(Comparison(kind, [head + "; ".join(lines) + _caps(front, base)], nothing))
    return out


def as_json(baselines: dict[str, FrozenTrial], metric_names: list[str]) -> dict:
    """The baselines as `--json` prints them: state, values by objective, launch command, reason."""
    out = {}
    for kind, t in baselines.items():
        out[kind] = {"state": t.state.name, "trial": t.number,
                     "values": dict(zip(metric_names, t.values)) if t.state == TrialState.COMPLETE else None,
                     "launch_command": t.user_attrs.get(record.LAUNCH_COMMAND),
                     "fail_reason": t.user_attrs.get(record.FAIL_REASON)}
    return out


def study_note(study: optuna.Study, baselines: dict[str, FrozenTrial]) -> str:
    """The study's dashboard note: each baseline arm and what tuning adds over it."""
    names = list(study.metric_names or [])
    lines = [f"## Baselines of {study.study_name}", "", "Measured like trials, in the sibling study "
             f"`{study_name_for(study.study_name)}`.", "", "| baseline | state | " + " | ".join(names) + " |",
             "|---|---|" + "---|" * len(names)]
    for kind, t in baselines.items():
        values = [f"{v:,.1f}" for v in t.values] if t.state == TrialState.COMPLETE else ["-"] * len(names)
        lines.append(f"| {kind.replace('_', ' ')} | {t.state.name} | " + " | ".join(values) + " |")
    lines += ["", "### What tuning adds", ""]
    lines += [f"- {line}" for c in compare(study, baselines) for line in c.lines] or ["- nothing measured yet"]
    return "\n".join(lines) + "\n"


def save_study_note(study: optuna.Study, baselines: dict[str, FrozenTrial]) -> None:
    from optuna_dashboard import save_note

    save_note(study, study_note(study, baselines))
