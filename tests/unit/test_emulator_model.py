"""The emulator's pure model: calibration anchors, SGLang's sizing rules, acceptance."""

import pytest

from sglang_emulator import model as m
from sglang_emulator.landscape import Workload, expect
from sglang_emulator.profiles import PROFILES

QWEN = PROFILES["qwen3.5-122b-a10b"]
LLAMA = PROFILES["llama-3.1-8b-instruct"]

# docs/h200-forward-times.md, linear layers only: (B, d) -> ms
H200_LINEAR = {
    (1, 1): 4.60, (1, 4): 4.74, (1, 16): 4.83, (8, 1): 4.78, (8, 8): 5.06, (8, 16): 6.58,
    (16, 8): 6.57, (32, 4): 6.59, (32, 8): 8.04, (32, 16): 14.03, (64, 2): 6.58, (64, 8): 14.35,
    (128, 1): 6.56, (128, 4): 14.14, (128, 8): 26.35, (128, 16): 52.34,
}
H200_DRAFT = {(1, 1): 0.223, (8, 4): 0.264, (32, 2): 0.371, (64, 8): 0.827, (128, 4): 1.106}


@pytest.mark.parametrize("shape, ms", H200_LINEAR.items())
def test_8b_profile_reproduces_h200_forward_times(shape, ms):
    batch, tokens = shape
    assert m.forward_ms(LLAMA, batch=batch, tokens_per_request=tokens) == pytest.approx(ms, rel=0.10)


@pytest.mark.parametrize("shape, ms", H200_DRAFT.items())
def test_8b_profile_reproduces_h200_draft_steps(shape, ms):
    batch, topk = shape
    assert m.draft_step_ms(LLAMA, batch=batch, topk=topk) == pytest.approx(ms, rel=0.10)


def test_8b_attention_matches_sdpa_at_one_token():
    # SDPA column, d = 1, 1,024-token context: linear + attention
    for batch, ms in ((1, 4.86), (32, 6.10), (64, 7.21), (128, 10.71)):
        total = m.forward_ms(LLAMA, batch=batch, tokens_per_request=1) + m.attention_ms(LLAMA, batch=batch, context_tokens=batch * 1024, tree=False)
        assert total == pytest.approx(ms, rel=0.10)


def _seed_plan(steps: int) -> m.MemoryPlan:
    chunk, max_bs = m.default_graph_settings(QWEN.gpu.total_mib, 4)
    mfs = m.default_mem_fraction_static(gpu_mib=QWEN.gpu.total_mib, tp=4, chunked_prefill_size=chunk, decode_max_bs=max_bs)
    return m.size_memory(QWEN, tp=4, dp=1, mem_fraction_static=mfs, spec=m.SpecShape("EAGLE", steps, 1, steps + 1),
                         max_running_requests=48, max_total_tokens=None, chunked_prefill_size=chunk, cuda_graph_max_bs=max_bs)


@pytest.mark.parametrize("steps, tokens, running", [(1, 455_357, 26), (2, 377_207, 21), (3, 295_931, 17)])
def test_seed_kv_figures(steps, tokens, running):
    plan = _seed_plan(steps)
    assert plan.max_total_num_tokens == pytest.approx(tokens, rel=0.04)
    assert plan.max_running_requests == running


def test_default_mem_fraction_follows_sglang_formula():
    # H200 tp1: 512 + 8192*1.5 + 128 + 256*2 = 13440 MB reserved of 143771 -> 0.907
    assert m.default_mem_fraction_static(gpu_mib=143_771, tp=1, chunked_prefill_size=8192, decode_max_bs=256) == 0.907
    assert m.default_graph_settings(97_887, 4) == (8192, 512)


def test_longer_drafts_shrink_the_hybrid_kv_pool_and_request_slots():
    plans = [_seed_plan(s) for s in range(1, 7)]
    tokens = [p.max_total_num_tokens for p in plans]
    running = [p.max_running_requests for p in plans]
    assert tokens == sorted(tokens, reverse=True) and running == sorted(running, reverse=True)


def test_memory_failures_by_phase():
    spec = m.SpecShape("EAGLE", 3, 1, 4)
    kwargs = dict(tp=4, dp=1, spec=spec, max_running_requests=48, max_total_tokens=None, chunked_prefill_size=8192, cuda_graph_max_bs=512)
    with pytest.raises(m.MemoryFailure) as low:
        m.size_memory(QWEN, mem_fraction_static=0.60, **kwargs)
    assert low.value.phase == "kv" and "Loaded weights leave no GPU memory" in low.value.message
    with pytest.raises(m.MemoryFailure) as high:
        m.size_memory(QWEN, mem_fraction_static=0.96, **kwargs)
    assert high.value.phase == "graph" and "CUDA out of memory" in high.value.message
    assert m.size_memory(QWEN, mem_fraction_static=0.90, **kwargs).max_total_num_tokens > 0


def test_max_total_tokens_caps_the_pool():
    plan = m.size_memory(LLAMA, tp=1, dp=1, mem_fraction_static=0.85, spec=m.SpecShape(None, 0, 0, 0), max_running_requests=None,
                         max_total_tokens=100_000, chunked_prefill_size=8192, cuda_graph_max_bs=256)
    assert plan.max_total_num_tokens == 100_000
    assert any("larger than the profiled value" in w for w in plan.warnings) is False


def test_tree_pool_bound():
    assert m.tree_pool_size(steps=3, topk=4) == 4 + 2 * 16
    assert m.tree_pool_size(steps=1, topk=2) == 2


def test_chain_accept_length_is_the_product_sum():
    qs = m.depth_acceptance(LLAMA.acceptance, steps=3, temperature=0.0)
    mass = m.accept_length_distribution(qs, topk=1, draft_tokens=4, second_share=0.5)
    assert mass == pytest.approx([qs[0], qs[0] * qs[1], qs[0] * qs[1] * qs[2]])


def test_acceptance_falls_with_depth_and_temperature_and_rises_with_topk():
    qs = m.depth_acceptance(QWEN.acceptance, steps=4, temperature=0.0)
    assert qs == sorted(qs, reverse=True)
    chain = m.expected_accept_length(QWEN, m.SpecShape("EAGLE", 3, 1, 4), temperature=0.0)
    tree = m.expected_accept_length(QWEN, m.SpecShape("EAGLE", 3, 4, 8), temperature=0.0)
    hot = m.expected_accept_length(QWEN, m.SpecShape("EAGLE", 3, 1, 4), temperature=0.8)
    loop = m.expected_accept_length(QWEN, m.SpecShape("EAGLE", 3, 1, 4), temperature=0.0, degenerate=True)
    assert tree > chain > hot
    assert loop > chain


def test_speculation_helps_less_as_batch_grows_on_the_dense_model():
    spec = m.SpecShape("EAGLE3", 5, 4, 16)
    none = m.SpecShape(None, 0, 0, 0)
    accept = m.expected_accept_length(LLAMA, spec, temperature=0.0)
    gain = {b: accept / m.step_ms(LLAMA, spec=spec, batch=b, context_tokens=b * 1000)
               / (1 / m.step_ms(LLAMA, spec=none, batch=b, context_tokens=b * 1000)) for b in (1, 64)}
    assert gain[1] > 2 and gain[64] < 1.2


def test_landscape_marks_infeasible_and_trades_capacity_for_speed():
    w = Workload(max_tokens=128, concurrency=16)
    assert not expect(QWEN, steps=3, topk=1, draft_tokens=4, mem_fraction_static=0.60, workload=w).feasible
    short = expect(QWEN, steps=1, topk=1, draft_tokens=2, mem_fraction_static=0.86, workload=w)
    deep = expect(QWEN, steps=4, topk=1, draft_tokens=5, mem_fraction_static=0.86, workload=w)
    assert deep.single_tps > short.single_tps and deep.capacity < short.capacity
