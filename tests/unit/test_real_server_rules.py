"""What a real SGLang server says, read right (docs/sglang-real-server.md rows 2, 10, 13, 16)."""

import pytest

from tuner.config import parse_config
from tuner.errors import ConfigError
from tuner.server.diagnose import classify, runtime_memory_failure

GRAPH_OOMS = [
    "Exception: Capture cuda graph failed: CUDA error: out of memory\nCUDA kernel errors might be asynchronously reported",
    "Exception: Capture cuda graph failed: CUBLAS_STATUS_ALLOC_FAILED when calling `cublasCreate(handle)`",
    "Exception: Capture cuda graph failed: cudaErrorMemoryAllocation: out of memory",
    "RuntimeError: Capture prefill CUDA graph failed: CUDA out of memory. Tried to allocate 1.00 GiB",
    "RuntimeError: Capture frozen-KV MTP cuda graph failed: CUDA error: out of memory",
    "Exception: Capture cuda graph failed: NCCL error in: ... ncclUnhandledCudaError: Call to CUDA function failed.\n"
    "NCCL WARN Cuda failure 2 'out of memory'",
    "Exception: Capture cuda graph failed: NCCL error in: /pytorch/torch/csrc/distributed/c10d/NCCLUtils.cpp:77, unhandled cuda "
    "error\nncclUnhandledCudaError: Call to CUDA function failed.\nLast error:\nCuda failure 2 'out of memory'",
]


@pytest.mark.parametrize("log", GRAPH_OOMS)
def test_every_graph_oom_wording_is_a_memory_failure(log):
    failure = classify(log, -9, params="mem_fraction_static=0.95")
    assert failure.kind == "memory_graph" and failure.prunes, failure


def test_kv_pressure_under_load_is_not_a_gpu_oom():
    for line in ("KV cache pool is full. Retract requests. #retracted_reqs: 3",
                 "RuntimeError: Prefill out of memory. Try to lower your batch size.",
                 "Decode out of memory happened. #retracted_reqs: 1",
                 "alloc_req_slots runs out of memory"):
        assert not runtime_memory_failure(line), line
    assert runtime_memory_failure("torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 2.00 GiB")
    assert runtime_memory_failure("RuntimeError: CUDA error: out of memory")


def test_a_port_still_held_is_neither_memory_nor_invalid():
    failure = classify("ValueError: dist_init_port at 30233 is not available in 30 seconds. dist_init_port at 30233 is not available", 1)
    assert failure.kind == "port_busy" and not failure.prunes and not failure.fatal


def test_0_5_9_wordings_are_invalid_parameters():
    assert classify("ValueError: speculative_eagle_topk > 1 with page_size > 1 is only supported for the 'flashinfer' backend.", 1).kind == "invalid"
    assert classify("ValueError: Spec v2 currently only supports topk = 1 for speculative decoding.", 1).kind == "invalid"


@pytest.mark.parametrize("algorithm", ["NGRAM", "DFLASH", "DSPARK"])
def test_algorithms_that_override_the_shape_are_refused_up_front(algorithm):
    text = f'[study]\nname = "s"\n[server]\ncommand = "python -m sglang.launch_server --model-path m --speculative-algo {algorithm}"\n' \
           '[space]\nspeculative_num_steps = { low = 1, high = 3 }\n'
    with pytest.raises(ConfigError, match=f"--speculative-algorithm {algorithm} is outside the search"):
        parse_config(text)
