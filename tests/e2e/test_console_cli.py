"""The operator's console (#18) on the real CLI: baselines that heal and stop the run on a fatal
launch error, `--trials 0`, `--dry-run`, `--json`, `--log-file`."""

from __future__ import annotations

import json
import socket

import optuna
import pytest
from optuna.trial import TrialState

from ..conftest import free_port, run_cli, write_config

pytestmark = pytest.mark.e2e


def _names(tmp_path) -> list[str]:
    return optuna.get_all_study_names(f"sqlite:///{tmp_path / 't.db'}")


def test_trials_zero_launches_nothing_not_even_a_baseline(tmp_path):
    config = write_config(tmp_path, study="baselines = true")
    result = run_cli("--trials", "0", "--config", str(config), timeout=60)
    assert result.returncode == 0, result.stderr
    assert "nothing launched (--trials 0)" in result.stdout
    assert _names(tmp_path) == ["t"]  # no t@baselines: no baseline was launched


def test_dry_run_writes_nothing_and_warns_that_two_trials_measure_nothing(tmp_path):
    config = write_config(tmp_path, study="baselines = true")
    result = run_cli("--trials", "2", "--config", str(config), "--dry-run", timeout=60)
    assert result.returncode == 0, result.stderr
    out = result.stdout
    assert "nothing answers there yet; nothing started" in out and "reachable" not in out  # nothing listens on the port
    assert "baseline no speculation: " in out and "baseline adaptive: " in out and "--speculative-adaptive" in out
    # The default (model) sampler's first launch: SGLang's default shape at a safe fraction,
    # 55% up the searched 0.80-0.90 (tuner/search/model_sampler.py · _design).
    assert "trial 0 (warm start: sglang_default): " in out and "--mem-fraction-static 0.84" in out
    assert "estimate: " in out and "GPU-hours on 4 GPU(s)" in out and "default: no launch measured yet" in out
    assert "warning: --trials 2: the first trials find the memory edge" in " ".join(result.stderr.split())
    assert not (tmp_path / "t.db").exists()


def test_a_silent_port_holder_is_refused_before_anything_is_launched(tmp_path):
    port = free_port()
    config = write_config(tmp_path, port=port, study="baselines = true")
    with socket.socket() as silent:  # holds the port and never answers HTTP
        silent.bind(("127.0.0.1", port))
        silent.listen()
        result = run_cli("--trials", "2", "--config", str(config))
    assert result.returncode == 2, result.stderr
    assert result.stderr.strip().splitlines()[-1].startswith(f"error: something already answers at http://127.0.0.1:{port}")
    assert "Traceback" not in result.stderr


def test_a_fatal_baseline_stops_the_run_and_baselines_are_measured_again_next_run(tmp_path):
    port = free_port()
    good = write_config(tmp_path, port=port, study="baselines = true")
    bad = tmp_path / "bad.toml"
    bad.write_text(good.read_text().replace("--model-path Qwen/Qwen3.5-122B-A10B", "--model-path no/such-model"))
    first = run_cli("--trials", "2", "--config", str(bad))
    assert first.returncode == 2, first.stderr
    assert first.stderr.strip().splitlines()[-1].startswith("error: model no/such-model does not exist")
    assert "Traceback" not in first.stderr
    sibling = optuna.load_study(study_name="t@baselines", storage=f"sqlite:///{tmp_path / 't.db'}")
    (failed,) = sibling.trials  # the run stopped at the first baseline
    assert failed.state == TrialState.FAIL and "does not exist" in failed.user_attrs["fail_reason"]
    assert not optuna.load_study(study_name="t", storage=f"sqlite:///{tmp_path / 't.db'}").trials
    config = good

    log = tmp_path / "run.log"
    second = run_cli("--trials", "1", "--config", str(config), "--json", "--log-file", str(log))
    assert second.returncode == 0, second.stderr
    doc = json.loads(second.stdout)
    assert set(doc) >= {"study", "objectives", "trials_run", "trials", "front", "baselines", "over_baselines", "error"}
    assert doc["trials_run"] == 1 and sum(doc["trials"].values()) == 1
    assert {k: v["state"] for k, v in doc["baselines"].items()} == {"no_speculation": "COMPLETE", "adaptive": "COMPLETE"}
    assert set(doc["baselines"]["no_speculation"]["values"]) == set(doc["objectives"])
    text = log.read_text()
    assert "baseline  no speculation" in text and "trial   0" in text

    again = run_cli("--trials", "1", "--config", str(config), "--dry-run", timeout=60)
    assert again.returncode == 0, again.stderr
    assert "baseline " not in again.stdout.replace("baseline(s)", "")  # both measured: none to launch
    assert "median of" in again.stdout  # the estimate comes from the study's own history


@pytest.mark.parametrize("storage, message", [
    ("mysql://tuner@localhost/optuna", "error: --storage: 'mysql://tuner@localhost/optuna' is not a store the tuner supports; use sqlite:///path.db"),
    ("sqlite:///{tmp}/no/such/dir/x.db", "error: --storage: folder {tmp}/no/such/dir does not exist"),
])
def test_storage_errors_are_exactly_one_line(tmp_path, storage, message):
    config = write_config(tmp_path)
    result = run_cli("--trials", "1", "--config", str(config), "--storage", storage.format(tmp=tmp_path), timeout=60)
    assert result.returncode == 2
    assert len(result.stderr.splitlines()) == 1 and result.stderr.startswith(message.format(tmp=tmp_path))
    assert not (tmp_path / "no").exists()


def test_dry_run_launches_carry_the_admin_api_key_and_the_estimate_follows_the_sampler(tmp_path):
    """Every launch passes --admin-api-key (the baselines' too: /flush_cache answers 401
    without it), redacted in what is shown; the estimate counts the memory edge's failed
    launches only for a sampler that walks the edge (auto, model, edge), the one --sampler names."""
    config = write_config(tmp_path, study="baselines = true", target='admin_api_key_env = "T_ADMIN_KEY"')
    env = {"T_ADMIN_KEY": "admin-secret-123"}
    result = run_cli("--trials", "2", "--config", str(config), "--dry-run", "--json", "--sampler", "random", timeout=60, env=env)
    assert result.returncode == 0, result.stderr
    plan = json.loads(result.stdout)
    assert [launch.get("baseline") for launch in plan["launches"][:2]] == ["no_speculation", "adaptive"]
    assert all("--admin-api-key <redacted>" in launch["launch_command"] for launch in plan["launches"]), plan["launches"]
    assert "admin-secret-123" not in result.stdout
    assert plan["estimate"]["expected_failed_launches"] == 0 and plan["warnings"] == []
    edge = json.loads(run_cli("--trials", "2", "--config", str(config), "--dry-run", "--json", "--sampler", "edge",
                              timeout=60, env=env).stdout)
    assert edge["estimate"]["expected_failed_launches"] == 2 and edge["estimate"]["duration_s"] != plan["estimate"]["duration_s"]
