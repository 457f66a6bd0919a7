"""The only place the tuner touches Optuna's private API, pinned to `optuna>=4.3,<5.1`
(pyproject.toml); `tests/unit/test_optuna_private.py` fails when an upgrade moves any of it.

Why private at all: a RUNNING trial whose worker stopped sending heartbeats must get a
`fail_reason` *before* it is failed, and be queued again; Optuna's public
`optuna.storages.fail_stale_trials` fails it with no reason and no retry.  Everything else
(storage, trial ids) goes through the public `BaseStorage` methods.  `HeartbeatForwarding`
gives a storage wrapper (`tuner.results.resilient.ResilientStorage`) Optuna's heartbeat
interface, whose stale-trial query is private by name.
"""

from __future__ import annotations

import optuna

from optuna.storages._heartbeat import BaseHeartbeat

__all__ = ["heartbeat_stale_trial_ids", "storage_of", "trial_id_of", "HeartbeatForwarding"]


def storage_of(study: optuna.Study) -> optuna.storages.BaseStorage:
    """The study's storage.  Public alternative: keep the storage one opened; a loaded
    `Study` does not expose it otherwise."""
    return study._storage


def trial_id_of(study: optuna.Study, number: int) -> int:
    """A trial's storage id, through public storage calls."""
    storage = storage_of(study)
    return storage.get_trial_id_from_study_id_trial_number(storage.get_study_id_from_name(study.study_name), number)


def heartbeat_stale_trial_ids(study: optuna.Study) -> set[int]:
    """Trials whose worker stopped sending Optuna heartbeats (any machine); empty without
    heartbeats."""
    from optuna.storages._heartbeat import BaseHeartbeat, is_heartbeat_enabled

    storage = storage_of(study)
    if not isinstance(storage, BaseHeartbeat) or not is_heartbeat_enabled(storage):
        return set()
    study_id = storage.get_study_id_from_name(study.study_name)
    return set(storage._get_stale_trial_ids(study_id))


class HeartbeatForwarding(BaseHeartbeat):
    """Optuna's heartbeat interface, forwarded to `self.inner` (an `RDBStorage`).  The wrapper
    provides `beat(call)` (one heartbeat, whose failure must not stop the trial),
    `stale_check_paused()` (no trial is stale while heartbeats resume after an outage) and
    `_retry(call)`."""

    def record_heartbeat(self, trial_id: int) -> None:
        self.beat(lambda: self.inner.record_heartbeat(trial_id))

    def _get_stale_trial_ids(self, study_id: int) -> list[int]:
        if self.stale_check_paused():
            return []
        return self._retry(lambda: self.inner._get_stale_trial_ids(study_id))

    def get_heartbeat_interval(self) -> int | None:
        return self.inner.get_heartbeat_interval()

    def get_heartbeat_stale_trial_callback(self):
        own = getattr(self.inner, "get_heartbeat_stale_trial_callback", None)  # Optuna >= 4.9
        return own() if own is not None else self.inner.get_failed_trial_callback()

    def get_failed_trial_callback(self):  # the name before Optuna 4.9
        return self.get_heartbeat_stale_trial_callback()
