"""Measurements a user can act on, checked against the emulator's own model."""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap

import optuna
import pytest

from tuner.server.client import ServerClient
from tuner.config import parse_config
from sglang_emulator import model as m
from sglang_emulator.profiles import PROFILES
from tuner.measure.runner import measure
from tuner.measure.workload import load_workload

from ..conftest import REPO, run_cli, write_config

pytestmark = pytest.mark.e2e

BENCH = """
max_tokens = 96
single_requests = 4
single_min_passes = 1
single_max_passes = 1
concurrency = 4
concurrent_requests = 12
warmup_requests = 1
"""


def _bench(temperature: float, **extra: str):
    lines = [line for line in BENCH.strip().splitlines() if line.split(" = ")[0] not in extra]
    lines += [f"{k} = {v}" for k, v in extra.items()] + [f"temperature = {temperature}"]
    text = '[study]\nname = "b"\n[server]\ncommand = "x --speculative-algorithm NEXTN"\n[bench]\n' + "\n".join(lines) + "\n"
    return parse_config(text).bench


def test_sampling_temperature_lowers_acceptance_and_speed_as_the_model_predicts(start_emulator):
    emu = start_emulator("--speculative-algorithm", "NEXTN", "--speculative-num-steps", "3", "--speculative-eagle-topk", "1",
                         "--speculative-num-draft-tokens", "4", env={"SGLANG_EMULATOR_TIME_SCALE": "0.5", "SGLANG_EMULATOR_SEED": "7"})
    emu.wait_healthy()
    client = ServerClient(emu.url)
    workload = load_workload("builtin")
    results = {}
    for t in (0.0, 0.8):
        bench = _bench(t)
        results[t] = measure(url=emu.url, bench=bench, info=client.server_info(), workload=workload, client=client)
    q = PROFILES["qwen3.5-122b-a10b"]
    spec = m.SpecShape("EAGLE", 3, 1, 4)
    shifts = [-0.5, 0.0, 0.5]
    predicted = sum(m.expected_accept_length(q, spec, temperature=0.8, prompt_shift=s) for s in shifts) / \
        sum(m.expected_accept_length(q, spec, temperature=0.0, prompt_shift=s) for s in shifts)
    measured_accept = results[0.8].accept_length / results[0.0].accept_length
    measured_speed = results[0.8].single_tps / results[0.0].single_tps
    assert predicted < 0.95  # the model predicts a real drop ...
    # ... and the server shows it.  A starved client sends a request again, which shifts every later
    # request's seed (wire.py: seed = bench.seed + sent): 0.898 idle, up to 0.926 at load 6, against
    # 0.873 predicted; a drop that did not happen would read ~1.0.
    assert measured_accept == pytest.approx(predicted, abs=0.08), (measured_accept, predicted)
    assert measured_speed == pytest.approx(predicted, abs=0.08)  # step time is the same: speed follows acceptance


def test_ignore_eos_reports_greedy_inflation(start_emulator):
    emu = start_emulator("--speculative-algorithm", "NEXTN", env={"SGLANG_EMULATOR_TIME_SCALE": "0.25"})
    emu.wait_healthy()
    client = ServerClient(emu.url)
    bench = _bench(0.0, ignore_eos="true", max_tokens="600")
    result = measure(url=emu.url, bench=bench, info=client.server_info(), workload=load_workload("builtin"), client=client)
    assert result.greedy_inflation > 1.1


def test_bench_cli_measures_a_running_server_and_a_launched_one(tmp_path, start_emulator):
    emu = start_emulator("--speculative-algorithm", "NEXTN", env={"SGLANG_EMULATOR_TIME_SCALE": "0.25"})
    emu.wait_healthy()
    config = write_config(tmp_path, port=emu.port)
    running = subprocess.run([sys.executable, "-m", "tuner.bench", "--config", str(config), "--json"], capture_output=True, text=True, cwd=REPO, timeout=300)
    assert running.returncode == 0, running.stderr
    figures = json.loads(running.stdout)
    assert figures["single_tps"] > 0 and figures["accept_length"] > 1
    emu.stop()
    launched = subprocess.run([sys.executable, "-m", "tuner.bench", "--config", str(config), "--flags",
                               "--speculative-num-steps 1 --speculative-eagle-topk 1 --speculative-num-draft-tokens 2"],
                              capture_output=True, text=True, cwd=REPO, timeout=300)
    assert launched.returncode == 0, launched.stderr
    assert "--speculative-num-steps 1" in launched.stderr and "single_tps" in launched.stdout
    assert "objective capacity" in launched.stdout


def test_concurrency_levels_are_objective_columns_and_slos_are_constraints(tmp_path):
    config = write_config(
        tmp_path,
        bench=textwrap.dedent(BENCH).replace("concurrency = 4", "concurrency = [1, 4]"),
        space="speculative_num_steps = { choices = [1, 3] }",
    )
    text = config.read_text() + "\n[constraints]\np99_itl_ms = 1000\nttft_ms = 60000\n"
    config.write_text(text)
    result = run_cli("--trials", "2", "--config", str(config))
    assert result.returncode == 0, result.stderr
    study = optuna.load_study(study_name="t", storage=f"sqlite:///{tmp_path / 't.db'}")
    assert study.metric_names == ["single_tps", "concurrent_tps@1", "concurrent_tps@4", "capacity"]
    for t in study.trials:
        assert len(t.values) == 4 and t.values[2] > t.values[1]
        assert len(t.user_attrs["constraints"]) == 2 and all(v < 0 for v in t.user_attrs["constraints"])
