"""MLflow tracking behind a narrow interface: the trainer calls ``log``, ``flush`` and ``finish``.

- Where: ``MLFLOW_TRACKING_URI`` when set (e.g. a team server), else MLflow's own default, an
  SQLite store ``mlflow.db`` in the working directory with artifacts in ``mlruns/`` beside it
  (made absolute, so a resumed run finds it from any directory).
- The database and the experiment are created once, by the process that plans the runs
  (``ensure_experiment``), never raced from several jobs (MLflow's ``set_experiment`` silently
  misroutes runs when it loses that race).
- Metrics are buffered and sent with ``log_batch`` (one SQLite call per value costs ~5 ms).
- A resumed run continues the same MLflow run. Points already stored are not sent again, so the
  history has each step exactly once however often the job was interrupted.
- Only rank 0 tracks; other ranks get a ``NullTracker`` with the same interface.
"""

from __future__ import annotations

import json
import os
import socket
import subprocess
import time
import urllib.error
import urllib.request
import warnings
from pathlib import Path
from typing import Any

from diffsweep.config import ConfigError

FLUSH_SECONDS = 10.0  # send buffered metrics at least this often
FLUSH_ITEMS = 900  # ... or when this many are waiting (log_batch takes at most 1,000)
SNAPSHOT_FILE = "SNAPSHOT.json"  # written by the launcher into a job's code snapshot (commit, dirty)
MAX_BUFFERED = 200_000  # a store unreachable for this long fails the run instead of growing memory


def tracking_uri() -> str:
    """``MLFLOW_TRACKING_URI``, else ``mlflow.db`` in the working directory as an absolute path
    (recorded in ``run.json``, so a resume from another directory finds the same store)."""
    return os.environ.get("MLFLOW_TRACKING_URI") or f"sqlite:///{Path('mlflow.db').absolute()}"


def check_tracking(uri: str) -> None:
    """Fail fast, before any run exists, when the tracking store cannot be used."""
    if uri.startswith(("http://", "https://")):
        health = uri.rstrip("/") + "/health"
        try:
            with urllib.request.urlopen(health, timeout=5) as response:  # noqa: S310 (user's own server)
                response.read()
        except (urllib.error.URLError, OSError, ValueError) as exc:
            reason = getattr(exc, "reason", exc)
            raise ConfigError("MLFLOW_TRACKING_URI", f"tracking server {uri} is unreachable ({reason})") from exc
    elif uri.startswith("sqlite:///"):
        parent = Path(uri.removeprefix("sqlite:///")).absolute().parent
        if not parent.is_dir() or not os.access(parent, os.W_OK):
            raise ConfigError("MLFLOW_TRACKING_URI", f"cannot write the SQLite store of {uri} in {parent}")


def ensure_experiment(uri: str, name: str) -> str:
    """The id of experiment ``name`` in ``uri``, created (with the database) if needed.

    Call this once in the parent process before starting jobs that log to it.
    """
    from mlflow.exceptions import MlflowException
    from mlflow.tracking import MlflowClient

    client = MlflowClient(uri)
    experiment = client.get_experiment_by_name(name)
    if experiment is not None:
        if experiment.lifecycle_stage == "deleted":
            raise ConfigError("--experiment", f"experiment {name!r} is deleted in {uri} "
                              "(restore it in the MLflow UI, or pick another name)")
        return experiment.experiment_id
    try:
        return client.create_experiment(name)
    except MlflowException as exc:  # another process created it first
        experiment = client.get_experiment_by_name(name)
        if experiment is None:
            raise
        del exc
        return experiment.experiment_id


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

        self.client = MlflowClient(uri)
        self.uri, self.experiment_id, self.run_id = uri, experiment_id, run_id
        self._buffer: list[Any] = []
        self._last_flush = time.monotonic()
        self._stored: dict[str, int] = {}  # metric key -> last step already in the store

    def start(self, run_name: str, params: dict[str, str], tags: dict[str, str], config_yaml: str) -> str:
        """Create the run (status RUNNING) and log its params, tags and ``config.yaml``."""
        from mlflow.entities import Param

        run = self.client.create_run(self.experiment_id, run_name=run_name, tags=tags)
        self.run_id = run.info.run_id
        try:
            items = [Param(k, v) for k, v in params.items()]
            for i in range(0, len(items), 100):  # log_batch takes at most 100 params per call
                self.client.log_batch(self.run_id, params=items[i : i + 100])
            self.client.log_text(self.run_id, config_yaml, "config.yaml")
        except BaseException:
            self.client.set_terminated(self.run_id, status="FAILED")  # never left RUNNING
            raise
        return self.run_id

    def resume(self) -> None:
        """Mark the existing run RUNNING again and learn which metric points it already has."""
        from mlflow.exceptions import MlflowException

        try:
            run = self.client.get_run(self.run_id)
        except MlflowException as exc:
            raise ConfigError("MLFLOW_TRACKING_URI", f"run {self.run_id} (from the checkpoint) is not in {self.uri}") from exc
        if run.info.lifecycle_stage == "deleted":
            raise ConfigError("MLFLOW_TRACKING_URI", f"run {self.run_id} (from the checkpoint) is deleted in "
                              f"{self.uri}; restore it in the MLflow UI to resume")
        for key in run.data.metrics:
            history = self.client.get_metric_history(self.run_id, key)
            self._stored[key] = max(m.step for m in history)
        if "diffsweep.end_reason" in run.data.tags:  # from an interrupted attempt; no longer true
            self.client.delete_tag(self.run_id, "diffsweep.end_reason")
        self.client.update_run(self.run_id, status="RUNNING")

    def ensure_finished(self) -> None:
        """Mark a run whose training is complete FINISHED (its job may have died before saying so)."""
        if self.client.get_run(self.run_id).info.status != "FINISHED":
            self.client.set_terminated(self.run_id, status="FINISHED")

    def set_tags(self, tags: dict[str, str]) -> None:
        for key, value in tags.items():
            self.client.set_tag(self.run_id, key, value)

    def log(self, step: int, metrics: dict[str, float]) -> None:
        """Buffer ``metrics`` of ``step``; sent in batches (see ``flush``)."""
        from mlflow.entities import Metric

        now = int(time.time() * 1000)
        for key, value in metrics.items():
            if step > self._stored.get(key, -1):  # a resumed run re-computes steps the store has
                self._buffer.append(Metric(key, float(value), now, step))
        if len(self._buffer) >= FLUSH_ITEMS or time.monotonic() - self._last_flush >= FLUSH_SECONDS:
            try:
                self.flush()
            except Exception as exc:  # a busy store ("database is locked", HTTP 5xx): retry later
                if len(self._buffer) > MAX_BUFFERED:
                    raise
                self._last_flush = time.monotonic()
                warnings.warn(f"MLflow logging failed, will retry ({type(exc).__name__}: {exc})", stacklevel=2)

    def flush(self) -> None:
        """Send every buffered metric; a batch leaves the buffer only once the store has it."""
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
                    self.client.set_tag(self.run_id, "diffsweep.end_reason", reason[:5000])
            finally:
                self.client.set_terminated(self.run_id, status=status)


class NullTracker:
    """What ranks other than 0 get: the same interface, no effect."""

    run_id: str | None = None

    def start(self, *args: Any, **kwargs: Any) -> str | None:
        return None

    def resume(self) -> None:
        pass

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
