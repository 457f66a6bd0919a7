"""Earlier trials settle proposals without a restart."""

from optuna.trial import TrialState, create_trial

from tuner.search.history import check
from tuner.sglang_args import Params


def _trial(number, params: Params, state, kind=None, values=None):
    attrs = {"flags": params.as_dict()}
    if kind:
        attrs["failure_kind"] = kind
    t = create_trial(state=state, values=values, user_attrs=attrs, params={}, distributions={})
    t.number = number
    return t


def test_identical_complete_trial_is_a_duplicate():
    done = _trial(3, Params(2, 1, 3, 0.85), TrialState.COMPLETE, values=[1.0])
    verdict = check(Params(2, 1, 3, 0.85), [done])
    assert verdict.kind == "duplicate" and verdict.trial.number == 3
    assert check(Params(2, 1, 3, 0.86), [done]) is None


def test_graph_oom_rules_out_larger_configs_only():
    oom = _trial(5, Params(3, 2, 6, 0.92), TrialState.PRUNED, kind="memory_graph")
    assert check(Params(3, 4, 8, 0.93), [oom]).kind == "ruled_out"
    assert "trial 5" in check(Params(3, 2, 6, 0.92), [oom]).reason
    assert check(Params(3, 2, 6, 0.91), [oom]) is None  # more slack: may fit
    assert check(Params(3, 1, 4, 0.95), [oom]) is None  # smaller tree: may fit


def test_kv_failure_rules_out_lower_fractions_with_as_many_drafts():
    kv = _trial(1, Params(4, 1, 5, 0.66), TrialState.PRUNED, kind="memory_kv")
    assert check(Params(5, 1, 6, 0.64), [kv]).kind == "ruled_out"
    assert check(Params(1, 1, 2, 0.64), [kv]) is None  # fewer drafts need less state
    assert check(Params(4, 1, 5, 0.70), [kv]) is None


def test_a_shape_sglang_rejected_is_rejected_at_every_fraction_and_no_other_shape_is():
    # A hybrid server whose every launch was classified "invalid" was asked the same flags for
    # all 20 trials: SGLang's rules on a shape (topk vs backend, draft tokens vs
    # mamba_track_interval) do not look at the mem fraction.
    invalid = _trial(2, Params(2, 2, 8, 0.8), TrialState.PRUNED, kind="invalid")
    verdict = check(Params(2, 2, 8, 0.9), [invalid])
    assert verdict.kind == "ruled_out" and "SGLang rejected the same speculative flags" in verdict.reason
    assert check(Params(2, 2, 7, 0.8), [invalid]) is None
    assert check(Params(2, 1, 3, 0.8), [invalid]) is None


def test_other_failures_and_settled_trials_are_not_evidence():
    crash = _trial(2, Params(2, 2, 8, 0.8), TrialState.PRUNED, kind="exit")
    assert check(Params(2, 2, 8, 0.8), [crash]) is None
    copied = _trial(4, Params(2, 1, 3, 0.85), TrialState.COMPLETE, values=[1.0])
    copied.user_attrs["duplicate_of"] = 3
    assert check(Params(2, 1, 3, 0.85), [copied]) is None


def test_of_two_workers_on_the_same_flags_only_the_later_waits():
    # Two workers drew the same flags at once (trials 7 and 8, both RUNNING): if each waited
    # for the other neither would ever launch; the later one waits for the earlier's result.
    p = Params(3, 1, 4, 0.85)
    a, b = _trial(7, p, TrialState.RUNNING), _trial(8, p, TrialState.RUNNING)
    assert check(p, [a, b], current=7) is None
    verdict = check(p, [a, b], current=8)
    assert verdict.kind == "running" and verdict.trial.number == 7


def test_three_launches_dying_alike_end_a_study_only_while_nothing_has_started():
    import optuna

    from tuner.search.history import same_failure

    crash = "the server exited (exit 1) before it was ready: DistBackendError: NCCL error in: ProcessGroupNCCL.cpp:1970"

    def study_of(*rows):
        study = optuna.create_study(directions=["maximize"] * 3)
        for state, kind, reason in rows:
            attrs = {"failure_kind": kind, "fail_reason": reason} if kind else {}
            study.add_trial(create_trial(state=state, values=[1.0, 1.0, 1.0] if state == TrialState.COMPLETE else None,
                                         user_attrs=attrs, params={}, distributions={}))
        return study

    dead = (TrialState.PRUNED, "exit", crash)
    assert same_failure(study_of(dead, dead, dead)) == crash
    assert same_failure(study_of(dead, dead)) is None  # two: may still be the flags'
    assert same_failure(study_of(dead, (TrialState.PRUNED, "exit", crash + " (other)"), dead)) is None
    oom = (TrialState.PRUNED, "memory_graph", "CUDA graph OOM")
    assert same_failure(study_of(oom, dead, dead, dead)) == crash  # in a row
    assert same_failure(study_of(dead, oom, dead, dead)) is None
    # once a launch has started, the host works: a repeating crash is the flags' (an OOM wording
    # diagnose does not know), and the search goes on to avoid it
    assert same_failure(study_of((TrialState.COMPLETE, None, None), dead, dead, dead)) is None
