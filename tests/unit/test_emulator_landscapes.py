"""Landscapes the search was not tuned on: the H100 128k profile whose wide trees only fit below
the chains' memory edge, and the drawn family (sglang_emulator/family.py)."""

import dataclasses
import itertools

import numpy as np
import pytest

from sglang_emulator import family as F
from sglang_emulator import landscape as L
from sglang_emulator import model as m
from sglang_emulator.profiles import PROFILES, find_profile

H100 = PROFILES["llama-3.1-8b-h100-128k"]
WORKLOAD = L.Workload(max_tokens=128, concurrency=32, request_tokens=32768, temperature=0.0)
MFS = tuple(round(0.70 + 0.01 * i, 2) for i in range(26))  # the sampler benchmark's H200_SPACE range


def _shapes():
    for steps in range(1, 9):
        yield steps, 1, steps + 1
        for topk, draft in itertools.product((2, 4, 8), (2, 4, 8, 16, 24, 32)):
            if draft - 1 <= m.tree_pool_size(steps, topk):
                yield steps, topk, draft


def _front(profile):
    points = []
    for (steps, topk, draft), mfs in itertools.product(_shapes(), MFS):
        e = L.expect(profile, steps=steps, topk=topk, draft_tokens=draft, mem_fraction_static=mfs, workload=WORKLOAD, algorithm="EAGLE3")
        if e.feasible:
            points.append(((steps, topk, draft, mfs), e.values()))
    values = np.array([v for _, v in points])
    front = [p for p, v in zip(points, values) if not np.any(np.all(values >= v, axis=1) & np.any(values > v, axis=1))]
    return front


def test_single_stream_end_is_a_wide_tree_below_the_chains_memory_edge():
    front = _front(H100)
    (steps, topk, draft, mfs), values = max(front, key=lambda p: p[1][0])
    chain_edge = min(L.mem_fraction_edge(H100, steps=s, topk=1, algorithm="EAGLE3") for s in range(1, 9))
    assert topk > 1 and draft >= 16
    # The property that made the old sampler fail: the tree starts only several points below
    # where every chain still starts (and where the capacity end sits).
    assert mfs <= chain_edge - 0.02
    tree_edge = L.mem_fraction_edge(H100, steps=steps, topk=topk, draft_tokens=draft, algorithm="EAGLE3")
    assert tree_edge <= chain_edge - 0.02
    over = L.expect(H100, steps=steps, topk=topk, draft_tokens=draft, mem_fraction_static=round(tree_edge + 0.01, 2),
                    workload=WORKLOAD, algorithm="EAGLE3")
    assert over.failure == "memory_graph"
    # The capacity end is at the top of the range, where the tree cannot start.
    (_, _, _, cap_mfs), _ = max(front, key=lambda p: (p[1][2], p[1][1]))
    assert cap_mfs > tree_edge
    # And the tree is worth finding: well ahead of the best chain alone.
    best_chain = max(
        L.expect(H100, steps=s, topk=1, draft_tokens=s + 1, mem_fraction_static=0.9, workload=WORKLOAD, algorithm="EAGLE3").single_tps
        for s in range(1, 9)
    )
    assert values[0] > 1.15 * best_chain


def test_flashinfer_tree_state_follows_the_source_sizes():
    spec = m.SpecShape("EAGLE3", 5, 8, 32)
    verify, draft = m.tree_state_gib(H100, spec, 48)
    # 48 x 32 tokens x 131,072 x (int32 + uint8); 5 steps x 48 x 8 x 131,072 x int32
    assert verify == pytest.approx(48 * 32 * 131_072 * 5 / 2**30)
    assert draft == pytest.approx(5 * 48 * 8 * 131_072 * 4 / 2**30)
    assert m.tree_state_gib(H100, m.SpecShape("EAGLE3", 5, 1, 6), 48) == (0.0, 0.0)  # chains stay on FA3
    # The calibrated H200 profile is unchanged (flag off).
    assert m.tree_state_gib(PROFILES["llama-3.1-8b-instruct"], spec, 48) == (0.0, 0.0)


def test_drawn_profiles_are_deterministic_and_within_their_ranges():
    base = PROFILES[F.FAMILY_BASE]
    seen, kinds = set(), set()
    for seed in range(30):
        p = F.draw_profile(seed)
        assert p == F.draw_profile(seed) and F.draw_overrides(seed) == F.draw_overrides(seed)
        seen.add((p.memory.kv_cell_bytes, p.acceptance.first))
        r = F.RANGES
        a = p.acceptance
        for name in ("first", "depth_decay", "second_share", "temperature_slope", "prompt_spread", "degenerate"):
            assert r[name][0] - 1e-4 <= getattr(a, name) <= r[name][1] + 1e-4, name
        assert r["context_mib"][0] <= p.gpu.context_mib <= r["context_mib"][1]
        assert r["weights_factor"][0] - 1e-3 <= p.memory.weights_gib / base.memory.weights_gib <= r["weights_factor"][1] + 1e-3
        full = p.timing.moe_full_stream_ms if p.timing.moe_experts else p.timing.stream_ms
        assert r["stream_factor"][0] - 1e-3 <= full / base.timing.stream_ms <= r["stream_factor"][1] + 1e-3
        assert r["knee_tokens"][0] <= p.timing.knee_tokens <= r["knee_tokens"][1]
        cells = {s.cell_bytes for s in F.KV_SHAPES}
        assert p.memory.kv_cell_bytes in (cells if not p.hybrid else {c // 4 for c in cells})
        assert p.context_len in F.CONTEXTS
        assert r["capture_reserve"][0] - 1e-4 <= p.memory.capture_reserve_frac <= r["capture_reserve"][1] + 1e-4
        kinds.add((p.memory.flashinfer_tree_state, bool(p.timing.moe_experts), p.hybrid))
        # Every drawn landscape can run SGLang's own default configuration.
        e = L.expect(p, steps=3, topk=1, draft_tokens=4, mem_fraction_static=0.85, workload=WORKLOAD)
        assert e.feasible, (seed, e.failure)
    assert len(seen) == 30
    # Issue #23's variety: with and without tree index buffers, dense and MoE, dense and hybrid KV.
    assert {k[0] for k in kinds} == {True, False} and {k[1] for k in kinds} == {True, False} and {k[2] for k in kinds} == {True, False}


def test_the_four_gpu_family_splits_real_models_four_ways_and_keeps_the_one_gpu_seeds():
    # The 1-GPU family's draws did not move when the four-GPU family came (its own stream, the
    # graph physics drawn by a shared helper): the figures every earlier benchmark reports.
    assert F.draw_overrides(0)["notes"][0].endswith("vocab 256000, context 32768; graphs 3.39 MiB/token "
                                                    "+ tree buffers, reserve 6.1%")
    assert F.draw_overrides(5)["notes"][0].endswith("graphs 0.75 MiB/token + tree buffers, reserve 7.1%; "
                                                    "hybrid (state 10 MiB/slot, 1.81 per draft token)")
    setups = set()
    for seed in range(24):
        p = F.draw_tp4_profile(seed)
        assert p == F.draw_tp4_profile(seed) and p.reference_tp == 4
        setup = next(s for s in F.TP4_SETUPS if p.notes[0].startswith(f"tp 4 drawn with seed {seed}: {s.model} on 4x {s.gpu}"))
        setups.add((setup.model, setup.gpu))
        # Weights are the checkpoint over four GPUs and fit the card with room for KV.
        assert p.memory.weights_gib == pytest.approx(setup.weights_gb * 1e9 / 4 / 2**30, rel=1e-3)
        assert p.memory.weights_gib < 0.8 * p.gpu.total_mib / 1024
        assert p.hybrid == setup.hybrid and bool(p.timing.moe_experts) == bool(setup.moe_experts)
        lo, hi, _ = F.TP4_RANGES["non_torch_gib"]
        assert lo - 1e-3 <= p.memory.non_torch_gib <= hi + 1e-3
        # SGLang's own configuration starts somewhere in the space the benchmark searches.
        steps, topk, draft = p.auto_spec
        assert any(L.expect(p, steps=steps, topk=topk, draft_tokens=draft, mem_fraction_static=mfs, workload=WORKLOAD,
                            algorithm="EAGLE3").feasible for mfs in MFS), seed
    assert len(setups) >= 5  # dense and MoE, hybrid, three kinds of card


def test_an_unreported_capture_reserve_fails_what_the_figures_say_fits():
    # The reserve the capture needs is in no figure: startup_available is what the graphs left.
    p = F.draw_profile(0)
    no_reserve = dataclasses.replace(p, memory=dataclasses.replace(p.memory, capture_reserve_frac=0.0))
    edge = L.mem_fraction_edge(no_reserve, steps=3, topk=1, draft_tokens=4)
    assert edge is not None and L.mem_fraction_edge(p, steps=3, topk=1, draft_tokens=4) < edge - 0.02


def test_the_live_emulator_serves_a_drawn_profile(monkeypatch):
    monkeypatch.delenv("SGLANG_EMULATOR_PROFILE", raising=False)
    monkeypatch.setenv("SGLANG_EMULATOR_LANDSCAPE_SEED", "7")
    p = find_profile("any/Model")
    assert p is not None and p.key == "drawn-7" and p.acceptance == F.draw_profile(7).acceptance


def test_the_live_emulator_serves_a_four_gpu_draw_and_names_a_bad_seed(monkeypatch):
    monkeypatch.delenv("SGLANG_EMULATOR_PROFILE", raising=False)
    monkeypatch.setenv("SGLANG_EMULATOR_LANDSCAPE_SEED", "tp4:3")
    p = find_profile("any/Model")
    assert p is not None and p.key == "drawn-tp4-3" and p.reference_tp == 4
    assert p.memory == F.draw_tp4_profile(3).memory
    monkeypatch.setenv("SGLANG_EMULATOR_LANDSCAPE_SEED", "tp8:3")
    with pytest.raises(ValueError, match="expected a seed N or tp4:N"):
        find_profile("any/Model")


def test_the_expectation_over_a_benchmarks_own_prompts_rates_deep_chains_by_those_prompts():
    # A benchmark sends a few fixed prompts, not the mix: three single-stream prompts that sit
    # +0.4 above the mix in logit(q) (the demo's, on family:2) make every shape faster, a deep
    # chain more than a wide tree, so the front those prompts measure is not the mix's.
    profile = F.draw_profile(2)
    chain, tree = dict(steps=8, topk=1, draft_tokens=9), dict(steps=4, topk=4, draft_tokens=8)

    def single(shape, workload):
        return L.expect(profile, **shape, mem_fraction_static=0.85, workload=workload, algorithm="EAGLE3").single_tps

    quantiles = dataclasses.replace(WORKLOAD, shifts=tuple(z * profile.acceptance.prompt_spread
                                                           for z in (-1.2816, -0.5244, 0.0, 0.5244, 1.2816)))
    assert single(chain, quantiles) == pytest.approx(single(chain, WORKLOAD))  # the mix, spelt out
    easy = dataclasses.replace(WORKLOAD, shifts=(-0.22, 0.19, 1.17))
    gain = {name: single(shape, easy) / single(shape, WORKLOAD) for name, shape in (("chain", chain), ("tree", tree))}
    assert gain["tree"] > 1.0 and gain["chain"] > gain["tree"] + 0.02, gain
