"""Per-trial files (the server's log) in an Optuna artifact store beside the study."""

from __future__ import annotations

import os
import tempfile

import optuna
from optuna.artifacts import FileSystemArtifactStore, upload_artifact

from tuner.config import Config
from tuner.results import record

__all__ = ["open_store", "save_log"]


def open_store(config: Config) -> FileSystemArtifactStore:
    path = config.artifacts_dir
    path.mkdir(parents=True, exist_ok=True)
    return FileSystemArtifactStore(str(path))


def save_log(store: FileSystemArtifactStore, trial: optuna.Trial, text: str) -> str:
    """Upload the trial's server log; returns the artifact id (also kept as user attr)."""
    with tempfile.TemporaryDirectory() as tmp:
        path = os.path.join(tmp, f"trial-{trial.number}-server.log")
        with open(path, "w", encoding="utf-8") as fh:
            fh.write(text)
        artifact_id = upload_artifact(artifact_store=store, file_path=path, study_or_trial=trial, mimetype="text/plain", encoding="utf-8")
    record.record_log_artifact(trial, artifact_id)
    return artifact_id
