"""MLflow tracking behind a narrow interface: the trainer calls ``log``, ``flush`` and ``finish``.

- Where: ``MLFLOW_TRACKING_URI`` when set (e.g. a team server), else MLflow's own default, an
  SQLite store ``mlflow.db`` in the working directory with artifacts in ``mlruns/`` beside it
  (made absolute, so a resume from any directory finds it).
- Which stores: ``sqlite:///PATH``, an MLflow server at ``http(s)://``, or a SQL database MLflow
  supports whose driver is installed. ``check_tracking`` refuses anything else before a run
  exists: the file store (MLflow 3 retires it, and it misroutes runs when several processes start
  at once), a server that does not answer within ``CONNECT_TIMEOUT``, an SQLite path that is a
  directory or not an SQLite database, a store left half-migrated.
- Opening a store (``init_store``) happens once per process, before anything is logged. MLflow
  creates an SQLite store's schema in whichever process opens it first, without a lock: 16
  training processes started together on a new store all crashed, or left it half-migrated.
  Here the first open happens under an exclusive lock on ``<database>.lock`` beside it, so one
  process creates the schema and the others find it complete. Experiments are created under the
  same lock (``ensure_experiment``; MLflow's ``set_experiment`` silently misroutes runs when it
  loses a race, so it is never used).
- SQLite answers "database is locked" when several processes write at once; creating, resuming
  and ending a run, and sending metrics before a checkpoint, retry that with backoff.
- Metrics are buffered and sent with ``log_batch`` (one SQLite call per value costs ~5 ms).
- A resumed run continues the same MLflow run. Points already stored are not sent again, so the
  history has each step exactly once however often the job was interrupted.
- Every start and resume is an attempt, recorded as tags ``diffsweep.attempt.<n>.<field>`` (host,
  git commit, code snapshot, Slurm job, first step trained, checkpoint resumed from, processes,
  threads, start time) and in the artifact ``attempts.json``; the top-level source tags (git commit, host,
  Slurm job) are the latest attempt's.
- Only rank 0 tracks; other ranks get a ``NullTracker`` with the same interface.
"""

from __future__ import annotations

import fcntl
import json
import os
import random
import re
import socket
import sqlite3
import subprocess
import time
import urllib.error
import urllib.parse
import urllib.request
import warnings
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any, TypeVar

from diffsweep.config import ConfigError

T = TypeVar("T")

FLUSH_SECONDS = 10.0  # send buffered metrics at least this often
FLUSH_ITEMS = 900  # ... or when this many are waiting (log_batch takes at most 1,000)
SNAPSHOT_FILE = "SNAPSHOT.json"  # written by the launcher into a job's code snapshot (commit, dirty)
MAX_BUFFERED = 200_000  # a store unreachable for this long fails the run instead of growing memory
CONNECT_TIMEOUT = 5.0  # seconds a tracking server gets to answer /health
BUSY_SECONDS = 120.0  # how long a locked SQLite database is retried before the error stands
KEY = "MLFLOW_TRACKING_URI"
SQL_DATABASES = ("postgresql", "mysql", "mssql")  # MLflow's other SQLAlchemy stores (need a driver)
SQLITE_HEADER = b"SQLite format 3\x00"  # the first 16 bytes of every SQLite database file
ATTEMPTS_FILE = "attempts.json"
SOURCE_KEYS = ("diffsweep.host", "diffsweep.git_commit", "mlflow.source.git.commit", "diffsweep.git_dirty",
               "diffsweep.code", "diffsweep.slurm_job_id", "diffsweep.slurm_array_job_id",
               "diffsweep.slurm_array_task_id")  # what ``source_tags`` may set: the attempt's origin
_ATTEMPT_TAG = re.compile(r"^diffsweep\.attempt\.(\d+)\.(.+)$")
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
        raise ConfigError(KEY, f"{_shown(uri)}: unsupported scheme {scheme!r}; expected sqlite:///PATH (e.g. "
                          "sqlite:///mlflow.db) or the http(s):// address of an MLflow server")


def init_store(uri: str) -> None:
    """Open the store at ``uri`` for this process, creating its schema if it is new, safely when
    many processes start at once (see the module's notes). Call it after ``check_tracking`` and
    before anything is logged; ``ensure_experiment`` and ``MlflowTracker`` do. A store whose
    schema MLflow cannot use is a ``ConfigError`` saying what to do.

    SQLite stores are created under the lock; other SQL databases and servers are created by
    MLflow (create a new SQL database once, from one process, before starting many)."""
    if uri in _READY:
        return
    from mlflow.exceptions import MlflowException
    from mlflow.tracking import MlflowClient

    def open_store() -> None:
        try:
            MlflowClient(uri).search_experiments(max_results=1)  # MLflow builds (and caches) the store here
        except MlflowException as exc:
            if _busy(exc):
                raise
            raise ConfigError(KEY, _unusable_store(uri, exc)) from exc

    if uri.startswith("sqlite:"):
        with _store_lock(_sqlite_path(uri), exclusive=True):
            _retry_busy(open_store)
    else:
        open_store()
    _READY.add(uri)


def ensure_experiment(uri: str, name: str) -> str:
    """The id of experiment ``name`` in ``uri``, created (with the store) if needed. Safe when
    several processes ask at once: under the store's lock for SQLite, else the loser of a
    creation race reads the winner's."""
    init_store(uri)
    if uri.startswith("sqlite:"):
        with _store_lock(_sqlite_path(uri), exclusive=True):
            return _retry_busy(lambda: _get_or_create_experiment(uri, name))
    return _retry_busy(lambda: _get_or_create_experiment(uri, name))


def _get_or_create_experiment(uri: str, name: str) -> str:
    from mlflow.exceptions import MlflowException
    from mlflow.tracking import MlflowClient

    client = MlflowClient(uri)
    experiment = client.get_experiment_by_name(name)
    if experiment is not None:
        if experiment.lifecycle_stage == "deleted":
            raise ConfigError("--experiment", f"experiment {name!r} is deleted in {_shown(uri)} "
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
        raise ConfigError(KEY, f"{_shown(uri)} answered /health with HTTP {exc.code}; is it an MLflow "
                          "server?") from exc
    except (urllib.error.URLError, OSError, ValueError) as exc:
        reason = getattr(exc, "reason", exc)
        raise ConfigError(KEY, f"tracking server {_shown(uri)} is unreachable ({reason}, within "
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
        raise ConfigError(KEY, f"{_shown(uri)}: cannot use this database from here ({type(exc).__name__}: "
                          f"{str(exc).splitlines()[0][:200]}); install its driver") from exc


def _unusable_store(uri: str, exc: Exception) -> str:
    """What is wrong with a store MLflow refused to open, and what to do."""
    import mlflow

    text = str(getattr(exc, "message", exc)).strip()
    found = _OUT_OF_DATE.search(text)
    if found:
        return (f"{_shown(uri)} has schema version {found[1]}, MLflow {mlflow.__version__} uses {found[2]}: if the "
                f"store is older, back it up and run `mlflow db upgrade {_shown(uri)}`; if a newer MLflow made it, use "
                "that one")
    return f"cannot open the store {_shown(uri)} ({text.splitlines()[0][:300] if text else type(exc).__name__})"


def _shown(uri: str) -> str:
    """``uri`` with any password replaced by ``***`` (it goes into error messages)."""
    parts = urllib.parse.urlsplit(uri)
    if parts.password is None:
        return uri
    netloc = parts.netloc.replace(f":{parts.password}@", ":***@", 1)
    return urllib.parse.urlunsplit(parts._replace(netloc=netloc))


@contextmanager
def _store_lock(database: Path, *, exclusive: bool) -> Iterator[None]:
    """An inter-process lock on ``<database>.lock`` (``flock``; NFS maps it to its own locks). The
    file stays: removing a lock file lets two processes lock two different files."""
    fd = os.open(database.with_name(database.name + ".lock"), os.O_RDWR | os.O_CREAT, 0o666)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX if exclusive else fcntl.LOCK_SH)
        yield
    finally:
        os.close(fd)  # releases the lock


def _busy(exc: BaseException) -> bool:
    """SQLite's "database is locked": another process is writing; worth retrying."""
    return "database is locked" in str(exc) or "database table is locked" in str(exc)


def _retry_busy(call: Callable[[], T], seconds: float = BUSY_SECONDS) -> T:
    """``call()``, retried with exponential backoff (and jitter, so waiting processes spread out)
    while the database is locked, for up to ``seconds``."""
    delay, deadline = 0.05, time.monotonic() + seconds
    while True:
        try:
            return call()
        except Exception as exc:
            if not _busy(exc) or time.monotonic() > deadline:
                raise
        time.sleep(delay * (1 + random.random()))
        delay = min(delay * 2, 5.0)


def source_tags() -> dict[str, str]:
    """Where this code and job come from: git commit and dirty flag, host, Slurm job."""
    tags = {"diffsweep.host": socket.gethostname()}
    root = Path(__file__).resolve().parents[2]
    snapshot = root / SNAPSHOT_FILE  # a launched job runs a copy of the code, made from a checkout
    if snapshot.is_file():
        info = json.loads(snapshot.read_text())
        return tags | {"diffsweep.git_commit": info["git_commit"], "mlflow.source.git.commit": info["git_commit"],
                       "diffsweep.git_dirty": info["git_dirty"], "diffsweep.code": str(root)} | _slurm_tags()
    try:
        commit = _git(root, "rev-parse", "HEAD")
        dirty = bool(_git(root, "status", "--porcelain", "--untracked-files=no"))
        tags |= {"diffsweep.git_commit": commit, "mlflow.source.git.commit": commit,
                 "diffsweep.git_dirty": str(dirty).lower()}
    except (OSError, subprocess.SubprocessError):
        tags |= {"diffsweep.git_commit": "unknown", "diffsweep.git_dirty": "unknown"}
    return tags | _slurm_tags()


def _slurm_tags() -> dict[str, str]:
    tags = {}
    for env, tag in (("SLURM_JOB_ID", "diffsweep.slurm_job_id"), ("SLURM_ARRAY_JOB_ID", "diffsweep.slurm_array_job_id"),
                     ("SLURM_ARRAY_TASK_ID", "diffsweep.slurm_array_task_id")):
        if os.environ.get(env):
            tags[tag] = os.environ[env]
    return tags


def _git(root: Path, *args: str) -> str:
    out = subprocess.run(["git", "-C", str(root), *args], capture_output=True, text=True, timeout=10, check=True)
    return out.stdout.strip()


class MlflowTracker:
    """One MLflow run: created with params, tags and the config artifact, or resumed by id."""

    def __init__(self, uri: str, experiment_id: str | None = None, run_id: str | None = None) -> None:
        from mlflow.tracking import MlflowClient

        init_store(uri)
        self.client = MlflowClient(uri)
        self.uri, self.experiment_id, self.run_id = uri, experiment_id, run_id
        self._buffer: list[Any] = []
        self._last_flush = time.monotonic()
        self._stored: dict[str, int] = {}  # metric key -> last step already in the store

    def _call(self, method: Callable[..., T], *args: Any, **kwargs: Any) -> T:
        """A client call, retried while the store is busy."""
        return _retry_busy(lambda: method(*args, **kwargs))

    def start(self, run_name: str, params: dict[str, str], tags: dict[str, str], config_yaml: str,
              attempt: dict[str, str]) -> str:
        """Create the run (status RUNNING) and log its params, tags, ``config.yaml`` and its first
        attempt (``attempt``: see ``resume``)."""
        from mlflow.entities import Param

        run = self._call(self.client.create_run, self.experiment_id, run_name=run_name,
                         tags=tags | _attempt_tags(1, attempt) | {"diffsweep.attempts": "1"})
        self.run_id = run.info.run_id
        try:
            items = [Param(k, v) for k, v in params.items()]
            for i in range(0, len(items), 100):  # log_batch takes at most 100 params per call
                self._call(self.client.log_batch, self.run_id, params=items[i : i + 100])
            self._call(self.client.log_text, self.run_id, config_yaml, "config.yaml")
            self._call(self.client.log_dict, self.run_id, [attempt], ATTEMPTS_FILE)
        except BaseException:
            self._call(self.client.set_terminated, self.run_id, status="FAILED")  # never left RUNNING
            raise
        return self.run_id

    def resume(self, source: dict[str, str], attempt: dict[str, str]) -> int:
        """Mark the existing run RUNNING again, learn which metric points it already has, and
        record this attempt: ``attempt`` (where the code and job come from, the first step it
        trains, ...) as tags ``diffsweep.attempt.<n>.<field>`` and in ``attempts.json``, and the
        top-level ``source`` tags as this attempt's. Returns n (2 for the first resume)."""
        from mlflow.entities import RunTag
        from mlflow.exceptions import MlflowException

        try:
            run = self._call(self.client.get_run, self.run_id)
        except MlflowException as exc:
            raise ConfigError(KEY, f"run {self.run_id} (from the checkpoint) is not in {_shown(self.uri)}") from exc
        if run.info.lifecycle_stage == "deleted":
            raise ConfigError(KEY, f"run {self.run_id} (from the checkpoint) is deleted in "
                              f"{_shown(self.uri)}; restore it in the MLflow UI to resume")
        for key in run.data.metrics:
            history = self._call(self.client.get_metric_history, self.run_id, key)
            self._stored[key] = max(m.step for m in history)
        tags = run.data.tags
        attempts = _attempts(tags)
        if not attempts:  # a run from before attempts were recorded: its top-level tags are its first's
            attempts[1] = {key.removeprefix("diffsweep."): tags[key] for key in SOURCE_KEYS
                           if key in tags and key.startswith("diffsweep.")}
        number = max(attempts) + 1
        attempts[number] = attempt
        new = source | {"diffsweep.attempts": str(number)}
        for n, fields in attempts.items():
            new |= _attempt_tags(n, fields)
        items = [RunTag(k, v) for k, v in new.items() if tags.get(k) != v]
        for i in range(0, len(items), 100):  # log_batch takes at most 100 tags per call
            self._call(self.client.log_batch, self.run_id, tags=items[i : i + 100])
        # Source tags this attempt lacks (a Slurm job id, when resumed outside Slurm) are not its.
        stale = [key for key in SOURCE_KEYS if key in tags and key not in source]
        if "diffsweep.end_reason" in tags:  # from an interrupted attempt; no longer true
            stale.append("diffsweep.end_reason")
        for key in stale:
            self._call(self.client.delete_tag, self.run_id, key)
        self._call(self.client.log_dict, self.run_id, [attempts[n] for n in sorted(attempts)], ATTEMPTS_FILE)
        self._call(self.client.update_run, self.run_id, status="RUNNING")
        return number

    def ensure_finished(self) -> None:
        """Mark a run whose training is complete FINISHED (its job may have died before saying so)."""
        if self._call(self.client.get_run, self.run_id).info.status != "FINISHED":
            self._call(self.client.set_terminated, self.run_id, status="FINISHED")

    def set_tags(self, tags: dict[str, str]) -> None:
        for key, value in tags.items():
            self._call(self.client.set_tag, self.run_id, key, value)

    def log(self, step: int, metrics: dict[str, float]) -> None:
        """Buffer ``metrics`` of ``step``; sent in batches (see ``flush``)."""
        from mlflow.entities import Metric

        now = int(time.time() * 1000)
        for key, value in metrics.items():
            if step > self._stored.get(key, -1):  # a resumed run re-computes steps the store has
                self._buffer.append(Metric(key, float(value), now, step))
        if len(self._buffer) >= FLUSH_ITEMS or time.monotonic() - self._last_flush >= FLUSH_SECONDS:
            try:
                self._send()
            except Exception as exc:  # a busy store ("database is locked", HTTP 5xx): retry later
                if len(self._buffer) > MAX_BUFFERED:
                    raise
                self._last_flush = time.monotonic()
                warnings.warn(f"MLflow logging failed, will retry ({type(exc).__name__}: {exc})", stacklevel=2)

    def flush(self) -> None:
        """Send every buffered metric, waiting out a busy store (before a checkpoint, at the end)."""
        _retry_busy(self._send)

    def _send(self) -> None:
        """Send the buffer; a batch leaves it only once the store has it."""
        while self._buffer:
            batch = self._buffer[:1000]
            self.client.log_batch(self.run_id, metrics=batch)
            del self._buffer[: len(batch)]
            for metric in batch:
                self._stored[metric.key] = max(self._stored.get(metric.key, -1), metric.step)
        self._last_flush = time.monotonic()

    def finish(self, status: str, reason: str | None = None) -> None:
        """Flush and end the run as FINISHED, FAILED or KILLED (with the reason as a tag)."""
        try:
            self.flush()
        finally:
            try:
                if reason:
                    self._call(self.client.set_tag, self.run_id, "diffsweep.end_reason", reason[:5000])
            finally:
                self._call(self.client.set_terminated, self.run_id, status=status)


def _attempt_tags(number: int, attempt: dict[str, str]) -> dict[str, str]:
    return {f"diffsweep.attempt.{number}.{key}": value for key, value in attempt.items()}


def _attempts(tags: dict[str, str]) -> dict[int, dict[str, str]]:
    """The attempts recorded in a run's tags, by number."""
    found: dict[int, dict[str, str]] = {}
    for key, value in tags.items():
        match = _ATTEMPT_TAG.match(key)
        if match:
            found.setdefault(int(match[1]), {})[match[2]] = value
    return found


class NullTracker:
    """What ranks other than 0 get: the same interface, no effect."""

    run_id: str | None = None

    def start(self, *args: Any, **kwargs: Any) -> str | None:
        return None

    def resume(self, source: dict[str, str], attempt: dict[str, str]) -> int:
        return 0

    def ensure_finished(self) -> None:
        pass

    def set_tags(self, tags: dict[str, str]) -> None:
        pass

    def log(self, step: int, metrics: dict[str, float]) -> None:
        pass

    def flush(self) -> None:
        pass

    def finish(self, status: str, reason: str | None = None) -> None:
        pass
