"""A Ctrl-C or SIGTERM at any moment of a study ends it within seconds: exit 130, no server left,
no trial RUNNING, every interrupted trial FAIL with its reason -- and a second signal does not
cut the first one's bookkeeping short.  The moment is found in the run's `--log-file` (its
phase and trial lines), never by sleeping, so the tests hold on a loaded machine."""

from __future__ import annotations

import fcntl
import os
import re
import signal
import subprocess
import time
from pathlib import Path

import optuna
import pytest
from optuna.trial import TrialState

from ..conftest import PYTHON, REPO, assert_no_server, free_port, write_config

pytestmark = pytest.mark.e2e

F_SETPIPE_SZ = getattr(fcntl, "F_SETPIPE_SZ", 1031)  # Linux; Python 3.10+ names it

# Start-up of ~3 s (readiness is a moment of its own) and decode steps in real time.
SLOW_ENV = 'SGLANG_EMULATOR_LOAD_SCALE = "0.03", SGLANG_EMULATOR_TIME_SCALE = "1"'
BENCH = "max_tokens = 200\nwarmup_requests = 2\nsingle_requests = 3\nsingle_min_passes = 2\nsingle_max_passes = 2\nconcurrency = 4\nconcurrent_requests = 12"
EXIT_WITHIN_S = 20.0  # ~2.5 s idle (the server's 2 s port linger included), 4.4 s at load 6; a hang is 60 s
MOMENT_TIMEOUT_S = 180.0  # a moment reached on an idle machine in under 40 s

# (name, a line of the log that marks the moment, whether the study measures its baselines)
MOMENTS = [
    ("baseline", r"phase: single pass 1 1/", True),
    ("launch", r"phase: launching", False),
    ("readiness", r"phase: waiting for the server", False),
    ("warm-up", r"phase: warm-up 1/", False),
    ("single stream", r"phase: single pass 1 1/", False),
    ("concurrent", r"phase: concurrency 4 1/", False),
    ("between trials (proposal)", r"trial +0 .*(COMPLETE|PRUNED)", False),
    ("second launch", r"(?s)trial +0 .*(COMPLETE|PRUNED).*phase: launching", False),
]


def _start(config: Path, log: Path, trials: int = 3) -> subprocess.Popen:
    return subprocess.Popen([PYTHON, "-m", "tuner.optimize", "--trials", str(trials), "--config", str(config),
                             "--log-file", str(log), "--seed", "3"],
                            cwd=REPO, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


def _wait_for(log: Path, pattern: str, proc: subprocess.Popen, timeout: float = MOMENT_TIMEOUT_S) -> None:
    deadline = time.monotonic() + timeout
    rx = re.compile(pattern)
    while time.monotonic() < deadline:
        if log.exists() and rx.search(log.read_text(errors="replace")):
            return
        if proc.poll() is not None:
            raise AssertionError(f"the tuner exited {proc.returncode} before {pattern!r}:\n{proc.stderr.read()[-3000:]}")
        time.sleep(0.05)
    proc.kill()
    raise AssertionError(f"{pattern!r} never appeared in {log} within {timeout} s")


def _all_trials(tmp_path: Path) -> list[optuna.trial.FrozenTrial]:
    storage = f"sqlite:///{tmp_path / 't.db'}"
    names = [s.study_name for s in optuna.get_all_study_summaries(storage)]
    return [t for name in names for t in optuna.load_study(study_name=name, storage=storage).trials]


def _ends_cleanly(proc: subprocess.Popen, tmp_path: Path, port: int, sent_at: float) -> str:
    try:
        _, err = proc.communicate(timeout=60)
    except subprocess.TimeoutExpired:
        proc.kill()
        raise AssertionError("the tuner was still running 60 s after the signal")
    took = time.monotonic() - sent_at
    assert proc.returncode == 130, err[-3000:]
    assert took < EXIT_WITHIN_S, f"exit took {took:.1f} s"
    assert "Traceback" not in err, err[-3000:]
    assert "Task was destroyed" not in err, err[-3000:]  # every open stream was closed
    assert_no_server(port)
    trials = _all_trials(tmp_path)
    assert not [t.number for t in trials if t.state == TrialState.RUNNING]
    for t in trials:
        if t.state == TrialState.FAIL:
            assert t.user_attrs.get("fail_reason"), f"trial {t.number} FAIL without a reason: {t.user_attrs}"
    return err


@pytest.mark.parametrize("moment,pattern,with_baselines", MOMENTS, ids=[m[0] for m in MOMENTS])
def test_a_signal_at_any_moment_ends_the_run_cleanly(tmp_path, moment, pattern, with_baselines):
    sig = signal.SIGTERM if MOMENTS.index((moment, pattern, with_baselines)) % 2 else signal.SIGINT
    port = free_port()
    config = write_config(tmp_path, port=port, env=SLOW_ENV, bench=BENCH,
                          study="baselines = true" if with_baselines else "",
                          space="speculative_num_steps = { low = 1, high = 3 }\nmem_fraction_static = { low = 0.80, high = 0.86, step = 0.02 }")
    log = tmp_path / "run.log"
    proc = _start(config, log)
    _wait_for(log, pattern, proc)
    proc.send_signal(sig)
    err = _ends_cleanly(proc, tmp_path, port, time.monotonic())
    if with_baselines:
        assert "baseline no speculation (measured again on the next run) recorded as FAIL (interrupted)" in err
    elif moment.startswith("between trials"):
        assert "interrupted" in err.splitlines()[-1]
    else:
        assert re.search(r"interrupted: trial \d+ \(.*\) recorded as FAIL \(interrupted\)", err), err[-2000:]


def test_a_second_signal_waits_for_the_bookkeeping_of_the_first(tmp_path):
    port = free_port()
    config = write_config(tmp_path, port=port, env=SLOW_ENV, bench=BENCH,
                          space="speculative_num_steps = { choices = [2] }\nmem_fraction_static = { choices = [0.84] }",
                          target="stop_timeout_s = 30")
    log = tmp_path / "run.log"
    proc = _start(config, log, trials=1)
    _wait_for(log, r"phase: single pass 1 1/", proc)
    proc.send_signal(signal.SIGINT)
    sent = time.monotonic()
    time.sleep(0.05)  # inside the first one's bookkeeping: stopping the server, writing the record
    proc.send_signal(signal.SIGINT)
    proc.send_signal(signal.SIGTERM)
    err = _ends_cleanly(proc, tmp_path, port, sent)
    assert "interrupted again: finishing the record" in err
    (trial,) = _all_trials(tmp_path)
    assert trial.state == TrialState.FAIL and trial.user_attrs["fail_reason"] == "interrupted"
    assert trial.user_attrs.get("log_tail")
    assert trial.user_attrs.get("server_log_artifact")


@pytest.mark.parametrize("sig", [signal.SIGINT, signal.SIGTERM], ids=["SIGINT", "SIGTERM"])
def test_a_signal_during_the_imports_is_one_line(tmp_path, sig):
    """`-X importtime` prints a line per finished import (~170 kB after the `tuner` package's own
    line).  Its stderr is a 4 kB pipe this test stops reading once the package's line came, so
    the command cannot get past its imports (optuna, pydantic, openai) before the signal lands,
    however loaded the machine: a test that only raced the imports once lost."""
    read_end, write_end = os.pipe()
    fcntl.fcntl(write_end, F_SETPIPE_SZ, 4096)
    proc = subprocess.Popen([PYTHON, "-X", "importtime", "-m", "tuner.optimize", "--trials", "1", "--config", str(tmp_path / "x.toml")],
                            cwd=REPO, stdout=subprocess.DEVNULL, stderr=write_end)
    os.close(write_end)
    seen = b""
    with os.fdopen(read_end, "rb", buffering=0) as stderr:
        while b"| tuner\n" not in seen:  # the package is imported (its hook set); the command's modules are next
            chunk = stderr.read(4096)
            if not chunk:
                raise AssertionError("no import line for the package:\n" + seen[-2000:].decode(errors="replace"))
            seen += chunk
        proc.send_signal(sig)
        rest = (seen[seen.index(b"| tuner\n"):] + stderr.read()).decode(errors="replace")
    proc.wait(timeout=30)
    said = [line for line in rest.splitlines()[1:] if not line.startswith("import time:")]
    assert proc.returncode == 130, rest[-2000:]
    assert said == ["interrupted while starting: nothing was run"], said[-20:]
