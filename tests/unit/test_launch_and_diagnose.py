"""The launch command and the classification of SGLang's failures."""

import pytest

from tuner.config import parse_config
from tuner.server.diagnose import classify, early_failure
from tuner.server.launch import launch_spec
from tuner.sglang_args import Params

CFG = parse_config('[study]\nname = "s"\n[server]\ncommand = "python3 -m sglang.launch_server --model-path m --speculative-num-steps 1 --mem-fraction-static=0.7 --port 30000"\nenv = { HF_TOKEN = "hf_secretvalue", CUDA_VISIBLE_DEVICES = "0,1" }\n')


def test_searched_flags_are_replaced_and_secrets_redacted():
    spec = launch_spec(CFG.server, Params(3, 2, 5, 0.88), api_key="topsecret")
    assert spec.argv.count("--speculative-num-steps") == 1 and "--mem-fraction-static=0.7" not in spec.argv
    assert "--speculative-num-steps 3 --speculative-eagle-topk 2 --speculative-num-draft-tokens 5 --mem-fraction-static 0.88" in spec.launch_command
    assert "topsecret" not in spec.launch_command and spec.launch_command.endswith("--api-key <redacted>")
    assert spec.env == {"HF_TOKEN": "hf_secretvalue", "CUDA_VISIBLE_DEVICES": "0,1"}
    assert "hf_secretvalue" in spec.secrets


SGLANG_LOGS = {
    "kv": ("[2026-01-01 00:00:00 TP0] Scheduler hit an exception: Traceback (most recent call last):\n"
           "RuntimeError: Not enough memory. Please try to increase --mem-fraction-static. Current value: mem_fraction_static=0.7\n"
           "[2026-01-01 00:00:00] Received sigquit from a child process. It usually means the child failed.\n", -9, "memory_kv", False),
    "weights": ("ValueError: Loaded weights leave no GPU memory for the KV cache under --mem-fraction-static=0.6. Raise ...", -9, "memory_kv", False),
    "graph": ("Exception: Capture cuda graph failed: CUDA out of memory. Tried to allocate 2.00 GiB.\nPossible solutions:\n1. set --mem-fraction-static to a smaller value", -9, "memory_graph", False),
    "tree": ("Exception: Capture cuda graph failed: selected index k out of range\nPossible solutions:", -9, "invalid", False),
    "ambiguous": ("usage: sglang serve [-h] ...\nsglang serve: error: ambiguous option: --cuda-graph-max-bs could match --cuda-graph-max-bs-decode, --cuda-graph-max-bs-prefill", 2, "fatal", True),
    "unrecognized": ("usage: sglang serve [-h]\nsglang serve: error: unrecognized arguments: --speculative-ngram-max-match-window-size 12", 2, "fatal", True),
    "model": ("OSError: foo/bar is not a local folder and is not a valid model identifier listed on 'https://huggingface.co/models'", 1, "fatal", True),
    "assert": ("Traceback (most recent call last):\n  File \"x\", line 1\nAssertionError", 1, "invalid", False),
    "port": ("[2026-01-01] ERROR:    [Errno 98] error while attempting to bind on address ('127.0.0.1', 30000): address already in use", 1, "fatal", True),
    "no_python_module": ("/usr/bin/python3: Error while finding module specification for 'sglang.launch_server' (ModuleNotFoundError: No module named 'sglang')", 1, "fatal", True),
    # `python -m sglang_emulator` run by a Python without it (the venv's not first on PATH)
    "no_top_module": ("/root/.pyenv/versions/3.11.7/bin/python: No module named sglang_emulator", 1, "fatal", True),
    "mamba_interval": ('Traceback (most recent call last):\n  File "mamba_hook.py", line 132, in validate_mamba_extra_buffer\n'
                       "    assert view.mamba_track_interval >= view.speculative_num_draft_tokens\nAssertionError", 1, "invalid", False),
    # A hybrid's server_args line names mamba_track_interval and speculative_num_draft_tokens: no rule of its own
    "hybrid_crash": ("server_args=ServerArgs(mamba_track_interval=256, speculative_num_draft_tokens=4, linear_attn_backend='triton')\n"
                     "Scheduler hit an exception: Traceback (most recent call last):\n"
                     "torch.distributed.DistBackendError: NCCL error in: ProcessGroupNCCL.cpp:1970, unhandled system error", 1, "exit", False),
    "crash": ("Traceback (most recent call last):\nRuntimeError: NCCL error: unhandled system error", 1, "exit", False),
}


@pytest.mark.parametrize("case", SGLANG_LOGS)
def test_classify_sglang_failures(case):
    log, code, kind, fatal = SGLANG_LOGS[case]
    failure = classify(log, code, params="mem_fraction_static=0.7")
    assert (failure.kind, failure.fatal) == (kind, fatal), failure
    assert "\n" not in failure.reason


def test_memory_beats_incidental_warnings():
    log = "WARNING: No module named 'vllm'; some kernels disabled\n" + SGLANG_LOGS["graph"][0]
    assert classify(log, -9).kind == "memory_graph"


def test_terminal_lines_are_seen_before_exit():
    assert early_failure("... Received sigquit from a child process. It usually means the child failed.")
    assert not early_failure("[x] Load weight begin. avail mem=95.01 GB")
