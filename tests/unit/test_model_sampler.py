"""The model sampler (tuner/search/model.py, model_sampler.py): acceptance by depth from a
stream, the memory line, and proposals that depend only on the study (resume, two workers)."""

import importlib.util
import math
import sys
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import optuna
import pytest
from optuna.trial import TrialState

from sglang_emulator import landscape as L
from tuner.config import SpaceConfig
from tuner.measure.runner import step_tokens
from tuner.results import record
from tuner.search import model as M
from tuner.search.model_sampler import ModelSampler, expected_hv_gain
from tuner.search.samplers import MemoryEdgeSampler, make_sampler
from tuner.search.space import suggest
from tuner.sglang_args import Params

SPACE = SpaceConfig.model_validate({
    "speculative_num_steps": {"low": 1, "high": 4},
    "speculative_eagle_topk": {"choices": [1, 2]},
    "speculative_num_draft_tokens": {"low": 2, "high": 8},
    "mem_fraction_static": {"low": 0.80, "high": 0.90, "step": 0.01},
})


# --- acceptance by depth ------------------------------------------------------------------------


def _stream(accepted: list[int]) -> list[int]:
    """Cumulative completion_tokens per chunk of a streamed request: the prefill's token, then
    1 + k per verify step, then a final (cut) chunk."""
    counts, total = [1], 1
    for k in accepted + [0]:
        total += 1 + k
        counts.append(total)
    return counts


def test_per_depth_acceptance_is_exact_on_a_constructed_stream():
    # A chain of 3 steps: 10 steps accept 0, 20 accept 1, 30 accept 2, 40 accept 3.
    accepted = [0] * 10 + [1] * 20 + [2] * 30 + [3] * 40
    counts = _stream(accepted)
    deltas = step_tokens([(c, None) for c in counts])  # what runner.generate_steps returns
    hist = [0] * 4
    for d in deltas:
        hist[d - 1] += 1
    assert hist == [10, 20, 30, 40]
    reach = M.reach_from_histogram(hist)
    assert reach == pytest.approx([0.9, 0.7, 0.4])
    rates = M.pooled_depth_rates([(3, hist)])
    assert [r for r, _ in rates] == pytest.approx([0.9, 0.7 / 0.9, 0.4 / 0.7])
    acc = M.Acceptance(rates, 0.5, {}, 3, 0.0)
    # Every shallower chain's accept length follows from the deep one: 1 + sum of the reaches.
    assert acc.accept(M.Shape(3, 1, 4)) == pytest.approx(1 + 0.9 + 0.7 + 0.4)
    assert acc.accept(M.Shape(2, 1, 3)) == pytest.approx(1 + 0.9 + 0.7)
    assert acc.accept(M.Shape(1, 1, 2)) == pytest.approx(1.9)


def test_coalesced_chunks_are_dropped_where_the_stream_counts_verify_steps():
    # SGLang's tokenizer manager merges chunks a slow reader has not taken: a delta of two
    # verify steps (spec_verify_ct + 2) would read as one step of 1 + 3 accepted drafts.
    accepted = [2, 0, 1, 3, 1]
    counts = _stream(accepted)
    verify = [0] + list(range(1, len(counts)))
    exact = step_tokens(list(zip(counts, verify)))
    assert exact == [1 + k for k in accepted]
    merged = [p for i, p in enumerate(zip(counts, verify)) if i != 3]  # steps 2 and 3 in one chunk
    assert step_tokens(merged) == [3, 1, 2]  # steps 3 and 4 (2 + 4 tokens) are gone, not read as one of 6
    # Without spec_verify_ct in the chunks nothing can be told apart: every delta is kept.
    assert len(step_tokens([(c, None) for i, c in enumerate(counts) if i != 3])) == len(accepted) - 1


def test_pooled_rates_of_two_chains_and_a_tree_of_one_candidate():
    deep, shallow = [10, 20, 30, 40], [5, 45]  # steps 3 and steps 1
    rates = M.pooled_depth_rates([(3, deep), (1, shallow)])
    assert rates[0][0] == pytest.approx((90 + 45) / (100 + 50))
    assert rates[1][0] == pytest.approx(70 / 90)
    # topk 2 with one verified draft is the chain of depth 1
    assert sum(M.tree_reach([0.9], 2, 2, 0.5)) == pytest.approx(0.9)
    # a second candidate catches share x the missed mass
    assert sum(M.tree_reach([0.9], 2, 3, 0.5)) == pytest.approx(0.9 + 0.1 * 0.5)


# --- memory -------------------------------------------------------------------------------------


def test_memory_line_from_two_launches():
    pre, weights, cell = 80.0, 16.0, 128 * 1024 / 2**30  # GiB, GiB per token
    def tokens(m):
        return (pre * m - weights) / cell
    slope, intercept = M.memory_line([(0.80, tokens(0.80)), (0.90, tokens(0.90))])
    for m in (0.70, 0.85, 0.95):
        assert slope * m + intercept == pytest.approx(tokens(m))


# --- a synthetic landscape the trials are told -------------------------------------------------


def _truth(steps, topk, draft, mfs):
    """A small physical landscape (not the emulator's): q = 0.8 per depth, 10 ms + 0.3 ms per
    draft step, graphs that grow with draft tokens and trees, 80 GiB card."""
    reach = [0.8 ** j for j in range(1, steps + 1)]
    accept = 1 + sum(reach) + (0.1 * (draft - steps - 1) / 4 if topk > 1 else 0.0)
    pre, weights, cell = 80.0, 16.0, 128 * 1024 / 2**30
    tokens = int((pre * mfs - weights) / cell)
    graphs = 0.3 + 48 * draft * 0.004 + (0.8 if topk > 1 else 0.0) * draft / 8
    avail = pre * (1 - mfs) - 0.5 - graphs
    ok = avail > 0.8
    step1 = 10 + 0.3 * steps + (0.2 if topk > 1 else 0)
    step32 = 12 + 0.5 * steps + 0.02 * max(32 * draft - 128, 0)
    values = [accept / step1 * 1000, 32 * accept / step32 * 1000, min(48, tokens // 8192)]
    attrs = {record.MAX_TOTAL_NUM_TOKENS: tokens, record.MAX_RUNNING_REQUESTS: 48, record.DECLARED_MAX_RUNNING: 48,
             record.ACCEPT_LENGTH: accept, record.REQUEST_TOKENS: 8192, "concurrent_tps_by_level": {"32": values[1]},
             record.ACCEPT_HISTOGRAM: [int(1000 * (([1] + reach)[k] - (reach + [0])[k])) for k in range(steps + 1)],
             record.MEMORY_USAGE: {"weight": weights, "kvcache": tokens * cell, "token_capacity": tokens,
                                   "startup_available": avail, "graph": {"all": graphs}}}
    return ok, values, attrs


def _study(sampler):
    study = optuna.create_study(directions=["maximize"] * 3, sampler=sampler)
    study.set_metric_names(["single_tps", "concurrent_tps", "capacity"])
    return study


def _run_one(study, *, tell=True, pick=None):
    """One trial of `study` on `_truth`; `pick` maps its three values to the study's objectives."""
    trial = study.ask()
    p = suggest(trial, SPACE, Params())
    trial.set_user_attr(record.FLAGS, p.as_dict())
    if not tell:
        return trial, p
    ok, values, attrs = _truth(p.speculative_num_steps, p.speculative_eagle_topk, p.speculative_num_draft_tokens, p.mem_fraction_static)
    if not ok:
        trial.set_user_attr(record.FAILURE_KIND, "memory_graph")
        study.tell(trial, state=TrialState.PRUNED)
    else:
        for k, v in attrs.items():
            trial.set_user_attr(k, v)
        study.tell(trial, pick(values) if pick else values)
    return trial, p


def _sampler(seed=0):
    return make_sampler("model", seed, n_objectives=3)


def test_model_predicts_what_the_launches_measured():
    study = _study(_sampler())
    for _ in range(6):
        _run_one(study)
    model, why = M.fit(study.get_trials(), list(study.metric_names))
    assert model is not None, why
    p = model.predict([3], [1], [4], [0.85])
    ok, values, _ = _truth(3, 1, 4, 0.85)
    assert p.single[0] == pytest.approx(values[0], rel=0.1)
    assert p.capacity[0] == pytest.approx(values[2], abs=1)
    assert p.accept[0] == pytest.approx(1 + 0.8 + 0.64 + 0.512, rel=0.03)
    notes = [t.user_attrs.get(record.MODEL_NOTE) for t in study.trials]
    assert notes[0].startswith("model: no launch completed yet")
    assert all(n and n.startswith("model:") for n in notes), notes


def test_resume_a_new_sampler_on_the_study_proposes_the_same():
    study = _study(_sampler(seed=3))
    for _ in range(4):
        _run_one(study)
    first = _study_copy(study, _sampler(seed=3))
    second = _study_copy(study, _sampler(seed=3))
    _, a = _run_one(first, tell=False)
    _, b = _run_one(second, tell=False)
    assert a == b


def _study_copy(study, sampler):
    storage = optuna.storages.InMemoryStorage()
    copy = optuna.create_study(storage=storage, directions=["maximize"] * 3, sampler=sampler)
    copy.set_metric_names(list(study.metric_names))
    for t in study.get_trials():
        copy.add_trial(t)
    return copy


def test_two_workers_do_not_propose_a_running_configuration():
    study = _study(_sampler())
    for _ in range(4):
        _run_one(study)
    _, running = _run_one(study, tell=False)  # worker A is measuring it
    other = optuna.load_study(study_name=study.study_name, storage=study._storage, sampler=_sampler())
    _, proposal = _run_one(other, tell=False)  # worker B asks meanwhile
    assert proposal != running


def test_falls_back_and_says_so_when_it_cannot_predict_an_objective():
    sampler = _sampler()
    study = optuna.create_study(directions=["maximize"] * 2, sampler=sampler)
    study.set_metric_names(["single_tps", "p99_itl"])
    trial = study.ask()
    suggest(trial, SPACE, Params())
    assert "does not predict p99_itl" in trial.user_attrs[record.MODEL_NOTE]
    assert isinstance(sampler._fallback, MemoryEdgeSampler)


def test_expected_hv_gain_matches_the_box_volume():
    front = np.array([[0.5, 0.5, 0.5]])
    samples = np.array([[[1.0, 1.0, 1.0]], [[0.4, 0.4, 0.4]], [[1.0, 0.5, 0.5]]])
    gain = expected_hv_gain(front, samples, cells=40)
    assert gain[0] == pytest.approx(1 - 0.125, abs=0.02)
    assert gain[1] == pytest.approx(0.0, abs=1e-9)
    assert gain[2] == pytest.approx(0.125, abs=0.02)


def test_predicted_front_lists_unlaunched_configurations_with_intervals():
    from tuner.search.model_sampler import predicted_front

    study = _study(_sampler())
    for _ in range(6):
        _run_one(study)
    header, rows, note = predicted_front(study, SPACE, Params())
    assert header[-1] == "P(start)" and rows and note.startswith("model fitted on")
    launched = {tuple(str(v) for v in (t.params.get("speculative_num_steps"),)) for t in study.trials}
    assert len({tuple(r[:3]) for r in rows}) == len(rows)  # one row per shape
    mid, lo, hi = (float(x) for x in rows[0][4].replace("[", "").replace("]", "").replace(",", "").split())
    assert lo <= mid <= hi and launched
    # Never a zero-width interval (a never-launched configuration is at least as uncertain as
    # one measurement), and capacity in whole requests (issue 25 item 10).
    for row in rows:
        for name, cell in zip(header[4:-1], row[4:-1]):
            mid, lo, hi = (float(x) for x in cell.replace("[", "").replace("]", "").replace(",", "").split())
            assert lo < mid < hi, (name, cell)
            if name == "capacity":
                assert all(v == int(v) and "." not in cell for v in (mid, lo, hi)), cell


def test_a_measured_shape_is_predicted_from_its_measurement_and_not_relaunched_for_noise():
    study = _study(_sampler())
    for _ in range(6):
        _run_one(study)
    model, _ = M.fit(study.get_trials(), list(study.metric_names))
    done = [t for t in study.trials if t.state == TrialState.COMPLETE]
    t = done[-1]
    f = t.user_attrs[record.FLAGS]
    shape = (f["speculative_num_steps"], f["speculative_eagle_topk"], f["speculative_num_draft_tokens"] or f["speculative_num_steps"] + 1)
    # Another fraction of that shape at the same batch: its measured single_tps, as precise as a
    # measurement, while an unlaunched shape keeps the model's wider spread.
    other = 0.80 if f["mem_fraction_static"] > 0.85 else 0.90
    p = model.predict([shape[0]], [shape[1]], [shape[2]], [other])
    assert p.single[0] == pytest.approx(t.values[0], rel=0.01)
    assert p.sd[0, 0] <= 0.005
    unlaunched = next((s, k, d) for s in range(1, 7) for k in (1, 2, 4) for d in range(2, 17)
                      if (s, k, d) not in {tuple(M._shape_of(x.user_attrs[record.FLAGS]).__dict__.values()) for x in done}
                      and k in model.measured_steps and s <= model.measured_steps[k] and (k > 1 or d == s + 1))
    assert model.predict(*[[v] for v in unlaunched], [other]).sd[0, 0] > p.sd[0, 0]
    # Ten more proposals: no shape is launched again at a fraction that gives the same pool
    # (here the batch is 32 whatever the pool: the same capacity is the same configuration).
    for _ in range(10):
        _run_one(study)
    seen = [(M._shape_of(x.user_attrs[record.FLAGS]), min(48, int(x.user_attrs.get(record.MAX_TOTAL_NUM_TOKENS) or 0) // 8192))
            for x in study.trials if x.state == TrialState.COMPLETE]
    assert len(seen) == len(set(seen)), seen


def test_sglang_0_5_9_memory_usage_one_graph_figure_and_no_startup_available():
    # 0.5.9's get_internal_state: {"weight", "kvcache", "token_capacity", "graph": <GiB>}.
    server_info = {"internal_states": [{"memory_usage": {"weight": 16.0, "kvcache": 50.0, "token_capacity": 409600, "graph": 1.25}}]}
    usage = record.memory_usage(server_info)
    assert usage == {"weight": 16.0, "kvcache": 50.0, "token_capacity": 409600, "graph": {"all": 1.25}}
    study = _study(_sampler())
    for _ in range(4):
        trial, p = _run_one(study, tell=False)
        ok, values, attrs = _truth(p.speculative_num_steps, p.speculative_eagle_topk, p.speculative_num_draft_tokens, p.mem_fraction_static)
        attrs[record.MEMORY_USAGE] = {k: v for k, v in attrs[record.MEMORY_USAGE].items() if k != "startup_available"}
        attrs[record.MEMORY_USAGE]["graph"] = {"all": attrs[record.MEMORY_USAGE]["graph"]["all"]}
        for k, v in attrs.items():
            trial.set_user_attr(k, v)
        study.tell(trial, values) if ok else study.tell(trial, state=TrialState.PRUNED)
    model, why = M.fit(study.get_trials(), list(study.metric_names))
    assert model is not None, why
    # Without startup_available the fractions above the measured ones are not ruled out: the
    # graph-OOM edge is left to failures to find.
    top = max(t.user_attrs[record.FLAGS]["mem_fraction_static"] for t in study.trials)
    assert model.predict([3], [1], [4], [min(top + 0.02, 0.9)]).p_start[0] > 0.5


def test_two_workers_starting_together_launch_two_shapes():
    # Nothing has completed: worker A's designed first launch (the deepest chain) is running
    # when worker B asks; B takes the next chain instead of waiting for A's result.
    study = _study(_sampler())
    _, first = _run_one(study, tell=False)
    other = optuna.load_study(study_name=study.study_name, storage=study._storage, sampler=_sampler())
    _, second = _run_one(other, tell=False)
    assert (first.speculative_num_steps, first.speculative_eagle_topk) == (4, 1)
    assert (second.speculative_num_steps, second.speculative_eagle_topk) == (3, 1)


def test_a_first_launch_sglang_rejected_is_not_asked_again():
    # Nothing has completed and the deepest chain was rejected ("invalid": SGLang's rule on the
    # shape, at any fraction): the next designed launch is another shape, not the same flags.
    study = _study(_sampler())
    trial, first = _run_one(study, tell=False)
    trial.set_user_attr(record.FAILURE_KIND, "invalid")
    study.tell(trial, state=TrialState.PRUNED)
    _, second = _run_one(study, tell=False)
    assert (first.speculative_num_steps, first.speculative_eagle_topk) == (4, 1)
    assert (second.speculative_num_steps, second.speculative_eagle_topk) == (3, 1)


def test_shapes_a_shallower_tree_or_the_chain_beats_by_construction_are_not_candidates():
    # EAGLE verifies the draft - 1 most probable nodes, none deeper than draft - 1: (3, 2, 3)
    # verifies what (2, 2, 3) does with one more draft forward; a two-token tree verifies the
    # chain (1, 1, 2)'s one node.  qwen-demo's studies launched (1, 4, 2), (2, 2, 2) and (2, 4, 2).
    sampler = _sampler()
    sampler.bind_space(SPACE, Params())
    shapes, _ = sampler._candidates({})
    assert (1, 1, 2) in shapes and (2, 2, 3) in shapes and (4, 2, 8) in shapes
    for s, k, d in shapes:
        assert k == 1 or (d > 2 and s <= d - 1), (s, k, d)
    # the rule needs the shape that beats it in the space: a space of trees only keeps them
    trees = SpaceConfig.model_validate({**SPACE.model_dump(exclude_none=True), "speculative_eagle_topk": {"choices": [2]}})
    sampler.bind_space(trees, Params())
    assert (1, 2, 2) in sampler._candidates({})[0]


def _launch(steps, draft, mfs, tokens, running, topk=1):
    usage = {"weight": 60.0, "kvcache": 95.0 * mfs - 60.0, "token_capacity": tokens, "startup_available": 3.0,
             "graph": {"all": 0.5 + 0.01 * draft}}
    attrs = {record.MEMORY_USAGE: usage, record.MAX_RUNNING_REQUESTS: running, record.DECLARED_MAX_RUNNING: 48,
             record.ARCHITECTURE: "Qwen3_5MoeForCausalLM"}
    return M.Launch(M.Shape(steps, topk, draft), mfs, "ok", {}, attrs)


def test_a_started_draft_count_predicts_its_own_pool_at_its_fraction():
    # The hybrid form's constants are fitted over every launch; where it misses a launch's
    # reported pool by a request (qwen-demo: 595k tokens and 34 running where (1, 1, 2) at 0.93
    # reported 620k and 35), that draft count's other fractions carry the launch's own ratio.
    ls = [_launch(3, 4, 0.80, 224_284, 13), _launch(3, 4, 0.90, 374_970, 21), _launch(5, 6, 0.91, 289_429, 16),
          _launch(1, 2, 0.93, 619_700, 35), _launch(2, 3, 0.93, 499_442, 28)]
    mem = M._fit_memory(ls)
    for x in ls[2:]:  # one launch per draft count: its own figures exactly
        tokens, running = mem.pool([x.mfs], [x.shape.draft])
        assert tokens[0] == pytest.approx(x.memory["token_capacity"], rel=1e-4)
        assert running[0] == x.attrs[record.MAX_RUNNING_REQUESTS]
    # one step up, the pool grows from the launch's own figure, not from the form's lower one
    assert mem.pool([0.94], [2])[1][0] >= 35


def test_a_climb_counts_the_whole_fronts_lift_only_while_the_reserve_is_uncertain(monkeypatch):
    # A climb's lift of every measured capacity stands for what it tells the other shapes about
    # the reserve; once the reserve is known a climb is worth its own gain (qwen-demo spent
    # launches on one-step climbs whose capacity did not follow).
    from tuner.search import model_sampler as MS

    calls = []
    real = MS._climb_gain
    monkeypatch.setattr(MS, "_climb_gain", lambda *a, **k: calls.append(1) or real(*a, **k))
    for known in (False, True):
        monkeypatch.setattr(MS, "_reserve_uncertain", lambda model, known=known: not known)
        calls.clear()
        study = _study(_sampler())
        for _ in range(5):
            _run_one(study)
        assert (len(calls) == 0) == known, (known, len(calls))


def test_a_tree_that_verifies_the_chains_nodes_is_as_sure_as_the_chain():
    # EAGLE verifies the draft - 1 most probable nodes: with chains measured at 0.8 per depth, a
    # sibling (at most 1 - 0.8 = 0.2) is never more probable than the chain's third node (0.51),
    # so (3, 4, 4) verifies (3, 1, 4)'s nodes whatever topk 4's siblings take: its unseen topk
    # is no reason to launch it (qwen-demo launched (3, 4, 4) and (5, 4, 6) for that spread).
    from types import SimpleNamespace

    acc = M.Acceptance(rates=[(0.8, 1000)] * 3, share=0.5, calib={}, measured_depth=3, spread=0.0)
    model = M.Model(acc, None, SimpleNamespace(max_draft={1: 4}), 32, 8192, {1: 3}, 0.0)
    novelty = model._novelty(np.array([3, 3, 6, 5]), np.array([1, 4, 4, 2]), np.array([4, 4, 15, 7]))
    assert novelty[0] == novelty[1] == 0.0  # the tree as sure as its chain
    assert novelty[2] == 1.0  # a wide tree verifies siblings: topk 4's share is unknown
    assert novelty[3] == 1.0  # six nodes of a five-deep tree: one is a sibling


def test_a_shape_inside_a_started_one_is_no_first_start():
    # Every graph term grows with steps, topk and draft tokens, so a shape no larger than a
    # started one in each needs no more graph memory at the same batch: like a climb of the
    # started shape, not a first start into unknown graph memory (qwen-demo climbed (3, 1, 4)
    # four times while (1, 1, 2) and (2, 1, 3) at 0.94 were on the front).
    from tuner.search import model_sampler as MS

    cand = np.array([(2, 1, 3, 0.9), (3, 1, 4, 0.93), (3, 2, 4, 0.9), (4, 1, 5, 0.9), (2, 1, 5, 0.9)], dtype=float)
    assert MS._inside(cand, {(3, 1, 4)}).tolist() == [True, True, False, False, False]
    assert MS._inside(cand, {(5, 4, 8)}).tolist() == [True, True, True, True, True]
    assert not MS._inside(cand, set()).any()


def test_a_measured_shape_is_not_relaunched_at_a_lower_fraction():
    # The same shape at a lower fraction has the same single-stream speed, no more running
    # requests and no larger batch: its measurement dominates it.  The demo's trials 13-14
    # re-launched (5, 1, 6) 0.93 -> 0.88 and (1, 1, 2) 0.93 -> 0.92 for throughput draws above
    # the measured speed that a smaller batch cannot give.
    from tuner.search import model_sampler as MS

    flags = {"speculative_num_steps": 5, "speculative_eagle_topk": 1, "speculative_num_draft_tokens": 6,
             "mem_fraction_static": 0.93}
    done = optuna.trial.create_trial(values=[240.0, 2000.0, 17.0], user_attrs={record.FLAGS: flags})
    cand = np.array([(5, 1, 6, 0.88), (5, 1, 6, 0.92), (5, 1, 6, 0.93), (5, 1, 6, 0.94), (4, 1, 5, 0.88)], dtype=float)
    assert MS._excluded(cand, [done]).tolist() == [True, True, True, False, False]


def test_a_tree_beyond_the_measured_verify_tokens_is_not_predicted_faster_than_physics_allows():
    # Chains at batch 32 measure up to 128 verify tokens, where _truth's verify is still flat;
    # a 16-token tree at batch 32 verifies 512, past the knee the chains never reached.  A fit
    # with no data there has no slope to give, so its interval must reach down to what a
    # compute-bound forward costs (time in proportion to tokens), and hold the truth.
    trials = []
    for steps, mfs in ((1, 0.80), (2, 0.82), (3, 0.84), (3, 0.86)):
        ok, values, attrs = _truth(steps, 1, steps + 1, mfs)
        flags = {"speculative_num_steps": steps, "speculative_eagle_topk": 1, "speculative_num_draft_tokens": steps + 1,
                 "mem_fraction_static": mfs}
        trials.append(optuna.trial.create_trial(values=values, user_attrs={**attrs, record.FLAGS: flags}))
    model, why = M.fit(trials, ["single_tps", "concurrent_tps", "capacity"])
    assert model is not None, why
    p = model.predict([3], [4], [16], [0.84])
    lo, mid, hi = p.interval(0)["concurrent_tps"]
    _, truth, _ = _truth(3, 4, 16, 0.84)
    assert lo <= truth[1] <= hi, (lo, truth[1], hi)
    # Inside the measured tokens nothing changes: a chain keeps the fit's own narrow interval.
    chain = model.predict([2], [1], [3], [0.84])
    assert chain.sd[0, 1] == pytest.approx(chain.sd[0, 0])


def _replayed_trials(landscape: str, launches, seed=0):
    """Trials as benchmarks/sampler_benchmark.py replays them on an emulator landscape: its
    noisy values and the attrs the emulator's server reports, for the given launches."""
    path = Path(__file__).resolve().parents[2] / "benchmarks" / "sampler_benchmark.py"
    spec = importlib.util.spec_from_file_location("sampler_benchmark", path)
    B = sys.modules.get("sampler_benchmark")
    if B is None:
        B = importlib.util.module_from_spec(spec)
        sys.modules["sampler_benchmark"] = B  # its dataclasses look their module up
        spec.loader.exec_module(B)
    lands = B.landscape_spec(landscape)
    profile = B.profile_from_dict(lands.profile)
    workload = L.Workload(max_tokens=128, concurrency=lands.concurrency, request_tokens=lands.request_tokens, temperature=0.0)
    world = SimpleNamespace(profile=profile, spec=lands, workload=workload)

    def expect(steps, topk, draft, mfs):
        return L.expect(profile, steps=steps, topk=topk, draft_tokens=draft, mem_fraction_static=mfs,
                        workload=workload, algorithm=lands.algorithm)

    trials = []
    for steps, topk, draft, mfs in launches:
        p = Params(speculative_num_steps=steps, speculative_eagle_topk=topk, speculative_num_draft_tokens=draft,
                   mem_fraction_static=mfs)
        e = expect(steps, topk, draft, mfs)
        assert e.feasible, (steps, topk, draft, mfs)
        attrs = {**B._server_attrs(world, e, p, seed), record.FLAGS: p.as_dict()}
        trials.append(optuna.trial.create_trial(values=B._measure(e, p, seed), user_attrs=attrs))
    return trials, expect


def test_a_chain_with_fewer_verify_tokens_than_any_measured_under_load_is_not_predicted_slower_than_it_is():
    # tp4:7 (Llama-3.1-70B on 4x H200), seed 0's first seven launches: trees and one chain,
    # all measured at batch 32 with 256-896 verify tokens.  A rise of the step time between
    # batch 1 and 32 fits as per-request work or as a verify that costs by its tokens below 256;
    # the first predicts a shallow chain (96-160 verify tokens) as slow as the trees, the second
    # faster.  The fit alone put (3, 1, 4) at 0.93, the front's best concurrency, 10% slow with
    # a 5% spread and the study never launched it; the interval must hold the truth.
    launches = [(5, 4, 8, 0.83), (5, 4, 8, 0.88), (5, 4, 8, 0.91), (7, 1, 8, 0.91), (4, 2, 9, 0.91),
                (5, 4, 21, 0.89), (5, 8, 28, 0.86)]
    trials, expect = _replayed_trials("tp4:7", launches)
    model, why = M.fit(trials, ["single_tps", "concurrent_tps", "capacity"])
    assert model is not None, why
    for shape in ((3, 1, 4, 0.93), (2, 1, 3, 0.93)):
        lo, mid, hi = model.predict(*([v] for v in shape)).interval(0)["concurrent_tps"]
        truth = expect(*shape).concurrent_tps
        assert lo <= truth <= hi, (shape, lo, mid, truth, hi)
    # From the fewest measured tokens up the two readings are not mixed: a tree's prediction is the fit's own.
    tree = model.predict([5], [4], [10], [0.91])
    model.time.below = None
    alone = model.predict([5], [4], [10], [0.91])
    assert tree.concurrent[0] == pytest.approx(alone.concurrent[0]) and tree.sd[0, 1] == pytest.approx(alone.sd[0, 1])


def test_a_launched_draft_count_knows_its_capacity_at_another_fraction():
    # The per-draft-token reservation is unknown, but at a draft count already launched the pool
    # at any fraction follows from its launches: its capacity is as sure as the pool line, and
    # only other draft counts carry the reservation's doubt.  Counted from zero draft tokens,
    # family:35's chain, launched only at 4 draft tokens, had a capacity spread of 0.48 at its
    # own shape, and the reserve probes climbed it five times for one request.
    trials = []
    for mfs in (0.80, 0.84):
        ok, values, attrs = _truth(3, 1, 4, mfs)
        flags = {"speculative_num_steps": 3, "speculative_eagle_topk": 1, "speculative_num_draft_tokens": 4,
                 "mem_fraction_static": mfs}
        # A hybrid architecture reserves intermediate state per draft token; its running
        # requests (48, the declared cap) do not show the state pool, so the form is unfitted.
        attrs = {**attrs, record.ARCHITECTURE: "Qwen3NextForCausalLM", record.FLAGS: flags}
        trials.append(optuna.trial.create_trial(values=values, user_attrs=attrs))
    model, why = M.fit(trials, ["single_tps", "concurrent_tps", "capacity"])
    assert model is not None, why
    assert model.memory.hybrid is None and model.memory.beta_hi > model.memory.beta_lo  # the reservation is not known
    same = model.predict([3, 3], [1, 1], [4, 4], [0.9, 0.76])
    other = model.predict([7], [1], [8], [0.9])
    assert same.sd[:, 2].max() <= 0.02, same.sd[:, 2]
    assert other.sd[0, 2] > same.sd[0, 2]


def test_an_older_sglangs_started_launch_tells_the_model_what_was_left_through_its_capture_log():
    # 0.5.9's memory_usage has no startup_available and one graph figure; its capture log says,
    # runner by runner, what was free after each graph.  Read from the log, the same launches
    # must give the same P(start) as 0.5.23's memory_usage gives; without it the model took the
    # slack as all free, and 10-trial live studies on 0.5.9 failed 3 and 4 launches of 10
    # (family:2, family:13) where 0.5.23's failed 1.
    def launch(steps, mfs, version):
        ok, values, attrs = _truth(steps, 1, steps + 1, mfs)
        flags = {"speculative_num_steps": steps, "speculative_eagle_topk": 1, "speculative_num_draft_tokens": steps + 1,
                 "mem_fraction_static": mfs}
        usage = dict(attrs[record.MEMORY_USAGE])
        if version == "0.5.9":
            left, graphs = usage.pop("startup_available"), usage["graph"]["all"]
            attrs = {**attrs, record.MEMORY_USAGE: {**usage, "graph": {"all": graphs}},
                     record.CAPTURE_MEMORY: {"free_before": left + graphs, "failed_runner": None, "cuda_graph_max_bs": 48,
                                             "runners": {"target_verify": {"avail_before": left + graphs, "usage": graphs - 0.1,
                                                                           "avail_after": left + 0.1},
                                                         "draft_extend": {"avail_before": left + 0.1, "usage": 0.1,
                                                                          "avail_after": left}}}}
        return optuna.trial.create_trial(values=values, user_attrs={**attrs, record.FLAGS: flags})

    names = ["single_tps", "concurrent_tps", "capacity"]
    cand = [np.array(v) for v in ([3, 3, 5, 5, 2], [1, 1, 1, 1, 1], [4, 4, 6, 6, 3], [0.9, 0.95, 0.9, 0.95, 0.96])]
    p = {}
    for version in ("0.5.23", "0.5.9"):
        model, why = M.fit([launch(3, 0.80, version), launch(3, 0.84, version)], names)
        assert model is not None, why
        p[version] = model.predict(*cand).p_start
    assert p["0.5.9"] == pytest.approx(p["0.5.23"], abs=0.01), p
    assert p["0.5.23"].min() < 0.9  # the candidates reach where memory decides


def test_a_study_of_single_stream_speed_takes_no_reserve_probe_nor_a_measured_shape_again():
    # A reserve probe raises a measured shape's fraction to learn where the pool's edge is: worth a
    # launch where an objective moves with the pool (capacity, a batch), none for single_tps alone
    # (a single_tps study on the demo raised (5, 4, 10) 0.82 -> 0.85, its third launch of four;
    # and, with no concurrent figure to anchor it, (6, 2, 13) 0.82 -> 0.83 for a draw of its noise).
    study = optuna.create_study(directions=["maximize"], sampler=make_sampler("model", 0, n_objectives=1))
    study.set_metric_names(["single_tps"])
    for _ in range(8):
        _run_one(study, pick=lambda values: [values[0]])
    notes = [str(t.user_attrs.get(record.MODEL_NOTE, "")) for t in study.trials]
    assert not any(n.startswith("model: a reserve probe") for n in notes), notes
    shapes = [(t.params["speculative_num_steps"], t.params["speculative_eagle_topk"], t.params.get("speculative_num_draft_tokens"))
              for t in study.trials]
    assert len(set(shapes)) == len(shapes), shapes


def test_a_two_rank_server_holds_a_request_of_each_ranks_own_pool():
    # DP attention: each rank has its own KV pool and slots, and a request cannot span ranks.  The
    # record keeps the running requests summed over ranks and rank 0's token capacity; with 32k-token
    # requests the pool limits, and the model read one rank's pool as the whole server's: half the
    # capacity the launches measured (an operator's DP study, --tp 4 --dp 2 --enable-dp-attention).
    request = 29000

    def launch(steps, mfs):
        _, values, attrs = _truth(steps, 1, steps + 1, mfs)
        tokens = attrs[record.MEMORY_USAGE]["token_capacity"]
        flags = {"speculative_num_steps": steps, "speculative_eagle_topk": 1, "speculative_num_draft_tokens": steps + 1,
                 "mem_fraction_static": mfs}
        ranks = [{"max_total_num_tokens": tokens, "max_running_requests": 22}] * 2
        attrs = {**attrs, record.MAX_RUNNING_REQUESTS: 44, record.MAX_TOTAL_NUM_TOKENS: 2 * tokens, record.REQUEST_TOKENS: request,
                 record.DP_RANKS: ranks, record.GPU_COUNT: 2, record.FLAGS: flags}
        return optuna.trial.create_trial(values=[values[0], values[1], 2 * min(22, tokens // request)], user_attrs=attrs)

    trials = [launch(3, 0.80), launch(3, 0.86), launch(5, 0.84)]
    model, why = M.fit(trials, ["single_tps", "concurrent_tps", "capacity"])
    assert model is not None, why
    # within a request a rank of what the launches measured (the pool's fit is not exact), not half
    measured = model.predict([3, 3, 5], [1, 1, 1], [4, 4, 6], [0.80, 0.86, 0.84]).capacity
    assert all(abs(p - t.values[2]) <= 2 for p, t in zip(measured, trials)), (list(measured), [t.values[2] for t in trials])
    tokens = _truth(4, 1, 5, 0.90)[2][record.MEMORY_USAGE]["token_capacity"]
    assert abs(model.predict([4], [1], [5], [0.90]).capacity[0] - 2 * min(22, tokens // request)) <= 2


def test_a_four_gpu_rank_is_less_sure_of_a_fraction_no_launch_reached():
    # With tp 4 the capture may also need NCCL's and the custom all-reduce's buffers, in no
    # figure: the unreported reserve's range reaches 1 GiB per GPU further.  The same launches
    # recorded by a four-GPU server (gpu_count 4, one DP rank) leave a fraction above them less
    # sure to start than on one GPU; fractions at or below a start stay as sure.  Without it the
    # four-GPU family's first reserve probes, predicted at P 0.64, started 38% of the time.
    def launch(mfs, gpus):
        ok, values, attrs = _truth(3, 1, 4, mfs)
        flags = {"speculative_num_steps": 3, "speculative_eagle_topk": 1, "speculative_num_draft_tokens": 4,
                 "mem_fraction_static": mfs}
        return optuna.trial.create_trial(values=values, user_attrs={**attrs, record.FLAGS: flags, record.GPU_COUNT: gpus,
                                                                    record.DP_RANKS: [{"max_total_num_tokens": 1}]})

    names = ["single_tps", "concurrent_tps", "capacity"]
    above = [np.array(v) for v in ([3, 3], [1, 1], [4, 4], [0.80, 0.90])]
    p = {}
    for gpus in (1, 4):
        model, why = M.fit([launch(0.80, gpus)], names)
        assert model is not None, why
        p[gpus] = model.predict(*above).p_start
    assert p[4][0] == p[1][0] == 1.0  # where it started
    assert p[1][1] < 0.95 and p[4][1] < p[1][1] - 0.05, p  # above it: the wider range is less sure


def test_an_unseen_tree_width_is_half_as_novel_once_another_width_fixed_the_rank_law():
    # qwen-demo's worst seeds spent their last launches on topk-4 trees at the full novelty of an
    # unmeasured tree although (4, 2, 6) had fixed the rank law's share (23 landscapes, 20 seeds:
    # HV at 10 97.37 -> 97.55%, four landscapes below 95% -> one).
    from types import SimpleNamespace

    def novelty(measured_steps):
        stub = SimpleNamespace(measured_steps=measured_steps, memory=SimpleNamespace(max_draft={1: 4, 2: 6}),
                               _verifies_chain=lambda s, k, d: False)
        return M.Model._shape_novelty(stub, 4, 4, 6)

    assert novelty({1: 3}) == 1.0  # no tree measured: nothing known of any width
    assert novelty({1: 3, 2: 4}) == 0.5
    assert novelty({1: 3, 4: 4}) == 0.0


def test_a_deeper_chain_is_novel_for_its_depth_once_not_again_for_its_draft_tokens():
    # A chain's draft tokens are its steps + 1: counting the extra depth and the extra draft
    # tokens both doubled a deeper chain's spread, and family:2's studies spent a launch on
    # (8, 1, 9) for it (its single-request fit was within 1.4% of the truth).
    from types import SimpleNamespace

    stub = SimpleNamespace(measured_steps={1: 5, 2: 5}, memory=SimpleNamespace(max_draft={1: 6, 2: 11}),
                           _verifies_chain=lambda s, k, d: False)
    assert M.Model._shape_novelty(stub, 8, 1, 9) == pytest.approx(0.45)  # three steps deeper, once
    assert M.Model._shape_novelty(stub, 5, 1, 6) == 0.0
    # a tree's draft tokens are not fixed by its depth: both still count
    assert M.Model._shape_novelty(stub, 7, 2, 15) == pytest.approx(0.3 + 4 / 15)


def _slo_study(name: str, seed: int = 0, latency_bound: bool = False) -> tuple[optuna.Study, list[float], list[bool]]:
    """Ten launches of a study with slo_capacity, which the model does not predict here (no
    promise recorded), on `_truth` with 6 GiB of memory the capture needs and no server reports:
    the top of the range (0.90) fails for every shape, 0.87 starts every tree.  With
    `latency_bound` each trial records its slo_capacity (12) below its running requests (48), as
    the load search does when the latency promise breaks first."""
    study = optuna.create_study(directions=["maximize"] * 2, sampler=make_sampler(name, seed, n_objectives=2))
    study.set_metric_names(["single_tps", "slo_capacity"])
    fractions, started = [], []
    for _ in range(10):
        trial = study.ask()
        p = suggest(trial, SPACE, Params())
        trial.set_user_attr(record.FLAGS, p.as_dict())
        ok, values, attrs = _truth(p.speculative_num_steps, p.speculative_eagle_topk, p.speculative_num_draft_tokens, p.mem_fraction_static)
        ok = ok and attrs[record.MEMORY_USAGE]["startup_available"] > 0.8 + 6.0
        fractions.append(p.mem_fraction_static)
        started.append(ok)
        if not ok:
            trial.set_user_attr(record.FAILURE_KIND, "memory_graph")
            study.tell(trial, state=TrialState.PRUNED)
            continue
        for k, v in {**attrs, **({record.SLO_CAPACITY: min(values[2], 12)} if latency_bound else {})}.items():
            trial.set_user_attr(k, v)
        study.tell(trial, [values[0], min(values[2], 12)])
    return study, fractions, started


def test_a_study_the_model_cannot_rank_still_launches_where_its_memory_model_says_it_starts():
    # With slo_capacity (or SLO constraints) the shapes come from TPE; the fraction came from the
    # edge walk down from the top, which failed the demo-slo study's first launch (a graph OOM at
    # 0.95).  The memory model knows where a shape starts without knowing its latency.
    probes = 0
    for seed in range(5):
        study, fractions, started = _slo_study("model", seed)
        assert fractions[0] == pytest.approx(0.85)  # the designed first launch's safe fraction
        assert started.count(False) <= 1, (seed, fractions, started)
        assert max(f for f, ok in zip(fractions, started) if ok) >= 0.87  # and it climbs toward the edge
        predicted = [t.user_attrs.get(record.MODEL_PREDICTION) for t in study.trials[1:]]
        assert all(p and 0 <= p["p_start"] <= 1 for p in predicted)
        notes = [t.user_attrs[record.MODEL_NOTE] for t in study.trials]
        assert any(": from the memory model (P(start)" in n for n in notes)
        probes += sum(n.startswith("model: a reserve probe") for n in notes)
        # Nor is a trial spent on a duplicate: a chain with no sure climb left is not proposed again.
        configs = [tuple(sorted(t.params.items())) for t in study.trials]
        assert len(set(configs)) == len(configs), (seed, configs)
        # Nor on a tree that verifies what a shallower one does (steps beyond draft - 1, or two draft tokens).
        trees = [(t.params["speculative_num_steps"], t.params["speculative_num_draft_tokens"]) for t in study.trials
                 if t.params["speculative_eagle_topk"] > 1]
        assert all(steps <= draft - 1 and draft > 2 for steps, draft in trees), (seed, trees)
        # A shape proposed again is not launched below its highest start (the same speed, less pool).
        highest: dict = {}
        for t, ok in zip(study.trials, started):
            shape = (t.params["speculative_num_steps"], t.params["speculative_eagle_topk"], t.params.get("speculative_num_draft_tokens"))
            assert t.params["mem_fraction_static"] >= highest.get(shape, 0.0), (seed, t.number, shape)
            if ok:
                highest[shape] = max(highest.get(shape, 0.0), t.params["mem_fraction_static"])
    assert probes  # the edge is learned by probes of front shapes, as the model sampler's own studies do
    # Where the latency promise, not the pool, caps slo_capacity at every shape launched, a larger
    # pool adds nothing the study scores: no launch is spent learning its edge.
    for seed in range(3):
        study, fractions, started = _slo_study("model", seed, latency_bound=True)
        notes = [t.user_attrs[record.MODEL_NOTE] for t in study.trials]
        assert not any(n.startswith("model: a reserve probe") for n in notes), (seed, notes)
        assert started.count(False) <= 1, (seed, fractions, started)
    _, _, walked = _slo_study("edge")
    assert walked.count(False) >= 2  # the landscape's premise: the walk from the top fails here


def _long_context(steps, topk, draft):
    """A long-context class's rate over the mix's: 0.6x everywhere, less for each verify token
    (attention over a long context costs every draft token, so wide trees lose their gain first)."""
    return 0.6 / (1 + 0.04 * (draft - 1))


def _launch_on_truth(study: optuna.Study, reserve_gib: float = 0.0):
    """Ask `study` for a trial and launch it on `_truth`, `reserve_gib` more memory needed by the
    capture than any server reports: (trial, shape, params, values, attrs), or None when it did
    not start (told PRUNED, a graph OOM)."""
    trial = study.ask()
    p = suggest(trial, SPACE, Params())
    trial.set_user_attr(record.FLAGS, p.as_dict())
    shape = (p.speculative_num_steps, p.speculative_eagle_topk, p.speculative_num_draft_tokens or p.speculative_num_steps + 1)
    ok, values, attrs = _truth(*shape, p.mem_fraction_static)
    if not ok or attrs[record.MEMORY_USAGE]["startup_available"] <= 0.8 + reserve_gib:
        trial.set_user_attr(record.FAILURE_KIND, "memory_graph")
        study.tell(trial, state=TrialState.PRUNED)
        return None
    return trial, shape, p, values, attrs


def _class_study(seed: int, trials: int = 8) -> optuna.Study:
    """A study of single_tps:long_context (with concurrent_tps and capacity) on `_truth`; each
    trial records the mix's single-stream rate as the tuner does (single_tps_runs)."""
    study = optuna.create_study(directions=["maximize"] * 3, sampler=make_sampler("model", seed, n_objectives=3))
    study.set_metric_names(["single_tps:long_context", "concurrent_tps", "capacity"])
    for _ in range(trials):
        if (launched := _launch_on_truth(study)) is None:
            continue
        trial, shape, _, values, attrs = launched
        for k, v in {**attrs, record.SINGLE_TPS_RUNS: [values[0]]}.items():
            trial.set_user_attr(k, v)
        study.tell(trial, [values[0] * _long_context(*shape), values[1], values[2]])
    return study


def test_a_request_class_objective_is_ranked_by_the_model_as_the_mix_times_its_fitted_ratio():
    # A study of one class's speed (what a long-context user sees) was TPE's draws: "model
    # sampler off: it does not predict single_tps:long_context".  The model predicts it as the
    # mix's rate times the class's ratio, fitted on the launches as a line in the shape.
    from tuner.search.model_sampler import predicted_front

    names = ["single_tps:long_context", "concurrent_tps", "capacity"]
    for seed in range(3):
        study = _class_study(seed)
        notes = [t.user_attrs[record.MODEL_NOTE] for t in study.trials]
        assert all(n.startswith("model:") for n in notes), (seed, notes)
        model, why = M.fit(study.get_trials(), names)
        assert model is not None, why
        launched = {(t.params["speculative_num_steps"], t.params["speculative_eagle_topk"],
                     t.params.get("speculative_num_draft_tokens", t.params["speculative_num_steps"] + 1)) for t in study.trials}
        unseen = [(s, k, d) for s in range(1, 5) for k in (1, 2) for d in range(2, 9)
                  if (k == 1 and d == s + 1 or k == 2 and s + 1 < d <= 2 * s + 1) and (s, k, d) not in launched]
        steps, topk, draft = (list(x) for x in zip(*unseen))
        mids, sds = model.predict(steps, topk, draft, [0.85] * len(unseen), names).columns(names)
        truth = np.array([_truth(*shape, 0.85)[1][0] * _long_context(*shape) for shape in unseen])
        assert np.all(np.abs(mids[:, 0] / truth - 1) < 0.05), (seed, list(zip(unseen, mids[:, 0].round(1), truth.round(1))))
        assert np.all(sds[:, 0] > 0)  # an unlaunched shape's figure is a prediction, with its doubt
    header, rows, _ = predicted_front(study, SPACE, Params())
    assert header[4] == "single_tps:long_context" and rows


def test_a_study_that_leaves_the_fraction_to_the_server_launches_no_tree_the_chain_beats_nor_a_shape_twice():
    # Without mem_fraction_static in [space] the shapes are the default sampler's draws; on the
    # demo such a study launched (3, 2, 2), which the chain (1, 1, 2) beats by construction.
    space = SpaceConfig.model_validate({k: v for k, v in SPACE.model_dump(exclude_none=True).items() if k != "mem_fraction_static"})
    for seed in range(5):
        study = _study(make_sampler("model", seed, n_objectives=3))
        shapes = []
        for _ in range(10):
            trial = study.ask()
            p = suggest(trial, space, Params())
            trial.set_user_attr(record.FLAGS, p.as_dict())
            shape = (p.speculative_num_steps, p.speculative_eagle_topk, p.speculative_num_draft_tokens or p.speculative_num_steps + 1)
            shapes.append(shape)
            ok, values, attrs = _truth(*shape, 0.85)  # the server's own fraction
            for k, v in attrs.items():
                trial.set_user_attr(k, v)
            study.tell(trial, values)
        assert len(set(shapes)) == len(shapes), (seed, shapes)
        trees = [(s, d) for s, k, d in shapes if k > 1]
        assert all(s <= d - 1 and d > 2 for s, d in trees), (seed, shapes)


_ITL_PROMISE = 8.0  # p95_itl_ms of the SLO studies below


def _slo_truth(steps, topk, draft, mfs, promise: float = _ITL_PROMISE):
    """(running requests the pool allows, slo_capacity, p95 ITL against load) on `_truth`: running
    requests are the KV tokens over 16,384 (at most 48); the p95 inter-token latency is 1.4x the
    mean per-token one, growing with log load, the step time interpolated between `_truth`'s
    batch-1 and batch-32 times; slo_capacity the most requests in flight, up to the running ones,
    within the promise."""
    _, values, attrs = _truth(steps, topk, draft, mfs)
    accept = attrs[record.ACCEPT_LENGTH]
    step1, step32 = accept / values[0] * 1000, 32 * accept / values[1] * 1000

    def p95(load):
        return 1.4 * (1 + 0.1 * math.log(load)) * (step1 + (step32 - step1) * (load - 1) / 31) / accept

    running = min(48, attrs[record.MAX_TOTAL_NUM_TOKENS] // 16384)
    holding = 0
    while holding < running and p95(holding + 1) <= promise:
        holding += 1
    return running, holding, p95


def _slo_model_study(seed: int, promise: dict | None = None, trials: int = 8, reserve_gib: float = 0.0) -> optuna.Study:
    """A study of single_tps and slo_capacity on `_slo_truth`; each trial records what the
    tuner's load search does: the promise, and the p95 ITL at the single stream's load, the
    concurrent phase's (16) and the two loads the search ended between.  `reserve_gib`: memory
    the capture needs that no server reports (as `_slo_study`)."""
    promise = promise or {"p95_itl_ms": _ITL_PROMISE, "attainment": 0.95, "arrival": "closed"}
    study = optuna.create_study(directions=["maximize"] * 2, sampler=make_sampler("model", seed, n_objectives=2))
    study.set_metric_names(["single_tps", "slo_capacity"])
    for _ in range(trials):
        if (launched := _launch_on_truth(study, reserve_gib)) is None:
            continue
        trial, shape, p, values, attrs = launched
        running, holding, p95 = _slo_truth(*shape, p.mem_fraction_static, promise.get("p95_itl_ms", _ITL_PROMISE))
        loads = sorted({1, 16, max(holding, 1), min(holding + 1, running)})
        attrs = {**attrs, record.MAX_RUNNING_REQUESTS: running, record.SLO_CAPACITY: holding,
                 record.SLO_PROMISE: promise,
                 record.SLO_CURVE: [{"load": c, "p95_itl_ms": round(p95(c), 3), "holds": c <= holding} for c in loads]}
        for k, v in attrs.items():
            trial.set_user_attr(k, v)
        study.tell(trial, [values[0], holding])
    return study


def test_slo_capacity_is_ranked_by_the_model_from_the_step_time_the_pool_and_the_measured_latencies():
    # A study of slo_capacity went to TPE's start-up draws ("model sampler off: it does not
    # predict slo_capacity"), the memory model choosing only the fraction.  The model predicts it
    # as the most requests in flight whose predicted p95 ITL (the step time's per-token ITL times
    # a ratio fitted on the measured load points) is within the promise, and no more than the
    # running requests the pool allows.
    from tuner.search.model_sampler import predicted_front

    names = ["single_tps", "slo_capacity"]
    for seed in range(3):
        study = _slo_model_study(seed)
        notes = [t.user_attrs[record.MODEL_NOTE] for t in study.trials]
        assert all(n.startswith("model:") and "off" not in n for n in notes), (seed, notes)
        model, why = M.fit(study.get_trials(), names)
        assert model is not None, why
        launched = {M._shape_of(t.params) for t in study.trials}
        unseen = [(s, k, d) for s in range(1, 5) for k in (1, 2) for d in range(2, 9)
                  if (k == 1 and d == s + 1 or k == 2 and s + 1 < d <= 2 * s + 1) and M.Shape(s, k, d) not in launched]
        for mfs in (0.80, 0.90):  # a pool of 24 running requests and one of 28
            steps, topk, draft = (list(x) for x in zip(*unseen))
            mids, sds = model.predict(steps, topk, draft, [mfs] * len(unseen), names).columns(names)
            truth = np.array([_slo_truth(*shape, mfs)[1] for shape in unseen])
            assert np.all(np.abs(mids[:, 1] - truth) <= 2), (seed, mfs, list(zip(unseen, mids[:, 1], truth)))
            assert len(set(truth)) > 3  # the premise: the latency, not the pool alone, ranks the shapes
    header, rows, _ = predicted_front(study, SPACE, Params())
    assert header[5] == "slo_capacity" and rows
    # A promise the step time says nothing about (TTFT alone) is not predicted: TPE's shapes, the
    # memory model's fractions, as before.
    study = _slo_model_study(0, {"p95_ttft_ms": 500, "attainment": 0.95, "arrival": "closed"}, trials=4)
    assert "slo_capacity is not predicted" in study.trials[-1].user_attrs[record.MODEL_NOTE]


def test_an_slo_study_whose_pool_caps_it_learns_the_memory_edge_every_other_trial_not_every_trial():
    # Live, the demo's SLO study (p95 ITL <= 40 ms: the running requests cap slo_capacity) spent
    # five trials in a row raising (3, 1, 4) one fraction step each and measured no other shape.
    # Here a generous promise (the pool caps every shape) and 6 GiB the capture needs unreported.
    loose = {"p95_itl_ms": 100.0, "attainment": 0.95, "arrival": "closed"}
    probes = 0
    for seed in range(3):
        study = _slo_model_study(seed, loose, trials=10, reserve_gib=6.0)
        notes = [t.user_attrs[record.MODEL_NOTE] for t in study.trials]
        probed = [n.startswith("model: a reserve probe") for n in notes]
        assert not any(a and b for a, b in zip(probed, probed[1:])), (seed, notes)
        assert sum(t.state == TrialState.PRUNED for t in study.trials) <= 1, (seed, notes)
        assert len({M._shape_of(t.params) for t in study.trials}) >= 4, (seed, notes)
        probes += sum(probed)
    assert probes  # the edge is still learned, by probes between the model's own choices
