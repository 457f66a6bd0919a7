"""ResilientStorage: a locked or away database is waited for, trial writes wait in a journal,
past the limit one line, and the next run writes the journal back."""

import os
import sqlite3
import threading
import time

import optuna
import pytest
from optuna.trial import TrialState

from tuner.errors import ConfigError
from tuner.results import resilient
from tuner.results.resilient import ResilientStorage, StorageOutage
from tuner.results.storage import storage_for_url


def _storage(tmp_path, *, outage_s=30.0, heartbeat=None):
    url = f"sqlite:///{tmp_path / 's.db'}"
    kwargs = {"heartbeat_interval": heartbeat, "grace_period": heartbeat * 2} if heartbeat else {}
    inner = optuna.storages.RDBStorage(url, engine_kwargs={"connect_args": {"timeout": 0.2}}, **kwargs)
    return ResilientStorage(inner, url=url, outage_s=outage_s, journal_dir=tmp_path / "journal")


def _lock(tmp_path, seconds: float) -> threading.Thread:
    """Another process's write transaction holding the sqlite file for `seconds`."""
    held = threading.Event()

    def hold():
        db = sqlite3.connect(str(tmp_path / "s.db"), isolation_level=None)
        db.execute("BEGIN EXCLUSIVE")
        held.set()
        time.sleep(seconds)
        db.execute("COMMIT")
        db.close()

    thread = threading.Thread(target=hold)
    thread.start()
    held.wait()
    return thread


def test_a_locked_store_is_waited_for_and_the_write_goes_through_the_journal(tmp_path):
    storage = _storage(tmp_path)
    lines = []
    storage.notify = lines.append
    study = optuna.create_study(storage=storage, study_name="s")
    trial = study.ask()
    holder = _lock(tmp_path, 2.0)
    seen_journal = []
    watcher = threading.Thread(target=lambda: [seen_journal.append(storage.journal.path.exists()) or time.sleep(0.1) for _ in range(10)])
    watcher.start()
    trial.set_user_attr("single_tps", 123.0)
    study.tell(trial, [1.0])
    holder.join()
    watcher.join()
    assert any(seen_journal), "the write should have waited in the journal"
    assert not storage.journal.path.exists()
    (done,) = study.trials
    assert done.state == TrialState.COMPLETE and done.user_attrs["single_tps"] == 123.0 and done.values == [1.0]
    assert lines and "waiting for the study's database sqlite:///" in lines[0]


def test_past_the_limit_one_line_and_the_next_run_writes_the_journal_back(tmp_path):
    storage = _storage(tmp_path, outage_s=1.0)
    study = optuna.create_study(storage=storage, study_name="s")
    trial = study.ask()
    holder = _lock(tmp_path, 3.0)
    with pytest.raises(StorageOutage, match=r"sqlite:///.*s\.db did not answer for 1 s .*1 trial write\(s\) wait in"):
        trial.set_user_attr("single_tps", 7.0)
    with pytest.raises(StorageOutage):  # gave up: everything after fails at once
        study.tell(trial, [1.0])
    holder.join()
    # The journal of a tuner that is gone (a pid no process has).
    dead = storage.journal.path.with_name(storage.journal.path.name.replace(f".{os.getpid()}.", ".999999999."))
    storage.journal.path.rename(dead)
    nxt = optuna.load_study(study_name="s", storage=_storage(tmp_path))
    warnings = []
    assert resilient.settle(nxt, warnings.append) == 1
    assert nxt.trials[0].user_attrs["single_tps"] == 7.0 and not dead.exists()
    assert "wrote back 1 trial write(s)" in warnings[0]


def test_heartbeats_never_fail_a_trial_and_no_trial_is_stale_right_after_an_outage(tmp_path):
    storage = _storage(tmp_path, heartbeat=1)
    study = optuna.create_study(storage=storage, study_name="s")
    trial = study.ask()
    storage.record_heartbeat(trial._trial_id)
    holder = _lock(tmp_path, 0.5)
    storage.record_heartbeat(trial._trial_id)  # fails quietly: no exception reaches the trial
    holder.join()
    assert storage.last_failure > float("-inf")
    deadline = time.monotonic() + 6  # past the grace period (the store's clock has whole seconds)
    while storage.inner._get_stale_trial_ids(study._study_id) != [trial._trial_id]:
        assert time.monotonic() < deadline
        time.sleep(0.2)
    storage.last_failure = time.monotonic()  # an outage just ended: heartbeats resume first
    assert storage._get_stale_trial_ids(study._study_id) == []
    storage.last_failure = float("-inf")
    assert storage._get_stale_trial_ids(study._study_id) == [trial._trial_id]


def test_a_damaged_store_is_one_line(tmp_path):
    (tmp_path / "bad.db").write_bytes(b"this is not a database at all" * 100)
    with pytest.raises(ConfigError, match=r"bad\.db.*(not a database|damaged)"):
        storage_for_url(f"sqlite:///{tmp_path / 'bad.db'}")


def test_a_signal_during_a_database_call_lands_after_it_and_the_store_stays_usable(tmp_path):
    """CI: a SIGINT in the sampler's proposal raised inside SQLAlchemy's fetch, which invalidated
    the connection mid-read and printed a pool traceback ("Cannot operate on a closed
    database") before the run's one line."""
    import signal

    from tuner import interrupts

    storage = _storage(tmp_path)
    study = optuna.create_study(storage=storage, study_name="s")
    study.tell(study.ask(), [1.0])
    real, reads = storage.inner.get_all_trials, []

    def signalled_read(*args, **kwargs):
        os.kill(os.getpid(), signal.SIGINT)
        deadline = time.monotonic() + 30
        while not interrupts.stopping() and time.monotonic() < deadline:
            time.sleep(0.01)  # the handler has run by now, in the middle of the call
        trials = real(*args, **kwargs)
        reads.append(len(trials))
        return trials

    interrupts.install()
    storage.inner.get_all_trials = signalled_read
    with pytest.raises(KeyboardInterrupt):
        study.get_trials()
    assert reads == [1], "the read should have finished before the interrupt was raised"
    storage.inner.get_all_trials = real
    assert [t.state for t in study.get_trials()] == [TrialState.COMPLETE]  # the bookkeeping can go on


def test_a_database_call_in_another_thread_never_holds_a_signal(tmp_path):
    """The heartbeat thread's calls are not deferred: only the main thread handles signals, and
    a deferral counted there would hold a Ctrl-C for as long as a heartbeat takes."""
    from tuner import interrupts

    held = []
    thread = threading.Thread(target=lambda: held.append(_deferring_inside()))
    thread.start()
    thread.join()
    assert held == [0]
    assert _deferring_inside() == 1


def _deferring_inside() -> int:
    from tuner import interrupts

    with interrupts.deferred():
        return interrupts._state["deferring"]


@pytest.mark.parametrize("queued", [False, True], ids=["new trial", "queued trial"])
def test_a_signal_while_optunas_ask_creates_a_trial_leaves_it_to_be_failed_not_running(tmp_path, queued):
    """CI: a SIGTERM in the sampler's proposal landed between the trial's insert and this
    process's note that it made it RUNNING; the run exited 130 with the trial RUNNING."""
    import signal

    from tuner import interrupts
    from tuner.search.recovery import fail_interrupted

    storage = _storage(tmp_path)
    study = optuna.create_study(storage=storage, study_name="s")
    if queued:
        study.enqueue_trial({"x": 1})
    op = "set_trial_state_values" if queued else "create_new_trial"
    real = getattr(storage.inner, op)

    def signalled(*args, **kwargs):
        result = real(*args, **kwargs)
        if queued and args[1] != TrialState.RUNNING:
            return result
        os.kill(os.getpid(), signal.SIGTERM)
        deadline = time.monotonic() + 30
        while not interrupts.stopping() and time.monotonic() < deadline:
            time.sleep(0.01)  # the handler has run, after the write and before the call returns
        return result

    interrupts.install()
    setattr(storage.inner, op, signalled)
    with pytest.raises(KeyboardInterrupt):
        study.ask()
    setattr(storage.inner, op, real)
    assert [t.state for t in study.get_trials()] == [TrialState.RUNNING]  # the write went through ...
    fail_interrupted(study)
    assert [t.state for t in study.get_trials()] == [TrialState.FAIL]  # ... and the run knew it was its own


def test_a_run_being_stopped_does_not_wait_out_an_outage_and_keeps_its_writes_in_the_journal(tmp_path):
    """An operator's Ctrl-C while PostgreSQL was down: the FAIL record waited the whole
    storage_outage_s (300 s) for the database.  Once a signal is being handled, the write goes
    to the journal and the run gives up at once; the next run writes it back."""
    import signal

    from tuner import interrupts

    storage = _storage(tmp_path, outage_s=120.0)
    study = optuna.create_study(storage=storage, study_name="s")
    trial = study.ask()
    interrupts.install()
    with pytest.raises(KeyboardInterrupt):
        os.kill(os.getpid(), signal.SIGINT)
        time.sleep(30)  # the handler raises long before
    holder = _lock(tmp_path, 15.0)
    try:
        started = time.monotonic()
        with pytest.raises(StorageOutage, match="is away"):
            trial.set_user_attr("fail_reason", "interrupted")
        assert time.monotonic() - started < 10  # not the 120 s limit, nor the 15 s lock
        assert [e["args"][1:] for e in storage.journal.entries()] == [["fail_reason", "interrupted"]]
    finally:
        holder.join()


def test_a_signal_as_optunas_objective_call_begins_still_leaves_the_trial_its_reason(tmp_path):
    """CI (a fresh clone on a busy machine): the signal landed after Optuna's ask and before the
    tuner's objective entered its own handler; Optuna failed the trial with no `fail_reason`."""
    import signal

    from tuner import interrupts
    from tuner.results import record

    storage = _storage(tmp_path)
    study = optuna.create_study(storage=storage, study_name="s")

    def objective(trial):  # stands for the instant before TrialRunner.__call__'s try
        os.kill(os.getpid(), signal.SIGINT)
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:
            time.sleep(0.01)  # the handler raises KeyboardInterrupt here
        raise AssertionError("no KeyboardInterrupt within 30 s")

    interrupts.install()
    with pytest.raises(KeyboardInterrupt):
        study.optimize(objective, n_trials=1)
    [t] = study.get_trials()
    assert t.state == TrialState.FAIL and t.user_attrs.get(record.FAIL_REASON) == record.INTERRUPTED
