"""Trials per hour with 1, 2 and 4 workers on one study (the ideal is linear).

    python benchmarks/fleet_throughput.py [--trials-per-worker 4] [--storage URL]

Each worker is a real `python -m tuner.optimize` process with its own emulator server (its own
port), all on one study in PostgreSQL (from .ci/.postgres/env, or --storage), with the demo's
model and a small benchmark.  Reports wall time, trials per hour and the speed-up over one
worker.  The machine's cores are shared by every worker and every emulator, so the scaling
measured here is a floor: on real hosts each worker has its own machine.
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import tempfile
import time
import uuid
from pathlib import Path

from rich.console import Console
from rich.table import Table

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from tests.conftest import free_port, write_config  # noqa: E402
from tuner.results.resilient import redacted_url  # noqa: E402


def storage_url(arg: str | None) -> str:
    if arg:
        return arg
    env = ROOT / ".ci" / ".postgres" / "env"
    if env.exists():
        return dict(l.split("=", 1) for l in env.read_text().splitlines() if "=" in l)["TUNER_TEST_POSTGRES"]
    raise SystemExit("no PostgreSQL: run .ci/services.sh up (as root) or pass --storage")


def run(workers: int, trials: int, storage: str, tmp: Path) -> tuple[float, int]:
    study = f"fleet-bench-{uuid.uuid4().hex[:6]}"
    procs = []
    for i in range(workers):
        d = tmp / f"{study}-w{i}"
        d.mkdir()
        config = write_config(
            d, name=study, port=free_port(),
            space="speculative_num_steps = { low = 1, high = 6 }\nspeculative_eagle_topk = { choices = [1, 2, 4] }\nmem_fraction_static = { low = 0.80, high = 0.93, step = 0.01 }",
            env='SGLANG_EMULATOR_LOAD_SCALE = "0.02", SGLANG_EMULATOR_TIME_SCALE = "1"',
            bench="max_tokens = 96\nsingle_requests = 2\nsingle_min_passes = 1\nsingle_max_passes = 2\nconcurrency = 8\nconcurrent_requests = 24\nwarmup_requests = 1",
        )
        procs.append(subprocess.Popen([sys.executable, "-m", "tuner.optimize", "--config", str(config), "--study-name", study,
                                       "--storage", storage, "--trials", str(trials)], cwd=ROOT,
                                      stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True))
    started = time.monotonic()
    for p in procs:
        _, err = p.communicate()
        if p.returncode != 0:
            raise SystemExit(f"a worker failed: {err[-2000:]}")
    return time.monotonic() - started, workers * trials


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--trials-per-worker", type=int, default=4)
    parser.add_argument("--storage")
    args = parser.parse_args()
    storage = storage_url(args.storage)
    console = Console(width=120)
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        for workers in (1, 2, 4):
            seconds, trials = run(workers, args.trials_per_worker, storage, Path(tmp))
            rows.append((workers, trials, seconds, trials / seconds * 3600))
            console.print(f"{workers} worker(s): {trials} trials in {seconds:.0f} s", highlight=False)
    table = Table(title=f"Trials per hour on one study ({redacted_url(storage)}), {args.trials_per_worker} trials per worker, {os.cpu_count()} CPU cores shared")
    for col in ("workers", "trials", "wall s", "trials / hour", "speed-up", "ideal"):
        table.add_column(col, justify="right")
    base = rows[0][3]
    for workers, trials, seconds, rate in rows:
        table.add_row(str(workers), str(trials), f"{seconds:.0f}", f"{rate:.0f}", f"{rate / base:.2f}x", f"{workers:.2f}x")
    console.print(table)


if __name__ == "__main__":
    main()
