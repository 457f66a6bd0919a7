"""The tuner against the emulator behaving as real SGLang does (docs/sglang-real-server.md):
a thinking model, two DP ranks, folded accept counters, an older SGLang, held ports."""

from __future__ import annotations

import optuna
import pytest

from tuner.config import parse_config
from tuner.measure.runner import measure
from tuner.measure.workload import load_workload
from tuner.results import record
from tuner.server.client import ServerClient

from ..conftest import run_cli, write_config

pytestmark = pytest.mark.e2e

BENCH = 'max_tokens = 48\nsingle_requests = 2\nsingle_min_passes = 1\nsingle_max_passes = 1\nconcurrency = 4\nconcurrent_requests = 8\nwarmup_requests = 1\n'


def _bench(**extra):
    text = '[study]\nname = "b"\n[server]\ncommand = "x --speculative-algorithm NEXTN"\n[bench]\n' + BENCH + "".join(f"{k} = {v}\n" for k, v in extra.items())
    return parse_config(text).bench


def test_a_thinking_model_is_timed_from_its_first_thought(start_emulator):
    emu = start_emulator("--speculative-algorithm", "NEXTN", "--speculative-num-steps", "2", "--speculative-eagle-topk", "1",
                         "--speculative-num-draft-tokens", "3", "--reasoning-parser", "qwen3",
                         env={"SGLANG_EMULATOR_TIME_SCALE": "0.5", "SGLANG_EMULATOR_SEED": "3"})
    emu.wait_healthy()
    client = ServerClient(emu.url)
    workload = load_workload("builtin")
    # 48 tokens are all thinking for these prompts: timing only delta.content would see nothing.
    served = measure(url=emu.url, bench=_bench(), info=client.server_info(), workload=workload, client=client)
    off = measure(url=emu.url, bench=_bench(thinking='"off"'), info=client.server_info(), workload=workload, client=client)
    assert served.thinking_tokens and served.thinking_tokens >= served.completion_tokens * 0.5
    assert off.thinking_tokens is None
    # Decode speed does not depend on whether the tokens are thoughts: both within 20%.
    assert served.single_tps == pytest.approx(off.single_tps, rel=0.2)
    assert served.ttft_ms < 2000


def test_accept_length_is_exact_per_request_not_the_servers_folded_counter(start_emulator):
    emu = start_emulator("--speculative-algorithm", "NEXTN", "--speculative-num-steps", "3", "--speculative-eagle-topk", "1",
                         "--speculative-num-draft-tokens", "4", env={"SGLANG_EMULATOR_TIME_SCALE": "0.5"})
    emu.wait_healthy()
    client = ServerClient(emu.url)
    m = measure(url=emu.url, bench=_bench(), info=client.server_info(), workload=load_workload("builtin"), client=client)
    assert m.accept_length_source == "sglext"
    assert 1.5 < m.accept_length < 4.0  # 3 steps: between one and four tokens per verify step
    # spec_correct_drafts_histogram of every measured request, summed: verify steps by drafts
    # accepted (0..3 for 3 steps), consistent with the accept length it came with.
    hist = m.accept_histogram
    assert hist is not None and len(hist) <= 4
    assert 1 + sum(k * n for k, n in enumerate(hist)) / sum(hist) == pytest.approx(m.accept_length, rel=0.02)


def test_on_sglang_0_5_9_accept_length_comes_from_generate(start_emulator):
    emu = start_emulator("--speculative-algorithm", "NEXTN", "--speculative-num-steps", "3", "--speculative-eagle-topk", "1",
                         "--speculative-num-draft-tokens", "4", env={"SGLANG_EMULATOR_TIME_SCALE": "0.5", "SGLANG_EMULATOR_VERSION": "0.5.9"})
    emu.wait_healthy()
    client = ServerClient(emu.url)
    info = client.server_info()
    assert info.version == "0.5.9" and info.accelerator is None
    # 0.5.9's memory_usage: one graph figure, no startup_available; recorded as {"all": GiB}.
    usage = info.args["internal_states"][0]["memory_usage"]
    assert isinstance(usage["graph"], float) and "startup_available" not in usage
    assert record.memory_usage(info.args)["graph"] == {"all": usage["graph"]}
    m = measure(url=emu.url, bench=_bench(), info=info, workload=load_workload("builtin"), client=client)
    assert m.accept_length_source == "generate" and 1.5 < m.accept_length < 4.0
    # 0.5.9 names the per-request histogram spec_accept_histogram (from /generate's meta_info).
    assert m.accept_histogram is not None and len(m.accept_histogram) <= 4 and sum(m.accept_histogram) > 10
    # Every class of the mix gets its own accept length from the same fallback, not None.
    assert len(m.by_class) >= 2 and all(1.0 < f.accept_length < 4.0 for f in m.by_class.values()), m.by_class


@pytest.mark.parametrize("dp_attention", ["", " --enable-dp-attention"], ids=["dp", "dp-attention"])
def test_a_study_on_a_thinking_model_with_two_dp_ranks(tmp_path, dp_attention):
    config = write_config(tmp_path, command_flags="--speculative-algorithm NEXTN --reasoning-parser qwen3 --dp-size 2" + dp_attention,
                          model="Qwen/Qwen3.5-122B-A10B --tp 4",
                          space="speculative_num_steps = { choices = [1, 2] }\nmem_fraction_static = { choices = [0.88] }")
    result = run_cli("--trials", "2", "--config", str(config), "--seed", "0")
    assert result.returncode == 0, result.stderr
    study = optuna.load_study(study_name="t", storage=f"sqlite:///{tmp_path / 't.db'}")
    done = [t for t in study.trials if t.state == optuna.trial.TrialState.COMPLETE]
    assert len(done) == 2, [(t.state, t.user_attrs.get("fail_reason")) for t in study.trials]
    for t in done:
        ranks = t.user_attrs["dp_ranks"]
        assert len(ranks) == 2 and ranks[0]["max_total_num_tokens"] != ranks[1]["max_total_num_tokens"]
        capacity = sum(min(r["max_running_requests"], r["max_total_num_tokens"] // 8192) for r in ranks)
        assert t.values[2] == capacity
        assert t.user_attrs["max_total_num_tokens"] == sum(r["max_total_num_tokens"] for r in ranks)
        assert t.user_attrs["thinking_tokens"] > 0 and t.user_attrs["accept_length_source"] == "sglext"
        assert t.user_attrs["attention_backend"] and t.user_attrs["sglang_version"] == "0.5.23"


def test_the_adaptive_baseline_on_sglang_0_5_9_is_not_available_not_an_error(tmp_path):
    config = write_config(tmp_path, study="baselines = true",
                          env='SGLANG_EMULATOR_LOAD_SCALE = "0.005", SGLANG_EMULATOR_TIME_SCALE = "0.25", SGLANG_EMULATOR_VERSION = "0.5.9"',
                          space="speculative_num_steps = { choices = [2] }\nmem_fraction_static = { choices = [0.88] }")
    result = run_cli("--trials", "1", "--config", str(config))
    assert result.returncode == 0, result.stderr
    base = optuna.load_study(study_name="t@baselines", storage=f"sqlite:///{tmp_path / 't.db'}")
    arms = {t.user_attrs["baseline"]: t for t in base.trials}
    assert arms["no_speculation"].state == optuna.trial.TrialState.COMPLETE
    assert "--speculative" not in arms["no_speculation"].user_attrs["launch_command"]
    assert arms["adaptive"].state == optuna.trial.TrialState.FAIL
    assert arms["adaptive"].user_attrs["fail_reason"].startswith("not available on this SGLang")
