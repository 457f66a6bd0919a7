"""Request classes without a server: the workload's classes, mix and sources, the per-class
objectives and record, the emulator's context physics."""

from __future__ import annotations

import json
from dataclasses import replace
import math
from collections import Counter
from types import SimpleNamespace

import pytest

from sglang_emulator import model as m
from sglang_emulator.profiles import PROFILES
from tuner.config import parse_config
from tuner.errors import ConfigError, MeasureError
from tuner.measure.by_class import auto_request_tokens, class_figures
from tuner.measure.objectives import check_classes, load_objectives
from tuner.measure.result import RequestResult
from tuner.measure.workload import Prompt, Workload, bench_workload, estimate_tokens, load_workload

HEAD = '[study]\nname = "x"\n[server]\ncommand = "python -m sglang_emulator --model-path m --speculative-algorithm EAGLE3"\n[bench]\n'


def _bench(text: str):
    return parse_config(HEAD + text).bench


def _prompts(**counts: int) -> list[Prompt]:
    return [Prompt(({"role": "user", "content": f"{c} prompt {i}"},), c, f"{c}-{i}") for c, n in counts.items() for i in range(n)]


def test_the_builtin_set_has_every_class_and_long_context_is_about_16k_tokens():
    w = load_workload("builtin")
    assert set(w.classes) == {"chat", "code", "maths", "summarisation", "long_context"}
    long = [len(p.text.split()) for p in w.by_class["long_context"]]
    tokens = sorted(estimate_tokens(p.text) for p in w.by_class["long_context"])
    assert 12_000 <= tokens[len(tokens) // 2] <= 20_000 and min(long) > 3000


def test_the_single_stream_pass_never_leaves_a_class_of_the_mix_unmeasured():
    w = Workload(_prompts(chat=50, code=30, long_context=2), mix={"chat": 0.98, "long_context": 0.01, "code": 0.01})
    for n in (1, 2, 4, 16):
        classes = Counter(p.request_class for p in w.single_pass(n))
        assert set(classes) == {"chat", "code", "long_context"}, n
    # interleaved: the first requests of a pass already touch every class
    assert {p.request_class for p in w.single_pass(16)[:3]} == {"chat", "code", "long_context"}


def test_the_concurrent_phase_draws_in_the_mix_and_a_class_without_share_is_not_sent():
    w = Workload(_prompts(chat=40, long_context=10, code=10), mix={"chat": 0.6, "long_context": 0.4})
    drawn = Counter(p.request_class for p in w.for_phase("concurrent", 50))
    assert drawn == {"chat": 30, "long_context": 20}
    assert w.classes == ["chat", "long_context"]
    default = Workload(_prompts(chat=30, code=10))  # default: as the file has them
    assert default.mix == {"chat": 0.75, "code": 0.25}


def test_a_mix_naming_an_unknown_class_is_one_line_naming_the_fix():
    with pytest.raises(ConfigError) as err:
        Workload(_prompts(chat=3, code=3), mix={"chat": 0.5, "retrieval": 0.5})
    assert str(err.value) == "[bench] mix: no prompt of builtin is in class 'retrieval'; its classes are chat, code"
    with pytest.raises(ConfigError, match=r"\[bench\] mix: shares must be numbers >= 0"):
        _bench("mix = { chat = -1 }")


def test_context_buckets_split_classes_by_prompt_length():
    short = Prompt(({"role": "user", "content": "word " * 100},), "chat")
    long = Prompt(({"role": "user", "content": "word " * 5000},), "chat")
    huge = Prompt(({"role": "user", "content": "word " * 40000},), "chat")
    w = Workload([short, long, huge], context_buckets=[2048, 8192, 32768])
    assert sorted(w.classes) == ["chat/2k", "chat/32k+", "chat/8k"]
    with pytest.raises(ConfigError, match="context_buckets: must be increasing"):
        _bench("context_buckets = [8192, 2048]")


def test_a_request_log_gives_messages_max_tokens_and_metadata_category(tmp_path):
    log = tmp_path / "requests.jsonl"
    lines = [{"model": "m", "messages": [{"role": "user", "content": [{"type": "text", "text": "hi there"}]}], "max_tokens": 64,
              "metadata": {"category": "support"}},
             {"model": "m", "messages": [{"role": "user", "content": "long " * 50}], "max_completion_tokens": 300}]
    log.write_text("\n".join(json.dumps(x) for x in lines) + "\n")
    w = load_workload(log)
    by_id = sorted(w.prompts, key=lambda p: p.category)
    assert [(p.category, p.max_tokens, p.text[:8]) for p in by_id] == [("support", 64, "hi there"), ("user", 300, "long lon")]
    log.write_text(json.dumps(lines[0]) + "\n{not json\n")
    with pytest.raises(ConfigError) as err:
        load_workload(log, base_dir=tmp_path)
    assert str(err.value).startswith(f"[bench] prompts: {log} line 2: not valid JSON")
    log.write_text(json.dumps({"messages": [{"role": "user", "content": "x"}], "max_tokens": "many"}) + "\n")
    with pytest.raises(ConfigError, match=r"^\[bench\] prompts: .* line 1: \"max_tokens\" must be an integer >= 2"):
        load_workload(log)


def test_synthetic_lengths_follow_bench_serving_random():
    bench = _bench("prompts = { input_len = 1000, output_len = 100, range_ratio = 0.5, num_prompts = 200, category = \"rag\" }")
    w = bench_workload(bench)
    inputs = [len(p.text.split()) for p in w.prompts]
    outputs = [p.max_tokens for p in w.prompts]
    # common.py · compute_random_lens: uniform in [max(int(len x ratio), 1), len]
    assert min(inputs) >= 500 and max(inputs) <= 1000 and 700 < sum(inputs) / len(inputs) < 800
    assert min(outputs) >= 50 and max(outputs) <= 100
    assert w.classes == ["rag"]
    with pytest.raises(ConfigError, match=r"\[bench\] prompts: synthetic input_len: Input should be greater than or equal to 1"):
        _bench("prompts = { input_len = 0, output_len = 10 }")


def test_request_tokens_defaults_to_auto_and_explicit_integers_keep_working():
    assert _bench("").request_tokens == "auto"
    assert _bench("request_tokens = 4096").request_tokens == 4096
    with pytest.raises(ConfigError, match='request_tokens: must be a positive integer or "auto"'):
        _bench('request_tokens = "lots"')


def _result(cls: str, prompt: int, tokens: int, verify: int, start: float) -> RequestResult:
    return RequestResult(prompt_tokens=prompt, completion_tokens=tokens, start=start, first_token=start + 0.1, end=start + 1.1,
                         spec_verify_ct=verify, request_class=cls, max_tokens=128)


def test_class_figures_and_the_auto_footprint_come_from_the_measured_requests():
    single = [_result("chat", 50, 101, 40, 0.0), _result("long_context", 16000, 101, 80, 2.0)]
    figures = class_figures({"chat": 0.6, "long_context": 0.4}, single, {"chat": [100.0, 102.0], "long_context": [90.0, 91.0]},
                            [], {}, speculative=True)
    assert figures["chat"].accept_length == pytest.approx(101 / 40) and figures["long_context"].accept_length == pytest.approx(101 / 80)
    assert figures["chat"].single_tps == pytest.approx(101.0) and figures["long_context"].prompt_tokens_median == 16000
    assert figures["long_context"].single_s == pytest.approx(1.1)
    # mean over requests in the mix's proportions of prompt tokens + max_tokens
    assert auto_request_tokens(figures) == math.ceil(0.6 * (50 + 128) + 0.4 * (16000 + 128))


def test_the_auto_footprint_is_the_same_however_many_passes_repeated_the_prompts():
    # The no-speculation baseline of a study ran two single-stream passes, its trials five: weighting
    # by sends gave them 11,662 and 11,981 tokens a request for the same workload.
    def sent(passes: int) -> list[RequestResult]:
        single = [replace(_result(c, n, 101, 40, 0.0), prompt_key=k) for _ in range(passes)
                  for c, n, k in (("chat", 300, 1), ("rag", 30000, 2))]
        concurrent = [replace(_result(c, n, 101, 40, 0.0), prompt_key=k)
                      for c, n, k in (("chat", 200, 3), ("rag", 15000, 4), ("chat", 300, 1), ("rag", 20000, 5))]
        return single + concurrent
    footprints = set()
    for passes in (1, 2, 5):
        results = sent(passes)
        figures = class_figures({"chat": 0.5, "rag": 0.5}, results, {}, [], {}, speculative=True)
        footprints.add(auto_request_tokens(figures))
    assert footprints == {math.ceil(0.5 * (250 + 128) + 0.5 * (65000 / 3 + 128))}


def test_per_class_objectives_are_accepted_and_checked_against_the_workload():
    objectives = load_objectives(["single_tps:long_context", "accept_length:chat", "capacity"], [16])
    assert [o.request_class for o in objectives] == ["long_context", "chat", None]
    check_classes(objectives, ["chat", "long_context"])
    with pytest.raises(ConfigError, match=r"'single_tps:long_context' names request class 'long_context', which the workload does not measure; its classes are chat"):
        check_classes(objectives, ["chat"])
    with pytest.raises(ConfigError, match="':<class>' goes with"):
        load_objectives(["capacity:chat"], [16])


def _level(level: int, classes: list[str], seconds: float = 6.0) -> list[RequestResult]:
    """`level` streams in flight for `seconds`, each request a second long, classes in turn."""
    out, n = [], 0
    for slot in range(level):
        t = 0.0
        while t < seconds:
            out.append(RequestResult(prompt_tokens=100, completion_tokens=101, start=t, first_token=t + 0.01, end=t + 1.0,
                                     request_class=classes[n % len(classes)], max_tokens=101))
            n, t = n + 1, t + 1.0
    return out


def test_each_class_has_its_figure_at_every_concurrency_level_and_an_objective_names_one():
    levels = {2: _level(2, ["chat", "code"]), 8: _level(8, ["chat"])}
    figures = class_figures({"chat": 0.5, "code": 0.5}, [], {}, [r for rs in levels.values() for r in rs], levels, speculative=False)
    assert set(figures["chat"].concurrent_tps_by_level) == {2, 8} and figures["chat"].concurrent_tps == figures["chat"].concurrent_tps_by_level[2]
    assert figures["chat"].concurrent_tps_by_level[8] > 2 * figures["chat"].concurrent_tps_by_level[2]  # more streams of it
    assert set(figures["code"].concurrent_tps_by_level) == {2}  # none of it was sent at 8: no figure, not a zero
    (objective,) = load_objectives(["concurrent_tps@8:chat"], [2, 8])
    assert (objective.level, objective.request_class) == (8, "chat")
    measured = SimpleNamespace(by_class=figures)
    assert objective(measured) == pytest.approx(figures["chat"].concurrent_tps_by_level[8])
    with pytest.raises(MeasureError, match="no concurrent figure for request class 'code' at concurrency 8"):
        load_objectives(["concurrent_tps@8:code"], [2, 8])[0](measured)
    with pytest.raises(ConfigError, match="names a level that"):
        load_objectives(["concurrent_tps@4:chat"], [2, 8])
    with pytest.raises(ConfigError, match="only concurrent_tps takes"):
        load_objectives(["single_tps@2:chat"], [2, 8])


def test_emulator_acceptance_falls_with_context_and_differs_by_category():
    acc = PROFILES["qwen3.5-122b-a10b"].acceptance
    spec = m.SpecShape("NEXTN", 3, 1, 4)
    q = PROFILES["qwen3.5-122b-a10b"]
    by_ctx = [m.expected_accept_length(q, spec, temperature=0.0, prompt_shift=m.context_shift(acc, n)) for n in (500, 4096, 16384, 131072)]
    assert by_ctx == sorted(by_ctx, reverse=True) and by_ctx[0] / by_ctx[-1] > 1.3
    # position-1 acceptance over 1k -> 128k tokens, shaped like vLLM #47602 (93.5% -> 72.1%)
    q1 = [m.depth_acceptance(acc, steps=1, temperature=0.0, prompt_shift=m.context_shift(acc, n))[0] for n in (1024, 131072)]
    assert q1[0] == pytest.approx(0.90) and 0.6 < q1[1] < 0.75
    shifts = {c: m.category_shift(acc, m.prompt_category(text)) for c, text in
              (("code", "Write a Python function that sorts a list"), ("maths", "Solve for x: 3x + 4 = 19"), ("chat", "Hello, how are you today?"))}
    assert shifts["code"] > shifts["maths"] > shifts["chat"] == 0.0  # SPEED-Bench's order


def test_emulator_attention_grows_with_the_kv_held_and_the_verify_path_costs_more():
    llama = PROFILES["llama-3.1-8b-instruct"]
    one = m.attention_ms(llama, batch=16, context_tokens=16 * 32768, tree=False)
    verify = m.attention_ms(llama, batch=16, context_tokens=16 * 32768, tree=False, query_tokens=4)
    assert one == pytest.approx(15.38, rel=0.15)  # docs/h200-forward-times.md: B = 16, d = 1 over 32k tokens
    assert verify > one * 1.3
    spec = m.SpecShape("EAGLE3", 4, 2, 8)
    short = m.step_ms(llama, spec=spec, batch=1, context_tokens=1000)
    long = m.step_ms(llama, spec=spec, batch=1, context_tokens=64000)
    draft = m.draft_attention_ms(llama, context_tokens=64000, topk=2)
    assert draft == pytest.approx(2 * m.draft_attention_ms(llama, context_tokens=64000, topk=1))
    assert long - short > 4 * draft  # the draft's own attention, per step and branch, is in the step


def _trial_with_classes(figures: dict[str, float]):
    import optuna
    from optuna.trial import TrialState

    by_class = {c: {"requests": 4, "single_tps": v, "single_tps_ci95": [v * 0.98, v * 1.02], "accept_length": 2.0, "share": 0.5}
                for c, v in figures.items()}
    return optuna.trial.create_trial(state=TrialState.COMPLETE, values=[max(figures.values())], user_attrs={"by_class": by_class},
                                     params={}, distributions={})


def test_the_report_plots_each_class_and_the_speed_up_over_no_speculation_per_class():
    from tuner.results.report.plots import class_plot

    fast_on_chat = _trial_with_classes({"chat": 240.0, "long_context": 90.0})
    base = _trial_with_classes({"chat": 120.0, "long_context": 110.0})
    plot = class_plot([fast_on_chat], {"no_speculation": base})
    assert plot is not None and plot.name == "classes" and plot.png[:8] == b"\x89PNG\r\n\x1a\n"
    assert "below the red line" in plot.caption  # the speed-up panel, drawn because no speculation was measured
    alone = class_plot([fast_on_chat], {})
    assert alone is not None and "below the red line" not in alone.caption  # no baseline: the rates only
    assert class_plot([_trial_with_classes({"user": 200.0})], {}) is None  # one class: the front plot shows it
