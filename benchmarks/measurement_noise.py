"""How noisy one trial's figures are, and what the repeats buy.

    python benchmarks/measurement_noise.py [--runs 10] [--config studies/demo.toml]

One configuration (the config's command with steps 3, topk 1) is measured `--runs` times, each
time on a freshly started emulator (as trials are), twice over:
  before: one single-stream pass (no repeats);
  after:  passes repeated until the 95% CI of the mean is within single_target_ci (3%).
It prints the coefficient of variation (std / mean across runs) of single_tps and of
concurrent_tps (steady window, and over the whole phase with ramp-up and drain, for
comparison), and the time a measurement costs.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time
from pathlib import Path

from rich.console import Console
from rich.progress import Progress
from rich.table import Table

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from tuner.config import load_config  # noqa: E402
from tuner.measure.workload import bench_workload  # noqa: E402
from tuner.sequence import connected, launch, measure_server  # noqa: E402
from tuner.sglang_args import Params  # noqa: E402


def cv(values: list[float]) -> float:
    return statistics.stdev(values) / statistics.fmean(values) if len(values) > 1 else float("nan")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=10)
    parser.add_argument("--config", default="studies/demo.toml")
    args = parser.parse_args()
    os.environ["PATH"] = str(Path(sys.executable).parent) + os.pathsep + os.environ["PATH"]
    config = load_config(args.config)
    params = Params(3, 1, 4, None)
    workload = bench_workload(config.bench)
    modes = {
        "before (1 pass)": config.bench.model_copy(update={"single_min_passes": 1, "single_max_passes": 1}),
        "after (repeats to 3% CI)": config.bench,
    }
    rows = {}
    console = Console(width=160)
    with connected(config) as target, Progress(console=console, transient=True) as progress:
        task = progress.add_task("measuring", total=args.runs * len(modes))
        for name, bench in modes.items():
            single, steady, whole, seconds, passes = [], [], [], [], []
            for _ in range(args.runs):
                ready = launch(target, target.spec(params))
                started = time.monotonic()
                m = measure_server(target, ready.info, workload, bench=bench)
                seconds.append(time.monotonic() - started)
                single.append(m.single_tps)
                steady.append(m.concurrent_tps)
                whole.append(next(iter(m.concurrent_phase_tps_by_level.values())))
                passes.append(len(m.single_runs))
                progress.advance(task)
            rows[name] = (single, steady, whole, seconds, passes)
    table = Table(title=f"{args.runs} measurements of one configuration (steps 3, topk 1) on fresh emulator servers, {config.path}")
    for col in ("mode", "single_tps mean", "single_tps CV", "passes", "concurrent_tps (steady) mean", "CV", "concurrent (whole phase) mean", "CV", "s / measurement"):
        table.add_column(col, justify="right")
    for name, (single, steady, whole, seconds, passes) in rows.items():
        table.add_row(name, f"{statistics.fmean(single):.1f}", f"{cv(single):.2%}", f"{statistics.fmean(passes):.1f}",
                      f"{statistics.fmean(steady):.1f}", f"{cv(steady):.2%}", f"{statistics.fmean(whole):.1f}", f"{cv(whole):.2%}",
                      f"{statistics.fmean(seconds):.1f}")
    console.print(table)


if __name__ == "__main__":
    main()
