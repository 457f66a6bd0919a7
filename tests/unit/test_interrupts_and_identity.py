"""Signals land where they are sent, and a measured server is the one launched (issue 25)."""

from __future__ import annotations

import os
import signal
import threading
import time

import invoke
import pytest

from tuner import interrupts
from tuner.config import TargetConfig
from tuner.errors import LaunchError
from tuner.server.client import Rank, ServerInfo
from tuner.server.host import connect
from tuner.server.readiness import check_server_args
from tuner.sglang_args import CommandLine


def _signal_once(path, sig: int = signal.SIGINT, timeout_s: float = 60.0) -> None:
    """Signal this process as soon as `path` exists: the command is running, however loaded the
    machine (a fixed 0.3 s timer once fired after the command had ended)."""
    def wait_then_signal() -> None:
        deadline = time.monotonic() + timeout_s
        while not path.exists() and time.monotonic() < deadline:
            time.sleep(0.02)
        os.kill(os.getpid(), sig)

    threading.Thread(target=wait_then_signal, daemon=True).start()


def test_a_ctrl_c_during_a_local_shell_command_is_raised_once_it_ends(tmp_path):
    """Invoke forwards the interrupt to the command and returned as if nothing happened: the run
    that got a Ctrl-C during one of a launch's many short polls went on with its study."""
    shell = connect(TargetConfig())
    running = tmp_path / "running"
    _signal_once(running)
    started = time.monotonic()
    with pytest.raises(KeyboardInterrupt):
        shell.run(f"touch {running}; sleep 2; echo done > {tmp_path / 'ended'}")
    assert (tmp_path / "ended").exists()  # let finish (a pid file is never left half-written) ...
    assert time.monotonic() - started < 30  # ... and raised when it ended, not at the run's end
    assert shell.run("echo still usable").stdout.strip() == "still usable"


@pytest.mark.parametrize("step", ["_unify_kwargs_with_config", "generate_env", "start", "start_timer", "create_io_threads", "wait"])
def test_a_ctrl_c_at_any_step_of_a_local_command_is_a_ctrl_c(monkeypatch, step):
    """A signal arriving while Invoke was still setting the command up came out as AttributeError
    (Local.stop read `using_pty` before it was set) and the tuner exited 1, not 130 (a fresh-clone
    CI run).  Each step of Invoke's run is interrupted in turn, as a signal can land in any."""
    shell = connect(TargetConfig())
    original = getattr(invoke.runners.Local, step)
    signals = [KeyboardInterrupt()]  # one signal: Invoke calls wait() again after one

    def interrupted(self, *args, **kwargs):
        if step not in ("start", "wait"):
            raise signals.pop()  # before the command exists
        result = original(self, *args, **kwargs)  # the command is under way when it lands
        if signals:
            raise signals.pop()
        return result

    monkeypatch.setattr(invoke.runners.Local, step, interrupted)
    with pytest.raises(KeyboardInterrupt):
        shell.run("true")
    monkeypatch.undo()
    assert shell.run("echo still usable").stdout.strip() == "still usable"


def test_a_signal_during_a_deferred_step_is_raised_when_the_step_ends(tmp_path):
    """A server's start and the record of its pid happen together or not at all."""
    previous = {s: signal.getsignal(s) for s in (signal.SIGINT, signal.SIGTERM)}
    steps = []
    try:
        interrupts.install()
        with pytest.raises(KeyboardInterrupt):
            with interrupts.deferred():
                os.kill(os.getpid(), signal.SIGTERM)
                deadline = time.monotonic() + 30
                while not interrupts.stopping() and time.monotonic() < deadline:
                    time.sleep(0.01)
                steps.append("the step went on after the signal")
            steps.append("never: raised at the block's end")
        assert steps == ["the step went on after the signal"]
    finally:
        for s, h in previous.items():
            signal.signal(s, h)


def test_after_the_first_signal_later_ones_wait_for_the_bookkeeping(capsys):
    previous = {s: signal.getsignal(s) for s in (signal.SIGINT, signal.SIGTERM)}
    try:
        interrupts.install()
        with pytest.raises(KeyboardInterrupt):
            os.kill(os.getpid(), signal.SIGTERM)
            time.sleep(1)
        assert interrupts.stopping()
        os.kill(os.getpid(), signal.SIGINT)  # the bookkeeping goes on
        time.sleep(0.05)
        assert interrupts.AGAIN_LINE in capsys.readouterr().err
    finally:
        for s, h in previous.items():
            signal.signal(s, h)


def _info(**args) -> ServerInfo:
    return ServerInfo(version="0.5.23", ranks=(Rank(1000, 8),), args=args)


LAUNCHED = CommandLine.split("python -m sglang.launch_server --model-path m --speculative-algorithm NEXTN "
                             "--speculative-num-steps 2 --speculative-eagle-topk 2 --speculative-num-draft-tokens 5 "
                             "--mem-fraction-static 0.84")
SAME = dict(speculative_algorithm="NEXTN", speculative_num_steps=2, speculative_eagle_topk=2,
            speculative_num_draft_tokens=5, mem_fraction_static=0.84)


def test_the_server_launched_passes_the_identity_check():
    check_server_args(_info(**SAME, startup_time=time.time()), LAUNCHED, "http://x", launched_at=time.time() - 3)


@pytest.mark.parametrize("other,said", [
    ({"mem_fraction_static": 0.9}, "mem_fraction_static=0.9, not the launched 0.84"),
    ({"speculative_num_draft_tokens": 6}, "speculative_num_draft_tokens=6, not the launched 5"),
    ({"speculative_num_steps": 3}, "speculative_num_steps=3, not the launched 2"),
    ({"speculative_algorithm": None}, "speculative_algorithm=None, not the launched NEXTN"),
    ({"startup_time": time.time() - 3600}, "s before this launch"),
])
def test_another_server_on_the_port_is_refused_by_what_it_reports(other, said):
    with pytest.raises(LaunchError) as exc:
        check_server_args(_info(**{**SAME, **other}), LAUNCHED, "http://x", launched_at=time.time())
    assert exc.value.fatal and said in exc.value.reason and "another server answers at [target] url" in exc.value.reason


def test_a_speculating_server_is_not_the_no_speculation_baseline():
    with pytest.raises(LaunchError, match="speculative_algorithm=EAGLE, not the launched None"):
        check_server_args(_info(speculative_algorithm="EAGLE"), CommandLine.split("python -m sglang.launch_server --model-path m"), "http://x")


# -- config types (item 9) -------------------------------------------------------------------
from tests.unit.test_config import _err  # noqa: E402  (the config tests' own helper)


@pytest.mark.parametrize("extra,expected", [
    ('[bench]\nmax_tokens = "128"', "x.toml [bench] max_tokens: is the string '128', not a whole number; write it without quotes: 128"),
    ('[bench]\ntemperature = "0.7"', "x.toml [bench] temperature: is the string '0.7', not a number; write it without quotes: 0.7"),
    ('[bench]\nignore_eos = "true"', "x.toml [bench] ignore_eos: is the string 'true', not true or false; write it without quotes: true"),
    ('[space]\nspeculative_eagle_topk = { choices = "1,2,4" }',
     "x.toml [space] speculative_eagle_topk choices: is the string '1,2,4', not a list; write it as a list: [1, 2, 4]"),
])
def test_a_value_of_the_wrong_type_is_named_with_its_fix(extra, expected):
    assert _err(extra) == expected


def test_a_broken_prompts_file_names_the_config_key(tmp_path):
    from tuner.errors import ConfigError
    from tuner.measure.workload import load_workload

    (tmp_path / "p.jsonl").write_text('{"prompt": "hi"}\nnot json\n')
    with pytest.raises(ConfigError, match=r"^\[bench\] prompts: .*p.jsonl line 2: not valid JSON"):
        load_workload("p.jsonl", base_dir=tmp_path)
    (tmp_path / "e.jsonl").write_text("\n")
    with pytest.raises(ConfigError, match=r"^\[bench\] prompts: e.jsonl has no usable prompts"):
        load_workload("e.jsonl", base_dir=tmp_path)


# -- console text (item 8) -------------------------------------------------------------------
def test_a_failed_baseline_shows_its_whole_reason_with_the_section_it_names():
    import optuna
    from rich.console import Console

    from tuner.results.terminal import baselines_table

    reason = "model Qwen/X does not exist on the target; fix --model-path in [server] command (in studies/demo.toml)"
    t = optuna.trial.create_trial(state=optuna.trial.TrialState.FAIL, user_attrs={"fail_reason": reason, "baseline": "adaptive"})
    console = Console(width=100, record=True)
    console.print(baselines_table({"adaptive": t}, ["single_tps", "concurrent_tps", "capacity"]))
    text = " ".join(console.export_text().split())
    assert reason in text


def test_best_list_tells_schedule_launches_from_baselines(tmp_path):
    import optuna

    from tuner.results.storage import study_summaries

    storage = optuna.storages.RDBStorage(f"sqlite:///{tmp_path / 's.db'}")
    sibling = optuna.create_study(study_name="t@baselines", storage=storage, directions=["maximize"])
    sibling.add_trial(optuna.trial.create_trial(values=[1.0], user_attrs={"baseline": "no_speculation"}))
    for steps in (1, 2):
        sibling.add_trial(optuna.trial.create_trial(values=[2.0], user_attrs={"schedule": {"role": "static", "steps": steps}}))
    (row,) = study_summaries(storage)
    assert row["trials"] == {"complete": 3} and row["kinds"] == {"baselines": 1, "schedule launches": 2}


def test_the_dashboard_note_puts_the_launch_command_one_option_per_line():
    from tuner.results.notes import trial_note

    command = "/opt/venv/bin/python -m sglang.launch_server --model-path Qwen/Qwen3.5-122B-A10B --tp 4 " + " ".join(
        f"--option-{i} {i}" for i in range(20))
    note = trial_note(state="COMPLETE", attrs={"launch_command": command})
    block = note.split("```")[1]
    assert max(len(line) for line in block.splitlines()) < 80
    assert block.replace(" \\\n    ", " ").strip() == command  # pastes back as the same command


def test_the_first_estimate_on_the_emulator_uses_the_emulators_speed():
    from tuner.results.estimate import estimate

    real = estimate([], n_trials=20, n_baselines=2, gpus=4)
    emulated = estimate([], n_trials=20, n_baselines=2, gpus=4, emulator=True)
    assert real.total_s > 30 * 60  # a real server: minutes per launch
    assert 3 * 60 < emulated.total_s < 10 * 60  # the demo's 20 trials + 2 baselines take about 6 minutes
    assert "the emulator's default" in " ".join(emulated.sources)
