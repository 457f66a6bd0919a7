"""Where a study lives: sqlite (one host, resumable) or PostgreSQL (several hosts).

sqlite is opened with a long busy timeout so that optuna-dashboard reading the file during a
run cannot make a write fail ("database is locked").  Only the default store's folder
(`studies/`) is created; any other missing folder is an error, and commands that only read a
study never create a store.  PostgreSQL needs the optional `postgres` extra (psycopg2).
"""

from __future__ import annotations

from pathlib import Path

import optuna
from sqlalchemy.exc import ArgumentError, DatabaseError, OperationalError, SQLAlchemyError
from sqlalchemy.exc import NoSuchModuleError

from tuner.config import Config, sqlite_path
from tuner.errors import ConfigError
from tuner.results import record
from tuner.results.resilient import ResilientStorage, redacted_url

__all__ = ["open_storage", "storage_for_url", "storage_source", "existing_storage", "load_existing_study", "study_summaries", "SQLITE_TIMEOUT_S"]

SQLITE_TIMEOUT_S = 60


SCHEMES = ("sqlite", "postgresql", "postgres")


def storage_for_url(url: str, *, heartbeat_s: int | None = None, source: str = "[study] storage",
                    create_dir: bool = False) -> optuna.storages.BaseStorage:
    """An Optuna RDB storage; `source` names where the URL came from in every error
    (`--storage`, or the config's `[study] storage`).  A sqlite file's folder must exist unless
    `create_dir` (the default `studies/` of a config that names no storage)."""
    check_no_password(url, source)
    scheme = url.split("://")[0].split("+")[0] if "://" in url else ""
    if scheme not in SCHEMES:
        raise ConfigError(f"{source}: {redacted_url(url)!r} is not a store the tuner supports; use sqlite:///path.db (one machine) or postgresql://user@host/db (several)")
    kwargs: dict = {}
    if scheme == "sqlite":
        _prepare_sqlite(url, source, create_dir)
        kwargs["engine_kwargs"] = {"connect_args": {"timeout": SQLITE_TIMEOUT_S}}
    else:
        _check_postgres_driver(url, source)
        # connect_timeout: a failover that drops packets is retried, not waited on for minutes
        kwargs["engine_kwargs"] = {"pool_pre_ping": True, "connect_args": {"connect_timeout": 10}}
    if heartbeat_s:
        kwargs.update(_heartbeat_kwargs(heartbeat_s))
    try:
        storage = optuna.storages.RDBStorage(url, **kwargs)
        storage.get_all_studies()  # a store of another program (or version) fails here, not mid-run
        return storage
    except (ArgumentError, NoSuchModuleError, ValueError, ImportError) as exc:
        raise ConfigError(f"{source}: {redacted_url(url)!r} is not a database URL optuna can open ({exc}); use sqlite:///path.db or postgresql://...") from None
    except OperationalError as exc:
        safe = redacted_url(url)
        raise ConfigError(f"{source}: cannot open {safe}: {str(exc.orig).strip().splitlines()[0]}; check the URL and that the database is up") from None
    except DatabaseError as exc:  # a damaged file: one line, never a traceback
        first = str(getattr(exc, "orig", None) or exc).strip().splitlines()[0]
        raise ConfigError(f"{source}: {redacted_url(url)} is damaged ({first}); restore it from a backup or use another storage") from None
    except (RuntimeError, SQLAlchemyError, optuna.exceptions.StorageInternalError) as exc:
        first = str(getattr(exc, "orig", None) or exc).strip().splitlines()[0]
        raise ConfigError(f"{source}: {redacted_url(url)} is not a usable Optuna store ({first}); point it at another file or database") from None


def _heartbeat_kwargs(heartbeat_s: int) -> dict:
    """Optuna's heartbeat with a retry of the stale trial, through the API of the installed
    Optuna (4.9 renamed the callback and its argument; the old names warn)."""
    kwargs: dict = {"heartbeat_interval": heartbeat_s, "grace_period": heartbeat_s * 4}
    if hasattr(optuna.storages, "RetryHeartbeatStaleTrialCallback"):
        kwargs["heartbeat_stale_trial_callback"] = optuna.storages.RetryHeartbeatStaleTrialCallback(max_retry=2)
    else:  # optuna < 4.9
        kwargs["failed_trial_callback"] = optuna.storages.RetryFailedTrialCallback(max_retry=2)
    return kwargs


def _prepare_sqlite(url: str, source: str, create_dir: bool) -> None:
    path = sqlite_path(url)
    if path is None:
        return
    if not path.parent.exists():
        if not create_dir:
            raise ConfigError(f"{source}: folder {path.parent} does not exist; create it, or fix the path in the sqlite URL")
        path.parent.mkdir(parents=True, exist_ok=True)
    _use_wal(path, source)


def _check_postgres_driver(url: str, source: str) -> None:
    try:
        if "+psycopg2" in url.split("://")[0]:
            import psycopg2  # noqa: F401
        else:
            import psycopg  # noqa: F401  # SQLAlchemy 2.1's default PostgreSQL driver
    except ImportError:
        raise ConfigError(f"{source}: {redacted_url(url)}: PostgreSQL needs its driver; pip install 'sglang-spec-tuner[postgres]'") from None


def _use_wal(path: Path, source: str) -> None:
    """Write-ahead logging: readers (optuna-dashboard) never block the tuner's writes.

    The mode is stored in the database file, so it is set once, on a new or old file.
    """
    import sqlite3

    try:
        with sqlite3.connect(str(path), timeout=SQLITE_TIMEOUT_S) as db:
            db.execute("PRAGMA journal_mode=WAL")
    except sqlite3.DatabaseError as exc:
        if any(mark in str(exc) for mark in ("not a database", "malformed")):
            raise ConfigError(f"{source}: {path} is damaged ({exc}); restore it from a backup or use another storage") from None
        raise ConfigError(f"{source}: cannot open {path}: {exc}; check the path and its permissions") from None
    except sqlite3.Error as exc:
        raise ConfigError(f"{source}: cannot open {path}: {exc}; check the path and its permissions") from None


def check_no_password(url: str, source: str = "[study] storage") -> None:
    from urllib.parse import urlsplit

    if "://" in url and urlsplit(url).password:
        raise ConfigError(
            f"{source}: the URL holds a password; keep it out of configs and command lines: "
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
    inner = storage_for_url(config.storage_url, heartbeat_s=heartbeat or None, source=storage_source(config),
                            create_dir=config.study.storage is None)
    journal_dir = Path(config.target.workdir).expanduser() / "journal"
    return ResilientStorage(inner, url=config.storage_url, outage_s=config.study.storage_outage_s, journal_dir=journal_dir)


def storage_source(config: Config) -> str:
    """Where the study's storage URL comes from, as an error names it."""
    return "--storage" if config.storage_flag else f"{config.path} [study] storage"


def existing_storage(config: Config, url: str | None = None, source: str | None = None) -> optuna.storages.BaseStorage:
    """The store of a command that only reads (report, best, dashboard): never created."""
    from tuner.errors import TunerError

    url = url or config.storage_url
    source = source or storage_source(config)
    path = sqlite_path(url)
    if url.startswith("sqlite") and path is not None and not path.exists():
        raise TunerError(f"{source}: {path}: no such study database; run python -m tuner.optimize first, or pass --storage")
    return storage_for_url(url, source=source)


def load_existing_study(config: Config) -> optuna.Study:
    """The config's study, for commands that read one (report, best); never creates a database."""
    from tuner.errors import TunerError

    url = config.storage_url
    storage = existing_storage(config)
    try:
        return optuna.load_study(study_name=config.study.name, storage=storage)
    except KeyError:
        raise TunerError(f"no study {config.study.name!r} in {redacted_url(url)}; pass --study-name, or run python -m tuner.optimize first") from None


def study_summaries(storage: optuna.storages.BaseStorage) -> list[dict]:
    """Every study of a store (baseline siblings beside their study): its trial counts by state
    and the best value of each objective over its complete trials."""
    rows = []
    for name in sorted(optuna.get_all_study_names(storage)):
        study = optuna.load_study(study_name=name, storage=storage)
        counts: dict[str, int] = {}
        for t in study.get_trials(deepcopy=False):
            counts[t.state.name.lower()] = counts.get(t.state.name.lower(), 0) + 1
        done = study.get_trials(deepcopy=False, states=(optuna.trial.TrialState.COMPLETE,))
        names = list(study.metric_names or [f"objective_{i}" for i in range(len(study.directions))])
        best = {n: max(t.values[i] for t in done) for i, n in enumerate(names)} if done else {}
        row = {"study": name, "trials": counts, "best": best}
        if name.endswith("@baselines"):  # a sibling holds tuner.schedule's launches too: not baselines
            trials = study.get_trials(deepcopy=False)
            row["kinds"] = {"baselines": sum(1 for t in trials if t.user_attrs.get(record.BASELINE)),
                            "schedule launches": sum(1 for t in trials if t.user_attrs.get(record.SCHEDULE))}
        rows.append(row)
    return rows
