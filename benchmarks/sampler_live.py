"""End to end: how much of the true Pareto front does the real tuner find against the live emulator?

    python benchmarks/sampler_live.py                      # qwen-demo, llama8b-h100-128k, family:0 x model, edge; 1 seed
    python benchmarks/sampler_live.py --landscapes qwen-demo --samplers model --budgets 4   # a smoke run
    python benchmarks/sampler_live.py --seeds 3 --budgets 10,20 --out /tmp/live
    python benchmarks/sampler_live.py --sglang-version 0.5.9 --landscapes family:2 --samplers model --budgets 10
    python benchmarks/sampler_live.py --landscapes family:2,tp4:7 --samplers model --seeds 20 --budgets 10 --jobs 3

The online counterpart of `benchmarks/sampler_benchmark.py`.  That one replays the tuner's trial
loop with `ask`/`tell` and simulated measurements; this one runs the tuner itself,
`python -m tuner.optimize --config <toml> --trials <max budget> --sampler <name> --seed <seed>`,
against the emulator as a real HTTP server (launch, readiness, benchmark, stop: all of it), one
fresh study per (landscape, sampler, seed), with `baselines = false` so that only searched
trials are launched.

What it scores is the TRUTH of what the study measured, not the measurements: for the first B
trials (in trial-number order, settled ones included, as `--trials B` counts them), each COMPLETE
trial that was a real launch (no `duplicate_of`) is looked up by its flags in the landscape's
exhaustive, noise-free table (`sampler_benchmark.landscape(name).expect(params)`), and the score is
hv3(those true points) / the exhaustive front's HV, objectives normalised by their grid maximum
as the offline benchmark does.  The measured values are noisy (step-time noise, a few requests
per trial); a sampler must not get credit for a lucky measurement of a mediocre config, nor
lose it for an unlucky measurement of a good one.  So the two benchmarks' numbers are directly
comparable; what the live one adds is everything the replay leaves out: the tuner's own warm
start, its duplicate and ruled-out settling, real launch failures, readiness and timing, and the
sampler fitted on real measurements.  The HV of the measured values (same normalisation) is
reported too, as a check that the emulator and the landscape agree.

Each study's emulator runs with SGLANG_EMULATOR_LOAD_SCALE=0.02 (start-up in seconds; decode
steps in real time) and SGLANG_EMULATOR_SEED=<seed>; the landscape's profile is served through
the model path, $SGLANG_EMULATOR_PROFILE or $SGLANG_EMULATOR_LANDSCAPE_SEED, and checked against
the profile the landscape was built from before anything is launched.

Writes <out>.md and <out>.json (default benchmarks/results/sampler_live).
"""

from __future__ import annotations

import argparse
import concurrent.futures
import dataclasses
import json
import os
import platform
import shlex
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
import tomllib
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "benchmarks"))

import numpy as np  # noqa: E402
import optuna  # noqa: E402
from optuna.trial import TrialState  # noqa: E402

import sampler_benchmark as offline  # noqa: E402
from sampler_benchmark import Landscape, LandscapeSpec, hv3, landscape, landscape_spec  # noqa: E402
from sglang_emulator import landscape as L  # noqa: E402
from sglang_emulator.completions import chat_prompt  # noqa: E402
from sglang_emulator.engine import count_tokens, prompt_traits  # noqa: E402
from sglang_emulator.family import tp4_setup  # noqa: E402
from sglang_emulator.profiles import LANDSCAPE_SEED_ENV, PROFILE_ENV, PROFILES, find_profile  # noqa: E402
from tuner.config import SyntheticPrompts, parse_config  # noqa: E402
from tuner.measure.workload import bench_workload  # noqa: E402
from tuner.results import record  # noqa: E402
from tuner.sglang_args import SEARCHED, Params  # noqa: E402

DEFAULT_OUT = ROOT / "benchmarks" / "results" / "sampler_live"
# Short names for offline LANDSCAPES entries (the offline benchmark marks perturbed ones "p:").
ALIASES = {"llama8b-h100-128k": "p:llama8b-h100-128k"}
# Served model paths, by the profile's architecture; --tp is the profile's reference_tp.
MODEL_PATHS = {"Qwen3_5MoeForConditionalGeneration": "Qwen/Qwen3.5-122B-A10B",
               "LlamaForCausalLM": "meta-llama/Llama-3.1-8B-Instruct",
               # the family's MoE and hybrid draws (sglang_emulator/family.py): served by seed, named like these
               "Qwen3MoeForCausalLM": "Qwen/Qwen3-30B-A3B", "Qwen3NextForCausalLM": "Qwen/Qwen3-Next-80B-A3B-Instruct"}
EAGLE3_DRAFT = "jamesliu1/sglang-EAGLE3-Llama-3.1-Instruct-8B"  # as tests/e2e/test_emulator_http.py
EMULATOR_ENV = {"SGLANG_EMULATOR_LOAD_SCALE": "0.02"}
SECONDS_PER_TRIAL = 150  # the default timeout allows this much per trial (observed: see the report)


# --- What the emulator serves -----------------------------------------------------------------


@dataclasses.dataclass
class Served:
    """The emulator's launch for one landscape: argv after `-m sglang_emulator` (no host/port)
    and its environment (the profile selection and the emulator's knobs)."""

    model: str
    flags: list[str]
    env: dict[str, str]


def served(spec: LandscapeSpec, lands: Landscape, seed: int, tmp: Path) -> Served:
    """Serve the landscape's profile: by model path when the emulator knows the profile by
    name, by $SGLANG_EMULATOR_LANDSCAPE_SEED for a family landscape (not one --capture-reserve
    changed), else from a JSON profile."""
    profile = lands.profile
    tp4 = spec.name.startswith(offline.FAMILY_TP4_PREFIX)
    # A four-GPU draw names its real model (the emulator serves the drawn profile whatever the name).
    model = tp4_setup(int(spec.name[len(offline.FAMILY_TP4_PREFIX):])).model if tp4 else MODEL_PATHS[profile.architecture]
    env = {**EMULATOR_ENV, "SGLANG_EMULATOR_SEED": str(seed)}
    if spec.family and offline.CAPTURE_RESERVE is None:  # with --capture-reserve the draw is not the seed's
        env[LANDSCAPE_SEED_ENV] = spec.name if tp4 else spec.name[len(offline.FAMILY_PREFIX):]
    elif not (isinstance(spec.profile, str) and PROFILES[spec.profile].model_names):
        path = tmp / "profile.json"
        path.write_text(json.dumps({"base": spec.profile} if isinstance(spec.profile, str) else spec.profile))
        env[PROFILE_ENV] = str(path)
    flags = ["--speculative-algorithm", spec.algorithm]
    if profile.reference_tp > 1:
        flags += ["--tp", str(profile.reference_tp)]
    if spec.algorithm == "EAGLE3":
        flags += ["--speculative-draft-model-path", EAGLE3_DRAFT]
    check_served_profile(lands, model, env)
    return Served(model, flags, env)


def check_served_profile(lands: Landscape, model: str, env: dict[str, str]) -> None:
    """The profile the emulator will serve (profiles.find_profile under that environment) must
    be the one the landscape's true values were computed from."""
    saved = {k: os.environ.get(k) for k in (PROFILE_ENV, LANDSCAPE_SEED_ENV)}
    try:
        for k in saved:
            os.environ.pop(k, None)
        os.environ.update({k: v for k, v in env.items() if k in saved})
        got = find_profile(model)
    finally:
        for k, v in saved.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v
    if got is None or dataclasses.replace(got, model_names=()) != dataclasses.replace(lands.profile, model_names=()):
        raise SystemExit(f"{lands.spec.name}: the emulator would serve {getattr(got, 'key', None)!r} for {model} "
                         f"with {env}, not the landscape's profile {lands.profile.key!r}")


# --- The study config -------------------------------------------------------------------------


def _toml(value: Any) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, (int, float)):
        return repr(value)
    if isinstance(value, str):
        return json.dumps(value)  # a JSON string is a TOML basic string
    if isinstance(value, list):
        return "[" + ", ".join(_toml(v) for v in value) + "]"
    if isinstance(value, dict):
        return "{ " + ", ".join(f"{k} = {_toml(v)}" for k, v in value.items()) + " }"
    raise TypeError(f"no TOML for {value!r}")


def _demo() -> dict[str, Any]:
    return tomllib.loads((ROOT / "studies" / "demo.toml").read_text())


def write_config(tmp: Path, spec: LandscapeSpec, srv: Served, port: int, name: str) -> Path:
    """A study as studies/demo.toml runs it, on a free port, storage and state in `tmp`."""
    demo = _demo()
    command = [sys.executable, "-m", "sglang_emulator", "--model-path", srv.model,
               "--host", "127.0.0.1", "--port", str(port), *srv.flags]
    sections = {
        "study": {"name": name, "storage": f"sqlite:///{tmp / 'study.db'}", "artifacts": str(tmp / "artifacts"),
                  "baselines": False},
        "target": {"host": "local", "manager": "process", "url": f"http://127.0.0.1:{port}",
                   "ready_timeout_s": demo["target"]["ready_timeout_s"], "workdir": str(tmp / "work")},
        "server": {"command": shlex.join(command), "env": srv.env},
        "space": demo["space"] if spec.space == "demo" else spec.space,
        "bench": {**demo["bench"], "concurrency": spec.concurrency, "request_tokens": spec.request_tokens},
    }
    if WORKLOAD["name"] == "landscape":
        sections["bench"]["prompts"] = LANDSCAPE_PROMPTS
    sections["bench"].update(BENCH_SET)
    text = "".join(f"[{section}]\n" + "".join(f"{k} = {_toml(v)}\n" for k, v in table.items()) + "\n"
                   for section, table in sections.items())
    path = tmp / f"{name}.toml"
    path.write_text(text)
    return path


# What the studies measure.  "builtin": studies/demo.toml's own, the built-in five-class mix
# (long-context prompts among them), which is not the workload the landscape's truth is
# computed for.  "landscape": that workload as synthetic prompts, so the tuner measures what
# it is scored on: the truth's 300-token chat prompts (sglang_emulator/landscape.py ·
# Workload) and its 128-token answers, every length exact (range_ratio 1).
WORKLOAD = {"name": "builtin"}
LANDSCAPE_PROMPTS = {"input_len": 300, "output_len": 128, "range_ratio": 1.0, "num_prompts": 32, "category": "chat"}
BENCH_SET: dict[str, Any] = {}  # --bench-set key=value: [bench] settings over the demo's
_TAKEN_PORTS: set[int] = set()
# The tuners running now: each is in its own session (a Ctrl-C here does not reach it), so an
# interrupted run stops them itself (main).
_RUNNING: set[subprocess.Popen] = set()
# Studies run on threads (--jobs): the port draw and check_served_profile's os.environ swap
# must not interleave.
_SETUP_LOCK = threading.Lock()


def free_port() -> int:
    """A port nothing listens on and no other study of this run has drawn (the OS may hand the
    same ephemeral port to two studies that bind it a moment apart)."""
    while True:
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            port = s.getsockname()[1]
        if port not in _TAKEN_PORTS:
            _TAKEN_PORTS.add(port)
            return port


def port_free(port: int) -> bool:
    """Nothing listens on the port.  SO_REUSEADDR as servers bind: the TIME_WAIT sockets a
    server leaves for a minute after closing connections do not count."""
    with socket.socket() as s:
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            s.bind(("127.0.0.1", port))
        except OSError:
            return False
    return True


# --- One live study ---------------------------------------------------------------------------


def run_tuner(config: Path, sampler: str, seed: int, trials: int, timeout_s: float, log: Path,
              label: str = "") -> dict[str, Any]:
    """`python -m tuner.optimize` in its own process group, its output to `log` and its trial
    lines echoed; on the timeout the group gets SIGTERM (the tuner then stops its server), then
    SIGKILL.  Its own `--timeout` (stop starting trials) is a trial's worth earlier, to end cleanly."""
    argv = [sys.executable, "-m", "tuner.optimize", "--config", str(config), "--trials", str(trials),
            "--sampler", sampler, "--seed", str(seed), "--timeout", str(int(max(60, timeout_s - SECONDS_PER_TRIAL)))]
    env = {k: v for k, v in os.environ.items() if not k.startswith("SGLANG_EMULATOR_")}  # the config's env only
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")]))
    t0 = time.perf_counter()
    with open(log, "w") as out:
        proc = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, cwd=ROOT, env=env,
                                start_new_session=True)
        _RUNNING.add(proc)
        pump = threading.Thread(target=_pump, args=(proc.stdout, out, label), daemon=True)
        pump.start()
        timed_out = False
        try:
            proc.wait(timeout=timeout_s)
        except subprocess.TimeoutExpired:
            timed_out = True
            _stop(proc)
        finally:
            _RUNNING.discard(proc)
        pump.join(timeout=10)
    return {"argv": argv, "returncode": proc.returncode, "timed_out": timed_out, "seconds": time.perf_counter() - t0}


def _stop(proc: subprocess.Popen) -> None:
    """SIGTERM to the tuner's process group (it stops its server and records the trial), then SIGKILL."""
    try:
        os.killpg(proc.pid, signal.SIGTERM)
        proc.wait(timeout=60)
    except ProcessLookupError:
        pass
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()


def _pump(stream: Any, out: Any, label: str) -> None:
    for line in stream:
        out.write(line)
        if line.startswith("trial "):  # the tuner's one line per finished trial
            print(f"      {label}{line.rstrip()}", flush=True)


def leftover_pids(workdir: Path) -> list[int]:
    """Processes of a server the tuner started under `workdir`: the process manager puts
    SGLANG_TUNER_STATE=<workdir>/<host-port> in the server's environment, its children inherit it."""
    marker = f"SGLANG_TUNER_STATE={workdir}/".encode()
    pids = []
    for proc in Path("/proc").iterdir():
        if proc.name.isdigit():
            try:
                if any(var.startswith(marker) for var in (proc / "environ").read_bytes().split(b"\0")):
                    pids.append(int(proc.name))
            except OSError:
                continue
    return pids


def settle(port: int, workdir: Path, grace_s: float = 20.0) -> dict[str, Any]:
    """After the tuner: no process of its server may be left and the port must be free (the
    emulator's child keeps it ~2 s after a stop).  Leftovers are killed and reported."""
    deadline = time.monotonic() + grace_s
    while time.monotonic() < deadline:
        left = leftover_pids(workdir)
        if not left and port_free(port):
            return {"port_free": True, "leftovers_killed": []}
        time.sleep(0.5)
    left = leftover_pids(workdir)
    for pid in left:
        try:
            os.kill(pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
    time.sleep(1.0)
    return {"port_free": port_free(port), "leftovers_killed": left}


def live_study(name: str, sampler: str, seed: int, budgets: list[int], timeout_s: float) -> dict[str, Any]:
    """One study: config, tuner, cleanup check, score.  The temp dir is kept if anything failed."""
    spec, lands = landscape_spec(ALIASES.get(name, name)), landscape(ALIASES.get(name, name))
    tmp = Path(tempfile.mkdtemp(prefix=f"sampler-live-{sampler}-{seed}-"))
    with _SETUP_LOCK:
        port, study_name = free_port(), f"live-{sampler}-{seed}"
        srv = served(spec, lands, seed, tmp)
    config = write_config(tmp, spec, srv, port, name=study_name)
    print(f"  {name} {sampler} seed {seed}: {config}", flush=True)
    run = run_tuner(config, sampler, seed, max(budgets), timeout_s, tmp / "tuner.log", label=f"{name} s{seed} ")
    run.update(settle(port, tmp / "work"))
    study = optuna.load_study(study_name=study_name, storage=f"sqlite:///{tmp / 'study.db'}")
    trials = [trial_row(t, lands) for t in sorted(study.get_trials(deepcopy=False), key=lambda t: t.number)]
    result = {"landscape": name, "sampler": sampler, "seed": seed, "port": port, "served": dataclasses.asdict(srv),
              "config": config.read_text(), "run": run, "trials": trials,
              "at": {b: at_budget(trials[:b], lands) for b in budgets}}
    score_sent_prompts(result)
    result["ok"] = run["returncode"] == 0 and not run["timed_out"] and run["port_free"] and not run["leftovers_killed"]
    if result["ok"]:
        shutil.rmtree(tmp, ignore_errors=True)
    else:
        tail = (tmp / "tuner.log").read_text(errors="replace")[-1500:]
        print(f"    !! not clean: {json.dumps({k: v for k, v in run.items() if k != 'argv'})}; kept {tmp}\n{tail}",
              flush=True)
    result["kept"] = None if result["ok"] else str(tmp)
    return result


# --- Scoring: the truth of what was measured --------------------------------------------------


def sent_prompts(lands: Landscape, config_text: str) -> tuple[L.Workload, L.Workload]:
    """The (single-stream, concurrent) workloads of the prompts a study's [bench] sends, as the
    emulator's engine sees them: each rendered chat prompt's shift (engine.py · prompt_traits,
    its category and context included) and the mean prompt length.  A few fixed prompts are not
    the mix: the demo's three single-stream chat prompts sit +0.38 above it in logit(q) on
    family:2, which rates deep chains ~10% above the mix's truth and wide trees ~5%."""
    bench = parse_config(config_text).bench
    workload = bench_workload(bench, ROOT)

    def of(prompts: list) -> L.Workload:
        texts = [chat_prompt(list(p.messages)) for p in prompts]
        tokens = [count_tokens(t) for t in texts]
        shifts = tuple(prompt_traits(t, lands.profile.acceptance, n)[0] for t, n in zip(texts, tokens))
        return dataclasses.replace(lands.workload, shifts=shifts, prompt_tokens=round(sum(tokens) / len(tokens)),
                                   max_tokens=bench.max_tokens)

    return (of(workload.for_phase("single", bench.single_requests)),
            of(workload.for_phase("concurrent", bench.concurrent_requests)))


def score_sent_prompts(run: dict[str, Any]) -> None:
    """Adds `hv_prompts` to each budget of a finished study: the HV of its launches' values
    under the truth of the prompts it sent (`sent_prompts`), against that truth's own front.
    The search is judged on what it could measure, less the timing noise; `hv` judges it on
    the mix the landscape is defined for.  Idempotent: `live_study` scores a new study, and
    `summarise` any study read from a run written before this score existed."""
    if all("hv_prompts" in a for a in run["at"].values()):
        return
    truth = sent_truth(run)
    rescored = [{**t, "true": list(e.values()) if (e := truth.expect(Params(**t["flags"]))).feasible else None}
                for t in run["trials"]]
    for b, a in run["at"].items():
        a["hv_prompts"] = at_budget(rescored[:b], truth)["hv"]


def sent_truth(run: dict[str, Any]) -> Landscape:
    """A study's landscape under the truth of the prompts it sent (`sent_prompts`; cached by `landscape`)."""
    name = ALIASES.get(run["landscape"], run["landscape"])
    return landscape(name, prompts=sent_prompts(landscape(name), run["config"]))


def _scatter(runs: list[dict[str, Any]]) -> list[str]:
    """The report's measurement-scatter table: per landscape, the relative sd of each launch's
    measured throughputs over the truth of the prompts its study sent, within each study (a
    study's mean ratio, the scale its workload and the emulator's batching put on every shape,
    divided out). What the replay's --noise stands for (benchmarks/sampler_benchmark.py)."""
    by_landscape: dict[str, list[list[float]]] = {}
    for run in runs:
        truth, ratios = sent_truth(run), []
        for t in run["trials"]:
            if t["state"] == "COMPLETE" and t["kind"] == "launch" and t.get("measured"):
                e = truth.expect(Params(**t["flags"]))
                if e.feasible and all(e.values()[:2]):
                    ratios.append([m / v for m, v in zip(t["measured"][:2], e.values()[:2])])
        if len(ratios) >= 3:
            ratios = np.asarray(ratios)
            by_landscape.setdefault(run["landscape"], []).extend((ratios / ratios.mean(axis=0) - 1).tolist())
    if not by_landscape:
        return []
    out = ["## Measurement scatter", "",
           "Per landscape, over the studies' launches: the relative sd of measured / true throughput (the truth of the "
           "prompts each study sent), each study's mean ratio divided out; the replay's default is 1.5% for both "
           "(`sampler_benchmark.py --noise` replays at others).", "",
           "| landscape | launches | single-stream | concurrent |", "|---|---|---|---|"]
    for name, rows in sorted(by_landscape.items()):
        sd = np.std(np.asarray(rows), axis=0)
        out.append(f"| {name} | {len(rows)} | {sd[0]:.1%} | {sd[1]:.1%} |")
    return out + [""]


def params_of(t: optuna.trial.FrozenTrial) -> Params:
    """The flags the trial launched with (its `flags` attr), else its sampled params."""
    p = record.params_of(t)
    return p if p is not None else Params(**{k: t.params.get(k) for k in SEARCHED})


def trial_row(t: optuna.trial.FrozenTrial, lands: Landscape) -> dict[str, Any]:
    """One trial: how it was settled, what it measured, and the landscape's true values."""
    kind = ("duplicate" if record.DUPLICATE_OF in t.user_attrs
            else "ruled_out" if record.RULED_OUT_BY in t.user_attrs else "launch")
    p = params_of(t)
    e = lands.expect(p)
    row = {"number": t.number, "state": t.state.name, "kind": kind, "flags": p.as_dict(),
           "failure_kind": t.user_attrs.get(record.FAILURE_KIND), "true_feasible": e.feasible,
           "true_failure": e.failure, "true": list(e.values()) if e.feasible else None,
           "measured": list(t.values) if t.state == TrialState.COMPLETE else None,
           # what the model sampler predicted for the launch (record.MODEL_PREDICTION), for the reliability table
           "p_start": (t.user_attrs.get(record.MODEL_PREDICTION) or {}).get("p_start"),
           # single-stream requests sent again: the tuner was starved of CPU during them (measure/stalls.py)
           "stall_resent": t.user_attrs.get(record.CLIENT_STALL_RESENT, 0)}
    return row


def at_budget(rows: list[dict[str, Any]], lands: Landscape) -> dict[str, Any]:
    """Figures over the first B trials: HV of the true and of the measured values of the real
    launches that completed, launches and failed launches, disagreements with the landscape."""
    done = [r for r in rows if r["kind"] == "launch" and r["state"] == "COMPLETE"]
    true = [np.asarray(r["true"]) / lands.scale for r in done if r["true"] is not None]
    measured = [np.clip(np.asarray(r["measured"]) / lands.scale, 0, None) for r in done]
    launches = [r for r in rows if r["kind"] == "launch"]
    return {
        "trials": len(rows),
        "launches": len(launches),
        "complete": len(done),
        "failed": sum(r["state"] in ("PRUNED", "FAIL") for r in launches),
        "settled": len(rows) - len(launches),
        # the emulator started and measured a config the landscape calls infeasible, or vice versa
        "disagree": sum(r["true"] is None for r in done)
                    + sum(r["state"] == "PRUNED" and r["true_feasible"] for r in launches),
        "hv": hv3(np.array(true)) / lands.front_hv if true else 0.0,
        "hv_measured": hv3(np.array(measured)) / lands.front_hv if measured else 0.0,
    }


# --- Report -----------------------------------------------------------------------------------


def summarise(runs: list[dict[str, Any]], budgets: list[int]) -> dict[str, dict[str, Any]]:
    """Per (landscape, sampler): HV mean and worst per budget, failed launches, minutes per study."""
    cells: dict[str, dict[str, Any]] = {}
    for r in runs:
        score_sent_prompts(r)
        cells.setdefault(f"{r['landscape']} | {r['sampler']}", {"landscape": r["landscape"], "sampler": r["sampler"],
                                                                   "runs": []})["runs"].append(r)
    samplers = {r["sampler"] for r in runs}
    if len(cells) > 1 and len(samplers) == 1:  # one sampler's every study in one row: how the issue states its bars
        cells["all"] = {"landscape": f"all {len(cells)}", "sampler": samplers.pop(), "runs": list(runs)}
    top = max(budgets)
    for cell in cells.values():
        rs = cell.pop("runs")
        trials = sum(r["at"][top]["trials"] for r in rs)
        cell.update(
            seeds=len(rs),
            hv={str(b): {"mean": float(np.mean([r["at"][b]["hv"] for r in rs])),
                         "worst": float(min(r["at"][b]["hv"] for r in rs))} for b in budgets},
            hv_prompts={str(b): {"mean": float(np.mean([r["at"][b]["hv_prompts"] for r in rs])),
                                 "worst": float(min(r["at"][b]["hv_prompts"] for r in rs))} for b in budgets},
            hv_measured={str(b): float(np.mean([r["at"][b]["hv_measured"] for r in rs])) for b in budgets},
            launches=float(np.mean([r["at"][top]["launches"] for r in rs])),
            failed=float(np.mean([r["at"][top]["failed"] for r in rs])),
            failed_most=int(max(r["at"][top]["failed"] for r in rs)),
            disagree=sum(r["at"][top]["disagree"] for r in rs),
            minutes=float(np.mean([r["run"]["seconds"] for r in rs])) / 60,
            seconds_per_trial=sum(r["run"]["seconds"] for r in rs) / max(1, trials),
            short=sum(r["at"][top]["trials"] < top for r in rs),
            not_ok=sum(not r["ok"] for r in rs),
        )
    return cells


def _reliability(runs: list[dict[str, Any]], budgets: list[int]) -> list[str]:
    """P(start) as the offline benchmark reports it (`sampler_benchmark._reliability_cells`):
    the launches of the first `max(budgets)` trials, by predicted bucket, against the share
    that started.  Runs written before the prediction was kept have none: no table."""
    by_sampler: dict[str, list[tuple[float, bool, str]]] = {}
    for r in runs:
        for t in r["trials"][:max(budgets)]:
            if t["kind"] == "launch" and t.get("p_start") is not None:
                by_sampler.setdefault(r["sampler"], []).append((float(t["p_start"]), t["state"] == "COMPLETE", r["landscape"]))
    if not by_sampler:
        return []
    out = [f"## P(start) reliability: predicted bucket vs share that started (launches of the first {max(budgets)} trials)", ""]
    out.append("| sampler | " + " | ".join(f"[{lo:.2f}, {min(hi, 1):.2f}{']' if hi > 1 else ')'}"
                                        for lo, hi in offline.RELIABILITY_BUCKETS) + " | launches predicted |")
    out.append("|" + "---|" * (len(offline.RELIABILITY_BUCKETS) + 2))
    for sampler, calls in by_sampler.items():
        out.append("| " + " | ".join([sampler] + offline._reliability_cells(calls)) + " |")
    out += ["", "Each cell: mean predicted P(start) -> share that started [its 90% interval, resampling landscapes] "
            "(launches, landscapes); **outside**: more than 10 points from the share and outside its interval.", ""]
    return out


def render(cells: dict[str, Any], meta: dict[str, Any], lands_info: dict[str, Any],
           runs: list[dict[str, Any]] | None = None) -> str:
    budgets = meta["budgets"]
    out = ["# Live sampler benchmark: the true hypervolume of what the tuner measured", ""]
    out.append(f"{meta['seeds']} seed(s) per cell ({meta['seed_list']}); budgets {', '.join(map(str, budgets))} Optuna "
               f"trials (settled duplicates / ruled-out trials count, as with `--trials N`; `baselines = false`). "
               f"Each study is `python -m tuner.optimize --trials {max(budgets)} --sampler <s> --seed <seed>` against "
               f"the live emulator ({', '.join(f'{k}={v}' for k, v in EMULATOR_ENV.items())}, SGLANG_EMULATOR_SEED=<seed>). "
               f"Cells: HV(true values of the configs the COMPLETE launches measured) / HV(exhaustive front), in %, "
               f"mean and worst over seeds. Generated by `{meta['command']}` in {meta['wall_s'] / 60:.1f} min "
               f"({'sequential studies' if meta.get('jobs', 1) == 1 else str(meta['jobs']) + ' studies at a time'}, optuna {meta['optuna']}, Python {meta['python']}, {meta['machine']}).")
    out.append("")
    if meta.get("bench_set"):
        out.append(f"[bench] over the demo's: {meta['bench_set']} (`--bench-set`).")
        out.append("")
    if meta.get("workload") == "landscape":
        out.append(f"Workload: the landscape's own (`--workload landscape`: [bench] prompts = {LANDSCAPE_PROMPTS}), "
                   "the one the true values are computed for.")
        out.append("")
    out.append("Setup: studies/demo.toml's [bench] with the landscape's concurrency and request tokens; Qwen "
               "landscapes search studies/demo.toml's [space], the others `H200_SPACE`; true values from "
               "`benchmarks/sampler_benchmark.py · landscape(name).expect(params)`, normalised by the grid maximum.")
    out.append("")
    head = (["landscape", "sampler"] + [f"HV@{b} mean / worst" for b in budgets]
            + [f"HV@{b} sent prompts" for b in budgets] + [f"measured HV@{max(budgets)}", "launches", "failed launches (most)", "min / study", "s / trial", "notes"])
    out += ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for cell in cells.values():
        notes = [f"{cell['short']} run(s) stopped short" if cell["short"] else "",
                 f"{cell['not_ok']} run(s) not clean (see JSON)" if cell["not_ok"] else "",
                 f"{cell['disagree']} trial(s) disagree with the landscape" if cell["disagree"] else ""]
        line = [cell["landscape"], cell["sampler"]]
        line += [f"{cell['hv'][str(b)]['mean'] * 100:.1f} / {cell['hv'][str(b)]['worst'] * 100:.1f}" for b in budgets]
        line += [f"{cell['hv_prompts'][str(b)]['mean'] * 100:.1f} / {cell['hv_prompts'][str(b)]['worst'] * 100:.1f}"
                 for b in budgets]
        line += [f"{cell['hv_measured'][str(max(budgets))] * 100:.1f}", f"{cell['launches']:.1f}",
                 f"{cell['failed']:.2f} ({cell['failed_most']})" if "failed_most" in cell else f"{cell['failed']:.1f}",
                 f"{cell['minutes']:.1f}", f"{cell['seconds_per_trial']:.0f}", "; ".join(n for n in notes if n) or "-"]
        out.append("| " + " | ".join(line) + " |")
    out.append("")
    out.append("HV@B sent prompts: the same launches scored on the truth of the prompts the study sent "
               "(`sent_prompts`: each prompt's own acceptance shift in place of the mix's quantiles), against that "
               "truth's own exhaustive front: the search judged on what it could measure, less the timing noise. "
               "A few fixed prompts are not the mix (the demo's single-stream prompts are easier than it), and a "
               "search that follows its measurements finds the front of the prompts it measured.")
    out.append("")
    out.append("Launches and failed launches are per study over all its trials (PRUNED/FAIL launches; settled "
               "trials are not launches; most: the most in one study). Measured HV uses the noisy measured values, same normalisation (it can "
               "exceed 100%).")
    out.append("")
    out += _reliability(runs or [], budgets)
    out += _scatter(runs or [])
    out.append("## Landscapes")
    out.append("")
    out += ["| landscape | served as | front points | grid | what |", "|---|---|---|---|---|"]
    for name, info in lands_info.items():
        out.append(f"| {name} | `{info['served']}` | {info['front_size']} | {info['grid']} | {info['note']} |")
    out.append("")
    return "\n".join(out)


# --- Main -------------------------------------------------------------------------------------


def describe_landscapes(names: list[str]) -> dict[str, Any]:
    info = {}
    for name in names:
        lands = landscape(ALIASES.get(name, name))
        with tempfile.TemporaryDirectory() as tmp:
            srv = served(lands.spec, lands, 0, Path(tmp))
        env = {k: v for k, v in srv.env.items() if k in (PROFILE_ENV, LANDSCAPE_SEED_ENV)}
        shown = " ".join([*(f"{k}={'<profile.json>' if k == PROFILE_ENV else v}" for k, v in env.items()),
                          "--model-path", srv.model, *srv.flags])
        info[name] = {"served": shown, "front_size": lands.front_size, "front_hv": lands.front_hv,
                      "scale": lands.scale.tolist(), "grid": len(lands.table), "note": lands.spec.note,
                      "concurrency": lands.spec.concurrency, "request_tokens": lands.spec.request_tokens}
        print(f"landscape {name}: {len(lands.table)} configs, front {lands.front_size} points, "
              f"max {np.round(lands.scale, 1).tolist()}; served as {shown}", flush=True)
    return info


def _progress(r: dict[str, Any], budgets: list[int], done: int, total: int, t0: float) -> None:
    top = r["at"][max(budgets)]
    hvs = "  ".join(f"HV@{b} {r['at'][b]['hv'] * 100:5.1f}%" for b in budgets)
    print(f"  [{done}/{total}] {r['landscape']:<20} {r['sampler']:<6} seed {r['seed']}: {hvs}  "
          f"launches {top['launches']} (failed {top['failed']}), {top['trials']} trials in {r['run']['seconds'] / 60:.1f} min"
          f"{'' if r['ok'] else '  NOT CLEAN'}   [{(time.perf_counter() - t0) / 60:.1f} min]", flush=True)


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--landscapes", default="qwen-demo,llama8b-h100-128k,family:0",
                    help="comma list: qwen-demo, llama8b-h100-128k, family:N, tp4:N, or any sampler_benchmark LANDSCAPES name")
    ap.add_argument("--samplers", default="model,edge", help="comma list of tuner.optimize --sampler values")
    ap.add_argument("--seeds", type=int, default=1, help="seeds per (landscape, sampler); default 1")
    ap.add_argument("--first-seed", type=int, default=0, help="seeds are first-seed .. first-seed + seeds - 1")
    ap.add_argument("--budgets", default="10,20", help="comma list of trial budgets to score; the largest is run")
    ap.add_argument("--timeout", type=float, help=f"seconds per study (default {SECONDS_PER_TRIAL} per trial + 120)")
    ap.add_argument("--sglang-version", choices=("0.5.23", "0.5.9"), default="0.5.23",
                    help="the SGLang release the emulator plays (SGLANG_EMULATOR_VERSION): its memory_usage, logs, wordings")
    ap.add_argument("--jobs", type=int, default=1,
                    help="studies at once (default 1).  The emulator's decode steps are real time, mostly "
                         "waiting, so a few fit on two cores; the truth scored does not depend on timing, "
                         "but a loaded machine makes the measurements the sampler sees noisier")
    ap.add_argument("--workload", choices=("builtin", "landscape"), default="builtin",
                    help="what the studies measure: the demo's built-in class mix (default), or the landscape's "
                         "own workload (300-token chat prompts, 128-token answers) that the truth is computed for")
    ap.add_argument("--capture-reserve", type=float, metavar="SHARE",
                    help="every drawn landscape's unreported capture reserve, as a share of the card (0.12: "
                         "beyond the family's 1-8%%; sampler_benchmark.py's option), served as a JSON profile")
    ap.add_argument("--bench-set", action="append", default=[], metavar="KEY=VALUE",
                    help="a [bench] setting over the demo's (a TOML value: concurrent_requests=96); repeatable")
    ap.add_argument("--resume", action="store_true",
                    help="run only the studies <out>.studies.jsonl does not hold yet (a run killed or stopped), "
                         "and report them all")
    ap.add_argument("--merge", nargs="+", metavar="RUN.json",
                    help="run nothing: one report of these runs' studies (seeds run in chunks, say), written to --out")
    ap.add_argument("--out", default=str(DEFAULT_OUT), help="output path without extension")
    args = ap.parse_args(argv)
    if args.jobs < 1:
        ap.error(f"--jobs {args.jobs}: give 1 or more studies at once")
    WORKLOAD["name"] = args.workload
    for item in args.bench_set:
        key, sep, value = item.partition("=")
        try:
            BENCH_SET.update(tomllib.loads(f"{key.strip()} = {value.strip()}") if sep else {})
        except tomllib.TOMLDecodeError:
            sep = ""
        if not sep:
            ap.error(f"--bench-set {item!r}: give KEY=VALUE with a TOML value, e.g. concurrent_requests=96")
    if args.sglang_version != "0.5.23":
        EMULATOR_ENV["SGLANG_EMULATOR_VERSION"] = args.sglang_version
    if args.capture_reserve is not None:
        if not 0 <= args.capture_reserve < 0.5:
            ap.error(f"--capture-reserve {args.capture_reserve}: give a share of the card in [0, 0.5), e.g. 0.12")
        offline.CAPTURE_RESERVE = args.capture_reserve
    args.landscapes = args.landscapes.split(",")
    args.samplers = args.samplers.split(",")
    args.budgets = sorted({int(b) for b in args.budgets.split(",")})
    args.timeout = args.timeout or SECONDS_PER_TRIAL * max(args.budgets) + 120
    return args


def merge(paths: list[str], argv: list[str]) -> tuple[dict[str, Any], dict[str, Any], list[dict[str, Any]]]:
    """The studies of several runs as one run: a (landscape, sampler, seed) run twice counts
    once (the later file's).  The budgets must agree."""
    runs: dict[tuple, dict[str, Any]] = {}
    lands_info: dict[str, Any] = {}
    metas = []
    for path in paths:
        try:
            payload = (_journal_payload(Path(path)) if path.endswith(".studies.jsonl")
                       else json.loads(Path(path).read_text(encoding="utf-8")))
        except (OSError, ValueError, KeyError) as exc:
            raise SystemExit(f"--merge {path}: not a sampler_live run ({exc}); give the .json or .studies.jsonl a run wrote")
        metas.append(payload["meta"])
        lands_info.update(payload["landscapes"])
        for r in payload["runs"]:
            r["at"] = {int(b): v for b, v in r["at"].items()}  # JSON made the budgets strings
            runs[(r["landscape"], r["sampler"], r["seed"])] = r
    budgets = metas[0]["budgets"]
    if any(m["budgets"] != budgets for m in metas):
        raise SystemExit(f"--merge: the runs scored different budgets ({[m['budgets'] for m in metas]}); merge runs of one --budgets")
    seeds = sorted({r["seed"] for r in runs.values()})
    meta = {**metas[-1], "command": "; ".join(m["command"] for m in metas) + "; python benchmarks/sampler_live.py "
            + shlex.join(argv), "seeds": len(seeds), "seed_list": ", ".join(map(str, seeds)),
            "wall_s": sum(m["wall_s"] for m in metas), "jobs": max(m.get("jobs", 1) for m in metas)}
    return meta, lands_info, list(runs.values())


def _journal_payload(path: Path) -> dict[str, Any]:
    """A run's per-study journal (a run killed before its report) as a run's JSON."""
    runs = read_studies(path)
    if not runs:
        raise ValueError("no finished study in it")
    synthetic = isinstance(parse_config(runs[0]["config"]).bench.prompts, SyntheticPrompts)
    meta = {"command": f"(the studies of {path}, their minutes summed)", "budgets": sorted(runs[0]["at"]), "jobs": 1,
            "wall_s": sum(r["run"]["seconds"] for r in runs), "optuna": optuna.__version__,
            "python": platform.python_version(), "machine": f"{platform.machine()}, {os.cpu_count()} cores",
            "workload": "landscape" if synthetic else "builtin"}
    return {"meta": meta, "landscapes": describe_landscapes(sorted({r["landscape"] for r in runs})), "runs": runs}


def studies_path(out: Path) -> Path:
    """Each finished study, one JSON line, appended as it finishes: a run that is killed (the
    machine stalls, the shell goes) keeps every study it finished; `--resume` runs the rest."""
    return out.with_name(out.name + ".studies.jsonl")


def read_studies(path: Path) -> list[dict[str, Any]]:
    runs = []
    for line in path.read_text(encoding="utf-8").splitlines():
        try:
            r = json.loads(line)
        except ValueError:
            continue  # the line a kill cut short: that study is run again
        r["at"] = {int(b): v for b, v in r["at"].items()}  # JSON made the budgets strings
        runs.append(r)
    return runs


def write_report(meta: dict[str, Any], lands_info: dict[str, Any], runs: list[dict[str, Any]], out: Path) -> None:
    cells = summarise(runs, meta["budgets"])
    text = render(cells, meta, lands_info, runs)
    print()
    print(text)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.with_suffix(".md").write_text(text + "\n", encoding="utf-8")
    payload = {"meta": meta, "landscapes": lands_info, "cells": cells, "runs": runs}
    out.with_suffix(".json").write_text(json.dumps(payload, default=str, indent=1) + "\n", encoding="utf-8")
    print(f"wrote {out.with_suffix('.md')} and {out.with_suffix('.json')}")


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    if args.merge:
        meta, lands_info, runs = merge(args.merge, argv if argv is not None else sys.argv[1:])
        write_report(meta, lands_info, runs, Path(args.out))
        return 0 if all(r["ok"] for r in runs) else 1
    offline._check_hv3()
    t0 = time.perf_counter()
    lands_info = describe_landscapes(args.landscapes)
    seeds = list(range(args.first_seed, args.first_seed + args.seeds))
    # Seed by seed: a run stopped early has every landscape's first seeds, not a few landscapes' all.
    tasks = [(name, sampler, seed) for seed in seeds for name in args.landscapes for sampler in args.samplers]
    journal = studies_path(Path(args.out))
    journal.parent.mkdir(parents=True, exist_ok=True)
    earlier = read_studies(journal) if args.resume and journal.exists() else []
    earlier = [r for r in earlier if (r["landscape"], r["sampler"], r["seed"]) in set(tasks)]
    if earlier:
        done = {(r["landscape"], r["sampler"], r["seed"]) for r in earlier}
        print(f"--resume: {len(done)} studies already in {journal}", flush=True)
    else:
        done = set()
        journal.write_text("", encoding="utf-8")
    all_tasks, tasks = tasks, [t for t in tasks if t not in done]
    at_once = "one at a time" if args.jobs == 1 else f"{args.jobs} at a time"
    print(f"{len(tasks)} studies of {max(args.budgets)} trials, {at_once} (timeout {args.timeout / 60:.0f} min each)",
          flush=True)
    runs: list[dict[str, Any]] = []
    interrupted = False
    # Threads, not processes: each study is a tuner subprocess this thread waits on.
    pool = concurrent.futures.ThreadPoolExecutor(max_workers=args.jobs)
    futures = [pool.submit(live_study, name, sampler, seed, args.budgets, args.timeout) for name, sampler, seed in tasks]
    try:
        for i, future in enumerate(concurrent.futures.as_completed(futures), 1):
            runs.append(future.result())
            with open(journal, "a", encoding="utf-8") as f:
                f.write(json.dumps(runs[-1], default=str) + "\n")
            _progress(runs[-1], args.budgets, i, len(tasks), t0)
    except KeyboardInterrupt:
        interrupted = True
        for future in futures:
            future.cancel()
        for proc in list(_RUNNING):
            _stop(proc)
        print(f"interrupted: the running tuners were stopped; the report holds the {len(runs)} of {len(tasks)} "
              f"studies that had finished", file=sys.stderr)
    finally:
        pool.shutdown(wait=True, cancel_futures=True)
    runs = earlier + runs
    if not runs:
        return 130
    order = {(name, sampler, seed): (args.landscapes.index(name), args.samplers.index(sampler), seed)
             for name, sampler, seed in all_tasks}
    runs.sort(key=lambda r: order[(r["landscape"], r["sampler"], r["seed"])])
    done_seeds = sorted({r["seed"] for r in runs})
    meta = {"command": "python benchmarks/sampler_live.py " + shlex.join(argv if argv is not None else sys.argv[1:])
            + (f" (interrupted after {len(runs)} of {len(all_tasks)} studies)" if interrupted else "")
            + (f" ({len(earlier)} studies from an earlier run)" if earlier else ""),
            "jobs": args.jobs, "seeds": len(done_seeds), "seed_list": ", ".join(map(str, done_seeds)), "budgets": args.budgets,
            "wall_s": time.perf_counter() - t0, "optuna": optuna.__version__, "python": platform.python_version(),
            "machine": f"{platform.machine()}, {os.cpu_count()} cores", "emulator_env": EMULATOR_ENV,
            "workload": args.workload, "bench_set": BENCH_SET}
    write_report(meta, lands_info, runs, Path(args.out))
    return 130 if interrupted else 0 if all(r["ok"] for r in runs) else 1

if __name__ == "__main__":
    sys.exit(main())
