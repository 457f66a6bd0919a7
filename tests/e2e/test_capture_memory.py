"""A failed launch's capture log says what was free (issue #23): the emulator prints SGLang's
capture lines runner by runner (0.5.23 and 0.5.9 wordings) and the tuner reads them."""

from __future__ import annotations

import optuna
import pytest

from sglang_emulator import landscape as L
from sglang_emulator.profiles import PROFILES
from tuner.search import model as M
from tuner.server.diagnose import capture_memory, classify

from ..conftest import run_cli, write_config

pytestmark = pytest.mark.e2e

SHAPE = ("--speculative-algorithm", "EAGLE3", "--speculative-num-steps", "5", "--speculative-eagle-topk", "4",
         "--speculative-num-draft-tokens", "16")


@pytest.mark.parametrize("version", ["0.5.23", "0.5.9"])
def test_a_graph_oom_logs_what_was_free_and_the_tuner_reads_it(start_emulator, version):
    edge = L.mem_fraction_edge(PROFILES["llama-3.1-8b-instruct"], steps=5, topk=4, draft_tokens=16, algorithm="EAGLE3")
    too_high = f"{min(edge + 0.02, 0.99):.3f}"
    emu = start_emulator(*SHAPE, "--mem-fraction-static", too_high, model="meta-llama/Llama-3.1-8B-Instruct",
                         env={"SGLANG_EMULATOR_VERSION": version})
    emu.wait_exit(timeout=60)
    log = emu.log()
    assert classify(log, None).kind == "memory_graph"
    got = capture_memory(log)
    assert got is not None and got["failed_runner"] is not None, log[-2000:]
    # What was free before the first graph: the slack of the static pool minus the activations,
    # never more than the slack itself.
    slack = (PROFILES["llama-3.1-8b-instruct"].gpu.total_mib - PROFILES["llama-3.1-8b-instruct"].gpu.context_mib) / 1024 * (1 - float(too_high))
    assert 0 <= got["free_before"] <= slack + 0.01


def test_a_started_launch_logs_every_runner_and_its_batch_sizes(start_emulator):
    emu = start_emulator(*SHAPE, "--mem-fraction-static", "0.80", model="meta-llama/Llama-3.1-8B-Instruct")
    emu.wait_healthy(timeout=60)
    got = capture_memory(emu.log())
    assert set(got["runners"]) == {"target_verify", "draft_decode", "draft_extend"} and got["failed_runner"] is None
    assert got["cuda_graph_max_bs"] == 48
    verify = got["runners"]["target_verify"]
    assert verify["avail_before"] - verify["usage"] == pytest.approx(verify["avail_after"], abs=0.011)


def test_a_trial_on_sglang_0_5_9_keeps_what_its_capture_left_for_the_model(tmp_path):
    # 0.5.9's memory_usage has no startup_available: the tuner must keep the capture log's
    # figures of a launch that started, not only of one that failed, or the model takes the
    # whole slack as free and climbs into graph OOMs (#23; live on 0.5.9, 3-4 of 10 failed).
    config = write_config(tmp_path, env='SGLANG_EMULATOR_LOAD_SCALE = "0.005", SGLANG_EMULATOR_TIME_SCALE = "0.25", '
                                         'SGLANG_EMULATOR_VERSION = "0.5.9"',
                          space="speculative_num_steps = { choices = [2] }\nmem_fraction_static = { choices = [0.88] }")
    result = run_cli("--trials", "1", "--config", str(config))
    assert result.returncode == 0, result.stderr
    trial = optuna.load_study(study_name="t", storage=f"sqlite:///{tmp_path / 't.db'}").trials[0]
    assert trial.state == optuna.trial.TrialState.COMPLETE and trial.user_attrs["sglang_version"] == "0.5.9"
    assert "startup_available" not in trial.user_attrs["memory_usage"]
    capture = trial.user_attrs["capture_memory"]
    assert capture["failed_runner"] is None and capture["runners"]
    left = M.launches([trial], None)[0].memory["startup_available"]
    assert left == min(r["avail_after"] for r in capture["runners"].values())
    assert 0 < left < capture["free_before"]
