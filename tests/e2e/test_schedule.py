"""`python -m tuner.schedule` end to end on the emulator: the table from measurements (reusing the
study's, launching what is missing), written where SGLang loads it; --apply and --restore."""

from __future__ import annotations

import json
import subprocess

import httpx
import optuna
import pytest
from optuna.trial import TrialState

from ..conftest import PYTHON, REPO, run_cli, stop_servers_left_in, wait_serving, write_config

pytestmark = pytest.mark.e2e

SPACE = "speculative_num_steps = { low = 1, high = 2 }\nspeculative_eagle_topk = { choices = [1] }"


def schedule(*args: str, timeout: float = 600) -> subprocess.CompletedProcess:
    return subprocess.run([PYTHON, "-m", "tuner.schedule", *args], capture_output=True, text=True, cwd=REPO, timeout=timeout)


def test_no_verify_writes_a_loadable_table_reusing_the_study_and_launching_only_what_is_missing(tmp_path):
    config = write_config(tmp_path, space=SPACE)
    assert run_cli("--trials", "1", "--config", str(config), "--seed", "0").returncode == 0
    storage = f"sqlite:///{tmp_path / 't.db'}"
    measured = optuna.load_study(study_name="t", storage=storage).trials[0].params["speculative_num_steps"]
    out = tmp_path / "t.adaptive.json"
    result = schedule("--config", str(config), "--levels", "1,4", "--out", str(out), "--no-verify")
    assert result.returncode == 0, result.stderr
    table = json.loads(out.read_text())
    assert list(table) == ["1", "4"] and json.loads(result.stdout) == table
    for slot in table.values():
        assert set(slot) == {"candidate_steps"} and slot["candidate_steps"]
        assert all(isinstance(s, int) and 0 <= s <= 2 for s in slot["candidate_steps"])
    launches = optuna.load_study(study_name="t@baselines", storage=storage).trials
    steps = sorted(t.user_attrs["schedule"]["steps"] for t in launches)
    # The study measured one steps value at level 4 only: every steps value is launched once (for
    # level 1), speculation off included; each launch measured every level.
    assert steps == [0, 1, 2] and all(t.state == TrialState.COMPLETE for t in launches)
    for t in launches:
        assert t.user_attrs["schedule"]["role"] == "static" and set(t.user_attrs["concurrent_tps_by_level"]) >= {"1", "4"}
    assert "--speculative" not in next(t for t in launches if t.user_attrs["schedule"]["steps"] == 0).user_attrs["launch_command"]
    assert any(f"--speculative-num-steps {measured}" in t.user_attrs["launch_command"] for t in launches)
    # Everything is measured now: a second run launches nothing and writes the same table.
    again = schedule("--config", str(config), "--levels", "1,4", "--out", str(out), "--no-verify")
    assert again.returncode == 0, again.stderr
    assert len(optuna.load_study(study_name="t@baselines", storage=storage).trials) == 3
    assert json.loads(out.read_text()) == table and "launch" not in again.stderr


def test_apply_installs_the_table_beside_the_workdir_and_restore_undoes_it(tmp_path):
    config = write_config(tmp_path, space="speculative_num_steps = { choices = [2] }\nspeculative_eagle_topk = { choices = [1] }",
                          bench=BENCH_ONE_LEVEL)
    assert run_cli("--trials", "1", "--config", str(config)).returncode == 0
    port = int(config.read_text().split("--port ")[1].split()[0])
    out = tmp_path / "out.json"
    try:
        result = schedule("--config", str(config), "--levels", "2", "--out", str(out), "--no-verify", "--apply")
        assert result.returncode == 0, result.stderr
        installed = tmp_path / "work" / "t.adaptive.json"
        assert json.loads(installed.read_text()) == json.loads(out.read_text())
        wait_serving(port)
        info = httpx.get(f"http://127.0.0.1:{port}/server_info").json()
        assert info["speculative_adaptive"] is True
        assert f"--speculative-adaptive-config {installed}" in info["launch_command"]
        assert "applied: ready" in result.stderr
        restored = schedule("--config", str(config), "--restore")
        assert restored.returncode == 0, restored.stderr
        assert not installed.exists() and "restored:" in restored.stderr
        with pytest.raises(httpx.HTTPError):
            httpx.get(f"http://127.0.0.1:{port}/health", timeout=2)
    finally:
        stop_servers_left_in(tmp_path)


BENCH_ONE_LEVEL = """
max_tokens = 32
single_requests = 1
single_min_passes = 1
single_max_passes = 1
concurrency = 2
concurrent_requests = 4
warmup_requests = 1
"""


def test_a_study_of_another_algorithm_gets_one_line_naming_why(tmp_path):
    config = write_config(tmp_path, command_flags="--speculative-algorithm STANDALONE --speculative-draft-model-path x",
                          space="speculative_num_steps = { choices = [2] }")
    optuna.create_study(study_name="t", storage=f"sqlite:///{tmp_path / 't.db'}")
    result = schedule("--config", str(config), "--no-verify")
    assert result.returncode == 2
    assert result.stderr.startswith("error: ") and "adaptive mode runs EAGLE/EAGLE3/NEXTN only" in result.stderr


def test_verification_compares_the_tuned_table_with_sglangs_default_and_the_best_static_per_level(tmp_path):
    config = write_config(tmp_path, space="speculative_num_steps = { choices = [1] }\nspeculative_eagle_topk = { choices = [1] }",
                          bench=BENCH_ONE_LEVEL)
    assert run_cli("--trials", "1", "--config", str(config)).returncode == 0
    out = tmp_path / "t.json"
    result = schedule("--config", str(config), "--levels", "1,2", "--out", str(out))
    assert result.returncode == 0, result.stderr
    assert "| in flight | best static (steps) | SGLang default table | tuned table |" in result.stderr
    assert "verdict: " in result.stderr and "changing load 1 -> 2: no stream dropped" in result.stderr
    roles = [t.user_attrs["schedule"]["role"] for t in optuna.load_study(study_name="t@baselines", storage=f"sqlite:///{tmp_path / 't.db'}").trials]
    assert roles.count("tuned") == 1 and roles.count("sglang_default") == 1
    tuned = next(t for t in optuna.load_study(study_name="t@baselines", storage=f"sqlite:///{tmp_path / 't.db'}").trials
                 if t.user_attrs["schedule"]["role"] == "tuned")
    assert tuned.user_attrs["speculative_adaptive"] is True and "--speculative-adaptive-config" in tuned.user_attrs["launch_command"]
    assert json.loads(out.read_text()) == tuned.user_attrs["schedule"]["table"]


# Short code prompts, one category: the emulator reads "code" off their words (model.prompt_category)
# and raises their acceptance (profiles.CATEGORY_SHIFTS); none is a summarisation or maths prompt.
CODE_PROMPTS = [
    "Write a Python function that reverses a singly linked list in place.",
    "Write a JavaScript function that debounces another function by 200 ms.",
    "Write a SQL query that lists the ten customers with the most orders.",
    "Write a bash script that renames every .jpeg file in a folder to .jpg.",
    "Write a Python class for a stack with push, pop and peek methods.",
    "Write a TypeScript function that deep-merges two plain objects.",
    "Write a regular expression that matches ISO 8601 dates, with a Python example.",
    "Write a Python function that parses a CSV line with quoted fields.",
]
LEVEL, MAX_TOKENS = 8, 96
# Four rounds of LEVEL requests: a steady window long enough that two launches of one table
# agree within ~3% on the loaded machine (two rounds of 64 tokens left ~5% between them).
BENCH_CODE = f"""
max_tokens = {MAX_TOKENS}
single_requests = 1
single_min_passes = 1
single_max_passes = 1
concurrency = {LEVEL}
concurrent_requests = {4 * LEVEL}
warmup_requests = 1
"""


HALF_SPEED = 'SGLANG_EMULATOR_LOAD_SCALE = "0.0025", SGLANG_EMULATOR_TIME_SCALE = "0.5"'


def expected_gain_of_steps_5_over_sglangs_default() -> float:
    """What the emulator's own model expects at LEVEL requests in flight on CODE_PROMPTS: steps 5
    over SGLang's default table, replayed with SGLang's policy (landscape.adaptive_level)."""
    from sglang_emulator import landscape as L
    from sglang_emulator.adaptive import load_adaptive_config
    from sglang_emulator.model import prompt_category

    assert {prompt_category(p) for p in CODE_PROMPTS} == {"code"}
    w = L.Workload(max_tokens=MAX_TOKENS, prompt_tokens=40, concurrency=LEVEL, category="code")
    default = L.adaptive_level("qwen3.5-122b-a10b", load_adaptive_config(None), batch=LEVEL, workload=w)
    tuned = L.static_level("qwen3.5-122b-a10b", batch=LEVEL, steps=5, workload=w)
    # The premise: the default's slot for 8..31 running requests is "8": [0, 1, 3], so it runs
    # steps 3 whatever its EMA says, and steps 5 is faster than 3 there.
    assert default.steps == ((3, 1.0),)
    return tuned.tokens_per_s / default.tokens_per_s - 1


def test_verification_shows_the_tuned_table_ahead_of_sglangs_default_where_the_model_says_so(tmp_path):
    # Qwen3.5 MTP at temperature 0, 8 code prompts in flight.  A batch of 8 routes to the default
    # table's "8": [0, 1, 3] slot (adaptive.AdaptiveTable.slot_key: padded to the capture size,
    # nearest lower key), so SGLang's default is pinned at steps 3 by its table, not by its EMA;
    # code's high acceptance makes steps 5 ~14% faster there (model; measured +15%).  The short
    # dips below 8 while a finished request's replacement is prefilled route to "1" and are a
    # few percent of the verifies.  Not 16 in flight: the default's largest candidate (7) leaves
    # 10 requests running, steps 5 13, so at 16 the gain (+33-48%) would be the cap's, not the
    # steps'.  Not one stream either: there the "1": [1, 3, 5, 7] slot's EMA of each request's
    # accepted drafts crosses 2.5 and climbs to 5 (the live emulator logs "steps 3 -> 5" and
    # back on the built-in mix; on code the model has it at 5 ~80% of the time, +2-3%), which is
    # why the one-stream version of this test measured no gain once acceptance varied by prompt.
    expected = expected_gain_of_steps_5_over_sglangs_default()
    assert expected > 0.08, expected
    prompts = tmp_path / "code.jsonl"
    prompts.write_text("".join(json.dumps({"prompt": p, "category": "code"}) + "\n" for p in CODE_PROMPTS))
    # Half speed (TIME_SCALE 0.5, not the suite's 0.25): half the streamed chunks a second, so the
    # emulator and the client stay ahead of the simulated GPU on a loaded 2-core machine.  At
    # 0.25 beside the rest of the suite, CI once measured the tuned table (steps 5 throughout) 9%
    # below the study's steps-5 launch and level with the default: CPU-bound, not the model.
    config = write_config(tmp_path, space="speculative_num_steps = { choices = [5] }\nspeculative_eagle_topk = { choices = [1] }",
                          bench=BENCH_CODE + f'prompts = "{prompts}"', env=HALF_SPEED)
    assert run_cli("--trials", "1", "--config", str(config)).returncode == 0
    out = tmp_path / "t.json"
    result = schedule("--config", str(config), "--levels", str(LEVEL), "--out", str(out))
    assert result.returncode == 0, result.stderr
    assert json.loads(out.read_text()) == {str(LEVEL): {"candidate_steps": [5]}}
    row = next(line for line in result.stderr.splitlines() if line.startswith(f"| {LEVEL} |"))
    gain = float(row.rstrip(" |").rsplit("|", 1)[1].strip().rstrip("%"))
    # Half the model's gain: above the launch-to-launch noise (two launches of SGLang's default
    # table measured -1.1% and +1.5% apart here), and far from the 0% of the same table twice.
    assert gain > 50 * expected, (row, f"model: {expected:+.1%}")
    assert f"ahead of SGLang's default table at {LEVEL}" in result.stderr
