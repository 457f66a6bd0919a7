"""What the console says, in order and nothing more (issue 25 item 10)."""

from __future__ import annotations

import json
import subprocess

import optuna
import pytest
from optuna.trial import TrialState

from ..conftest import PYTHON, REPO, assert_no_server, free_port, run_cli, write_config

pytestmark = pytest.mark.e2e

ONE = "speculative_num_steps = { choices = [2] }\nmem_fraction_static = { choices = [0.84] }"


def test_verbose_logs_the_tuners_steps_not_every_http_request(tmp_path):
    config = write_config(tmp_path, space=ONE)
    result = run_cli("--trials", "1", "--config", str(config), "-v", timeout=300)
    assert result.returncode == 0, result.stderr
    lines = result.stderr.splitlines()
    assert any(line.startswith("INFO tuner") for line in lines)
    assert not [line for line in lines if "httpx" in line or "HTTP Request" in line], lines[:5]


def test_bench_says_ready_before_the_benchmark_lines(tmp_path):
    config = write_config(tmp_path, space=ONE)
    result = subprocess.run([PYTHON, "-m", "tuner.bench", "--config", str(config), "--flags",
                             "--speculative-num-steps 1 --speculative-eagle-topk 1 --speculative-num-draft-tokens 2"],
                            capture_output=True, text=True, cwd=REPO, timeout=300)
    assert result.returncode == 0, result.stderr
    lines = result.stderr.splitlines()
    ready = next(i for i, line in enumerate(lines) if line.startswith("ready in "))
    first_phase = next(i for i, line in enumerate(lines) if line.startswith("  "))
    assert lines[0].startswith("launching: ") and ready < first_phase


def test_the_log_file_does_not_echo_on_stderr_nor_twice(tmp_path):
    config = write_config(tmp_path, space=ONE)
    log = tmp_path / "run.log"
    result = run_cli("--trials", "1", "--config", str(config), "--log-file", str(log), timeout=300)
    assert result.returncode == 0, result.stderr
    assert not [line for line in result.stderr.splitlines() if line.startswith("INFO ")]
    text = log.read_text()
    assert text.count("study t in ") == 1 and "phase: launching" in text and "phase: single pass 1 1/" in text


def test_bench_flags_sglang_cannot_start_with_are_one_line_naming_the_missing_flag_before_any_launch(tmp_path):
    # SGLang's own failure is a TypeError ('>' not supported between 'NoneType' and 'int') after
    # a model load; the flags are complete or the launch does not happen.
    port = free_port()
    config = write_config(tmp_path, port=port, space=ONE)  # the command: --speculative-algorithm NEXTN, no steps
    result = subprocess.run([PYTHON, "-m", "tuner.bench", "--config", str(config), "--flags", "--speculative-num-steps 3"],
                            capture_output=True, text=True, cwd=REPO, timeout=300)
    assert result.returncode == 2, result.stderr
    lines = [line for line in result.stderr.splitlines() if line.strip()]
    assert len(lines) == 1 and lines[0].startswith("error: --flags: with --speculative-num-steps SGLang needs --speculative-eagle-topk"), lines
    assert "launching" not in result.stderr
    assert_no_server(port)


def test_a_prompt_beyond_the_servers_context_stops_the_run_at_its_first_launch_naming_the_fix(tmp_path):
    # SGLang answers 400 to a request longer than its context; no searched flag changes that, and
    # the run failed every trial alike, each after a model load.
    prompts = tmp_path / "prompts.jsonl"
    rows = [{"prompt": "Summarise: " + "lorem ipsum dolor sit amet " * 400, "category": "long"}]
    rows += [{"prompt": f"Write a short poem number {i} about the sea.", "category": "chat"} for i in range(3)]
    prompts.write_text("".join(json.dumps(r) + "\n" for r in rows))
    port = free_port()
    config = write_config(tmp_path, port=port, space=ONE, command_flags="--speculative-algorithm NEXTN --context-length 1024",
                          bench=f'max_tokens = 64\nwarmup_requests = 1\nsingle_requests = 4\nconcurrency = 2\nconcurrent_requests = 4\nprompts = "{prompts}"')
    result = run_cli("--trials", "3", "--config", str(config), timeout=300)
    assert result.returncode == 2, result.stderr
    (line,) = [x for x in result.stderr.splitlines() if x.startswith("error:")]
    assert "[bench] prompts" in line and "longer than its context" in line and "--context-length" in line, line
    trials = optuna.load_study(study_name="t", storage=f"sqlite:///{tmp_path / 't.db'}").trials
    assert [t.state for t in trials] == [TrialState.FAIL]  # one launch, not three
    assert "longer than its context" in trials[0].user_attrs["fail_reason"]
    assert_no_server(port)
