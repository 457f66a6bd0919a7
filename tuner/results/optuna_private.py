"""The only place the tuner touches Optuna's private API, pinned to `optuna>=4.3,<5.1`
(pyproject.toml); `tests/unit/test_optuna_private.py` fails when an upgrade moves any of it.

Why private at all: a RUNNING trial whose worker stopped sending heartbeats must get a
`fail_reason` *before* it is failed, and be queued again; Optuna's public
`optuna.storages.fail_stale_trials` fails it with no reason and no retry.  Everything else
(storage, trial ids) goes through the public `BaseStorage` methods.
"""

from __future__ import annotations

import optuna

__all__ = ["heartbeat_stale_trial_ids", "storage_of", "trial_id_of"]


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
