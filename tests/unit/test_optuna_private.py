"""The private Optuna calls the tuner makes (tuner/results/optuna_private.py) still exist and
mean what they did: this fails on an Optuna upgrade that moves them."""

import time

import optuna

from tuner.results.optuna_private import heartbeat_stale_trial_ids, storage_of, trial_id_of


def test_storage_and_trial_ids(tmp_path):
    study = optuna.create_study(storage=f"sqlite:///{tmp_path}/s.db", study_name="s")
    trial = study.ask()
    assert isinstance(storage_of(study), optuna.storages.BaseStorage)
    assert trial_id_of(study, trial.number) == trial._trial_id


def test_heartbeat_stale_ids_find_a_silent_worker(tmp_path):
    storage = optuna.storages.RDBStorage(f"sqlite:///{tmp_path}/h.db", heartbeat_interval=1, grace_period=1)
    study = optuna.create_study(storage=storage, study_name="h")
    trial = study.ask()
    storage.record_heartbeat(trial._trial_id)
    assert heartbeat_stale_trial_ids(study) == set()
    time.sleep(2.2)
    assert heartbeat_stale_trial_ids(study) == {trial_id_of(study, trial.number)}


def test_without_heartbeats_nothing_is_stale():
    study = optuna.create_study()
    study.ask()
    assert heartbeat_stale_trial_ids(study) == set()
