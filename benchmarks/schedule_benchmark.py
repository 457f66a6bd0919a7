"""The per-load schedule on the emulator: best static configuration, SGLang's default adaptive
table and the tuned table, per level, on both profiles at temperature 0 and 0.7.

    python benchmarks/schedule_benchmark.py [--levels 1,4,16,32] [--profiles qwen,llama] [--temperatures 0,0.7]

For each (profile, temperature): a study of two trials (topk 1) on a fresh emulator, then
`python -m tuner.schedule --levels ...`, which launches every other steps value 0..6 at every
level, writes the table, and verifies it (tuned table, SGLang's default, a changing load).  The
per-level table `tuner.schedule` prints is collected here.  Takes ~2-4 minutes per case.
"""

from __future__ import annotations

import argparse
import json
import os
import socket
import subprocess
import sys
import tempfile
import textwrap
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
PROFILES = {
    "qwen": ("Qwen/Qwen3.5-122B-A10B --tp 4", "NEXTN"),
    "llama": ("meta-llama/Llama-3.1-8B-Instruct --speculative-draft-model-path x/eagle3", "EAGLE3"),
}


def _port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _config(tmp: Path, profile: str, temperature: float) -> Path:
    model, algorithm = PROFILES[profile]
    port = _port()
    text = textwrap.dedent(f"""
        [study]
        name = "sched"
        storage = "sqlite:///{tmp / 'sched.db'}"
        artifacts = "{tmp / 'artifacts'}"
        baselines = false

        [target]
        url = "http://127.0.0.1:{port}"
        ready_timeout_s = 120
        poll_interval_s = 0.2
        workdir = "{tmp / 'work'}"

        [server]
        command = "{sys.executable} -m sglang_emulator --model-path {model} --host 127.0.0.1 --port {port} --speculative-algorithm {algorithm}"
        env = {{ SGLANG_EMULATOR_LOAD_SCALE = "0.005", SGLANG_EMULATOR_TIME_SCALE = "0.25" }}

        [space]
        speculative_num_steps = {{ low = 1, high = 6 }}
        speculative_eagle_topk = {{ choices = [1] }}

        [bench]
        temperature = {temperature}
        max_tokens = 96
        single_requests = 2
        single_min_passes = 1
        single_max_passes = 2
        concurrency = 16
        concurrent_requests = 32
        warmup_requests = 1
    """)
    path = tmp / "sched.toml"
    path.write_text(text)
    return path


def run_case(profile: str, temperature: float, levels: str) -> str:
    with tempfile.TemporaryDirectory(prefix="schedule-bench-") as d:
        tmp = Path(d)
        config = _config(tmp, profile, temperature)
        env = {**os.environ, "PYTHONPATH": str(REPO)}
        study = subprocess.run([sys.executable, "-m", "tuner.optimize", "--trials", "2", "--config", str(config)],
                               capture_output=True, text=True, cwd=REPO, env=env)
        if study.returncode != 0:
            return f"study failed: {study.stderr.strip().splitlines()[-1:]}"
        out = tmp / "table.json"
        result = subprocess.run([sys.executable, "-m", "tuner.schedule", "--config", str(config), "--levels", levels, "--out", str(out)],
                                capture_output=True, text=True, cwd=REPO, env=env)
        if result.returncode != 0:
            return f"schedule failed: {result.stderr.strip().splitlines()[-1:]}"
        keep = [line for line in result.stderr.splitlines() if line.startswith(("|", "verdict", "changing load", "verification", "tok/s per level", "  "))
                and not line.startswith(("  single", "  warm", "  concurrency", "  waiting", "  launching", "  schedule", "  ->"))]
        return f"table: {json.dumps(json.loads(out.read_text()))}\n" + "\n".join(keep)


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--levels", default="1,4,16,32")
    p.add_argument("--profiles", default="qwen,llama")
    p.add_argument("--temperatures", default="0,0.7")
    args = p.parse_args()
    for profile in args.profiles.split(","):
        for temperature in (float(t) for t in args.temperatures.split(",")):
            print(f"\n## {profile}, temperature {temperature:g}\n", flush=True)
            print(run_case(profile, temperature, args.levels), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
