"""Figures per request class, end to end: a study on short chat and ~16k-token prompts against
an emulator whose physics makes deep speculation win on chat and lose on long context."""

from __future__ import annotations

import json
import math
import subprocess
import textwrap
import time

import optuna
import pytest
from optuna.trial import TrialState

from sglang_emulator import model as m
from sglang_emulator.profiles import profile_from_dict

from ..conftest import PYTHON, REPO, run_cli, write_config

pytestmark = pytest.mark.e2e

TIME_SCALE = 0.25
MAX_TOKENS = 128
# A costly draft (a small standalone model rather than one EAGLE layer) and acceptance falling
# fast with context: on chat deep speculation pays, at 16k tokens one draft step is best
# (the truth below: steps 4 beats steps 1 by ~20% on chat and loses by ~20% at 16k).
PROFILE = {"base": "llama-3.1-8b-instruct", "draft_timing": {"stream_ms": 1.0},
           "acceptance": {"context_decay": 0.5, "prompt_spread": 0.0}}
PROMPTS = ('[{ category = "chat", input_len = 60, output_len = 128, range_ratio = 1.0, num_prompts = 8 }, '
           '{ category = "long_context", input_len = 16000, output_len = 128, range_ratio = 1.0, num_prompts = 4 }]')


def truth(steps: int, prompt_tokens: int) -> float:
    """The emulator's own single-stream decode rate at this context (its model, time-scaled)."""
    profile = profile_from_dict(PROFILE)
    spec = m.SpecShape("EAGLE3", steps, 1, steps + 1) if steps else m.SpecShape(None, 0, 0, 0)
    accept = m.expected_accept_length(profile, spec, temperature=0.0, prompt_shift=m.context_shift(profile.acceptance, prompt_tokens))
    return accept / m.step_ms(profile, spec=spec, batch=1, context_tokens=prompt_tokens + MAX_TOKENS // 2) * 1000 / TIME_SCALE


def _best(config, objective: str) -> dict:
    out = subprocess.run([PYTHON, "-m", "tuner.best", "--config", str(config), "--pick", objective, "--json"],
                         capture_output=True, text=True, timeout=120, cwd=REPO)
    assert out.returncode == 0, out.stderr
    return json.loads(out.stdout) | {"stderr": out.stderr}


def test_a_two_class_study_records_each_class_and_picks_per_class(tmp_path):
    profile = tmp_path / "profile.json"
    profile.write_text(json.dumps(PROFILE))
    bench = textwrap.dedent(f"""
        max_tokens = {MAX_TOKENS}
        single_requests = 8
        single_min_passes = 2
        single_max_passes = 3
        concurrency = 4
        concurrent_requests = 8
        warmup_requests = 1
        mix = {{ chat = 0.5, long_context = 0.5 }}
        prompts = {PROMPTS}
    """)
    config = write_config(
        tmp_path, model="meta-llama/Llama-3.1-8B-Instruct",
        command_flags="--speculative-algorithm EAGLE3 --speculative-num-steps 1 --speculative-eagle-topk 1 --speculative-num-draft-tokens 2",
        env=f'SGLANG_EMULATOR_LOAD_SCALE = "0.005", SGLANG_EMULATOR_TIME_SCALE = "{TIME_SCALE}", SGLANG_EMULATOR_PROFILE = "{profile}"',
        # The warm start measures the command's steps 1, then SGLang's Llama default (5) moved to 4.
        space="speculative_num_steps = { choices = [1, 4] }\nspeculative_eagle_topk = { choices = [1] }",
        study='objectives = ["single_tps:chat", "single_tps:long_context", "capacity"]\nbaselines = true', bench=bench)
    result = run_cli("--trials", "2", "--config", str(config), timeout=900)
    assert result.returncode == 0, result.stderr
    assert "request_tokens=" in result.stderr and "(auto)" in result.stderr  # the value chosen, in the trial line

    study = optuna.load_study(study_name="t", storage=f"sqlite:///{tmp_path / 't.db'}")
    trials = {t.params["speculative_num_steps"]: t for t in study.trials if t.state == TrialState.COMPLETE}
    assert set(trials) == {1, 4}
    for steps, t in trials.items():
        by_class = t.user_attrs["by_class"]
        assert set(by_class) == {"chat", "long_context"}
        for name, tokens in (("chat", 60), ("long_context", 16000)):
            figures = by_class[name]
            assert figures["requests"] >= 4 and figures["accept_length"] > 1
            assert figures["prompt_tokens_median"] == pytest.approx(tokens, rel=0.05, abs=40)  # + the chat template
            assert figures["single_tps"] == pytest.approx(truth(steps, int(figures["prompt_tokens_median"])), rel=0.15), (steps, name)
            assert figures["concurrent_tps_by_level"] == {"4": figures["concurrent_tps"]}  # the study's one level
        # capacity from the measured footprint: the mix's mean prompt tokens (usage) + max_tokens
        expected = math.ceil(sum(0.5 * (f["prompt_tokens_median"] + MAX_TOKENS) for f in by_class.values()))
        assert t.user_attrs["request_tokens"] == pytest.approx(expected, abs=2)
        assert t.values[2] == min(t.user_attrs["max_running_requests"], t.user_attrs["max_total_num_tokens"] // t.user_attrs["request_tokens"])

    chat, long = _best(config, "single_tps:chat"), _best(config, "single_tps:long_context")
    assert chat["flags"]["speculative_num_steps"] == 4 and long["flags"]["speculative_num_steps"] == 1
    assert any(loss.startswith("long_context: ") and "x no speculation" in loss for loss in chat["losses"])
    assert "slower than no speculation on long_context" in chat["stderr"]

    out = subprocess.run([PYTHON, "-m", "tuner.report", "--config", str(config), "--out", str(tmp_path / "report")],
                         capture_output=True, text=True, timeout=300, cwd=REPO)
    assert out.returncode == 0, out.stderr
    report = (tmp_path / "report" / "report.md").read_text()
    section = report.split("## Per request class", 1)[1].split("\n## ", 1)[0]
    assert "| no speculation | long_context |" in section and f"| trial {trials[4].number} | long_context |" in section
    assert f"trial {trials[4].number}: long_context: " in section  # the chat pick's loss, named


def test_a_level_ends_at_its_request_count_or_level_seconds_whichever_first(start_emulator):
    """Issue 25 item 11: a level sends a few times its concurrency (not one global count) and
    stops sending after [bench] level_seconds."""
    from tuner.config import parse_config
    from tuner.measure.runner import measure
    from tuner.measure.workload import bench_workload
    from tuner.server.client import ServerClient

    emu = start_emulator("--speculative-algorithm", "NEXTN", env={"SGLANG_EMULATOR_TIME_SCALE": "0.25"})
    emu.wait_healthy()
    client = ServerClient(emu.url)

    def run(level_seconds: float) -> tuple[dict[str, int], float]:
        bench = parse_config(HEAD + f"max_tokens = 256\nsingle_requests = 1\nsingle_min_passes = 1\nsingle_max_passes = 1\n"
                                    f"concurrency = [1, 4]\nconcurrent_requests = 64\nwarmup_requests = 0\nlevel_seconds = {level_seconds}\n"
                                    'prompts = { input_len = 50, output_len = 256, range_ratio = 1.0, num_prompts = 8, category = "chat" }\n').bench
        sent: dict[str, int] = {}
        spans: dict[str, list[float]] = {}

        def progress(phase: str, done: int, total: int) -> None:
            sent[phase] = max(sent.get(phase, 0), done)
            spans.setdefault(phase, []).append(time.monotonic())

        measure(url=emu.url, bench=bench, info=client.server_info(), workload=bench_workload(bench), client=client, progress=progress)
        level_1 = spans["concurrency 1"]
        return sent, level_1[-1] - level_1[0]

    sent, _ = run(600)
    assert sent["concurrency 1"] == 8 and sent["concurrency 4"] == 16  # min(concurrent_requests, 4 x level)
    sent, span = run(1.0)
    assert 1 <= sent["concurrency 1"] < 8 and span < 1.0 + 3.0


HEAD = '[study]\nname = "x"\n[server]\ncommand = "x --speculative-algorithm NEXTN"\n[bench]\n'


def test_the_dry_run_shows_the_measurement_time_per_trial(tmp_path):
    config = write_config(tmp_path, bench="concurrency = [1, 8]\nlevel_seconds = 30")
    result = run_cli("--trials", "3", "--dry-run", "--config", str(config), timeout=120)
    assert result.returncode == 0, result.stderr
    # Before any history the emulator's own default measurement time (the config runs the
    # emulator), and the cap two levels of 30 s put on the concurrent phase.
    from tuner.results.estimate import EMULATOR_MEASURE_S
    assert (f"measurement {EMULATOR_MEASURE_S:.0f} s per trial (the emulator's default, concurrent levels capped at 60 s by "
            "[bench] level_seconds)") in result.stdout + result.stderr
