"""Calibrated memory (issue #23): what a failure teaches the model sampler, how far it trusts
shapes larger than any launched, and what a failed launch's log says about memory."""

import optuna
import pytest
from optuna.distributions import FloatDistribution
from optuna.trial import TrialState, create_trial

from sglang_emulator import model as EM
from sglang_emulator.capture_log import capture_lines
from tuner.config import SpaceConfig
from tuner.results import record
from tuner.search import model as M
from tuner.search.samplers import make_sampler
from tuner.search.space import suggest
from tuner.server.diagnose import capture_memory
from tuner.sglang_args import Params

NAMES = ["single_tps", "concurrent_tps", "capacity"]
SPACE = SpaceConfig.model_validate({
    "speculative_num_steps": {"low": 1, "high": 16},
    "speculative_eagle_topk": {"choices": [1, 2, 4]},
    "speculative_num_draft_tokens": {"low": 2, "high": 16},
    "mem_fraction_static": {"low": 0.80, "high": 0.93, "step": 0.01},
})


def _flags(steps, topk, draft, mfs):
    return {"speculative_num_steps": steps, "speculative_eagle_topk": topk,
            "speculative_num_draft_tokens": draft if topk > 1 else None, "mem_fraction_static": mfs}


def _started(steps, topk, draft, mfs, *, tokens, startup, graph, weight, kvcache, arch="LlamaForCausalLM", high=0.93):
    accept = 1 + sum(0.8 ** j for j in range(1, steps + 1))
    single, concurrent = accept / (10 + 0.3 * steps) * 1000, 32 * accept / (12 + 0.5 * steps) * 1000
    reach = [1.0] + [0.8 ** j for j in range(1, steps + 1)] + [0.0]
    attrs = {record.FLAGS: _flags(steps, topk, draft, mfs), record.MAX_TOTAL_NUM_TOKENS: tokens,
             record.MAX_RUNNING_REQUESTS: 48, record.DECLARED_MAX_RUNNING: 48, record.ACCEPT_LENGTH: accept,
             record.REQUEST_TOKENS: 8192, record.ARCHITECTURE: arch, "concurrent_tps_by_level": {"32": concurrent},
             record.ACCEPT_HISTOGRAM: [int(1000 * (reach[k] - reach[k + 1])) for k in range(steps + 1)],
             record.MEMORY_USAGE: {"weight": weight, "kvcache": kvcache, "token_capacity": tokens, "startup_available": startup,
                                   "graph": graph if isinstance(graph, dict) else {"target_verify": graph}}}
    return create_trial(state=TrialState.COMPLETE, values=[single, concurrent, min(48, tokens // 8192)],
                        params={"mem_fraction_static": mfs}, distributions={"mem_fraction_static": FloatDistribution(0.8, high)},
                        user_attrs=attrs)


def _failed(steps, topk, draft, mfs, kind, **extra):
    attrs = {record.FLAGS: _flags(steps, topk, draft, mfs), record.FAILURE_KIND: kind, **extra}
    return create_trial(state=TrialState.PRUNED, params={"mem_fraction_static": mfs},
                        distributions={"mem_fraction_static": FloatDistribution(0.8, 0.93)}, user_attrs=attrs)


# --- a KV-pool failure moves the line -----------------------------------------------------------

PRE, WEIGHTS, ALPHA = 90.0, 60.0, 20_000.0  # a hybrid on a 96 GB card: GiB, GiB, KV tokens per GiB of pool


def _hybrid(steps, mfs, tokens):
    rest = PRE * mfs - WEIGHTS
    return _started(steps, 1, steps + 1, mfs, tokens=tokens, startup=PRE * (1 - mfs) - 3.0 - 0.05, graph=0.05,
                    weight=WEIGHTS, kvcache=rest, arch="Qwen3_5MoeForConditionalGeneration")


def _p_start(trials, steps, topk, draft, mfs):
    model, why = M.fit(trials, NAMES)
    assert model is not None, why
    return float(model.predict([steps], [topk], [draft], [mfs]).p_start[0])


def test_after_a_kv_failure_at_draft_16_no_draft_from_10_at_that_fraction_or_lower_is_predicted_to_start():
    # Drafts 4 and 5 started with nearly the same pool (a small per-draft-token reservation), so the
    # line says draft 16 fits at 0.93; it failed: the reservation is far larger than the line said.
    trials = [_hybrid(3, 0.90, int(ALPHA * (PRE * 0.90 - WEIGHTS)) - 8_000),
              _hybrid(4, 0.92, int(ALPHA * (PRE * 0.92 - WEIGHTS)) - 10_000)]
    assert _p_start(trials, 15, 1, 16, 0.93) > 0.5  # what the line said before the failure
    trials.append(_failed(15, 1, 16, 0.93, "memory_kv"))
    for draft in range(10, 17):
        for mfs in (0.85, 0.88, 0.90, 0.92, 0.93):
            assert _p_start(trials, draft - 1, 1, draft, mfs) < 0.5, (draft, mfs)
    # ... unless a later launch says so: draft 12 started at 0.92, so draft 10 fits at 0.90.
    trials.append(_hybrid(11, 0.92, 72_000))
    assert _p_start(trials, 9, 1, 10, 0.90) >= 0.5


# --- graph memory of shapes larger than any launched -------------------------------------------

def _dense(steps, topk, draft, mfs, graph=1.0):
    """A dense 8B on an 80 GB card; `graph`: GiB of all graphs, or SGLang 0.5.23's {runner: GiB}."""
    pre, weights, other = 80.0, 16.0, 1.0
    rest = pre * mfs - weights
    total = sum(graph.values()) if isinstance(graph, dict) else graph
    return _started(steps, topk, draft, mfs, tokens=int(rest * 4000), startup=pre * (1 - mfs) - other - total, graph=graph,
                    weight=weights, kvcache=rest, high=max(0.93, mfs))


def _narrow_edge():
    """The tree (5, 4, 8) started at 0.82 and 0.87 and ran out of graph memory at 0.90 (the
    first launch of issue #23's dense 8B study, and its edge)."""
    return [_dense(5, 4, 8, 0.82, graph=3.0), _dense(5, 4, 8, 0.87, graph=3.0),
            _failed(5, 4, 8, 0.90, "memory_graph", **{record.CAPTURE_MEMORY: {"free_before": 7.0, "runners": {},
                                                                            "failed_runner": "target_verify"}})]


def _propose(trials, shape):
    """The model sampler's fraction for a shape an operator fixed (enqueued without a fraction)."""
    study = optuna.create_study(directions=["maximize"] * 3, sampler=make_sampler("model", 0, n_objectives=3))
    study.set_metric_names(NAMES)
    for t in trials:
        study.add_trial(t)
    steps, topk, draft = shape
    study.enqueue_trial({"speculative_num_steps": steps, "speculative_eagle_topk": topk, "speculative_num_draft_tokens": draft})
    trial = study.ask()
    p = suggest(trial, SPACE, Params())
    assert (p.speculative_num_steps, p.speculative_eagle_topk, p.speculative_num_draft_tokens) == shape
    return p.mem_fraction_static, trial.user_attrs[record.MODEL_PREDICTION]["p_start"]


def test_a_first_tree_twice_as_wide_is_not_launched_at_the_narrow_shapes_edge():
    trials = _narrow_edge()
    # Twice the draft tokens: 1.5x the graph tokens of the narrow tree, whose graphs sat at the
    # edge at 0.87; the wide one's upper bound (its graph tokens x the narrow tree's GiB per token)
    # does not fit there with the largest reserve the launches allow.
    assert _p_start(trials, 5, 4, 16, 0.87) < 0.9
    mfs, p = _propose(trials, (5, 4, 16))
    assert mfs < 0.87 and p >= 0.9, (mfs, p)


@pytest.mark.parametrize("version", ["0.5.23", "0.5.9"])
def test_a_chain_first_launched_after_a_tree_is_priced_by_the_trees_runners(version):
    # tp4:51, a drawn four-GPU world: the tree (5, 4, 8) started at 0.83 and failed at 0.89; the
    # chain (6, 1, 7), never launched, went to 0.89 at P(start) 0.91 and failed.  Fitted on the
    # total, the chain's graphs were anywhere from 0 GiB (the fit gave the tree-only terms all of
    # the tree's memory) to 2 GiB.  Per runner, each scales by the tokens SGLang captures for it:
    # verify and extend by draft tokens 8 -> 7, draft decode by topk x (steps - 1) 16 -> 5:
    # 1.08 + 0.51 + 0.51 = 2.1 GiB, or down to 1.4 GiB if the tree's figures held index buffers
    # a chain has none of.  0.5.23 says so in memory_usage.graph; 0.5.9 reports one figure
    # there, and each runner's "mem usage" in its capture log.
    runners = {"target_verify": 1.23, "draft_decode": 1.62, "draft_extend": 0.58}
    tree = _dense(5, 4, 8, 0.83, graph=runners if version == "0.5.23" else {"all": sum(runners.values())})
    log = capture_lines(EM.SpecShape("EAGLE3", 5, 4, 8), runners, (1, 2, 4, 8, 48), 11.4, failed_runner=None,
                        version=version, elapsed_s=3.0)
    tree.user_attrs[record.CAPTURE_MEMORY] = capture_memory("\n".join(log))
    trials = [tree, _failed(5, 4, 8, 0.89, "memory_graph", **{record.CAPTURE_MEMORY: {"free_before": 7.8}})]
    model, _ = M.fit(trials, NAMES)
    lo, hi = model.memory.graph_range([6], [1], [7], [48])
    assert 1.3 <= lo[0] <= 1.5 and 1.9 <= hi[0] <= 2.3, (lo, hi)
    assert _p_start(trials, 6, 1, 7, 0.89) < 0.5  # where the tree just failed
    mfs, p = _propose(trials, (6, 1, 7))
    assert p >= 0.9 and mfs <= 0.88, (mfs, p)


def test_after_a_graph_oom_the_next_launch_of_that_shape_is_where_the_upper_bound_says_it_fits():
    # Issue #23: (5, 4, 8) started at 0.82; the wide tree failed at 0.90; the next try went to
    # 0.87 at P(start) 1.00 and failed again.  Here the next try is where the upper bound fits.
    trials = [_dense(5, 4, 8, 0.82, graph=3.0),
              _failed(5, 4, 16, 0.90, "memory_graph", **{record.CAPTURE_MEMORY: {"free_before": 7.0}})]
    assert _p_start(trials, 5, 4, 16, 0.90) < 0.1  # the failure moved the model
    mfs, p = _propose(trials, (5, 4, 16))
    assert p >= 0.9 and mfs <= 0.85, (mfs, p)  # not one step down from 0.90


def test_a_failure_only_a_reserve_beyond_the_prior_explains_moves_every_shape_at_that_fraction():
    # A capture reserve of 12% of the card (9.6 GiB of 80; the prior allows up to 10%): the deep
    # chain started at 0.80 leaving 12.3 GiB, and a chain inside it failed at 0.85 with 11 GiB
    # free, where its graphs (at most the started chain's per token: 1.7 GiB) and any reserve
    # up to 10% fitted.  Before, the failure sat in the prior's last corner and the chains
    # inside the started one were predicted at P(start) 1.00 at 0.85, 0.84 and 0.85 again (four
    # failures in a row on a drawn landscape with that reserve).
    trials = [_dense(8, 1, 9, 0.80, graph=2.7)]
    assert _p_start(trials, 5, 1, 6, 0.85) > 0.9  # what the prior said
    trials.append(_failed(5, 1, 6, 0.85, "memory_graph", **{record.CAPTURE_MEMORY: {"free_before": 11.0}}))
    for shape in ((5, 1, 6), (4, 1, 5), (6, 1, 7), (8, 1, 9)):
        assert _p_start(trials, *shape, 0.85) < 0.1, shape
        assert _p_start(trials, *shape, 0.84) < 0.5, shape
    assert _p_start(trials, 8, 1, 9, 0.80) == pytest.approx(1.0)  # where it started


def test_a_failure_at_the_last_corner_of_the_prior_widens_the_reserve():
    # The deep chain started at 0.80 leaving 12.3 GiB; a first tree failed at 0.83 with 11.8 GiB
    # free, which only its graphs' upper bound (3.9 GiB) plus a reserve of the prior's full 10%
    # (8 GiB) explain.  Read that way the next tree, one fraction step down, fits at P(start)
    # 1.00 (family:0 with a 12% reserve: (5, 2, 8) at 0.83, then (5, 2, 10) at 0.82, both failed).
    trials = [_dense(8, 1, 9, 0.80, graph=2.7),
              _failed(5, 2, 8, 0.83, "memory_graph", **{record.CAPTURE_MEMORY: {"free_before": 11.8}})]
    assert _p_start(trials, 5, 2, 10, 0.82) < 0.5
    assert _p_start(trials, 8, 1, 9, 0.80) == pytest.approx(1.0)


def test_a_failure_in_the_priors_last_tenth_leaves_a_larger_reserve_possible():
    # family:7 with a 12% reserve: the chain (3, 1, 4) started at 0.83 and failed at 0.90 and
    # 0.88 (7.9 GiB free, its graphs 0.62 GiB: a reserve above 7.3 GiB, the prior's last 9%).
    # The prior alone then put the chain inside it, (2, 1, 3) at 0.87, at P(start) 1.00 (it
    # failed); a reserve beyond the prior explains the failures as well and keeps its share.
    trials = [_dense(3, 1, 4, 0.83, graph=0.62),
              _failed(3, 1, 4, 0.90, "memory_graph", **{record.CAPTURE_MEMORY: {"free_before": 7.0}}),
              _failed(3, 1, 4, 0.88, "memory_graph", **{record.CAPTURE_MEMORY: {"free_before": 7.9}})]
    assert _p_start(trials, 2, 1, 3, 0.87) < 0.9
    assert _p_start(trials, 2, 1, 3, 0.86) > _p_start(trials, 2, 1, 3, 0.87)
    assert _p_start(trials, 3, 1, 4, 0.83) == pytest.approx(1.0)  # where it started


def test_a_failure_the_prior_explains_keeps_the_prior():
    # The same start, a failure at 0.92 with 5.4 GiB free: graphs and a reserve within 10% of the
    # memory explain it, so a shape inside the started one at 0.85 (11 GiB free) still starts.
    trials = [_dense(8, 1, 9, 0.80, graph=2.7),
              _failed(8, 1, 9, 0.92, "memory_graph", **{record.CAPTURE_MEMORY: {"free_before": 5.4}})]
    assert _p_start(trials, 5, 1, 6, 0.85) > 0.9


def test_a_failure_the_starts_cannot_explain_keeps_what_the_other_failures_taught():
    # A server whose launches do not all need the same memory: (6, 1, 7) started at 0.85 and
    # 0.88 and failed at 0.90, so the reserve lies between what 0.90 had free less its graphs and
    # what 0.88 left.  Then (5, 1, 6), inside it, failed at 0.88, which no single reserve
    # explains.  Read as exact, the failures were set aside, and a chain inside both at 0.90,
    # where (6, 1, 7) had failed, was predicted at P(start) 0.85 (family:0 seed 12 with
    # `benchmarks/sampler_benchmark.py --memory-jitter 0.3`: three failures in a row after it).
    def failed(steps, mfs, free):
        return _failed(steps, 1, steps + 1, mfs, "memory_graph", **{record.CAPTURE_MEMORY: {"free_before": free}})

    trials = [_dense(6, 1, 7, 0.85, graph=2.2), _dense(6, 1, 7, 0.88, graph=2.2), failed(6, 0.90, 7.0),
              failed(5, 0.88, 8.6)]
    assert _p_start(trials, 4, 1, 5, 0.90) < 0.1
    assert _p_start(trials, 4, 1, 5, 0.89) < 0.5
    assert _p_start(trials, 4, 1, 5, 0.86) > 0.99  # two fraction steps below the failures
    model, _ = M.fit(trials, NAMES)
    assert model.memory.launch_noise > 0  # and it says the memory varies from launch to launch
    model, _ = M.fit(trials[:3], NAMES)
    assert model.memory.launch_noise == 0  # which a consistent history does not


# --- what a failed launch's log says -----------------------------------------------------------

def _emulator_failure_log(version):
    spec = EM.SpecShape("EAGLE3", 3, 4, 8)
    graphs = {"target_verify": 2.5, "draft_decode": 0.75, "draft_extend": 0.4}
    return "\n".join(capture_lines(spec, graphs, (1, 2, 4, 8, 48), 3.1, failed_runner="draft_decode", version=version,
                                   elapsed_s=3.0)) + "\nCapture cuda graph failed: CUDA error: CUBLAS_STATUS_ALLOC_FAILED"


@pytest.mark.parametrize("version", ["0.5.23", "0.5.9"])
def test_the_capture_log_of_a_failed_launch_is_read(version):
    got = capture_memory(_emulator_failure_log(version))
    assert got["free_before"] == 3.1
    assert got["failed_runner"] == "draft_decode"
    target = got["runners"]["target_verify" if version == "0.5.23" else "target"]
    assert target == {"avail_before": 3.1, "usage": 2.5, "avail_after": 0.6}
    assert got["cuda_graph_max_bs"] == 48


def test_sglang_0_5_23_capture_lines_as_sglang_prints_them():
    # model_runner_components/cuda_graph_setup.py · capture_decode_graph and eagle_worker_v2.py (0.5.23)
    log = ("[2026-12-01 10:00:01 TP0] Capture target verify CUDA graph begin. backend=full, num_tokens_per_req=8, avail mem=9.87 GB\n"
           "[2026-12-01 10:00:04 TP0] Capture target verify CUDA graph end. bs=[1, 2, 4, 8, 12, 16], elapsed=3.10 s, mem usage=1.23 GB, avail mem=8.64 GB.\n"
           "[2026-12-01 10:00:04 TP0] Capture draft decode CUDA graph begin. backend=full, num_tokens_per_req=4, bs=[1, 2, 4, 8, 12, 16], avail mem=8.64 GB\n"
           "[2026-12-01 10:00:05 TP0] Scheduler hit an exception: Traceback ...\nException: Capture cuda graph failed: CUDA error: out of memory")
    got = capture_memory(log)
    assert got == {"free_before": 9.87, "failed_runner": "draft_decode", "cuda_graph_max_bs": 16,
                   "runners": {"target_verify": {"avail_before": 9.87, "usage": 1.23, "avail_after": 8.64},
                               "draft_decode": {"avail_before": 8.64}}}


def test_memory_usage_of_a_started_launch_keeps_cuda_graph_max_bs():
    info = {"cuda_graph_max_bs": 48, "internal_states": [{"memory_usage": {
        "weight": 16.0, "kvcache": 50.0, "token_capacity": 409600, "startup_available": 4.2,
        "graph": {"target_verify": 1.1, "draft_decode": 0.2, "draft_extend": 0.1}}}]}
    assert record.memory_usage(info)["cuda_graph_max_bs"] == 48


def test_a_reserve_below_one_percent_of_the_memory_is_possible():
    # A server whose capture needs nothing beyond what it reports (the emulator's H200 profile:
    # 0.6 GiB of non-PyTorch memory on 141 GiB, 0.4%).  A 1% floor on the reserve called every
    # launch leaving less than 0.8 GiB of this 80 GiB card after its graphs certain to fail, and
    # launches near the edge riskier than they were.
    trials = [_dense(5, 4, 8, 0.82, graph=3.0), _dense(5, 4, 8, 0.93, graph=3.0)]  # 1.6 GiB left at 0.93
    p = _p_start(trials, 5, 4, 8, 0.945)  # leaves 0.4 GiB: 0.5% of the memory
    assert 0.1 < p < 0.5, p
    assert _p_start(trials, 5, 4, 8, 0.93) == pytest.approx(1.0)  # where it started


def test_graphs_captured_up_to_cuda_graph_max_bs_are_predicted_at_that_batch():
    # A 48 GB L40S captures graphs up to 32 batches while the pool holds 48 requests
    # (cuda_graph_max_bs, said by /server_info and the capture log).  The shape that measured
    # 3 GiB of graphs at 32 needs the same 3 GiB one fraction step up; counted at 48 request
    # slots it looked 1.5x that, and the replayed L40S studies stayed a step below their edge
    # (HV at 10 launches 95.3% -> 92.6% once the replay passed on the capture log's batch sizes).
    def at_32(trial):
        trial.user_attrs[record.MEMORY_USAGE]["cuda_graph_max_bs"] = 32
        return trial
    capped = [at_32(_dense(5, 4, 8, 0.82, graph=3.0)), at_32(_dense(5, 4, 8, 0.87, graph=3.0))]
    uncapped = [_dense(5, 4, 8, 0.82, graph=3.0), _dense(5, 4, 8, 0.87, graph=3.0)]
    # 6.4 GiB were left at 0.87; one step up leaves 5.6 with the same graphs.
    assert _p_start(capped, 5, 4, 8, 0.88) == pytest.approx(_p_start(uncapped, 5, 4, 8, 0.88), abs=0.02)
    # a wider tree scales the measured GiB per graph token at 32 batches, not at 48
    assert _p_start(capped, 5, 4, 12, 0.85) == pytest.approx(_p_start(uncapped, 5, 4, 12, 0.85), abs=0.02)


def test_a_launch_leaving_less_than_any_start_did_is_not_taken_as_sure(monkeypatch):
    # qwen-demo: every start at its top fraction left 2.0x GiB, 2.0 GiB of them NCCL's buffers,
    # counted as free but not free; a new shape with slightly larger graphs there looked 0.95 sure
    # under a reserve uniform up to that least margin, and failed (make demo's trial 14: (2, 4, 3)
    # at 0.94, P 0.94).  Here (3, 1, 4) left 1.7 GiB of 80 at 0.96 (the reserve known within 2%)
    # and (4, 1, 5) would leave 1.55.
    trials = [_dense(3, 1, 4, 0.85, graph=0.5), _dense(3, 1, 4, 0.96, graph=0.5)]
    monkeypatch.setattr(M, "_EDGE_ATOM", 0.0)
    assert _p_start(trials, 4, 1, 5, 0.96) >= 0.9  # uniform up to the least margin: "sure"
    monkeypatch.undo()
    assert _p_start(trials, 4, 1, 5, 0.96) < 0.9
    assert _p_start(trials, 4, 1, 5, 0.95) >= 0.9  # one step down it leaves more than any start did
    assert _p_start(trials, 3, 1, 4, 0.96) == pytest.approx(1.0)  # where it started


def test_while_the_reserve_is_unknown_the_least_margin_is_no_edge():
    # (3, 1, 4) left 4.1 GiB at 0.93: the reserve anywhere up to 5% of the memory, the probes not
    # done.  A launch leaving a little less keeps the uniform prior's odds (the atom steered the
    # probes there: qwen-demo 95.0 -> 92.1% of the front at 10 launches).
    trials = [_dense(3, 1, 4, 0.85, graph=0.5), _dense(3, 1, 4, 0.93, graph=0.5)]
    assert _p_start(trials, 4, 1, 5, 0.93) >= 0.9


def _ask(trials):
    """The model sampler's next configuration, its P(start) and its note, nothing fixed."""
    study = optuna.create_study(directions=["maximize"] * 3, sampler=make_sampler("model", 0, n_objectives=3))
    study.set_metric_names(NAMES)
    for t in trials:
        study.add_trial(t)
    trial = study.ask()
    p = suggest(trial, SPACE, Params())
    shape = (p.speculative_num_steps, p.speculative_eagle_topk, p.speculative_num_draft_tokens)
    return shape, p.mem_fraction_static, trial.user_attrs[record.MODEL_PREDICTION]["p_start"], trial.user_attrs[record.MODEL_NOTE]


def test_after_two_failed_launches_the_next_is_one_the_model_is_all_but_sure_of():
    # A capture reserve beyond the prior: a chain inside the started deep chain failed at 0.85, a
    # tree at 0.83, both proposed by the model.  It then put a new tree at 0.80 at P(start) 0.93;
    # in the 12%-reserve worlds such launches after two failures started half the time, the third
    # failure of 98 studies in 160.  After two the study launches only what it is all but sure of.
    started = [_dense(8, 1, 9, 0.80, graph=2.7), _dense(4, 2, 6, 0.80, graph=2.0)]
    predicted = {record.MODEL_PREDICTION: {"p_start": 0.9}}
    chain_oom = _failed(5, 1, 6, 0.85, "memory_graph", **{record.CAPTURE_MEMORY: {"free_before": 11.0}}, **predicted)
    tree_oom = _failed(5, 2, 8, 0.83, "memory_graph", **{record.CAPTURE_MEMORY: {"free_before": 11.8}}, **predicted)
    shape, mfs, p, note = _ask(started + [chain_oom, tree_oom])
    assert p >= 0.98, (shape, mfs, p)
    assert "2 of its launches failed: only P(start) >= 0.98" in note  # the trial says why
    # One failure is the price of finding the edge: a launch at P 0.9 is still taken after it ...
    shape, mfs, p, note = _ask(started + [chain_oom])
    assert p < 0.98, (shape, mfs, p)
    # ... and a failed first launch, designed before there was a model, did not find the model wrong.
    designed = _failed(5, 2, 8, 0.83, "memory_graph", **{record.CAPTURE_MEMORY: {"free_before": 11.8}})
    shape, mfs, p, note = _ask(started + [chain_oom, designed])
    assert p < 0.98 and "only P(start)" not in note, (shape, mfs, p)
