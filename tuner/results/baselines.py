"""What static tuning is compared with: the same server with no speculation, and with SGLang
0.5.23's own `--speculative-adaptive` (runtime step switching by batch size, topk 1 only).

Baselines are measured once per study, like trials, into a sibling study `<name>@baselines`
(same objectives), so the sampler never sees them as part of the search space.  `compare`
says what the front adds over each, or that it adds nothing within measurement noise.
"""

from __future__ import annotations

from dataclasses import dataclass

import optuna
from optuna.trial import FrozenTrial, TrialState

from tuner.results import record
from tuner.results.picks import DEFAULT_NOISE, measured_front
from tuner.sglang_args import ADAPTIVE_ALGORITHMS, SPECULATIVE_SHAPE, CommandLine

__all__ = ["KINDS", "baseline_argv", "study_name_for", "load", "compare", "Comparison", "baseline_command"]

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


def load(storage, name: str) -> dict[str, FrozenTrial]:
    """The finished baseline trials of a study, by kind (the newest of each)."""
    try:
        study = optuna.load_study(study_name=study_name_for(name), storage=storage)
    except KeyError:
        return {}
    out: dict[str, FrozenTrial] = {}
    for t in study.get_trials(deepcopy=False):
        kind = t.user_attrs.get("baseline")
        if kind and t.state.is_finished():
            out[kind] = t
    return out


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
            out.append(Comparison(kind, [f"{kind}: not measured ({base.user_attrs.get('fail_reason', base.state.name)})"], False))
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
