"""A Ctrl-C or SIGTERM at a random moment of a small study, N times: does every run end cleanly?

    python benchmarks/signal_stress.py            # 30 runs, ~35 min on 2 cores
    python benchmarks/signal_stress.py --runs 5   # a smoke run

The suite's `tests/e2e/test_signals.py` signals at eight named moments, found in the run's log.
This script signals at moments nobody chose (uniform over the first 100 s of a 3-trial study on
the emulator, a third of them with baselines), which is how the two failures the named moments
missed were found: a SIGINT inside SQLAlchemy's fetch printed a pool traceback (fixed by running
each database call inside `tuner.interrupts.deferred`), and a SIGTERM during the imports killed
the process with -15 and no line (fixed in `tuner.interrupts.quiet_start`).

A run is clean when the tuner exits 130 (or 0: the study had ended) within 10 s, prints no
traceback, leaves no server on the port and no trial RUNNING (a signal held to the end of
Optuna's trial insert once left one).  Each run's phase at the signal is read from its
`--log-file`.  Writes benchmarks/results/signal_stress.md.
"""

from __future__ import annotations

import argparse
import platform
import random
import re
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from collections import Counter
from dataclasses import dataclass
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from tests.conftest import PYTHON, free_port, write_config  # noqa: E402  (the suite's own study set-up)
from tests.e2e.test_signals import BENCH, EXIT_WITHIN_S, SLOW_ENV  # noqa: E402

SPACE = "speculative_num_steps = { low = 1, high = 3 }\nmem_fraction_static = { low = 0.80, high = 0.86, step = 0.02 }"
SIGNALS = {"SIGINT": 2, "SIGTERM": 15}
MAX_DELAY_S = 100.0  # a trial takes ~40-60 s here: the signal lands in the first two or three


@dataclass
class Run:
    delay_s: float
    signal: str
    phase: str
    returncode: int
    exit_s: float
    problems: list[str]


def _phase(log: Path) -> str:
    """The run's last phase or trial line before the signal, as a short name."""
    if not log.exists():
        return "imports"
    lines = [line for line in log.read_text(errors="replace").splitlines() if "phase:" in line or re.search(r"trial +\d+ ", line)]
    if not lines:
        return "start-up"
    last = lines[-1]
    if "phase:" in last:
        return re.sub(r"[\d/]+", "", last.split("phase:", 1)[1]).strip().split(" (")[0] or "phase"
    return "between trials"


def _running_trials(db: Path) -> list[int]:
    import optuna

    if not db.exists():
        return []
    url = f"sqlite:///{db}"
    return [t.number for s in optuna.get_all_study_summaries(url)
            for t in optuna.load_study(study_name=s.study_name, storage=url).trials
            if t.state == optuna.trial.TrialState.RUNNING]


def one_run(i: int, rng: random.Random, keep: Path) -> Run:
    tmp = Path(tempfile.mkdtemp(prefix="sigstress"))
    port = free_port()
    config = write_config(tmp, port=port, env=SLOW_ENV, bench=BENCH, space=SPACE,
                          study="baselines = true" if i % 3 == 0 else "")
    log = tmp / "run.log"
    proc = subprocess.Popen([PYTHON, "-m", "tuner.optimize", "--trials", "3", "--config", str(config),
                             "--log-file", str(log), "--seed", str(i)],
                            cwd=REPO, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    delay, name = rng.uniform(0.5, MAX_DELAY_S), rng.choice(sorted(SIGNALS))
    time.sleep(delay)
    phase = _phase(log) if proc.poll() is None else "ended"
    sent = time.monotonic()
    proc.send_signal(SIGNALS[name])
    try:
        _, err = proc.communicate(timeout=60)
    except subprocess.TimeoutExpired:
        proc.kill()
        _, err = proc.communicate()
        err = "still running 60 s after the signal\n" + err
    exit_s = time.monotonic() - sent
    problems = []
    if proc.returncode not in (130, 0):
        problems.append(f"exit {proc.returncode}")
    if "Traceback" in err:
        problems.append("traceback")
    if exit_s > EXIT_WITHIN_S:
        problems.append(f"exit took {exit_s:.1f} s")
    with socket.socket() as s:
        if s.connect_ex(("127.0.0.1", port)) == 0:
            problems.append("a server still answers")
            subprocess.run(["fuser", "-k", f"{port}/tcp"], capture_output=True)
    running = _running_trials(tmp / "t.db")
    if running:
        problems.append(f"trial(s) {running} left RUNNING")
    if problems:
        keep.mkdir(parents=True, exist_ok=True)
        (keep / f"run{i}.stderr").write_text(err)
    return Run(delay, name, phase, proc.returncode, exit_s, problems)


def report(runs: list[Run], seconds: float) -> str:
    bad = [r for r in runs if r.problems]
    exits = [r.exit_s for r in runs]
    phases = Counter(r.phase for r in runs)
    lines = [
        "# Signal stress: a signal at a random moment of a study",
        "",
        f"{len(runs)} runs of `python -m tuner.optimize --trials 3` on the emulator; SIGINT or SIGTERM "
        f"uniformly 0.5-{MAX_DELAY_S:.0f} s after the start. Generated by `benchmarks/signal_stress.py` in {seconds:.0f} s "
        f"({platform.machine()}, load average at the end {open('/proc/loadavg').read().split()[0]}).",
        "",
        f"- **clean: {len(runs) - len(bad)} of {len(runs)}** (exit 130 or 0 within {EXIT_WITHIN_S:.0f} s, "
        "no traceback, no server left, no trial RUNNING)",
        f"- exit after the signal: median {statistics.median(exits):.1f} s, max {max(exits):.1f} s",
        "- phase at the signal: " + ", ".join(f"{p} {n}" for p, n in phases.most_common()),
        "",
        "| run | signal after | signal | phase | exit | exit after | problems |",
        "|---|---|---|---|---|---|---|",
    ]
    lines += [f"| {i} | {r.delay_s:.1f} s | {r.signal} | {r.phase} | {r.returncode} | {r.exit_s:.1f} s | "
              f"{', '.join(r.problems) or '-'} |" for i, r in enumerate(runs)]
    return "\n".join(lines) + "\n"


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--runs", type=int, default=30)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--out", default=str(REPO / "benchmarks/results/signal_stress"))
    args = ap.parse_args()
    rng, started, runs = random.Random(args.seed), time.monotonic(), []
    for i in range(args.runs):
        run = one_run(i, rng, Path(args.out + "_failures"))
        runs.append(run)
        print(f"{i + 1}/{args.runs}: {run.signal} after {run.delay_s:.1f} s ({run.phase}): exit {run.returncode} "
              f"in {run.exit_s:.1f} s {'OK' if not run.problems else 'BAD: ' + ', '.join(run.problems)}", flush=True)
    text = report(runs, time.monotonic() - started)
    Path(args.out + ".md").write_text(text)
    print(text)
    return 1 if any(r.problems for r in runs) else 0


if __name__ == "__main__":
    sys.exit(main())
