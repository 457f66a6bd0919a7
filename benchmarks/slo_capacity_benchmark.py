"""slo_capacity's search against an exhaustive sweep of the same live emulator.

For each configuration: every load 1..cap measured as the search measures a new load (a closed
loop of load + max(rounds x load, 20) requests, the ramp-up not judged), the capacity read off
that curve smoothed to be monotone; then the search itself (`tuner/measure/load_sweep.py`, from
a trial's own single-stream and concurrent phases) `--repeats` times on the same server.  Prints
a Markdown table: exhaustive capacity, the search's answers, whether each lies within the
precision, the new loads and seconds each took.

    python benchmarks/slo_capacity_benchmark.py [--p95-itl-ms 15] [--repeats 3] [--out FILE]
"""

from __future__ import annotations

import argparse
import asyncio
import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import httpx

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from tuner.config import SloConfig, parse_config  # noqa: E402
from tuner.measure import load_sweep  # noqa: E402
from tuner.measure.phases import closed_loop  # noqa: E402
from tuner.measure.runner import measure  # noqa: E402
from tuner.measure.wire import StreamClient  # noqa: E402
from tuner.measure.workload import load_workload  # noqa: E402
from tuner.server.client import ServerClient  # noqa: E402

CONFIGS = [  # (steps, topk, draft, running cap)
    (1, 1, 2, 24),
    (3, 1, 4, 24),
    (6, 1, 7, 15),
    (3, 4, 8, 20),
]
BENCH = ('[study]\nname = "s"\n[server]\ncommand = "x --speculative-algorithm NEXTN"\n[bench]\nmax_tokens = 64\n'
         "single_requests = 3\nsingle_max_passes = 2\nconcurrency = 8\nconcurrent_requests = 24\nwarmup_requests = 1\n")


def _port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _start(steps, topk, draft, cap) -> tuple[subprocess.Popen, str]:
    port = _port()
    argv = [sys.executable, "-m", "sglang_emulator", "--model-path", "Qwen/Qwen3.5-122B-A10B", "--tp", "4", "--host", "127.0.0.1",
            "--port", str(port), "--speculative-algorithm", "NEXTN", "--speculative-num-steps", str(steps), "--speculative-eagle-topk",
            str(topk), "--speculative-num-draft-tokens", str(draft), "--max-running-requests", str(cap)]
    env = dict(os.environ, SGLANG_EMULATOR_LOAD_SCALE="0.005")
    proc = subprocess.Popen(argv, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True, cwd=REPO)
    url = f"http://127.0.0.1:{port}"
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline:
        try:
            if httpx.get(url + "/health_generate", timeout=5).status_code == 200:
                return proc, url
        except httpx.HTTPError:
            pass
        time.sleep(0.2)
    os.killpg(proc.pid, signal.SIGKILL)
    raise SystemExit(f"emulator {argv} not ready")


def _exhaustive(url: str, cap: int, slo: SloConfig) -> tuple[int, float]:
    bench = parse_config(BENCH).bench
    workload = load_workload("builtin")

    async def run():
        runner = StreamClient(url, None, bench, "m")
        try:
            points = []
            for c in range(1, cap + 1):
                prompts = workload.for_phase("concurrent", c + max(slo.rounds * c, load_sweep.MIN_JUDGED))
                points.append(load_sweep.point_of(await closed_loop(runner, prompts, c, None, "x"), c, slo))
            return points
        finally:
            await runner.close()

    began = time.monotonic()
    points = asyncio.run(run())
    lo = 0
    for load, (_, broken) in sorted(load_sweep.smoothed(points, slo).items()):
        if broken:
            break
        lo = load
    return lo, time.monotonic() - began


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--p95-itl-ms", type=float, default=15.0)
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--out", help="also write the table here")
    args = p.parse_args()
    slo = SloConfig(p95_itl_ms=args.p95_itl_ms)
    lines = [f"[slo] p95_itl_ms = {args.p95_itl_ms:g} (attainment {slo.attainment:.0%}, precision {slo.precision:.0%}), "
             f"Qwen3.5-122B-A10B MTP profile, 64-token answers, `[bench] concurrency = 8`", "",
             "| steps | topk | draft | cap | exhaustive (s) | search: value, new loads, s | within precision |",
             "|---:|---:|---:|---:|---|---|---|"]
    for steps, topk, draft, cap in CONFIGS:
        proc, url = _start(steps, topk, draft, cap)
        try:
            truth, sweep_s = _exhaustive(url, cap, slo)
            client = ServerClient(url)
            runs = []
            for _ in range(args.repeats):
                m = measure(url=url, bench=parse_config(BENCH).bench, info=client.server_info(), workload=load_workload("builtin"),
                            client=client, slo=slo)
                curve = m.load_curve
                runs.append((curve.slo_capacity, sum(pt.source == "sweep" for pt in curve.points), curve.sweep_s))
        finally:
            os.killpg(proc.pid, signal.SIGTERM)
            proc.wait(timeout=30)
        ok = sum(abs(v - truth) <= max(1, slo.precision * truth) for v, _, _ in runs)
        line = (f"| {steps} | {topk} | {draft} | {cap} | {truth} ({sweep_s:.0f} s) | "
                + "; ".join(f"{v:g}, {n}, {s:.0f} s" for v, n, s in runs) + f" | {ok}/{len(runs)} |")
        print(line, flush=True)
        lines.append(line)
    if args.out:
        Path(args.out).write_text("\n".join(lines) + "\n")
    print("\n".join(lines))


if __name__ == "__main__":
    main()
