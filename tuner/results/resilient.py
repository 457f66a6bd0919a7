"""A study's storage that rides out an outage of its database.

`ResilientStorage` wraps the `RDBStorage` a study is opened with.  A call that fails because
the database is unreachable or busy (PostgreSQL restarting or failing over, a network blip; a
locked or briefly unwritable sqlite file) is retried with backoff for up to `[study]
storage_outage_s`, with one line in the progress display while it waits.  A write to a trial
(its attrs, its measured values and state) that fails is first appended to a local journal
(`[target] workdir`/journal, one file per tuner process) and then written, in order, when the
database answers again; past the limit the run stops with one line naming the database, and
the journal stays behind for the next run, which writes it back before its first trial
(`settle`).  A damaged store (not a database, malformed) is one line, never a traceback.

Why a storage proxy rather than our own ask/tell loop: `study.optimize` reaches the storage in
places the tuner does not see (ask, tell, the heartbeat thread, fail_stale_trials, callbacks),
and when tell fails there, Optuna's own bookkeeping raises `UnboundLocalError: updated_state`
(optuna/study/_optimize.py, `_run_trial`: the `finally` reads a variable the failed tell never
set).  One wrapper under all of them covers every call, keeps `study.optimize`, and makes that
path unreachable while the limit lasts.  Heartbeats are never retried (a missed one is
harmless), and no trial is declared stale until the heartbeats had a grace period to resume
after an outage, so a live trial is never failed because the database was away.

A signal (Ctrl-C, SIGTERM) never lands inside one database call: each runs inside
`tuner.interrupts.deferred`, with this process's own note of what it did (`claimed`), and the
signal is raised when the call returns.  The waits between retries are not deferred, so a run
waiting for its database still stops at once; one call holds a signal at most as long as the
driver's own timeout (PostgreSQL's connect_timeout, sqlite's busy timeout).
"""

from __future__ import annotations

import json
import logging
import os
import time
from pathlib import Path
from typing import Any, Callable

import optuna
from optuna.storages import BaseStorage
from optuna.trial import TrialState
from sqlalchemy import exc as sa_exc

from tuner.errors import TunerError
from tuner.interrupts import deferred, stopping
from tuner.server.control.base import pid_alive
from tuner.results import record
from tuner.results.optuna_private import HeartbeatForwarding, storage_of

__all__ = ["ResilientStorage", "StorageOutage", "settle", "watch", "reraise_outage", "redacted_url"]

logger = logging.getLogger(__name__)

# Trial writes worth keeping through an outage: the measurement, its attrs, the outcome.
JOURNALED = ("set_trial_user_attr", "set_trial_system_attr", "set_trial_intermediate_value", "set_trial_state_values")
_CORRUPT = ("file is not a database", "malformed", "database disk image")
_MAX_DELAY_S = 10.0


class StorageOutage(TunerError):
    """The study's database stayed away longer than `[study] storage_outage_s`, or is damaged."""


def redacted_url(url: str) -> str:
    """A storage URL as every message and record shows it: a password replaced by ***
    (the one redaction of storage URLs; a config refuses passwords anyway)."""
    from urllib.parse import urlsplit, urlunsplit

    parts = urlsplit(url)
    if not parts.password:
        return url
    return urlunsplit(parts._replace(netloc=parts.netloc.replace(f":{parts.password}@", ":***@")))


def _classify(exc: BaseException) -> str | None:
    """"transient" (retry), "corrupt" (one line) or None (a real error) for a storage failure."""
    seen = exc
    while seen is not None:
        if isinstance(seen, sa_exc.DBAPIError):
            text = str(seen.orig).lower()
            if any(mark in text for mark in _CORRUPT):
                return "corrupt"
            if isinstance(seen, (sa_exc.OperationalError, sa_exc.InterfaceError)) or seen.connection_invalidated:
                return "transient"
            return None
        if isinstance(seen, sa_exc.TimeoutError):  # the connection pool gave up waiting
            return "transient"
        seen = seen.__cause__ or seen.__context__
    return None


def _first_line(exc: BaseException) -> str:
    while exc.__cause__ is not None:
        exc = exc.__cause__
    orig = getattr(exc, "orig", None) or exc
    lines = str(orig).strip().splitlines()
    return lines[0][:160] if lines else type(orig).__name__


class Journal:
    """Trial writes not yet in the database, in order, one JSON line each."""

    def __init__(self, path: Path):
        self.path = path

    def entries(self) -> list[dict]:
        if not self.path.exists():
            return []
        return [json.loads(line) for line in self.path.read_text().splitlines() if line.strip()]

    def append(self, op: str, args: tuple) -> None:
        self.path.parent.mkdir(parents=True, exist_ok=True)
        with open(self.path, "a") as f:
            f.write(json.dumps({"op": op, "args": _encode(op, args)}) + "\n")
            f.flush()
            os.fsync(f.fileno())

    def keep(self, entries: list[dict]) -> None:
        if not entries:
            self.path.unlink(missing_ok=True)
            return
        tmp = self.path.with_suffix(".tmp")
        tmp.write_text("".join(json.dumps(e) + "\n" for e in entries))
        tmp.replace(self.path)


def _encode(op: str, args: tuple) -> list:
    if op == "set_trial_state_values":
        trial_id, state, *rest = args
        return [trial_id, state.name, *(list(v) if v is not None else None for v in rest)]
    return list(args)


def _decode(op: str, args: list) -> list:
    if op == "set_trial_state_values":
        return [args[0], TrialState[args[1]], *args[2:]]
    return args


class ResilientStorage(HeartbeatForwarding, BaseStorage):
    def __init__(self, inner: optuna.storages.RDBStorage, *, url: str, outage_s: float, journal_dir: Path):
        self.inner = inner
        self.url = redacted_url(url)
        self.outage_s = outage_s
        self.journal_dir = journal_dir
        self.journal = Journal(journal_dir / f"{_url_key(url)}.{os.getpid()}.jsonl")
        self.notify: Callable[[str], None] = logger.warning
        self.gave_up: StorageOutage | None = None
        self.last_failure = float("-inf")  # monotonic time of the last transient failure
        # Trials this process made RUNNING (created, or popped from the queue): a signal inside
        # Optuna's ask -- the sampler's proposal, before the objective runs -- leaves one RUNNING
        # that no code of ours has seen yet (search/recovery.py · fail_interrupted).
        self.claimed: list[int] = []

    # -- the retry ----------------------------------------------------------------------------
    def _retry(self, call: Callable[[], Any]) -> Any:
        if self.gave_up is not None:
            raise self.gave_up
        started, delay = None, 0.5
        while True:
            try:
                with deferred():  # a signal lands between database calls, never inside one
                    return call()
            except Exception as exc:
                kind = _classify(exc)
                if kind == "corrupt":
                    raise StorageOutage(f"the study's database {self.url} is damaged ({_first_line(exc)}); "
                                        "restore it from a backup or use another [study] storage") from None
                if kind is None:
                    raise
                now = self.last_failure = time.monotonic()
                started = started if started is not None else now
                if now - started >= self.outage_s or stopping():
                    # A run being stopped does not wait out the outage: its trial writes are in
                    # the journal already (an operator's Ctrl-C while PostgreSQL was down waited
                    # the whole 300 s for the FAIL record).
                    self._give_up(exc)
                self.notify(f"waiting for the study's database {self.url}: {now - started:.0f} s of "
                            f"{self.outage_s:.0f} s ({_first_line(exc)})")
                time.sleep(min(delay, max(0.1, self.outage_s - (now - started))))
                delay = min(delay * 2, _MAX_DELAY_S)

    def _give_up(self, exc: BaseException) -> None:
        pending = len(self.journal.entries())
        kept = f"; {pending} trial write(s) wait in {self.journal.path} for the next run" if pending else ""
        if stopping():
            self.gave_up = StorageOutage(f"the study's database {self.url} is away ({_first_line(exc)}){kept}")
            raise self.gave_up from None
        self.gave_up = StorageOutage(
            f"the study's database {self.url} did not answer for {self.outage_s:.0f} s ({_first_line(exc)}){kept}; "
            "check that it is up, or raise [study] storage_outage_s")
        raise self.gave_up from None

    # -- heartbeats (HeartbeatForwarding) ----------------------------------------------------
    def beat(self, call: Callable[[], None]) -> None:
        """A heartbeat: never retried (the next one comes soon), never fatal to the trial."""
        if self.gave_up is not None:
            return
        try:
            call()  # not deferred: Optuna beats from its heartbeat thread, where signals never land
        except Exception as exc:
            if _classify(exc) is None:
                raise
            self.last_failure = time.monotonic()

    def stale_check_paused(self) -> bool:
        """After an outage, every worker's heartbeats were stopped too: no trial counts as stale
        until they had a grace period to resume."""
        interval = self.inner.get_heartbeat_interval() or 0
        grace = self.inner.grace_period or 2 * interval
        return time.monotonic() - self.last_failure < grace + interval

    def _forward(self, name: str, *args: Any, **kwargs: Any) -> Any:
        return self._retry(lambda: getattr(self.inner, name)(*args, **kwargs))

    # -- trial writes: journaled when the database does not take them -------------------------
    def _write(self, op: str, *args: Any, then: Callable[[Any], Any] = lambda result: result) -> Any:
        """One trial write; `then` (this process's own bookkeeping of it) runs in the same
        deferred step, so a signal never lands between a write and its record here."""
        if self.gave_up is not None:
            raise self.gave_up
        if not self.journal.path.exists():
            try:
                with deferred():
                    return then(getattr(self.inner, op)(*args))
            except Exception as exc:
                if _classify(exc) != "transient":
                    raise
                self.last_failure = time.monotonic()
        with deferred():  # a line cut short by a signal would make the journal unreadable
            self.journal.append(op, args)
        return self._retry(lambda: then(self.flush()))

    def flush(self) -> Any:
        """Write the journal to the database, in order; the last write's result."""
        entries, result = self.journal.entries(), None
        while entries:
            result = _apply(self.inner, entries[0])
            entries = entries[1:]
            self.journal.keep(entries)
        return result

    def set_trial_user_attr(self, trial_id: int, key: str, value: Any) -> None:
        return self._write("set_trial_user_attr", trial_id, key, value)

    def set_trial_system_attr(self, trial_id: int, key: str, value: Any) -> None:
        return self._write("set_trial_system_attr", trial_id, key, value)

    def set_trial_intermediate_value(self, trial_id: int, step: int, intermediate_value: float) -> None:
        return self._write("set_trial_intermediate_value", trial_id, step, intermediate_value)

    def set_trial_state_values(self, trial_id: int, state: TrialState, values=None) -> bool:
        if state == TrialState.FAIL and stopping():
            # Optuna fails the trial itself when the signal lands in its objective call before
            # the tuner's own handler is entered (a signal is raised at a function's first
            # instruction, outside its try): the reason goes first, while the trial still takes
            # it (CI, `test_signals[between trials (proposal)]`: "trial 1 FAIL without a reason").
            trial = self.get_trial(trial_id)
            if trial.state == TrialState.RUNNING and record.FAIL_REASON not in trial.user_attrs:
                self.set_trial_user_attr(trial_id, record.FAIL_REASON, record.INTERRUPTED)

        def claim(done: bool) -> bool:
            if state == TrialState.RUNNING and done:
                self.claimed.append(trial_id)  # a queued trial popped by Optuna's ask
            return done

        return self._write("set_trial_state_values", trial_id, state, values, then=claim)

    # -- everything else: retried -------------------------------------------------------------
    def create_new_study(self, directions, study_name=None):
        return self._forward("create_new_study", directions, study_name)

    def delete_study(self, study_id):
        return self._forward("delete_study", study_id)

    def set_study_user_attr(self, study_id, key, value):
        return self._forward("set_study_user_attr", study_id, key, value)

    def set_study_system_attr(self, study_id, key, value):
        return self._forward("set_study_system_attr", study_id, key, value)

    def get_study_id_from_name(self, study_name):
        return self._forward("get_study_id_from_name", study_name)

    def get_study_name_from_id(self, study_id):
        return self._forward("get_study_name_from_id", study_id)

    def get_study_directions(self, study_id):
        return self._forward("get_study_directions", study_id)

    def get_study_user_attrs(self, study_id):
        return self._forward("get_study_user_attrs", study_id)

    def get_study_system_attrs(self, study_id):
        return self._forward("get_study_system_attrs", study_id)

    def get_all_studies(self):
        return self._forward("get_all_studies")

    def create_new_trial(self, study_id, template_trial=None):
        def claim(trial_id: int) -> int:
            # In the same deferred step as the insert: a signal raised between the two left a
            # RUNNING trial nobody failed (CI, `test_signals[between trials (proposal)]`).
            if template_trial is None or template_trial.state == TrialState.RUNNING:
                self.claimed.append(trial_id)
            return trial_id

        return self._retry(lambda: claim(self.inner.create_new_trial(study_id, template_trial)))

    def set_trial_param(self, trial_id, param_name, param_value_internal, distribution):
        return self._forward("set_trial_param", trial_id, param_name, param_value_internal, distribution)

    def get_trial_id_from_study_id_trial_number(self, study_id, trial_number):
        return self._forward("get_trial_id_from_study_id_trial_number", study_id, trial_number)

    def get_trial_number_from_id(self, trial_id):
        return self._forward("get_trial_number_from_id", trial_id)

    def get_trial(self, trial_id):
        return self._forward("get_trial", trial_id)

    def get_all_trials(self, study_id, deepcopy=True, states=None):
        return self._forward("get_all_trials", study_id, deepcopy=deepcopy, states=states)

    def get_n_trials(self, study_id, state=None):
        return self._forward("get_n_trials", study_id, state)

    def get_best_trial(self, study_id):
        return self._forward("get_best_trial", study_id)

    def remove_session(self):
        return self._forward("remove_session")

    def check_trial_is_updatable(self, trial_id, trial_state):
        return self.inner.check_trial_is_updatable(trial_id, trial_state)


def _url_key(url: str) -> str:
    import hashlib

    return hashlib.sha256(redacted_url(url).encode()).hexdigest()[:12]


def _apply(storage: BaseStorage, entry: dict) -> Any:
    """One journaled write; a trial that ended meanwhile (another worker failed it) is skipped
    with a warning, and a state the database already holds (the write went through before the
    connection dropped) counts as written."""
    op, args = entry["op"], _decode(entry["op"], entry["args"])
    try:
        return getattr(storage, op)(*args)
    except optuna.exceptions.UpdateFinishedTrialError:
        if op == "set_trial_state_values" and storage.get_trial(args[0]).state == args[1]:
            return True
        logger.warning("journal: trial id %s ended meanwhile; its journaled %s is dropped", args[0], op)
        return False


def watch(study: optuna.Study, notify: Callable[[str], None]) -> None:
    """Say in the progress display (`notify`) while the study's database is awaited."""
    storage = storage_of(study)
    if isinstance(storage, ResilientStorage):
        storage.notify = notify


def settle(study: optuna.Study, warn: Callable[[str], None]) -> int:
    """Write back the journals earlier runs left for this database (their tuner is gone);
    the number of writes.  Run before the first trial, before stale trials are recovered."""
    storage = storage_of(study)
    if not isinstance(storage, ResilientStorage):
        return 0
    written = 0
    for path in sorted(storage.journal_dir.glob(f"{_url_key(storage.url)}.*.jsonl")):
        pid = path.name.split(".")[1]
        if pid.isdigit() and int(pid) != os.getpid() and pid_alive(int(pid)):
            continue  # a live tuner's own journal
        journal = Journal(path)
        count = len(journal.entries())
        storage._retry(lambda: _settle_one(storage, journal))
        written += count
        warn(f"wrote back {count} trial write(s) an earlier run kept in {path} while the database was away")
    return written


def _settle_one(storage: ResilientStorage, journal: Journal) -> None:
    entries = journal.entries()
    while entries:
        _apply(storage.inner, entries[0])
        entries = entries[1:]
        journal.keep(entries)


def reraise_outage(study: optuna.Study) -> None:
    """Inside an `except`: if the study's storage gave up, raise its one-line error instead
    (whatever Optuna made of it on the way out, e.g. `UnboundLocalError: updated_state`)."""
    storage = storage_of(study)
    if isinstance(storage, ResilientStorage) and storage.gave_up is not None:
        raise storage.gave_up from None
