"""What earlier trials already say about a proposal, so no restart is wasted on it.

- A proposal identical to a finished (COMPLETE) trial is not relaunched: the trial reports
  that trial's values, with `duplicate_of`.
- Memory failures rule out their neighbourhood without a launch:
  * CUDA-graph OOM at (steps, topk, draft, mfs): anything at least as large in all four
    needs at least as much graph memory out of a smaller slack;
  * KV pool too small at (draft, mfs): a lower or equal mem fraction with at least as many
    draft tokens leaves no more room (hybrid models also store per-draft-token state).
- Launches that die alike before any has started (tuner/study.py ends the run on them,
  `same_failure`): the host or the command is at fault, not the flags.
- A shape SGLang rejected (diagnose's "invalid": topk against the attention backend, draft tokens
  against mamba_track_interval) is rejected at every mem fraction.
"""

from __future__ import annotations

from dataclasses import dataclass

import optuna
from optuna.trial import FrozenTrial, TrialState

from tuner.sglang_args import SEARCHED, Params
from tuner.results.record import params_of
from tuner.results import record

__all__ = ["Verdict", "check", "same_failure", "SAME_FAILURE_LIMIT"]

_KEYS = SEARCHED


@dataclass(frozen=True)
class Verdict:
    kind: str  # "duplicate" | "ruled_out" | "running" (the same flags are being measured elsewhere)
    reason: str
    trial: FrozenTrial


def _ge(a: float | int | None, b: float | int | None) -> bool:
    """a >= b, where None (not set) compares only with None."""
    if a is None or b is None:
        return a is None and b is None
    return a >= b - 1e-9


def _le(a: float | int | None, b: float | int | None) -> bool:
    if a is None or b is None:
        return a is None and b is None
    return a <= b + 1e-9


def check(params: Params, trials: list[FrozenTrial], *, current: int | None = None, target: str | None = None) -> Verdict | None:
    """The earlier trial that settles `params` without a launch, if any.

    An earlier RUNNING trial with the same flags (another worker of the study) is reported as
    "running": measuring one configuration twice at once would only halve both servers' GPUs;
    the later trial waits for the earlier one's result.
    With `target` ("<host> <url>"), only trials that ran on that server are evidence (a worker whose hardware
    is not yet known to match the study's must not reuse other machines' results).
    """
    if target is not None:
        trials = [t for t in trials if f"{t.user_attrs.get(record.TARGET)} {t.user_attrs.get(record.URL)}" == target]
    for t in trials:
        # Only an EARLIER trial: two workers that drew the same flags at once would otherwise
        # each wait for the other, forever.
        if t.state == TrialState.RUNNING and (current is None or t.number < current) and params_of(t) == params:
            return Verdict("running", f"trial {t.number} is measuring the same flags on {t.user_attrs.get(record.TARGET, 'another worker')}", t)
    for t in trials:
        if t.user_attrs.get(record.DUPLICATE_OF) is not None or t.user_attrs.get(record.RULED_OUT_BY) is not None:
            continue  # only trials that really ran are evidence
        other = params_of(t)
        if other is None:
            continue
        if t.state == TrialState.COMPLETE and other == params:
            return Verdict("duplicate", f"same flags as trial {t.number}", t)
        if t.state != TrialState.PRUNED:
            continue
        kind = t.user_attrs.get(record.FAILURE_KIND)
        p, o = params, other
        if kind == "memory_graph" and all(
            _ge(getattr(p, k), getattr(o, k)) for k in _KEYS
        ):
            return Verdict(
                "ruled_out",
                f"ruled out by trial {t.number}: its CUDA graphs did not fit at "
                f"{_describe(o)}, and these parameters need at least as much graph memory",
                t,
            )
        if kind == "memory_kv" and _le(p.mem_fraction_static, o.mem_fraction_static) and _ge(
            p.speculative_num_draft_tokens, o.speculative_num_draft_tokens
        ):
            return Verdict(
                "ruled_out",
                f"ruled out by trial {t.number}: its KV cache did not fit at {_describe(o)}, "
                "and these parameters leave no more room for it",
                t,
            )
        if kind == "invalid" and all(getattr(p, k) == getattr(o, k) for k in _KEYS if k != "mem_fraction_static"):
            return Verdict(
                "ruled_out",
                f"ruled out by trial {t.number}: SGLang rejected the same speculative flags at {_describe(o)} "
                "(its rules do not depend on the mem fraction)",
                t,
            )
    return None


def _describe(p: Params) -> str:
    return ", ".join(f"{k}={v}" for k, v in p.as_dict().items())


# A server that never started and dies the same way on this many launches in a row, for no
# reason diagnose can tie to the searched flags ("exit": a crash it has no pattern for, say an NCCL or driver error),
# will die so on every other: each further launch is a model load (~100 s of the seed's four
# GPUs) that can only repeat it.  Three, not one: a single crash can be the configuration's own.
SAME_FAILURE_LIMIT = 3


def same_failure(study: optuna.Study) -> str | None:
    """The reason the study's last SAME_FAILURE_LIMIT launches all failed with, if they did
    (kind "exit", one reason) and no launch of the study ever started; None otherwise.  Once one
    has started, the host and the command work, and a crash that repeats belongs to the flags
    (a server's OOM wording diagnose does not know, say): the search must go on to avoid them.
    Settled trials (duplicates, ruled out) are no launches."""
    launched = [t for t in study.get_trials(deepcopy=False, states=(TrialState.COMPLETE, TrialState.PRUNED))
                if t.user_attrs.get(record.DUPLICATE_OF) is None and t.user_attrs.get(record.RULED_OUT_BY) is None]
    if any(t.state == TrialState.COMPLETE for t in launched):
        return None
    last = sorted(launched, key=lambda t: t.number)[-SAME_FAILURE_LIMIT:]
    if len(last) < SAME_FAILURE_LIMIT or any(t.user_attrs.get(record.FAILURE_KIND) != "exit" for t in last):
        return None
    reasons = {t.user_attrs.get(record.FAIL_REASON) for t in last}
    return reasons.pop() if len(reasons) == 1 else None


def finished(study: optuna.Study) -> list[FrozenTrial]:
    return study.get_trials(deepcopy=False, states=(TrialState.COMPLETE, TrialState.PRUNED))


def relevant(study: optuna.Study) -> list[FrozenTrial]:
    """Finished trials, and the ones other workers are running now."""
    return study.get_trials(deepcopy=False, states=(TrialState.COMPLETE, TrialState.PRUNED, TrialState.RUNNING))
