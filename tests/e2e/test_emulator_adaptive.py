"""--speculative-adaptive on a running emulator: a config file, load at two levels, SGLang's
switch lines, /server_info, and the silent fallback to static."""

from __future__ import annotations

import json

import httpx
import pytest

from ..conftest import loads_while_streaming

pytestmark = pytest.mark.e2e

LLAMA = "meta-llama/Llama-3.1-8B-Instruct"
FAST = {"SGLANG_EMULATOR_TIME_SCALE": "0.2"}


def _generate(url: str, tokens: int) -> dict:
    body = {"text": "Explain how a hash map works.", "sampling_params": {"max_new_tokens": tokens, "ignore_eos": True, "temperature": 0}}
    return httpx.post(url + "/generate", json=body, timeout=120).json()


def test_config_file_steps_follow_the_batch_size_with_sglangs_log_lines(start_emulator, tmp_path):
    config = tmp_path / "adaptive.json"
    config.write_text(json.dumps({
        "warmup_batches": 0, "update_interval": 1, "ema_alpha": 0.5,
        "1": {"candidate_steps": [1, 3]},  # climbs from 1 to 3 on its EMA
        "4": {"candidate_steps": [0]},  # speculation off from 4 running requests
    }))
    emu = start_emulator("--speculative-algorithm", "EAGLE3", "--speculative-draft-model-path", "yuhuili/EAGLE3-LLaMA3.1-Instruct-8B",
                         "--speculative-adaptive", "--speculative-adaptive-config", str(config), model=LLAMA, env=FAST)
    emu.wait_healthy()
    info = httpx.get(emu.url + "/server_info").json()
    assert info["speculative_adaptive"] is True
    # Middle of the candidate union [0, 1, 3]; topk 1, draft = steps + 1.
    assert (info["speculative_num_steps"], info["speculative_eagle_topk"], info["speculative_num_draft_tokens"]) == (1, 1, 2)

    single = _generate(emu.url, 200)  # level 1: one request
    # Six requests at once (streams that cannot finish: threads posting short requests ran one after
    # another on a loaded machine, and no switch to 0 steps came), until the switch is logged.
    switch = "Switch adaptive runtime state: steps 3 -> 0, draft_tokens 4 -> 1"
    loads_while_streaming(emu.url, 6, lambda _: switch in emu.log(), timeout=180, what="the switch to 0 steps at six requests")
    for _ in range(5):  # back to one request, once the server has dropped the closed streams
        _generate(emu.url, 100)
        if "Switch adaptive runtime state: steps 0 -> 3" in emu.log():
            break

    log = emu.log()
    assert "AdaptiveSpeculativeParams initialized: steps=1, candidate_steps=[1, 3]" in log
    assert "Built adaptive runtime state steps=0: elapsed=" in log and "Built adaptive runtime state steps=3: elapsed=" in log
    assert "Adaptive spec params updated: steps 1 -> 3 (ema_accept_len=" in log
    assert "Switch adaptive runtime state: steps 1 -> 3, draft_tokens 2 -> 4" in log
    assert "Switch adaptive runtime state: steps 3 -> 0, draft_tokens 4 -> 1" in log
    assert "Switch adaptive runtime state: steps 0 -> 3, draft_tokens 1 -> 4" in log
    # Alone, the request ran mostly with 3 steps: well over one token per verify.
    assert single["meta_info"]["spec_verify_ct"] < 200 / 1.8


def test_topk_above_one_falls_back_to_static(start_emulator):
    emu = start_emulator("--speculative-algorithm", "EAGLE3", "--speculative-draft-model-path", "yuhuili/EAGLE3-LLaMA3.1-Instruct-8B",
                         "--speculative-adaptive", "--speculative-num-steps", "3", "--speculative-eagle-topk", "4",
                         "--speculative-num-draft-tokens", "8", model=LLAMA, env=FAST)
    emu.wait_healthy()
    info = httpx.get(emu.url + "/server_info").json()
    assert info["speculative_adaptive"] is False
    assert (info["speculative_num_steps"], info["speculative_eagle_topk"], info["speculative_num_draft_tokens"]) == (3, 4, 8)
    assert ("speculative_adaptive disabled: speculative_eagle_topk=4 (only topk=1 is supported). "
            "Falling back to static speculative params.") in emu.log()
    assert "Switch adaptive runtime state" not in emu.log()


def test_a_bad_config_file_fails_resolution_like_sglang(start_emulator, tmp_path):
    config = tmp_path / "adaptive.json"
    config.write_text(json.dumps({"1": {"candidate_steps": [1, -3]}}))
    emu = start_emulator("--speculative-algorithm", "EAGLE3", "--speculative-draft-model-path", "d",
                         "--speculative-adaptive", "--speculative-adaptive-config", str(config), model=LLAMA, env=FAST)
    assert emu.wait_exit() == 1
    log = emu.log()
    assert "Traceback (most recent call last)" in log
    assert "ValueError: BS 1: candidate_steps must be a list of non-negative ints, got [1, -3]" in log
