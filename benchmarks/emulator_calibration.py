"""The emulator's calibration table for the seed's profile, next to the seed's figures.

    python benchmarks/emulator_calibration.py           # the model (instant)
    python benchmarks/emulator_calibration.py --live    # also measure steps 1-3 on real emulator processes (~2 min)

Rows: steps 1..6 x topk 1..4 (draft tokens = steps + 1 for topk 1, else the widest tree the
tuner's default space allows, min(steps * topk + 1, 16)), at the default mem_fraction_static.
Columns: accept length and single-request decode tok/s under greedy + ignore_eos (the seed's
benchmark: past a prompt's natural end the text loops), then with natural text at T=0 and
T=0.8, and the KV figures.  A second table checks the dense 8B profile's forward times
against the H200 measurements.
"""

from __future__ import annotations

import argparse
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

from rich.console import Console
from rich.table import Table

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from sglang_emulator import model as m  # noqa: E402
from sglang_emulator.profiles import PROFILES  # noqa: E402

SEED = {1: (123, 455_357, 26), 2: (186, 377_207, 21), 3: (234, 295_931, 17)}
H200 = {(1, 1): 4.60, (1, 16): 4.83, (8, 8): 5.06, (32, 4): 6.59, (32, 16): 14.03, (64, 8): 14.35, (128, 8): 26.35, (128, 16): 52.34}


def model_table(console: Console) -> None:
    q = PROFILES["qwen3.5-122b-a10b"]
    chunk, max_bs = m.default_graph_settings(q.gpu.total_mib, 4)
    mfs = m.default_mem_fraction_static(gpu_mib=q.gpu.total_mib, tp=4, chunked_prefill_size=chunk, decode_max_bs=max_bs)
    table = Table(title=f"Qwen3.5-122B-A10B MTP, tp 4 on RTX PRO 6000, mem_fraction_static={mfs} (model)")
    for col in ("steps", "topk", "draft", "accept (loop)", "tok/s (loop)", "seed tok/s", "accept T=0", "tok/s T=0", "tok/s T=0.8",
                "max_total_num_tokens", "seed", "max_running_requests", "seed "):
        table.add_column(col, justify="right")
    for steps in range(1, 7):
        for topk in range(1, 5):
            draft = steps + 1 if topk == 1 else min(steps * topk + 1, 16)
            spec = m.SpecShape("EAGLE", steps, topk, draft)
            try:
                plan = m.size_memory(q, tp=4, dp=1, mem_fraction_static=mfs, spec=spec, max_running_requests=48,
                                     max_total_tokens=None, chunked_prefill_size=chunk, cuda_graph_max_bs=max_bs)
                tokens, running = f"{plan.max_total_num_tokens:,}", str(plan.max_running_requests)
            except m.MemoryFailure as failure:
                tokens, running = f"fails ({failure.phase})", "-"
            step = m.step_ms(q, spec=spec, batch=1, context_tokens=1500)
            loop = m.expected_accept_length(q, spec, temperature=0.0, degenerate=True)
            natural = m.expected_accept_length(q, spec, temperature=0.0)
            hot = m.expected_accept_length(q, spec, temperature=0.8)
            seed = SEED.get(steps) if topk == 1 else None
            table.add_row(
                str(steps), str(topk), str(draft), f"{loop:.2f}", f"{loop / step * 1000:.0f}", str(seed[0]) if seed else "",
                f"{natural:.2f}", f"{natural / step * 1000:.0f}", f"{hot / step * 1000:.0f}",
                tokens, f"{seed[1]:,}" if seed else "", running, str(seed[2]) if seed else "",
            )
    console.print(table)
    llama = PROFILES["llama-3.1-8b-instruct"]
    check = Table(title="Llama-3.1-8B shape on one H200: target forward (linear layers) vs the measurement")
    for col in ("B", "d", "measured ms", "emulator ms", "error"):
        check.add_column(col, justify="right")
    for (b, d), ms in H200.items():
        got = m.forward_ms(llama, batch=b, tokens_per_request=d)
        check.add_row(str(b), str(d), f"{ms:.2f}", f"{got:.2f}", f"{(got - ms) / ms:+.1%}")
    console.print(check)


def live_table(console: Console) -> None:
    """Measure steps 1..3 (topk 1) on real emulator processes: greedy, ignore_eos, 1,024 tokens."""
    import httpx
    import openai

    table = Table(title="Measured on the emulator (real processes, real time): greedy + ignore_eos, 1,024 tokens")
    for col in ("steps", "tok/s", "seed tok/s", "max_total_num_tokens", "seed", "max_running_requests", "seed "):
        table.add_column(col, justify="right")
    for steps, (seed_tps, seed_tokens, seed_running) in SEED.items():
        port = 31000 + steps
        argv = [sys.executable, "-m", "sglang_emulator", "--model-path", "Qwen/Qwen3.5-122B-A10B", "--tp", "4", "--port", str(port),
                "--speculative-algorithm", "NEXTN", "--speculative-num-steps", str(steps), "--speculative-eagle-topk", "1",
                "--speculative-num-draft-tokens", str(steps + 1)]
        proc = subprocess.Popen(argv, env={**os.environ, "SGLANG_EMULATOR_LOAD_SCALE": "0.005"}, stdout=subprocess.DEVNULL,
                                stderr=subprocess.DEVNULL, start_new_session=True)
        url = f"http://127.0.0.1:{port}"
        try:
            for _ in range(300):
                try:
                    if httpx.get(url + "/health_generate", timeout=5).status_code == 200:
                        break
                except httpx.HTTPError:
                    pass
                time.sleep(0.1)
            info = httpx.get(url + "/server_info").json()
            client = openai.OpenAI(base_url=url + "/v1", api_key="none")
            rates = []
            for prompt in ("Tell me about the history of Rome.", "Explain photosynthesis to a child.", "Why is the sky blue?"):
                first = last = usage = None
                for chunk in client.chat.completions.create(model="x", messages=[{"role": "user", "content": prompt}], max_tokens=1024,
                                                            temperature=0, stream=True, stream_options={"include_usage": True},
                                                            extra_body={"ignore_eos": True}):
                    if chunk.choices and chunk.choices[0].delta.content:
                        last = time.monotonic()
                        first = first or last
                    if chunk.usage:
                        usage = chunk.usage
                rates.append((usage.completion_tokens - 1) / (last - first))
            table.add_row(str(steps), f"{sum(rates) / len(rates):.0f}", str(seed_tps), f"{info['max_total_num_tokens']:,}", f"{seed_tokens:,}",
                          str(info["internal_states"][0]["effective_max_running_requests_per_dp"]), str(seed_running))
        finally:
            os.killpg(proc.pid, signal.SIGTERM)
            proc.wait()
    console.print(table)
    console.print("The first ~200 tokens of each answer are natural text, so measured figures sit a few percent under the loop-only model.")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--live", action="store_true", help="also measure steps 1..3 on emulator processes")
    args = parser.parse_args()
    console = Console(width=200)
    model_table(console)
    if args.live:
        live_table(console)


if __name__ == "__main__":
    main()
