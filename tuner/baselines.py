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

from .picks import DEFAULT_NOISE, measured_front

__all__ = ["KINDS", "baseline_argv", "study_name_for", "load", "compare", "Comparison", "family_default"]

KINDS = ("no_speculation", "adaptive")
SUFFIX = "@baselines"
_TRIPLE = ("--speculative-num-steps", "--speculative-eagle-topk", "--speculative-num-draft-tokens")


def study_name_for(name: str) -> str:
    return name + SUFFIX


def _strip(argv: list[str], drop) -> list[str]:
    """argv without the flags `drop(flag)` selects, and their values (SGLang has no positionals:
    an argument that is not a flag belongs to the flag before it)."""
    out: list[str] = []
    skipping = False
    for arg in argv:
        if arg.startswith("--"):
            skipping = drop(arg.split("=", 1)[0])
            if not skipping:
                out.append(arg)
            elif "=" in arg:
                skipping = False
        elif not skipping:
            out.append(arg)
    return out


def baseline_argv(argv: list[str], kind: str) -> list[str] | None:
    """The operator's command turned into a baseline; None when SGLang cannot run it."""
    if kind == "no_speculation":
        return _strip(argv, lambda flag: flag.startswith("--speculative"))
    algorithm = next((argv[i + 1] for i, a in enumerate(argv[:-1]) if a.startswith("--speculative-algo") and "=" not in a), None)
    algorithm = algorithm or next((a.split("=", 1)[1] for a in argv if a.startswith("--speculative-algo") and "=" in a), None)
    if algorithm is None or algorithm.upper() not in ("EAGLE", "EAGLE3", "NEXTN"):
        return None  # SGLang switches adaptive off for other algorithms
    return _strip(argv, lambda flag: flag in _TRIPLE or flag == "--speculative-adaptive") + ["--speculative-adaptive"]


def family_default(argv: list[str]) -> tuple[int, int, int]:
    """SGLang 0.5.23's auto choice (_auto_choose_speculative_params): (5, 4, 8) for Llama and
    Grok, (3, 1, 4) for everything else.  Guessed from the model path (the tuner has not asked
    the server yet)."""
    model = next((argv[i + 1] for i, a in enumerate(argv[:-1]) if a in ("--model-path", "--model")), "").lower()
    return (5, 4, 8) if ("llama" in model or "grok" in model) else (3, 1, 4)


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
        head = f"over {kind.replace('_', ' ')}: " + ("static tuning adds nothing beyond measurement noise; " if nothing else "")
        out.append(Comparison(kind, [head + "; ".join(lines)], nothing))
    return out
