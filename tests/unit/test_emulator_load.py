"""The emulator's latency under load (sglang_emulator/engine.py): a prefill (cut into --chunked-prefill-size chunks, one per iteration) stalls the
decode of every running stream, as SGLang's scheduler does."""

import asyncio
import logging
import time

from sglang_emulator import model as m
from sglang_emulator.__main__ import plan_memory
from sglang_emulator.args import parse_args, resolve
from sglang_emulator.engine import Chunk, Engine, Request
from sglang_emulator.profiles import find_profile

MODEL = "meta-llama/Llama-3.1-8B-Instruct"


def _engine(*flags: str) -> Engine:
    ns = parse_args(["--model-path", MODEL, *flags])
    resolved = resolve(ns, find_profile(MODEL))
    return Engine(resolved, plan_memory(resolved), step_noise=0.0, seed=1)


async def _collect(req: Request) -> list[tuple[float, int]]:
    """(arrival time, tokens) of every chunk until the request finishes."""
    out = []
    while True:
        chunk = await req.out.get()
        assert isinstance(chunk, Chunk), chunk
        out.append((time.monotonic(), chunk.tokens))
        if chunk.finish_reason:
            return out


def _request(rid: str, prompt_tokens: int, max_new: int) -> Request:
    return Request(rid, "a plain question " + rid, prompt_tokens, max_new, temperature=0.0, ignore_eos=True)


def _run(engine: Engine, body):
    async def main():
        task = asyncio.create_task(engine.run())
        try:
            return await body()
        finally:
            task.cancel()
    return asyncio.run(main())


def test_a_long_prompt_is_prefilled_in_chunks_that_stall_the_running_stream(caplog):
    caplog.set_level(logging.INFO, logger="sglang.srt.managers.scheduler")
    engine = _engine("--chunked-prefill-size", "4096")
    chunk_ms = m.prefill_ms(engine.profile, tokens=4096, tp=1)

    async def body():
        stream = _request("s", 20, 400)
        engine.submit(stream)
        collecting = asyncio.create_task(_collect(stream))
        await asyncio.sleep(0.3)
        long = _request("l", 4 * 4096, 2)
        sent = time.monotonic()
        engine.submit(long)
        first = await _collect(long)
        return await collecting, first[0][0] - sent

    chunks, ttft = _run(engine, body)
    gaps = [b[0] - a[0] for a, b in zip(chunks, chunks[1:])]
    step = sorted(gaps)[len(gaps) // 2]
    # Four chunks, one per iteration, back to back: the stream waits through all of them.
    assert max(gaps) >= step + 0.9 * 4 * chunk_ms / 1000, (max(gaps), step, chunk_ms)
    assert ttft >= 0.9 * 4 * chunk_ms / 1000
    # The server's log shows the chunks as SGLang's does: one prefill batch of 4096 tokens each.
    prefills = [r.getMessage() for r in caplog.records if r.getMessage().startswith("Prefill batch")]
    assert sum("#new-token: 4096," in line for line in prefills) == 4, prefills
