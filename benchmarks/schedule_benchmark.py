"""The per-load schedule: per level, the best static configuration, SGLang's default adaptive
table and the tuned table, on the emulator's profiles at temperature 0 and 0.7.

    python benchmarks/schedule_benchmark.py                      # offline, ~10 s: writes benchmarks/results/schedule_benchmark.md
    python benchmarks/schedule_benchmark.py --seeds 10 --profiles qwen --temperatures 0
    python benchmarks/schedule_benchmark.py --live [--levels 1,4,16,32]   # real servers, see below

Offline (the default), on the emulator's pure model (`sglang_emulator/landscape.py`); no server
is started:

1. **Measurements.** What `tuner.schedule` would measure: one launch per steps value 0..7
   (0 = speculation off, the command without speculation), each measured at every level.  A
   launch at level L runs min(L, its running-request cap) requests (`expect(...)`: the KV pool
   and hybrid state at SGLang's default memory fraction; the Qwen profile's cap falls from 26
   at steps 1 to 10 at steps 7); its figure is `static_level(...)` times the emulator's
   launch-to-launch factor exp(N(0, 1%)) (engine.py · launch_factor: step_noise / 2) and a 0.5%
   per-level jitter (the measured CV of one configuration is 0.7-0.9%,
   benchmarks/results/measurement_noise.txt), drawn from the seed.  The launch's running-request
   cap is recorded with it, as the tuner records `max_running_requests` from /server_info.
2. **The table.** Those figures go through the tuner's own code (`tuner/results/adaptive_table.py`:
   `figures`, `choose`, `table_for`, `dumps`): the JSON `tuner.schedule` would write.
3. **Evaluation**, noise-free: the best static configuration at each level (each level's own
   best steps, at its own cap); SGLang's default table and the tuned table replayed with
   SGLang 0.5.23's policy (`adaptive_level`: slot routing after CUDA-graph padding, the EMA of
   each request's accepted drafts as the live engine draws them, warm-up, probing out of steps
   0 -- whatever the policy visits is paid for at its mean rate),
   at the running-request cap adaptive mode leaves (`adaptive_memory`: draft buffers for the
   largest candidate, one graph set per candidate).  Tuned figures are the mean over seeds and
   the worst seed.

`--live` runs the real thing instead: per (profile, temperature) a 2-trial study on a fresh
emulator and `python -m tuner.schedule --levels ...` (7 static launches, the tuned and the
default adaptive servers, a changing-load run).  Each launch is a real server start-up plus a
benchmark at every level: ~3 minutes per launch on 2 shared cores at real time (time scale 0.25
here), so roughly half an hour per case.  Its output is the terminal table `tuner.schedule`
prints; it is not written to the results file.
"""

from __future__ import annotations

import argparse
import math
import random
import sys
from dataclasses import dataclass
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from sglang_emulator import landscape as L  # noqa: E402
from sglang_emulator import model as m  # noqa: E402
from sglang_emulator.adaptive import AdaptiveTable, load_adaptive_config  # noqa: E402
from sglang_emulator.profiles import PROFILES  # noqa: E402
from tuner.results import adaptive_table as sch  # noqa: E402

OUT = REPO / "benchmarks" / "results" / "schedule_benchmark.md"
LAUNCH_NOISE = 0.01  # engine.py: launch_factor = exp(N(0, step_noise / 2)), step_noise 0.02
LEVEL_NOISE = 0.005  # per-level jitter of one measurement window


@dataclass(frozen=True)
class Case:
    key: str  # sglang_emulator.profiles key
    algorithm: str  # what the model runs (SGLang turns NEXTN into EAGLE)
    label: str


CASES = {
    "qwen": Case("qwen3.5-122b-a10b", "EAGLE", "Qwen3.5-122B-A10B MTP (NEXTN), tp 4 on RTX PRO 6000"),
    "llama": Case("llama-3.1-8b-instruct", "EAGLE3", "Llama-3.1-8B-Instruct EAGLE3, H200"),
    "h100": Case("llama-3.1-8b-h100-128k", "EAGLE3", "Llama-3.1-8B-Instruct EAGLE3, H100, 128k context"),
}


# -- the model ---------------------------------------------------------------------------------
def mem_fraction(case: Case) -> float:
    """SGLang's default memory fraction for the profile (what the live benchmark's study ran at)."""
    p = PROFILES[case.key]
    chunk, max_bs = m.default_graph_settings(p.gpu.total_mib, p.reference_tp)
    return m.default_mem_fraction_static(gpu_mib=p.gpu.total_mib, tp=p.reference_tp, chunked_prefill_size=chunk,
                                         decode_max_bs=min(max_bs, 48))


def static_cap(case: Case, steps: int) -> int:
    """Running-request cap of a static launch (steps 0: no speculation)."""
    e = L.expect(case.key, steps=steps or None, topk=1, draft_tokens=None, mem_fraction_static=mem_fraction(case),
                 algorithm=case.algorithm if steps else None)
    if not e.feasible:
        raise SystemExit(f"{case.key} steps {steps}: {e.failure} at the default memory fraction")
    return e.max_running_requests


def static_tps(case: Case, steps: int, level: int, w: L.Workload) -> float:
    """Noise-free throughput of a static launch with `level` requests in flight."""
    batch = min(level, static_cap(case, steps))
    return L.static_level(case.key, batch=batch, steps=steps or None, workload=w, algorithm=case.algorithm).tokens_per_s


def adaptive_tps(case: Case, table: AdaptiveTable, level: int, w: L.Workload) -> tuple[float, tuple, int]:
    """(tok/s, steps visited with their shares, running requests) of an adaptive server."""
    cap = L.adaptive_memory(case.key, table, mem_fraction_static=mem_fraction(case), algorithm=case.algorithm).max_running_requests
    batch = min(level, cap)
    e = L.adaptive_level(case.key, table, batch=batch, workload=w, algorithm=case.algorithm)
    return e.tokens_per_s, e.steps, batch


# -- what tuner.schedule would measure, and its table ---------------------------------------------
def measured_samples(case: Case, steps: list[int], levels: list[int], w: L.Workload, seed: int | None) -> list[sch.Sample]:
    """One launch per steps value, every level measured, with the emulator's noise (seeded;
    seed None: the exact model figures)."""
    rng = random.Random(f"{case.key}/{w.temperature}/{seed}")
    sigma = 0.0 if seed is None else 1.0
    out = []
    for s in steps:
        launch = math.exp(rng.gauss(0.0, LAUNCH_NOISE * sigma))
        tps = {lvl: static_tps(case, s, lvl, w) * launch * math.exp(rng.gauss(0.0, LEVEL_NOISE * sigma)) for lvl in levels}
        out.append(sch.Sample(s, None if s == 0 else mem_fraction(case), tps, f"model#{s}", static_cap(case, s)))
    return out


def tuned_config(case: Case, steps: list[int], levels: list[int], w: L.Workload, seed: int | None) -> dict:
    """The JSON tuner.schedule would write from those measurements (its own code)."""
    figs = sch.figures(measured_samples(case, steps, levels, w, seed), levels)
    return sch.table_for(sch.choose(figs))


# -- one case ------------------------------------------------------------------------------------
@dataclass
class LevelResult:
    level: int
    best_steps: int
    best: float
    single_steps: int  # the one static configuration best across all levels
    single: float
    default: float
    default_visits: tuple
    tuned: list[float]  # per seed
    tuned_visits: tuple  # seed 0's
    tuned_batch: int  # requests running with the tuned table (seed 0)
    exact: float  # the table the rule chooses from noise-free figures


def _visits(shares: tuple) -> str:
    if len(shares) == 1:
        return str(shares[0][0])
    return "/".join(f"{s}:{share:.0%}" for s, share in shares)


def one_static_for_all(table: dict[int, dict[int, float]]) -> int:
    """The steps whose worst ratio to each level's best is highest (the best single launch)."""
    levels = list(table)
    best = {lvl: max(table[lvl].values()) for lvl in levels}
    return max(table[levels[0]], key=lambda s: min(table[lvl][s] / best[lvl] for lvl in levels))


def run_case(case: Case, temperature: float, levels: list[int], steps: list[int], seeds: int) -> tuple[list[LevelResult], list[dict]]:
    w = L.Workload(temperature=temperature)
    statics = {lvl: {s: static_tps(case, s, lvl, w) for s in steps} for lvl in levels}
    single = one_static_for_all(statics)
    default = load_adaptive_config(None)
    configs = [tuned_config(case, steps, levels, w, seed) for seed in range(seeds)]
    tables = [load_adaptive_config(cfg) for cfg in configs]
    exact = load_adaptive_config(tuned_config(case, steps, levels, w, None))
    out = []
    for lvl in levels:
        best_steps = max(statics[lvl], key=statics[lvl].get)
        d_tps, d_visits, _ = adaptive_tps(case, default, lvl, w)
        tuned = [adaptive_tps(case, t, lvl, w) for t in tables]
        out.append(LevelResult(lvl, best_steps, statics[lvl][best_steps], single, statics[lvl][single], d_tps, d_visits,
                               [t[0] for t in tuned], tuned[0][1], tuned[0][2], adaptive_tps(case, exact, lvl, w)[0]))
    return out, configs


# -- the report ----------------------------------------------------------------------------------
def _pct(x: float) -> str:
    return f"{x:+.1%}"


def case_markdown(case: Case, temperature: float, results: list[LevelResult], configs: list[dict]) -> str:
    distinct = {sch.dumps(c) for c in configs}
    lines = [f"### {case.label}, temperature {temperature:g}", "",
             f"Tuned table (seed 0; {len(distinct)} distinct table(s) over {len(configs)} seeds): "
             f"`{sch.dumps(configs[0]).replace(chr(10), ' ').replace('  ', ' ').strip()}`", "",
             "| in flight | best static (steps) | one static for all (steps) | SGLang default (steps run) "
             "| tuned, mean over seeds (steps run, seed 0) | tuned vs best: mean / worst seed "
             "| table from exact figures vs best | tuned vs default |",
             "|---:|---:|---:|---:|---:|---:|---:|---:|"]
    for r in results:
        mean = sum(r.tuned) / len(r.tuned)
        worst = min(r.tuned)
        running = "" if r.tuned_batch == r.level else f", {r.tuned_batch} running"
        lines.append(f"| {r.level} | {r.best:,.0f} ({r.best_steps}) | {r.single:,.0f} ({r.single_steps}) "
                     f"| {r.default:,.0f} ({_visits(r.default_visits)}) | {mean:,.0f} ({_visits(r.tuned_visits)}{running}) "
                     f"| {_pct(mean / r.best - 1)} / {_pct(worst / r.best - 1)} | {_pct(r.exact / r.best - 1)} | {_pct(mean / r.default - 1)} |")
    rows = [sch.Row(r.level, _figure(r), r.default, min(r.tuned)) for r in results]
    lines += ["", f"Verdict (tuner.results.adaptive_table.verdict, worst seed): {sch.verdict(rows)}.", ""]
    return "\n".join(lines)


def _figure(r: LevelResult) -> sch.Figure:
    return sch.Figure(r.best_steps, r.level, r.best, sch.DEFAULT_NOISE * r.best, 1, None, ("model",))


def summary_markdown(summary: list[tuple[Case, float, list[LevelResult]]]) -> str:
    lines = ["| profile | T | levels within 2% of their best (worst seed) | tuned vs best, worst level: mean / worst seed "
             "| from exact figures, worst level | tuned vs SGLang default (mean), per level |", "|---|---:|---|---:|---:|---|"]
    for case, temperature, results in summary:
        held = [r.level for r in results if min(r.tuned) >= (1 - sch.DEFAULT_NOISE) * r.best]
        mean = min(sum(r.tuned) / len(r.tuned) / r.best - 1 for r in results)
        worst = min(min(r.tuned) / r.best - 1 for r in results)
        exact = min(r.exact / r.best - 1 for r in results)
        gains = ", ".join(f"{r.level}: {_pct(sum(r.tuned) / len(r.tuned) / r.default - 1)}" for r in results)
        lines.append(f"| {case.label} | {temperature:g} | {len(held)}/{len(results)} ({', '.join(map(str, held)) or '-'}) "
                     f"| {_pct(mean)} / {_pct(worst)} | {_pct(exact)} | {gains} |")
    return "\n".join(lines) + "\n"


def offline(args: argparse.Namespace) -> int:
    levels = sch.parse_levels(args.levels or "1,2,4,8,16,32")
    steps = list(range(0, args.max_steps + 1))
    parts, summary = [], []
    for name in args.profiles.split(","):
        case = CASES[name]
        for temperature in (float(t) for t in args.temperatures.split(",")):
            results, configs = run_case(case, temperature, levels, steps, args.seeds)
            parts.append(case_markdown(case, temperature, results, configs))
            summary.append((case, temperature, results))
    head = (f"# Schedule benchmark (offline, the emulator's model)\n\n`python benchmarks/schedule_benchmark.py "
            f"--levels {','.join(map(str, levels))} --max-steps {args.max_steps} --seeds {args.seeds}`\n\n"
            "Throughput in tok/s at each level (requests in flight).  Steps run: the adaptive steps the policy "
            "visits with their share of decode batches.\n\n## Summary\n\n")
    text = head + summary_markdown(summary) + "\n## Per case\n\n" + "\n".join(parts)
    print(text)
    if args.out != "-":
        Path(args.out).write_text(text)
        print(f"wrote {args.out}", file=sys.stderr)
    return 0


# -- --live: real servers -------------------------------------------------------------------------
LIVE_MODELS = {
    "qwen": ("Qwen/Qwen3.5-122B-A10B --tp 4", "NEXTN"),
    "llama": ("meta-llama/Llama-3.1-8B-Instruct --speculative-draft-model-path x/eagle3", "EAGLE3"),
}


def _port() -> int:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _live_config(tmp: Path, profile: str, temperature: float) -> Path:
    import textwrap

    model, algorithm = LIVE_MODELS[profile]
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


def live_case(profile: str, temperature: float, levels: str) -> str:
    import json
    import os
    import subprocess
    import tempfile

    with tempfile.TemporaryDirectory(prefix="schedule-bench-") as d:
        tmp = Path(d)
        config = _live_config(tmp, profile, temperature)
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


def live(args: argparse.Namespace) -> int:
    for profile in args.profiles.split(","):
        if profile not in LIVE_MODELS:
            print(f"\n## {profile}: no live command (offline only)\n", flush=True)
            continue
        for temperature in (float(t) for t in args.temperatures.split(",")):
            print(f"\n## {profile}, temperature {temperature:g}\n", flush=True)
            print(live_case(profile, temperature, args.levels or "1,4,16,32"), flush=True)
    return 0


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--levels", help="requests in flight (offline default 1,2,4,8,16,32; --live default 1,4,16,32)")
    p.add_argument("--profiles", default="qwen,llama,h100", help=f"of {','.join(CASES)}")
    p.add_argument("--temperatures", default="0,0.7")
    p.add_argument("--max-steps", type=int, default=7, help="offline: steps 0..N are measured (default 7)")
    p.add_argument("--seeds", type=int, default=5, help="offline: measurement draws per case (default 5)")
    p.add_argument("--out", default=str(OUT), help="offline: the Markdown file ('-': stdout only)")
    p.add_argument("--live", action="store_true", help="real emulator servers through tuner.optimize + tuner.schedule (~30 min per case)")
    args = p.parse_args()
    return live(args) if args.live else offline(args)


if __name__ == "__main__":
    sys.exit(main())
