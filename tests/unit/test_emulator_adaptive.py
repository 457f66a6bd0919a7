"""Adaptive speculative decoding as 0.5.23 runs it (sglang_emulator/adaptive.py) and the pure
batch-level helpers built on it (sglang_emulator/landscape.py)."""

import json
import logging

import pytest

from sglang_emulator import adaptive as A
from sglang_emulator import landscape as L
from sglang_emulator import model as m
from sglang_emulator.args import parse_args, resolve
from sglang_emulator.profiles import PROFILES

LLAMA = PROFILES["llama-3.1-8b-instruct"]
SPEC_GRAPH_BS = m.capture_batch_sizes(48, True)


def _resolve(*flags):
    return resolve(parse_args(["--model-path", "meta-llama/Llama-3.1-8B-Instruct", *flags]), LLAMA)


# --- loading and merging ------------------------------------------------------------------------


def test_default_table_is_sglangs():
    t = A.load_adaptive_config(None)
    assert t.keys == (1, 8, 32, 64)
    assert [s.candidate_steps for _, s in t.slots] == [(1, 3, 5, 7), (0, 1, 3), (0, 1), (0,)]
    # The slot "1" sets down_hysteresis -0.25, the others 0.0; unset knobs take the class defaults.
    assert [s.down_hysteresis for _, s in t.slots] == [-0.25, 0.0, 0.0, 0.0]
    assert all((s.ema_alpha, s.update_interval, s.warmup_batches) == (0.2, 5, 10) for _, s in t.slots)
    assert t.candidate_steps == (0, 1, 3, 5, 7) and t.max_draft_tokens == 8


def test_top_level_knobs_merge_into_every_slot_and_the_entry_wins(tmp_path):
    path = tmp_path / "adaptive.json"
    path.write_text(json.dumps({
        "ema_alpha": 0.5, "warmup_batches": 2, "update_interval": 1, "down_hysteresis": -0.1,
        "strategy": "throughput_aware",  # not a 0.5.23 key: skipped like any non-digit key
        "4": {"candidate_steps": [3, 1, 3]},
        "1": {"candidate_steps": [2, 4], "ema_alpha": 0.9},
    }))
    t = A.load_adaptive_config(str(path))
    assert t.keys == (1, 4)  # sorted by batch size
    one, four = dict(t.slots)[1], dict(t.slots)[4]
    assert one.ema_alpha == 0.9 and four.ema_alpha == 0.5  # entry over top level
    assert four.candidate_steps == (1, 3)  # sorted(set(...))
    assert (four.warmup_batches, four.update_interval, four.down_hysteresis, four.up_hysteresis) == (2, 1, -0.1, 0.0)
    # A config file replaces SGLang's defaults; it is not merged with them.
    assert t.candidate_steps == (1, 2, 3, 4)


@pytest.mark.parametrize("cfg, message", [
    ({"1": {"candidate_steps": []}}, "BS 1: candidate_steps must be a list of non-negative ints, got []"),
    ({"8": {"candidate_steps": [1, -1]}}, "BS 8: candidate_steps must be a list of non-negative ints, got [1, -1]"),
    ({"8": {"candidate_steps": "1,3"}}, "BS 8: candidate_steps must be a list of non-negative ints, got '1,3'"),
    ({"8": {}}, "BS 8: candidate_steps must be a list of non-negative ints, got None"),
    ({"ema_alpha": 0.3}, 'speculative_adaptive_config must contain at least one integer-string BS key, e.g. '
                         '{"1": {"candidate_steps": [1,3,7]}}. Got keys: [\'ema_alpha\']'),
])
def test_validation_errors_are_sglangs(cfg, message):
    with pytest.raises(ValueError) as err:
        A.load_adaptive_config(cfg)
    assert str(err.value) == message


def test_routing_pads_to_the_graph_size_then_takes_the_nearest_lower_key():
    t = A.load_adaptive_config(None)
    # Spec capture sizes: 1..8, 10..32 step 2, 40..64 step 4.  7 -> 7 -> "1"; 31 -> 32 -> "32".
    graph_bs = m.capture_batch_sizes(64, True)
    assert [t.slot_key(b, graph_bs) for b in (1, 7, 8, 9, 31, 33, 63, 64, 500)] == [1, 1, 8, 8, 32, 32, 64, 64, 64]
    # Past the largest captured size the batch is not padded: with graphs up to 48, 63 -> "32".
    assert t.slot_key(63, SPEC_GRAPH_BS) == 32
    assert t.slot_key(31) == 8  # without graphs the batch itself routes
    custom = A.table_from_steps({4: 3, 16: 1})
    assert custom.slot_key(1) == 4  # below every key: the smallest key


# --- resolution and fallbacks -------------------------------------------------------------------


def test_resolution_takes_the_middle_of_the_union_and_forces_a_chain(tmp_path):
    r = _resolve("--speculative-algorithm", "EAGLE3", "--speculative-adaptive")
    assert r.adaptive and (r.spec.steps, r.spec.topk, r.spec.draft_tokens) == (3, 1, 4)
    assert r.as_dict()["speculative_adaptive"] is True
    path = tmp_path / "a.json"
    path.write_text(json.dumps({"1": {"candidate_steps": [2, 4, 6]}, "16": {"candidate_steps": [0, 2]}}))
    r = _resolve("--speculative-algorithm", "EAGLE3", "--speculative-adaptive", "--speculative-adaptive-config", str(path))
    assert (r.spec.steps, r.spec.draft_tokens, r.adaptive_max_steps) == (4, 5, 6)  # union [0, 2, 4, 6]
    with pytest.raises(ValueError, match=r"--speculative-num-steps=3 is not in the adaptive config candidate_steps \[0, 2, 4, 6\]. Pass one of those values."):
        _resolve("--speculative-algorithm", "EAGLE3", "--speculative-adaptive", "--speculative-adaptive-config", str(path),
                 "--speculative-num-steps", "3")


@pytest.mark.parametrize("flags, reason", [
    (("--speculative-eagle-topk", "4", "--speculative-num-steps", "3", "--speculative-num-draft-tokens", "8"),
     "speculative_eagle_topk=4 (only topk=1 is supported)"),
    (("--enable-dp-attention", "--dp-size", "2", "--tp-size", "2", *("--speculative-num-steps", "3", "--speculative-eagle-topk", "1")),
     "attention DP is not supported (adaptive tier decisions are not synchronized across DP ranks)"),
    (("--enable-two-batch-overlap", "--speculative-num-steps", "3", "--speculative-eagle-topk", "1"),
     "enable_two_batch_overlap=True is not supported (adaptive state swap would discard the TboAttnBackend wrapper)"),
])
def test_unsupported_settings_fall_back_to_static_with_sglangs_warning(flags, reason, caplog, tmp_path):
    bad = tmp_path / "bad.json"
    bad.write_text("{}")  # never read: the fallback happens before the config is loaded
    with caplog.at_level(logging.WARNING, logger="sglang.srt.arg_groups.speculative_hook"):
        r = _resolve("--speculative-algorithm", "EAGLE3", "--speculative-adaptive", "--speculative-adaptive-config", str(bad), *flags)
    assert not r.adaptive and r.as_dict()["speculative_adaptive"] is False
    assert f"speculative_adaptive disabled: {reason}. Falling back to static speculative params." in caplog.text


def test_ngram_falls_back_too():
    r = _resolve("--speculative-algorithm", "NGRAM", "--speculative-adaptive")
    assert not r.adaptive
    assert "speculative_adaptive disabled: speculative_algorithm=NGRAM (only EAGLE/EAGLE3 are supported). " \
           "Falling back to static speculative params." in r.warnings


def test_standalone_falls_back_too():
    r = _resolve("--speculative-algorithm", "STANDALONE", "--speculative-draft-model-path", "d", "--speculative-adaptive")
    assert not r.adaptive
    assert "speculative_adaptive disabled: speculative_algorithm=STANDALONE (only EAGLE/EAGLE3 are supported). " \
           "Falling back to static speculative params." in r.warnings


# --- the EMA policy -----------------------------------------------------------------------------


def _slot(cands, initial, **knobs):
    return A.AdaptiveStepSlot(initial, A.SlotConfig(candidate_steps=tuple(cands), **knobs))


def test_slot_waits_for_warmup_then_updates_every_interval():
    s = _slot([1, 3, 5, 7], 3)
    assert s.ema_accept_len == 2.0  # current steps - 1
    changed = [s.update([3, 3]) for _ in range(20)]
    # Warm-up 10 batches, then every 5th: batch 15 is the first decision.
    assert changed.index(True) == 14 and s.current_steps == 5
    # EMA after 20 batches of 3 from 2.0 with alpha 0.2
    assert s.ema_accept_len == pytest.approx(3 - 0.8 ** 20)


def test_thresholds_and_hysteresis():
    # Down from 3 to 1 needs ema <= 1 - 0.5 + down_hysteresis; the slot "1" default is -0.25.
    s = _slot([1, 3, 5], 3, warmup_batches=0, update_interval=1, ema_alpha=1.0)
    assert not s.update([0.3])  # 0.3 > 0.25: stays (hysteresis)
    assert s.update([0.2]) and s.current_steps == 1
    # Up from 1 needs ema > 1 - 0.5 + up_hysteresis; it climbs several candidates at once.
    assert s.update([4.6]) and s.current_steps == 5
    # To 0: ema <= 0.5 + down_hysteresis, and from 0 it always probes the next candidate.
    z = _slot([0, 1, 3], 1, warmup_batches=0, update_interval=1, ema_alpha=1.0, down_hysteresis=0.0)
    assert z.update([0, 0]) and z.current_steps == 0
    assert z.update([0, 0]) and z.current_steps == 1  # the probe; the EMA was not touched at 0
    assert z.update([0, 0]) and z.current_steps == 0


def test_ceiling_only_caps_downward_moves():
    s = _slot([1, 3, 5, 7], 7, warmup_batches=0, update_interval=1, ema_alpha=1.0, ceiling_coeff=1.5)
    # ema 5.6 keeps 7 by thresholds (> 6.5? no -> drop to 5 needs <= 4.25; so target 7 stays),
    # but the ceiling ceil(5.6 * 1.5) = 9 >= 7: no cap.
    assert not s.update([5.6])
    # ema 4.4: thresholds keep 7 (drop needs <= 4.25); the ceiling ceil(6.6) = 7 does not bind.
    assert not s.update([4.4])
    s2 = _slot([1, 3, 5, 7], 7, warmup_batches=0, update_interval=1, ema_alpha=1.0, ceiling_coeff=1.0)
    # ema 4.4, ceiling 5 < 7 and 7 <= old steps: capped to 5.
    assert s2.update([4.4]) and s2.current_steps == 5


def test_params_route_by_batch_and_log_sglangs_lines(caplog):
    table = A.load_adaptive_config({"1": {"candidate_steps": [1, 3], "warmup_batches": 0, "update_interval": 1,
                                          "ema_alpha": 1.0},
                                    "8": {"candidate_steps": [0]}})
    with caplog.at_level(logging.INFO, logger="sglang.srt.speculative"):
        p = A.AdaptiveSpeculativeParams(3, table, SPEC_GRAPH_BS)
        assert p.activate_step_by_batch(4) == 3
        assert p.activate_step_by_batch(12) == 0  # slot "8" pins 0
        assert p.activate_step_by_batch(2) == 3
        assert p.on_verify_complete([0, 0], 2) == 1
    text = caplog.text
    assert "AdaptiveSpeculativeParams initialized: steps=3, candidate_steps=[1, 3]" in text
    assert "Switch adaptive runtime state: steps 3 -> 0, draft_tokens 4 -> 1" in text
    assert "Switch adaptive runtime state: steps 0 -> 3, draft_tokens 1 -> 4" in text
    assert "Adaptive spec params updated: steps 3 -> 1 (ema_accept_len=0.00)" in text
    assert "Switch adaptive runtime state: steps 3 -> 1, draft_tokens 4 -> 2" in text


# --- memory -------------------------------------------------------------------------------------


def test_graph_states_follow_the_pruned_capture_sizes():
    t = A.load_adaptive_config(None)
    states = dict(A.graph_states(t, 3, SPEC_GRAPH_BS))
    # start-up state over every size; 7 and 5 only below 8; 1 below 64; 0 from 8 up.
    assert states == {3: 48, 0: 48, 1: 48, 5: 7, 7: 7}


def test_adaptive_memory_adds_every_states_graphs():
    static = L.expect(LLAMA, steps=3, topk=1, draft_tokens=4, mem_fraction_static=0.9)
    plan = L.adaptive_memory(LLAMA, A.load_adaptive_config(None), mem_fraction_static=0.9)
    assert plan.max_total_num_tokens == static.max_total_num_tokens  # the KV cell does not change
    assert sum(plan.graph_gib.values()) > sum(m.graph_memory_gib(LLAMA, m.SpecShape("EAGLE", 3, 1, 4), 48).values())


# --- batch levels and the oracle ----------------------------------------------------------------


def test_a_pinned_table_matches_the_static_level_it_pins():
    w = L.Workload(concurrency=16)
    for b in (1, 8, 32):
        pinned = L.adaptive_level(LLAMA, A.table_from_steps({1: 2}), batch=b, workload=w)
        static = L.static_level(LLAMA, batch=b, steps=2, workload=w)
        assert pinned.steps == ((2, 1.0),)
        assert pinned.tokens_per_s == pytest.approx(static.tokens_per_s)


def test_oracle_table_gives_the_best_static_speed_at_every_level_and_beats_sglangs_default():
    w = L.Workload(concurrency=16)
    best = L.best_steps_by_batch(LLAMA, workload=w)
    # Speculation pays less as the batch grows (the dense model's knee), never more.
    assert best[1] >= best[48] and best[1] >= 3
    tuned, default = L.oracle_table(LLAMA, workload=w), A.load_adaptive_config(None)
    worse_somewhere = False
    for b in L.DEFAULT_LEVELS:
        top = max(L.static_level(LLAMA, batch=b, steps=s, workload=w).tokens_per_s for s in L.ORACLE_STEPS)
        assert L.adaptive_level(LLAMA, tuned, batch=b, workload=w).tokens_per_s == pytest.approx(top)
        d = L.adaptive_level(LLAMA, default, batch=b, workload=w).tokens_per_s
        assert d <= top * (1 + 1e-9)
        worse_somewhere |= d < 0.97 * top
    assert worse_somewhere


QWEN = PROFILES["qwen3.5-122b-a10b"]


def test_at_one_stream_sglangs_default_slot_moves_between_3_and_5_as_the_live_server_does():
    # The live engine feeds SGLang's EMA each request's accepted drafts (engine.py · _decode):
    # at one stream that EMA is noisy enough to cross 2.5 and climb from 3 to 5, where the
    # down-hysteresis keeps it (the live emulator logs "steps 3 -> 5" on chat and code).  Fed
    # the mean (2.16 accepted drafts at steps 3 on chat), the replay stayed at 3 for ever.
    default = A.load_adaptive_config(None)
    for category in ("chat", "code"):
        w = L.Workload(max_tokens=64, prompt_tokens=40, concurrency=1, category=category)
        shares = dict(L.adaptive_level(QWEN, default, batch=1, workload=w).steps)
        assert shares.get(5, 0) > 0.1 and shares.get(3, 0) > 0.05, (category, shares)
    code = L.Workload(max_tokens=64, prompt_tokens=40, concurrency=1, category="code")
    assert dict(L.adaptive_level(QWEN, default, batch=1, workload=code).steps)[5] > 0.5
    # From 8 running requests the default's slot is "8": [0, 1, 3]: steps 3, whatever the EMA.
    assert L.adaptive_level(QWEN, default, batch=8, workload=code).steps == ((3, 1.0),)


def test_a_workloads_category_and_context_shift_its_acceptance_as_the_engine_does():
    chat = L.static_level(QWEN, batch=1, steps=3, workload=L.Workload(category="chat"))
    code = L.static_level(QWEN, batch=1, steps=3, workload=L.Workload(category="code"))
    creative = L.static_level(QWEN, batch=1, steps=3, workload=L.Workload(category="creative"))
    long = L.static_level(QWEN, batch=1, steps=3, workload=L.Workload(category="chat", prompt_tokens=16_384))
    assert creative.accept_length < chat.accept_length < code.accept_length
    assert long.accept_length < chat.accept_length  # context_decay per doubling past 1,024 tokens
    spec = m.SpecShape("EAGLE", 3, 1, 4)
    shift = m.category_shift(QWEN.acceptance, "code")
    spread = QWEN.acceptance.prompt_spread
    mean = sum(m.expected_accept_length(QWEN, spec, temperature=0.0, prompt_shift=shift + z * spread)
               for z in (-1.2816, -0.5244, 0.0, 0.5244, 1.2816)) / 5
    assert code.accept_length == pytest.approx(mean)


def test_steps_zero_is_a_verify_of_one_token_plus_the_draft_extend():
    zero = m.SpecShape("EAGLE", 0, 1, 1)
    plain = m.SpecShape(None, 0, 0, 0)
    assert L.static_level(LLAMA, batch=8, steps=0).accept_length == 1.0
    extend = m.step_ms(LLAMA, spec=zero, batch=8, context_tokens=4000) - m.step_ms(LLAMA, spec=plain, batch=8, context_tokens=4000)
    assert extend == pytest.approx(m.draft_step_ms(LLAMA, batch=8, topk=1))
