"""Trials a dead tuner left RUNNING: failed with a reason and queued again.

A RUNNING trial whose tuner is gone -- killed on this machine (its pid is dead), or silent
elsewhere (no heartbeat for the grace period) -- is marked FAIL with a `fail_reason` and its
parameters are queued again, so no measurement is lost and nothing stays RUNNING.  Runs before
Optuna's own stale-trial check, which would fail them without a reason.
"""

from __future__ import annotations

import os
import socket
from typing import Callable

import optuna

from tuner.results import record
from tuner.server.control.base import pid_alive
from tuner.results.optuna_private import heartbeat_stale_trial_ids, storage_of, trial_id_of

__all__ = ["recover_stale_trials", "fail_interrupted"]


def _why_stale(t: optuna.trial.FrozenTrial, trial_id: int, stale: set[int]) -> str | None:
    worker = t.user_attrs.get(record.WORKER, "")
    name, _, pid = worker.rpartition(":")
    if trial_id in stale:
        return f"interrupted: its worker {worker or '?'} stopped sending heartbeats; retried"
    if name == socket.gethostname() and pid.isdigit() and int(pid) != os.getpid() and not pid_alive(int(pid)):
        return f"interrupted: the tuner running it (pid {pid}) is gone; retried"
    return None


def recover_stale_trials(study: optuna.Study, warn: Callable[[str], None]) -> list[int]:
    """Fail and re-queue the study's RUNNING trials whose tuner is gone; their numbers."""
    retried = []
    stale = heartbeat_stale_trial_ids(study)
    storage = storage_of(study)
    for t in study.get_trials(deepcopy=False, states=(optuna.trial.TrialState.RUNNING,)):
        trial_id = trial_id_of(study, t.number)
        reason = _why_stale(t, trial_id, stale)
        if reason is None:
            continue
        try:
            storage.set_trial_user_attr(trial_id, record.FAIL_REASON, reason)
            if not storage.set_trial_state_values(trial_id, optuna.trial.TrialState.FAIL):
                continue
        except (optuna.exceptions.UpdateFinishedTrialError, RuntimeError):
            continue  # another worker got there first
        study.enqueue_trial(t.params, user_attrs={record.RETRY_OF: t.number}, skip_if_exists=False)
        retried.append(t.number)
        warn(f"trial {t.number} was left RUNNING ({reason}): marked FAIL and queued again")
    return retried


def fail_interrupted(study: optuna.Study) -> list[optuna.trial.FrozenTrial]:
    """After a Ctrl-C or SIGTERM: every trial this process made RUNNING (in any study of the
    storage: the study and its baselines' sibling) that is still RUNNING is FAIL "interrupted"
    -- one interrupted inside Optuna's ask, during the sampler's proposal, which the objective
    never saw.  Returns the trials of this process the interruption failed, in order, so the
    command can say which one it was (a trial, a baseline, a schedule launch)."""
    storage = storage_of(study)
    hit = []
    for trial_id in dict.fromkeys(getattr(storage, "claimed", ())):
        t = storage.get_trial(trial_id)
        if t.state == optuna.trial.TrialState.RUNNING:
            try:
                storage.set_trial_user_attr(trial_id, record.FAIL_REASON, record.INTERRUPTED)
                storage.set_trial_state_values(trial_id, optuna.trial.TrialState.FAIL)
            except (optuna.exceptions.UpdateFinishedTrialError, RuntimeError):
                continue
            t = storage.get_trial(trial_id)
        if t.state == optuna.trial.TrialState.FAIL and t.user_attrs.get(record.FAIL_REASON) == record.INTERRUPTED:
            hit.append(t)
    return hit
