"""The emulator's argument resolution and failure wordings follow real SGLang (0.5.23 / 0.5.9)."""

from __future__ import annotations

import pytest

from sglang_emulator import failures
from sglang_emulator import model as m
from sglang_emulator.__main__ import plan_memory, rank_plan
from sglang_emulator.args import parse_args, resolve
from sglang_emulator.engine import thinking_length
from sglang_emulator.profiles import find_profile

QWEN = ["--model-path", "Qwen/Qwen3.5-122B-A10B", "--tp", "4"]
LLAMA = ["--model-path", "meta-llama/Llama-3.1-8B-Instruct"]


def _resolve(*argv: str):
    ns = parse_args(list(argv))
    return resolve(ns, find_profile(ns.model_path))


def test_topk_above_one_moves_hopper_from_fa3_to_flashinfer(caplog):
    caplog.set_level("INFO")
    assert _resolve(*LLAMA).attention_backend == "fa3"
    assert _resolve(*LLAMA, "--speculative-algorithm", "EAGLE3", "--speculative-num-steps", "3",
                    "--speculative-eagle-topk", "1", "--speculative-num-draft-tokens", "4").attention_backend == "fa3"
    tree = _resolve(*LLAMA, "--speculative-algorithm", "EAGLE3")  # auto (5, 4, 8) for LlamaForCausalLM
    assert (tree.spec.steps, tree.spec.topk, tree.spec.draft_tokens) == (5, 4, 8)
    assert tree.attention_backend == "flashinfer" and tree.as_dict()["attention_backend"] == "flashinfer"
    assert "Attention backend not specified. Use flashinfer backend by default." in caplog.text
    assert _resolve(*QWEN).attention_backend == "flashinfer"  # SM120 is not Hopper


def test_ngram_dflash_dspark_force_their_shape(caplog):
    ngram = _resolve(*LLAMA, "--speculative-algorithm", "NGRAM", "--speculative-eagle-topk", "2")
    assert ngram.spec.topk == 10  # --speculative-ngram-max-bfs-breadth default
    dflash = _resolve(*LLAMA, "--speculative-algorithm", "DFLASH", "--speculative-draft-model-path", "z-lab/x",
                      "--speculative-num-steps", "4", "--speculative-eagle-topk", "2")
    assert (dflash.spec.steps, dflash.spec.topk, dflash.spec.draft_tokens) == (1, 1, 16)
    assert "DFLASH only supports speculative_num_steps == 1; overriding speculative_num_steps=4 to 1." in caplog.text
    dspark = _resolve(*LLAMA, "--speculative-algorithm", "DSPARK")
    assert (dspark.spec.steps, dspark.spec.topk) == (1, 1)
    with pytest.raises(ValueError, match="DFLASH speculative decoding requires setting --speculative-draft-model-path."):
        _resolve(*LLAMA, "--speculative-algorithm", "DFLASH")


def test_config_yaml_merges_and_the_command_line_wins(tmp_path):
    cfg = tmp_path / "c.yaml"
    cfg.write_text("mem-fraction-static: 0.8\nmax-running-requests: 12\nenable-dp-attention: true\nspeculative-algorithm: NEXTN\n")
    r = _resolve(*QWEN, "--config", str(cfg), "--mem-fraction-static", "0.85")
    assert r.mem_fraction_static == 0.85 and r.max_running_requests == 12 and r.raw["enable_dp_attention"]
    assert r.spec.algorithm == "EAGLE"
    with pytest.raises(ValueError, match="Config file must be YAML format, got: .json"):
        _resolve(*QWEN, "--config", str(tmp_path / "c.json"))


def test_059_flag_table_and_wordings(monkeypatch, capsys):
    monkeypatch.setenv("SGLANG_EMULATOR_VERSION", "0.5.9")
    r = _resolve(*QWEN, "--cuda-graph-max-bs", "16", "--speculative-algorithm", "NEXTN")
    assert r.version == "0.5.9" and r.cuda_graph_max_bs == 16 and r.tp == 4
    assert "speculative_adaptive" not in r.as_dict()
    with pytest.raises(SystemExit) as exit_info:
        parse_args([*QWEN, "--speculative-adaptive"])
    assert exit_info.value.code == 2 and "unrecognized arguments: --speculative-adaptive" in capsys.readouterr().err
    with pytest.raises(ValueError, match="only supported for the 'flashinfer' backend"):
        _resolve(*LLAMA, "--speculative-algorithm", "EAGLE3", "--speculative-num-steps", "3", "--speculative-eagle-topk", "2",
                 "--speculative-num-draft-tokens", "6", "--page-size", "16", "--attention-backend", "triton")
    monkeypatch.setenv("SGLANG_ENABLE_SPEC_V2", "1")
    with pytest.raises(ValueError, match="Spec v2 currently only supports topk = 1 for speculative decoding."):
        _resolve(*LLAMA, "--speculative-algorithm", "EAGLE3", "--speculative-num-steps", "3", "--speculative-eagle-topk", "2",
                 "--speculative-num-draft-tokens", "6")


def test_dp_attention_splits_a_global_max_running_requests_and_ranks_differ():
    plain = _resolve(*QWEN, "--dp-size", "2", "--max-running-requests", "20")
    split = _resolve(*QWEN, "--dp-size", "2", "--enable-dp-attention", "--max-running-requests", "20")
    assert plan_memory(plain).max_running_requests == 20
    plan = plan_memory(split)
    assert plan.max_running_requests == 10  # resolve_max_num_reqs: // attn_dp_size
    r0, r1 = rank_plan(plan, 0, 2), rank_plan(plan, 1, 2)
    assert r0.max_total_num_tokens < r1.max_total_num_tokens < plan.max_total_num_tokens * 1.001
    assert r0.max_total_num_tokens > 0.95 * r1.max_total_num_tokens


def _graph_failure(free: float, **graphs: float) -> m.MemoryFailure:
    return m.MemoryFailure("graph", "CUDA out of memory. Tried to allocate 1.00 GiB.", graphs=graphs, free_gib=free)


@pytest.mark.parametrize(
    "free, tp, expected",
    [
        (-1.0, 4, "Capture cuda graph failed: NCCL error in: "),
        (-0.1, 4, "Capture cuda graph failed: CUDA error: out of memory\n"),
        (0.5, 1, "Capture cuda graph failed: CUDA out of memory. Tried to allocate"),
        (1.1, 1, "Capture cuda graph failed: CUDA error: CUBLAS_STATUS_ALLOC_FAILED when calling `cublasCreate(handle)`"),
        (1.25, 1, "Capture cuda graph failed: CUDA error: cudaErrorMemoryAllocation: out of memory"),
    ],
)
def test_graph_oom_wording_follows_the_runner_that_runs_out_first(free, tp, expected):
    failure = _graph_failure(free, target_verify=1.0, draft_decode=0.2, draft_extend=0.1)
    oom = failures.graph_oom(failure, tp=tp, version="0.5.23", gpu_gib=96)
    assert oom.message.startswith(expected), oom.message
    assert "Possible solutions:\n1. set --mem-fraction-static" in oom.message


def test_graph_oom_wording_can_be_forced(monkeypatch):
    failure = _graph_failure(0.5, target_verify=1.0)
    monkeypatch.setenv("SGLANG_EMULATOR_OOM_WORDING", "prefill")
    assert failures.graph_oom(failure, tp=1, version="0.5.23", gpu_gib=96).message.startswith(
        "Capture prefill CUDA graph failed: CUDA out of memory.")
    monkeypatch.setenv("SGLANG_EMULATOR_OOM_WORDING", "frozen_kv_mtp")
    assert failures.graph_oom(failure, tp=1, version="0.5.23", gpu_gib=96).message.startswith(
        "Capture frozen-KV MTP cuda graph failed: ")
    monkeypatch.setenv("SGLANG_EMULATOR_OOM_WORDING", "torch_oom")
    assert "2. set --cuda-graph-max-bs to a smaller value" in failures.graph_oom(failure, tp=1, version="0.5.9", gpu_gib=96).message


def test_thinking_length_is_deterministic_and_often_exceeds_256():
    prompts = [f"Question number {i}: why is the sky blue?" for i in range(40)]
    lengths = [thinking_length(p) for p in prompts]
    assert lengths == [thinking_length(p) for p in prompts]
    assert sum(n > 256 for n in lengths) >= 30 and all(100 < n < 6001 for n in lengths)


def test_derived_ports_follow_port_args():
    ports = dict(failures.derived_ports(30000, None))
    assert ports["dist_init_port"] == 30233 and ports["port_base"] == 30234 and ports["scheduler_input_port"] == 30238
