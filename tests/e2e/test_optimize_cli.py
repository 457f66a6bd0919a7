"""The real CLI against real emulator processes: what a study records, each readiness outcome."""

from __future__ import annotations


import optuna
import pytest
from optuna.trial import TrialState

from ..conftest import run_cli, write_config

pytestmark = pytest.mark.e2e

CONTRACT_ATTRS = {"launch_command", "max_total_num_tokens", "max_running_requests", "accept_length", "ttft_ms"}


def _study(tmp_path, name="t"):
    return optuna.load_study(study_name=name, storage=f"sqlite:///{tmp_path / (name + '.db')}")


def test_runs_trials_records_the_contract_and_resumes(tmp_path):
    config = write_config(tmp_path)
    first = run_cli("--trials", "3", "--config", str(config), "--seed", "1")
    assert first.returncode == 0, first.stderr
    assert "Pareto front of study 't'" in first.stdout
    study = _study(tmp_path)
    assert study.metric_names == ["single_tps", "concurrent_tps", "capacity"]
    assert [d.name for d in study.directions] == ["MAXIMIZE"] * 3
    complete = [t for t in study.trials if t.state == TrialState.COMPLETE]
    assert len(study.trials) == 3 and complete
    for t in complete:
        assert CONTRACT_ATTRS <= set(t.user_attrs)
        steps, topk = t.params["speculative_num_steps"], t.params["speculative_eagle_topk"]
        cmd = t.user_attrs["launch_command"]
        assert f"--speculative-num-steps {steps} --speculative-eagle-topk {topk} --speculative-num-draft-tokens" in cmd
        if topk == 1:
            assert "speculative_num_draft_tokens" not in t.params
            assert f"--speculative-num-draft-tokens {steps + 1}" in cmd
        single, concurrent, capacity = t.values
        assert single > 0 and concurrent > single  # four requests in flight beat one
        assert capacity == min(t.user_attrs["max_running_requests"], t.user_attrs["max_total_num_tokens"] // 8192)
        assert t.user_attrs["accept_length"] > 1.0
    second = run_cli("--trials", "2", "--config", str(config))
    assert second.returncode == 0, second.stderr
    assert len(_study(tmp_path).trials) == 5
    assert "3 earlier trial(s)" in second.stderr


@pytest.mark.parametrize("mfs, reason", [(0.60, "KV cache does not fit in mem_fraction_static at "), (0.97, "CUDA graph capture ran out of memory at ")])
def test_memory_failures_are_pruned_with_their_reason_in_seconds(tmp_path, mfs, reason):
    # Loading takes ~1.6 s, the failure comes right after it, the port holder lingers 2 s (5-6 s
    # a trial, idle or loaded); the ready timeout is 60 s.
    config = write_config(
        tmp_path,
        space=f"mem_fraction_static = {{ choices = [{mfs}] }}\nspeculative_num_steps = {{ choices = [2] }}",
        env='SGLANG_EMULATOR_LOAD_SCALE = "0.02", SGLANG_EMULATOR_TIME_SCALE = "1"',
    )
    result = run_cli("--trials", "1", "--config", str(config))
    assert result.returncode == 0, result.stderr
    (trial,) = _study(tmp_path).trials
    assert trial.state == TrialState.PRUNED
    assert reason in trial.user_attrs["fail_reason"] and f"mem_fraction_static={mfs}" in trial.user_attrs["fail_reason"]
    assert (trial.datetime_complete - trial.datetime_start).total_seconds() < 20
    assert "Received sigquit from a child process" in trial.user_attrs["log_tail"]
    assert "no trial completed (1 pruned)" in result.stdout


def test_a_flag_the_server_rejects_ends_the_study_after_the_first_trial(tmp_path):
    config = write_config(tmp_path, command_flags="--speculative-algorithm NEXTN --cuda-graph-max-bs 16")
    result = run_cli("--trials", "5", "--config", str(config))
    assert result.returncode == 2
    last = result.stderr.strip().splitlines()[-1]
    assert last.startswith("error: the server finds --cuda-graph-max-bs ambiguous") and "[server] command" in last
    trials = _study(tmp_path).trials
    assert len(trials) == 1 and trials[0].state == TrialState.FAIL
    assert "Traceback" not in result.stderr


def test_a_missing_model_ends_the_study(tmp_path):
    config = write_config(tmp_path, model="nobody/no-such-model")
    result = run_cli("--trials", "3", "--config", str(config))
    assert result.returncode == 2
    assert "model nobody/no-such-model does not exist on the target; fix --model-path in [server] command" in result.stderr
    assert len(_study(tmp_path).trials) == 1


def test_a_server_that_dies_alike_whatever_its_flags_ends_the_study_after_three_launches(tmp_path):
    """An NCCL failure in distributed init is no pattern diagnose ties to a flag (an "exit"):
    each trial is pruned with it, and the third alike ends the run instead of spending the other
    17 launches (model loads) on it."""
    config = write_config(tmp_path, env='SGLANG_EMULATOR_LOAD_SCALE = "0.005", SGLANG_EMULATOR_FAULT = "nccl_at_init"')
    result = run_cli("--trials", "20", "--config", str(config))
    assert result.returncode == 2, result.stderr
    last = result.stderr.strip().splitlines()[-1]
    assert last.startswith("error: the last 3 launches failed alike: the server exited"), last
    assert "NCCL error in" in last and "fix the target or [server] command" in last
    trials = _study(tmp_path).trials
    assert len(trials) == 3 and all(t.state == TrialState.PRUNED for t in trials)
    # after a crash the next launch is another shape, not the same flags again
    assert len({(t.params.get("speculative_num_steps"), t.params.get("speculative_eagle_topk")) for t in trials}) == 3
    assert "Traceback" not in result.stderr


def test_a_server_that_never_answers_is_pruned_at_the_timeout(tmp_path):
    config = write_config(tmp_path, ready_timeout_s=2, env='SGLANG_EMULATOR_LOAD_SCALE = "1"',
                          space="speculative_num_steps = { choices = [2] }")
    result = run_cli("--trials", "1", "--config", str(config))
    assert result.returncode == 0, result.stderr
    trial = _study(tmp_path).trials[0]
    assert trial.state == TrialState.PRUNED
    assert "did not answer /health_generate within ready_timeout_s=2 s" in trial.user_attrs["fail_reason"]


def test_a_server_dying_mid_benchmark_fails_the_trial_and_the_study_goes_on(tmp_path):
    config = write_config(tmp_path, env='SGLANG_EMULATOR_LOAD_SCALE = "0.005", SGLANG_EMULATOR_TIME_SCALE = "0.25", SGLANG_EMULATOR_FAULT = "crash_after_tokens=150"',
                          space="speculative_num_steps = { choices = [2] }")
    result = run_cli("--trials", "2", "--config", str(config))
    assert result.returncode == 0, result.stderr
    trials = _study(tmp_path).trials
    assert [t.state for t in trials] == [TrialState.FAIL, TrialState.FAIL]
    reason = trials[0].user_attrs["fail_reason"]
    assert "mid-benchmark" in reason and "exited (-9)" in reason


def test_bad_config_is_one_line_and_no_trial(tmp_path):
    config = write_config(tmp_path, bench="concurency = 8")
    result = run_cli("--trials", "1", "--config", str(config))
    assert result.returncode == 2
    assert result.stderr.strip() == f"error: {config} [bench] concurency: unknown key; check its spelling against the README's config reference"


def test_another_server_on_the_port_is_refused(tmp_path, start_emulator):
    other = start_emulator("--speculative-algorithm", "NEXTN", env={"SGLANG_EMULATOR_TIME_SCALE": "0.2"})
    other.wait_healthy()
    config = write_config(tmp_path, port=other.port)
    result = run_cli("--trials", "1", "--config", str(config))
    assert result.returncode == 2
    assert "something already answers at" in result.stderr
    assert other.proc.poll() is None  # not ours: left alone
