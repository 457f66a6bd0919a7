"""Where a study lives: sqlite (one host, resumable) or PostgreSQL (several hosts).

sqlite is opened with a long busy timeout so that optuna-dashboard reading the file during a
run cannot make a write fail ("database is locked"); the directory of a relative sqlite path
is created.  PostgreSQL needs the optional `postgres` extra (psycopg2).
"""

from __future__ import annotations

from pathlib import Path

import optuna
from sqlalchemy.exc import ArgumentError, DatabaseError, OperationalError
from sqlalchemy.exc import NoSuchModuleError

from tuner.config import Config
from tuner.errors import ConfigError
from tuner.results.resilient import ResilientStorage

__all__ = ["open_storage", "storage_for_url", "load_existing_study", "SQLITE_TIMEOUT_S"]

SQLITE_TIMEOUT_S = 60


def storage_for_url(url: str, *, heartbeat_s: int | None = None) -> optuna.storages.BaseStorage:
    check_no_password(url)
    kwargs: dict = {}
    if url.startswith("sqlite:///"):
        path = url[len("sqlite:///"):]
        if path and path != ":memory:":
            Path(path).expanduser().parent.mkdir(parents=True, exist_ok=True)
            _use_wal(Path(path).expanduser())
        kwargs["engine_kwargs"] = {"connect_args": {"timeout": SQLITE_TIMEOUT_S}}
    elif url.startswith(("postgresql", "postgres")):
        try:
            if "+psycopg2" in url.split("://")[0]:
                import psycopg2  # noqa: F401
            else:
                import psycopg  # noqa: F401  # SQLAlchemy 2.1's default PostgreSQL driver
        except ImportError:
            raise ConfigError(f"{url.split('@')[-1]}: PostgreSQL needs its driver; pip install 'sglang-spec-tuner[postgres]'") from None
        # connect_timeout: a failover that drops packets is retried, not waited on for minutes
        kwargs["engine_kwargs"] = {"pool_pre_ping": True, "connect_args": {"connect_timeout": 10}}
    if heartbeat_s:
        kwargs["heartbeat_interval"] = heartbeat_s
        kwargs["grace_period"] = heartbeat_s * 4
        kwargs["failed_trial_callback"] = optuna.storages.RetryFailedTrialCallback(max_retry=2)
    try:
        return optuna.storages.RDBStorage(url, **kwargs)
    except (ArgumentError, NoSuchModuleError, ValueError) as exc:
        raise ConfigError(f"[study] storage: {url!r} is not a database URL optuna can open ({exc}); use sqlite:///path.db or postgresql://...") from None
    except OperationalError as exc:
        safe = url.split("@")[-1]
        raise ConfigError(f"[study] storage: cannot open {safe}: {str(exc.orig).strip().splitlines()[0]}; check the URL and that the database is up") from None
    except DatabaseError as exc:  # a damaged file: one line, never a traceback
        raise ConfigError(f"[study] storage: {url.split('@')[-1]} is damaged ({str(exc.orig).strip().splitlines()[0]}); restore it from a backup or use another storage") from None


def _use_wal(path: Path) -> None:
    """Write-ahead logging: readers (optuna-dashboard) never block the tuner's writes.

    The mode is stored in the database file, so it is set once, on a new or old file.
    """
    import sqlite3

    try:
        with sqlite3.connect(str(path), timeout=SQLITE_TIMEOUT_S) as db:
            db.execute("PRAGMA journal_mode=WAL")
    except sqlite3.DatabaseError as exc:
        if any(mark in str(exc) for mark in ("not a database", "malformed")):
            raise ConfigError(f"[study] storage: {path} is damaged ({exc}); restore it from a backup or use another storage") from None
        raise ConfigError(f"[study] storage: cannot open {path}: {exc}; check the path and its permissions") from None


def check_no_password(url: str) -> None:
    from urllib.parse import urlsplit

    if "://" in url and urlsplit(url).password:
        raise ConfigError(
            "[study] storage: the URL holds a password; keep it out of configs and command lines: "
            "use ~/.pgpass or the PGPASSWORD environment variable"
        )


DEFAULT_HEARTBEAT_S = 30


def open_storage(config: Config) -> optuna.storages.BaseStorage:
    """A shared database (several workers) gets Optuna's heartbeat by default, so a trial of a
    worker that died is failed and retried by another; sqlite (one machine) recovers its
    stale trials by process id instead (study.recover_stale_trials).  Either rides out an
    outage (`tuner.results.resilient`), journaling trial writes beside the target's state."""
    heartbeat = config.study.heartbeat_s
    if heartbeat is None and not config.storage_url.startswith("sqlite"):
        heartbeat = DEFAULT_HEARTBEAT_S
    inner = storage_for_url(config.storage_url, heartbeat_s=heartbeat or None)
    journal_dir = Path(config.target.workdir).expanduser() / "journal"
    return ResilientStorage(inner, url=config.storage_url, outage_s=config.study.storage_outage_s, journal_dir=journal_dir)


def load_existing_study(config: Config) -> optuna.Study:
    """The config's study, for commands that read one (report, best); never creates a database."""
    from tuner.errors import TunerError

    url = config.storage_url
    if url.startswith("sqlite:///") and not Path(url[len("sqlite:///"):]).expanduser().exists():
        raise TunerError(f"{url[len('sqlite:///'):]}: no such study database; run python -m tuner.optimize first, or pass --storage")
    try:
        return optuna.load_study(study_name=config.study.name, storage=storage_for_url(url))
    except KeyError:
        raise TunerError(f"no study {config.study.name!r} in {url.split('@')[-1]}; pass --study-name, or run python -m tuner.optimize first") from None
