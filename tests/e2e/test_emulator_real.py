"""The emulator behaves as a real SGLang server on the points a tuner trips over
(docs/sglang-real-server.md): thinking models, DP ranks, accept counters, versions,
ports of a stopped server, /health, admin auth, runtime KV pressure."""

from __future__ import annotations

import json
import os
import signal
import threading
import time

import httpx
import openai
import pytest

from ..conftest import loads_while_streaming, wait_until
from tuner.server.client import ServerClient

pytestmark = pytest.mark.e2e

FAST = {"SGLANG_EMULATOR_TIME_SCALE": "0.1"}


def _long_thinker() -> str:
    """A prompt the emulated model thinks about for well over 256 tokens."""
    from sglang_emulator.engine import thinking_length
    from sglang_emulator.completions import chat_prompt

    for i in range(100):
        content = f"Question {i}: why is the sky blue?"
        if 400 < thinking_length(chat_prompt([{"role": "user", "content": content}])) < 2000:
            return content
    raise AssertionError("no long thinker")


LONG_THINKER = _long_thinker()


def _chat(url: str, **body) -> dict:
    body.setdefault("model", "x")
    return httpx.post(url + "/v1/chat/completions", json=body, timeout=60).json()


def _stream(url: str, path: str, body: dict) -> list[dict]:
    events = []
    with httpx.stream("POST", url + path, json=body, timeout=60) as res:
        for line in res.iter_lines():
            if line.startswith("data: ") and line != "data: [DONE]":
                events.append(json.loads(line[6:]))
    return events


def test_thinking_model_streams_reasoning_first_and_counts_it(start_emulator):
    emu = start_emulator("--speculative-algorithm", "NEXTN", "--reasoning-parser", "qwen3", env=FAST)
    emu.wait_healthy()
    msgs = [{"role": "user", "content": LONG_THINKER}]
    client = openai.OpenAI(base_url=emu.url + "/v1", api_key="none")
    reasoning, content, usage = [], [], None
    for chunk in client.chat.completions.create(model="x", messages=msgs, max_tokens=256, stream=True,
                                                stream_options={"include_usage": True}):
        if chunk.choices:
            delta = chunk.choices[0].delta
            reasoning.append(getattr(delta, "reasoning_content", None) or "")
            content.append(delta.content or "")
        if chunk.usage:
            usage = chunk.usage
    assert "".join(reasoning).strip() and not "".join(content)  # max_tokens used up by thinking
    assert usage.completion_tokens == 256 and usage.reasoning_tokens == 256
    assert usage.completion_tokens_details.reasoning_tokens == 256

    full = _chat(emu.url, messages=msgs, max_tokens=8000)
    message, usage = full["choices"][0]["message"], full["usage"]
    assert message["reasoning_content"] and message["content"] and "</think>" not in message["reasoning_content"]
    assert 256 < usage["reasoning_tokens"] < usage["completion_tokens"]
    assert usage["completion_tokens_details"] == {"reasoning_tokens": usage["reasoning_tokens"]}

    off = _chat(emu.url, messages=msgs, max_tokens=64, chat_template_kwargs={"enable_thinking": False})
    assert off["choices"][0]["message"]["reasoning_content"] is None and off["choices"][0]["message"]["content"]
    assert off["usage"]["reasoning_tokens"] == 0 and off["usage"]["completion_tokens_details"] is None

    inline = _chat(emu.url, messages=msgs, max_tokens=8000, separate_reasoning=False)
    assert inline["choices"][0]["message"]["reasoning_content"] is None
    assert "</think>" in inline["choices"][0]["message"]["content"]


def test_without_reasoning_parser_nothing_thinks(start_emulator):
    emu = start_emulator("--speculative-algorithm", "NEXTN", env=FAST)
    emu.wait_healthy()
    full = _chat(emu.url, messages=[{"role": "user", "content": LONG_THINKER}], max_tokens=64)
    assert full["choices"][0]["message"]["reasoning_content"] is None and full["usage"]["reasoning_tokens"] == 0


@pytest.mark.parametrize("dp_attention", [False, True])
def test_dp_ranks_report_their_own_capacity(start_emulator, dp_attention):
    flags = ["--speculative-algorithm", "NEXTN", "--dp-size", "2", "--max-running-requests", "20"] + (["--enable-dp-attention"] if dp_attention else [])
    emu = start_emulator(*flags, env=FAST)
    emu.wait_healthy()
    info = httpx.get(emu.url + "/server_info").json()
    states = info["internal_states"]
    assert len(states) == 2
    caps = [s["memory_usage"]["token_capacity"] for s in states]
    assert info["max_total_num_tokens"] == caps[0] < caps[1]  # rank 0's only, and a little short
    assert info["max_running_requests"] == 20  # the declared argument
    per_dp = [s["effective_max_running_requests_per_dp"] for s in states]
    # resolve_max_num_reqs: 20 // attn_dp_size under DP attention; a plain DP rank is a full
    # replica that gets all 20 (then capped by this hybrid model's mamba state slots).
    if dp_attention:
        assert per_dp == [10, 10]
    else:
        assert per_dp[0] == per_dp[1] and 10 < per_dp[0] <= 20
    loads = httpx.get(emu.url + "/v1/loads").json()
    assert [entry["dp_rank"] for entry in loads["loads"]] == [0, 1]
    assert loads["num_accelerators"] == (2 if dp_attention else 4)
    # Round-robin dispatch: each rank gets its own share of the batch.
    running = loads_while_streaming(emu.url, 4, lambda loads: (lambda r: r if sum(r) == 4 else None)(
        [entry["num_running_reqs"] for entry in loads["loads"]]), what="four requests running")
    assert running == [2, 2]


def test_accept_counters_lag_by_the_decode_log_interval_and_requests_carry_their_own(start_emulator):
    emu = start_emulator("--speculative-algorithm", "NEXTN", env=FAST)
    emu.wait_healthy()
    short = httpx.post(emu.url + "/generate", json={"text": "The capital of France is",
                                                    "sampling_params": {"max_new_tokens": 40, "ignore_eos": True, "temperature": 0}}).json()
    meta = short["meta_info"]
    assert meta["completion_tokens"] == 40 and meta["spec_verify_ct"] < 40
    assert meta["spec_accept_length"] == pytest.approx(40 / meta["spec_verify_ct"])
    # Fewer than 40 decode iterations: nothing folded into the rank's average yet.
    assert "avg_spec_accept_length" not in httpx.get(emu.url + "/server_info").json()["internal_states"][0]

    events = _stream(emu.url, "/generate", {"text": "Count to a hundred", "stream": True,
                                            "sampling_params": {"max_new_tokens": 60, "ignore_eos": True}})
    counts = [e["meta_info"]["completion_tokens"] for e in events]
    assert counts == sorted(counts) and counts[-1] == 60 and len(counts) < 60  # one chunk per verify step

    chat = {"model": "x", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 30, "ignore_eos": True,
            "return_spec_tokens_details": True}
    events = _stream(emu.url, "/v1/chat/completions", {**chat, "stream": True})
    sglext = [e["sglext"] for e in events if "sglext" in e]
    assert len(sglext) == 1 and events[-1].get("sglext") == sglext[0] and events[-1]["choices"] == []
    details = sglext[0]["spec_tokens_details"]
    assert set(details) == {"spec_accept_rate", "spec_accept_length", "spec_cap_length", "spec_block_accept_length",
                            "spec_num_correct_drafts", "spec_num_proposed_drafts", "spec_verify_ct",
                            "spec_correct_drafts_histogram", "spec_cap_lens_histogram"}
    assert details["spec_accept_length"] == pytest.approx(30 / details["spec_verify_ct"])
    full = _chat(emu.url, **chat)
    assert full["sglext"]["spec_tokens_details"]["spec_verify_ct"] > 0
    assert "sglext" not in _chat(emu.url, messages=chat["messages"], max_tokens=5)


def test_version_059(start_emulator):
    env = {**FAST, "SGLANG_EMULATOR_VERSION": "0.5.9"}
    emu = start_emulator("--speculative-algorithm", "NEXTN", "--cuda-graph-max-bs", "16", env=env)
    emu.wait_healthy()
    assert httpx.get(emu.url + "/server_info").json()["version"] == "0.5.9"
    loads = httpx.get(emu.url + "/v1/loads").json()
    assert "accelerator" not in loads and "num_accelerators" not in loads
    assert ServerClient(emu.url).server_info().gpu_count == 4  # --tp 4, counted from /server_info's arguments
    full = _chat(emu.url, messages=[{"role": "user", "content": "hi"}], max_tokens=20, return_spec_tokens_details=True)
    assert "sglext" not in full and "completion_tokens_details" not in full["usage"]
    bad = start_emulator("--speculative-algorithm", "NEXTN", "--speculative-adaptive", env=env)
    assert bad.wait_exit() == 2 and "unrecognized arguments: --speculative-adaptive" in bad.log()


def test_a_stopped_servers_ports_are_still_held_and_the_next_launch_fails(start_emulator):
    env = {"SGLANG_EMULATOR_TIME_SCALE": "0.1", "SGLANG_EMULATOR_LINGER_S": "200"}  # 20 s of linger
    flags = ("--speculative-algorithm", "NEXTN", "--dp-size", "2", "--enable-dp-attention")
    first = start_emulator(*flags, env=env)
    first.wait_healthy()
    os.kill(first.proc.pid, signal.SIGKILL)  # the launcher only: its child keeps the ports
    first.proc.wait(timeout=10)
    second = start_emulator(*flags, env=env, port=first.port)
    assert second.wait_exit(timeout=30) == 1  # 30 polls x 0.1 s
    log = second.log()
    dist_init = first.port + 233
    assert f"ValueError: dist_init_port at {dist_init} is not available in 30 seconds." in log, log[-2000:]
    assert "Port is already in use. dist_init_port=" in log and "Load weight begin" not in log


def test_the_port_holder_lets_go_after_the_linger(start_emulator):
    emu = start_emulator("--speculative-algorithm", "NEXTN", env={"SGLANG_EMULATOR_TIME_SCALE": "0.1", "SGLANG_EMULATOR_LINGER_S": "10"})
    emu.wait_healthy()
    group = os.getpgid(emu.proc.pid)
    os.killpg(group, signal.SIGTERM)
    emu.proc.wait(timeout=10)
    with pytest.raises(OSError):  # the lingering child took the HTTP port over
        import socket
        with socket.socket() as sock:
            sock.bind(("127.0.0.1", emu.port))
    deadline = time.monotonic() + 5
    while time.monotonic() < deadline:
        try:
            os.killpg(group, 0)
        except ProcessLookupError:
            break
        time.sleep(0.1)
    else:
        pytest.fail("the port holder outlived its linger")


def test_health_runs_a_generate_and_takes_at_least_a_second(start_emulator):
    emu = start_emulator("--speculative-algorithm", "NEXTN", env={"SGLANG_EMULATOR_TIME_SCALE": "0.5"})
    emu.wait_healthy()
    started = time.monotonic()
    assert httpx.get(emu.url + "/health", timeout=10).status_code == 200
    assert time.monotonic() - started >= 0.5  # 1 s x time scale


def test_flush_cache_is_admin_optional(start_emulator):
    emu = start_emulator("--speculative-algorithm", "NEXTN", "--api-key", "user", "--admin-api-key", "admin", env=FAST)
    emu.wait_healthy()
    assert httpx.post(emu.url + "/flush_cache", headers={"Authorization": "Bearer user"}).status_code == 401
    assert httpx.post(emu.url + "/flush_cache", headers={"Authorization": "Bearer admin"}).status_code == 200
    assert httpx.get(emu.url + "/server_info", headers={"Authorization": "Bearer user"}).status_code == 200


def test_kv_pressure_retracts_with_sglang_warning(start_emulator):
    emu = start_emulator("--max-total-tokens", "3000", "--max-running-requests", "16", model="meta-llama/Llama-3.1-8B-Instruct", env=FAST)
    emu.wait_healthy()
    body = {"text": "x", "sampling_params": {"max_new_tokens": 600, "ignore_eos": True}}
    workers = [threading.Thread(target=lambda: httpx.post(emu.url + "/generate", json=body, timeout=120)) for _ in range(12)]
    for w in workers:
        w.start()
    for w in workers:
        w.join()
    assert "KV cache pool is full. Retract requests. #retracted_reqs: " in emu.log()
    assert "#new_token_ratio: 0.3000 -> 0.5000" in emu.log()
