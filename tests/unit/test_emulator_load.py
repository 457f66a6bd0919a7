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


def test_the_first_chunk_is_the_time_to_first_token_even_when_the_engine_ran_ahead():
    """A loaded event loop reads a request's first chunk after the engine decoded further: the
    TTFT histogram must still get its sample (a fresh-clone suite beside a CPU hog scraped
    /metrics after a whole request and found no time_to_first_token bucket)."""
    import asyncio

    from prometheus_client import CollectorRegistry

    from sglang_emulator.completions import _collect
    from sglang_emulator.engine import Chunk, Request
    from sglang_emulator.metrics import Latency

    class RanAhead:
        _wake = None

        def submit(self, req):  # both steps decoded before the handler reads the first chunk
            req.out.put_nowait(Chunk(3, "a b c"))
            req.out.put_nowait(Chunk(2, " d e", finish_reason="length"))
            req.generated, req.finish_reason = 5, "length"

    class State:
        def pick_engine(self):
            return RanAhead()

    registry = CollectorRegistry()
    latency = Latency(registry, "m")

    async def run():
        return await _collect(State(), Request(rid="r", prompt="p", prompt_tokens=1, max_new_tokens=5), latency)

    text, finish, _ = asyncio.run(run())
    assert (text, finish) == ("a b c d e", "length")
    assert registry.get_sample_value("sglang:time_to_first_token_seconds_count", {"model_name": "m", "engine_type": "unified"}) == 1
    assert registry.get_sample_value("sglang:inter_token_latency_seconds_count", {"model_name": "m", "engine_type": "unified"}) == 2
