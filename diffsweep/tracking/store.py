"""The MLflow store runs are tracked in: where it is, whether it can be used, opening it safely
from many processes at once, and ``mlflow_client``, the one constructor of an MLflow client.

This module sits low (next to ``diffsweep.config``): launch/, scaling/, compare/ and the CLI use it
without importing the trainer, and it imports neither torch nor mlflow at module level (mlflow is
imported by the functions that talk to a store). Where: ``tracking_uri``; which stores:
``check_tracking``; a new store opened by many processes at once: ``init_store``, ``ensure_experiment``
(under a lock beside an SQLite store); "database is locked": ``retry_busy``; a dead job's run:
``end_run``. Beside it: ``provenance.source_tags`` (where runs come from) and
``filesystems.shared_store_warning`` (which file system holds a store).
See docs/training.md, 'What a run logs to MLflow'.
"""

from __future__ import annotations

import fcntl
import os
import random
import re
import sqlite3
import sys
import time
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any, TypeVar

from diffsweep.config import ConfigError
from diffsweep.tracking import tags as tag

T = TypeVar("T")

CONNECT_TIMEOUT = 5.0  # seconds a tracking server gets to answer /health
BUSY_SECONDS = 120.0  # how long a locked SQLite database is retried before the error stands
LOCK_SECONDS = 300.0  # how long one process may hold the store's lock file before a waiter gives up
LOCK_NOTICE = 10.0  # after which a process waiting for it says so on stderr
KEY = "MLFLOW_TRACKING_URI"
SQL_DATABASES = ("postgresql", "mysql", "mssql")  # MLflow's other SQLAlchemy stores (need a driver)
SQLITE_HEADER = b"SQLite format 3\x00"  # the first 16 bytes of every SQLite database file
_OUT_OF_DATE = re.compile(r"found version (\S+), but expected (\S+)\)")
_READY: set[str] = set()  # stores this process has opened (``init_store``)


def tracking_uri() -> str:
    """``MLFLOW_TRACKING_URI``, else ``mlflow.db`` in the working directory as an absolute path
    (recorded in ``run.json``, so a resume from another directory finds the same store)."""
    return os.environ.get("MLFLOW_TRACKING_URI") or f"sqlite:///{Path('mlflow.db').absolute()}"


def check_tracking(uri: str) -> None:
    """Fail fast, before any run exists, when ``uri`` is no usable tracking store: a
    ``ConfigError`` on ``MLFLOW_TRACKING_URI`` saying why (and what to do, for a damaged store).

    Creates nothing (but the lock file beside an existing SQLite store) and imports neither
    mlflow nor torch. A server gets ``CONNECT_TIMEOUT`` seconds to answer ``/health``; an SQLite
    file must be empty or start with the SQLite header, and an existing store must not hold
    tables left by an interrupted schema migration. A SQL database's driver must be installed
    (whether the database answers is not checked)."""
    scheme = uri.split("://", 1)[0].lower() if "://" in uri else ""
    if scheme in ("http", "https"):
        _check_server(uri)
    elif scheme == "sqlite":
        _check_sqlite(uri)
    elif scheme.split("+", 1)[0] in SQL_DATABASES:
        _check_sql_driver(uri)
    elif scheme in ("", "file"):
        raise ConfigError(KEY, f"{uri} is MLflow's file store, which diffsweep does not use (MLflow 3 retires it, "
                          "and it misroutes runs when several processes start at once); use sqlite:///PATH/mlflow.db "
                          "(`mlflow migrate-filestore` moves existing runs there)")
    else:
        raise ConfigError(KEY, f"{shown(uri)}: unsupported scheme {scheme!r}; expected sqlite:///PATH (e.g. "
                          "sqlite:///mlflow.db) or the http(s):// address of an MLflow server")


def import_mlflow(uri: str) -> None:
    """Import MLflow's client, and for a SQLite ``uri`` its SQL store (which the first call of a
    client imports): a command imports them with its other start-up imports
    (``diffsweep.startup.imports_frozen``)."""
    import mlflow.tracking  # noqa: F401

    if uri.startswith("sqlite:"):
        import mlflow.store.tracking.sqlalchemy_store  # noqa: F401


def mlflow_client(uri: str) -> Any:
    """An MLflow client of the store at ``uri``: the one place diffsweep constructs one. Open the
    store first where it may be new or busy (``init_store``, ``existing_store``)."""
    from mlflow.tracking import MlflowClient

    return MlflowClient(uri)


def init_store(uri: str) -> None:
    """Open the store at ``uri`` for this process, creating its schema if it is new, safely when
    many processes start at once. Call it after ``check_tracking`` and before anything is logged,
    once per process; ``ensure_experiment`` and ``MlflowTracker`` do. A store whose schema MLflow
    cannot use is a ``ConfigError`` saying what to do.

    MLflow creates an SQLite store's schema in whichever process opens it first, without a lock: 16
    training processes started together on a new store all crashed, or left it half-migrated. Here
    the first open happens under an exclusive lock on ``<database>.lock`` beside it, so one process
    creates the schema and the others find it complete.

    SQLite stores are created under the lock; other SQL databases and servers are created by
    MLflow (create a new SQL database once, from one process, before starting many)."""
    if uri in _READY:
        return
    from mlflow.exceptions import MlflowException

    def open_store() -> None:
        try:
            mlflow_client(uri).search_experiments(max_results=1)  # MLflow builds (and caches) the store here
        except MlflowException as exc:
            if busy(exc):
                raise
            raise ConfigError(KEY, _unusable_store(uri, exc)) from exc

    if uri.startswith("sqlite:"):
        with _store_lock(_sqlite_path(uri), exclusive=True):
            retry_busy(open_store)
    else:
        open_store()
    _READY.add(uri)


def fail_fast_http() -> None:
    """MLflow's HTTP client retries a lost server for minutes (7 retries, 120 s timeouts); commands
    that check the store up front report a failure later within seconds instead."""
    os.environ.setdefault("MLFLOW_HTTP_REQUEST_MAX_RETRIES", "2")
    os.environ.setdefault("MLFLOW_HTTP_REQUEST_TIMEOUT", "30")


def existing_store(uri: str) -> str:
    """A store to read finished runs from (``fit``, ``compare``): it must exist already (nothing is
    created), answer within seconds, and be of this MLflow's schema; returns ``uri``."""
    fail_fast_http()
    if uri.startswith("sqlite:///") and not Path(uri.removeprefix("sqlite:///")).is_file():
        raise ConfigError("MLFLOW_TRACKING_URI", f"no MLflow store at {uri.removeprefix('sqlite:///')}: nothing has "
                          "been trained from this directory (set MLFLOW_TRACKING_URI or cd to the project)")
    check_tracking(uri)
    init_store(uri)  # a store another MLflow version made: one line saying what to do
    return uri


MAX_EXPERIMENT_NAME = 500  # MLflow's limit (mlflow.utils.validation.MAX_EXPERIMENT_NAME_LENGTH)


def check_experiment_name(name: object, key: str = "experiment") -> str:
    """An MLflow experiment name a user gave (``train --experiment``, a sweep's ``experiment:``),
    checked before any store exists: a non-empty string of at most 500 characters, not only
    spaces, without control characters (a newline or NUL cannot be typed back in the UI's search).
    Returns it; a ``ConfigError`` on ``key`` otherwise."""
    if not isinstance(name, str) or not name.strip():
        raise ConfigError(key, f"expected a non-empty experiment name, got {name!r}")
    if len(name) > MAX_EXPERIMENT_NAME:
        raise ConfigError(key, f"expected an experiment name of at most {MAX_EXPERIMENT_NAME} characters, got "
                          f"{len(name)}")
    if any(ord(c) < 32 or ord(c) == 127 for c in name):
        raise ConfigError(key, f"expected an experiment name without control characters, got {name!r}")
    return name


def ensure_experiment(uri: str, name: str) -> str:
    """The id of experiment ``name`` in ``uri``, created (with the store) if needed. Safe when
    several processes ask at once: under the store's lock for SQLite, else the loser of a
    creation race reads the winner's. (MLflow's ``set_experiment`` silently misroutes runs when it
    loses a race, so it is never used.)"""
    check_experiment_name(name)
    init_store(uri)
    if uri.startswith("sqlite:"):
        with _store_lock(_sqlite_path(uri), exclusive=True):
            return retry_busy(lambda: _get_or_create_experiment(uri, name))
    return retry_busy(lambda: _get_or_create_experiment(uri, name))


def _get_or_create_experiment(uri: str, name: str) -> str:
    from mlflow.exceptions import MlflowException

    client = mlflow_client(uri)
    experiment = client.get_experiment_by_name(name)
    if experiment is not None:
        if experiment.lifecycle_stage == "deleted":
            raise ConfigError("experiment", f"experiment {name!r} is deleted in {shown(uri)} "
                              "(restore it in the MLflow UI, or pick another name)")
        return experiment.experiment_id
    try:
        return client.create_experiment(name)
    except MlflowException:
        experiment = client.get_experiment_by_name(name)  # another process created it first
        if experiment is None:
            raise
        return experiment.experiment_id


def _check_server(uri: str) -> None:
    health = uri.rstrip("/") + "/health"
    try:
        with urllib.request.urlopen(health, timeout=CONNECT_TIMEOUT) as response:  # noqa: S310 (user's own server)
            response.read()
    except urllib.error.HTTPError as exc:
        raise ConfigError(KEY, f"{shown(uri)} answered /health with HTTP {exc.code}; is it an MLflow "
                          "server?") from exc
    except (urllib.error.URLError, OSError, ValueError) as exc:
        reason = getattr(exc, "reason", exc)
        raise ConfigError(KEY, f"tracking server {shown(uri)} is unreachable ({reason}, within "
                          f"{CONNECT_TIMEOUT:g} s)") from exc


def _sqlite_path(uri: str) -> Path:
    """The database file of ``sqlite:///PATH`` (relative) or ``sqlite:////PATH`` (absolute)."""
    path = uri.removeprefix("sqlite:///").split("?", 1)[0] if uri.startswith("sqlite:///") else ""
    if path in ("", ":memory:"):
        raise ConfigError(KEY, f"{uri} is an in-memory store, which keeps nothing; use sqlite:///PATH/mlflow.db")
    return Path(path)


def _check_sqlite(uri: str) -> None:
    path = _sqlite_path(uri)
    if path.is_dir():
        raise ConfigError(KEY, f"{uri}: {path} is a directory, not an SQLite database file")
    parent = path.absolute().parent
    if not parent.is_dir() or not os.access(parent, os.W_OK):
        raise ConfigError(KEY, f"cannot write the SQLite store of {uri} in {parent}")
    if not path.exists():
        return  # created by ``init_store``
    try:
        with open(path, "rb") as f:
            header = f.read(len(SQLITE_HEADER))
    except OSError as exc:
        raise ConfigError(KEY, f"{uri}: cannot read {path} ({exc.strerror})") from exc
    if header and header != SQLITE_HEADER:  # an empty file is an empty database, which MLflow fills
        raise ConfigError(KEY, f"{uri}: {path} is not an SQLite database")
    if header:
        _check_schema(uri, path)


def _check_schema(uri: str, path: Path) -> None:
    """The store is MLflow's and no schema migration was left half done."""
    try:
        with _store_lock(path, exclusive=False):  # not while another process creates the schema
            connection = sqlite3.connect(f"{path.absolute().as_uri()}?mode=ro", uri=True)
            try:
                tables = {row[0] for row in connection.execute("SELECT name FROM sqlite_master WHERE type='table'")}
                runs = connection.execute("SELECT count(*) FROM runs").fetchone()[0] if "runs" in tables else 0
            finally:
                connection.close()
    except sqlite3.Error as exc:
        raise ConfigError(KEY, f"{uri}: {path} is not a readable SQLite database ({exc})") from exc
    leftovers = sorted(t for t in tables if t.startswith("_alembic_tmp_"))
    if leftovers:
        if runs:
            todo = (f"back it up, drop those tables (sqlite3 {path} 'DROP TABLE {leftovers[0]};' and so on), then run "
                    f"`mlflow db upgrade {uri}`")
        else:
            todo = f"it holds no runs: delete {path} and run again"
        raise ConfigError(KEY, f"{uri} was left half-migrated by an interrupted schema upgrade (tables "
                          f"{', '.join(leftovers)}); {todo}")
    if tables and "alembic_version" not in tables:
        raise ConfigError(KEY, f"{uri}: {path} is an SQLite database but not an MLflow store")


def _check_sql_driver(uri: str) -> None:
    import sqlalchemy

    try:
        sqlalchemy.create_engine(uri)  # loads the driver; connects to nothing
    except (ImportError, sqlalchemy.exc.ArgumentError, sqlalchemy.exc.NoSuchModuleError) as exc:
        raise ConfigError(KEY, f"{shown(uri)}: cannot use this database from here ({type(exc).__name__}: "
                          f"{str(exc).splitlines()[0][:200]}); install its driver") from exc


def _unusable_store(uri: str, exc: Exception) -> str:
    """What is wrong with a store MLflow refused to open, and what to do."""
    import mlflow

    text = str(getattr(exc, "message", exc)).strip()
    found = _OUT_OF_DATE.search(text)
    if found:
        return (f"{shown(uri)} has schema version {found[1]}, MLflow {mlflow.__version__} uses {found[2]}: if the "
                f"store is older, back it up and run `mlflow db upgrade {shown(uri)}`; if a newer MLflow made it, use "
                "that one")
    return f"cannot open the store {shown(uri)} ({text.splitlines()[0][:300] if text else type(exc).__name__})"


def shown(uri: str) -> str:
    """``uri`` with any password replaced by ``***`` (it goes into error messages)."""
    parts = urllib.parse.urlsplit(uri)
    if parts.password is None:
        return uri
    netloc = parts.netloc.replace(f":{parts.password}@", ":***@", 1)
    return urllib.parse.urlunsplit(parts._replace(netloc=netloc))


@contextmanager
def _store_lock(database: Path, *, exclusive: bool) -> Iterator[None]:
    """An inter-process lock on ``<database>.lock`` (``flock``; NFS maps it to its own locks). The
    file stays: removing a lock file lets two processes lock two different files.

    It is held for the seconds a store takes to open, never longer; a process that finds it taken
    waits (many processes starting at once queue here), says so on stderr after ``LOCK_NOTICE``
    seconds, and gives up with a ``ConfigError`` naming the file and the holder once one process
    has held it for ``LOCK_SECONDS`` (``/proc/locks``; where that cannot be read, once it has
    waited that long): that holder is stopped (Ctrl-Z, a suspended job) or hung, and waiting on
    would hang this command with it."""
    path = database.with_name(database.name + ".lock")
    fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o666)
    try:
        mode = fcntl.LOCK_EX if exclusive else fcntl.LOCK_SH
        start = time.monotonic()
        since: dict[str, float] = {}  # each holder seen, with when it was first seen
        delay, noticed = 0.01, False
        while True:
            try:
                fcntl.flock(fd, mode | fcntl.LOCK_NB)
                break
            except BlockingIOError:
                now = time.monotonic()
            holders = lock_holders(os.fstat(fd).st_ino)
            since = {pid: since.get(pid, now) for pid in holders}
            oldest = min(since.items(), key=lambda kv: kv[1], default=None)
            held = now - (oldest[1] if oldest else start)
            if held > LOCK_SECONDS:
                who = f"pid {oldest[0]}" if oldest else "another process"
                raise ConfigError(KEY, f"{path} has been locked by {who} for {LOCK_SECONDS:g} s; a process "
                                  "opening this store is stopped (Ctrl-Z, a suspended job) or hung: "
                                  f"`fuser -v {path}` names it")
            if now - start > LOCK_NOTICE and not noticed:
                print(f"diffsweep: waiting for {path} (locked by another process; gives up once one has held it "
                      f"for {LOCK_SECONDS:g} s)", file=sys.stderr, flush=True)
                noticed = True
            time.sleep(delay * (1 + random.random()))
            delay = min(delay * 2, 0.5)
        yield
    finally:
        os.close(fd)  # releases the lock


def lock_holders(inode: int) -> set[str]:
    """The pids ``/proc/locks`` shows holding (not waiting for) a lock on the file of ``inode``;
    empty where it cannot be read."""
    try:
        text = Path("/proc/locks").read_text()
    except OSError:
        return set()
    fields = (line.split() for line in text.splitlines())  # "1: FLOCK ADVISORY READ 1234 fd:01:5678 0 EOF"
    return {f[4] for f in fields if len(f) > 5 and "->" not in f and f[5].rsplit(":", 1)[-1] == str(inode)}


def busy(exc: BaseException) -> bool:
    """SQLite's "database is locked": another process is writing; worth retrying."""
    return "database is locked" in str(exc) or "database table is locked" in str(exc)


def retry_busy(call: Callable[[], T], seconds: float = BUSY_SECONDS) -> T:
    """``call()``, retried with exponential backoff (and jitter, so waiting processes spread out)
    while the database is locked, for up to ``seconds``."""
    delay, deadline = 0.05, time.monotonic() + seconds
    while True:
        try:
            return call()
        except Exception as exc:
            if not busy(exc) or time.monotonic() > deadline:
                raise
        time.sleep(delay * (1 + random.random()))
        delay = min(delay * 2, 5.0)


def end_run(uri: str, run_id: str, status: str, reason: str) -> None:
    """End run ``run_id`` of ``uri`` as ``status`` (FAILED, KILLED) with ``reason`` as its
    ``diffsweep.end_reason`` tag, if it is still RUNNING or SCHEDULED (a job that died without
    ending its run); a run that ended itself is left as it is."""
    client = mlflow_client(uri)
    run = client.get_run(run_id)
    if run.info.status in ("RUNNING", "SCHEDULED"):
        client.set_tag(run_id, tag.END_REASON, reason)
        client.set_terminated(run_id, status=status)


def all_runs(client: Any, experiment_id: str, query: str = "") -> list[Any]:
    """Every run of an experiment that ``query`` (an MLflow search filter) matches: MLflow pages
    ``search_runs`` (at most 50,000 a page), so this follows its page tokens."""
    runs: list[Any] = []
    token = None
    while True:
        page = client.search_runs([experiment_id], query, max_results=5000, page_token=token)
        runs.extend(page)
        token = page.token
        if not token:
            return runs
