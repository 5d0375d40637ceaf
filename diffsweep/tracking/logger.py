"""The trainer's metric logger: one MLflow run behind a narrow interface (the trainer calls ``log``,
``flush`` and ``finish``).

- The store (where it is, checking it, opening it safely from many processes at once, the source
  tags) is ``diffsweep.tracking.store``; the run directory's files (``run.json``) are ``diffsweep.rundir``.
  Creating, resuming and ending a run, and sending metrics before a checkpoint, retry a busy
  SQLite store.
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

import re
import time
import warnings
from collections.abc import Callable
from typing import Any, Protocol, TypeVar

from diffsweep.config import ConfigError
from diffsweep.tracking import tags as tag
from diffsweep.tracking.provenance import SOURCE_KEYS
from diffsweep.tracking.store import KEY, init_store, mlflow_client, retry_busy, shown

T = TypeVar("T")

FLUSH_SECONDS = 10.0  # send buffered metrics at least this often
FLUSH_ITEMS = 900  # ... or when this many are waiting (log_batch takes at most 1,000)
MAX_BUFFERED = 200_000  # a store unreachable for this long fails the run instead of growing memory
ATTEMPTS_FILE = "attempts.json"
_ATTEMPT_TAG = re.compile(rf"^{re.escape(tag.ATTEMPT)}(\d+)\.(.+)$")


class Tracker(Protocol):
    """What the trainer logs through: ``MlflowTracker`` on rank 0, ``NullTracker`` elsewhere."""

    run_id: str | None

    def resume(self, source: dict[str, str], attempt: dict[str, str]) -> int: ...
    def ensure_finished(self) -> None: ...
    def set_tags(self, tags: dict[str, str]) -> None: ...
    def log(self, step: int, metrics: dict[str, float]) -> None: ...
    def flush(self) -> None: ...
    def finish(self, status: str, reason: str | None = None) -> None: ...


class MlflowTracker:
    """One MLflow run: created with params, tags and the config artifact, or resumed by id."""

    def __init__(self, uri: str, experiment_id: str | None = None, run_id: str | None = None) -> None:
        init_store(uri)
        self.client = mlflow_client(uri)
        self.uri, self.experiment_id, self.run_id = uri, experiment_id, run_id
        self._buffer: list[Any] = []
        self._last_flush = time.monotonic()
        self._stored: dict[str, int] = {}  # metric key -> last step already in the store

    def _call(self, method: Callable[..., T], *args: Any, **kwargs: Any) -> T:
        """A client call, retried while the store is busy."""
        return retry_busy(lambda: method(*args, **kwargs))

    def start(self, run_name: str, params: dict[str, str], tags: dict[str, str], config_yaml: str,
              attempt: dict[str, str]) -> str:
        """Create the run (status RUNNING) and log its params, tags, ``config.yaml`` and its first
        attempt (``attempt``: see ``resume``)."""
        from mlflow.entities import Param

        run = self._call(self.client.create_run, self.experiment_id, run_name=run_name,
                         tags=tags | _attempt_tags(1, attempt) | {tag.ATTEMPTS: "1"})
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
            raise ConfigError(KEY, f"run {self.run_id} (from the checkpoint) is not in {shown(self.uri)}") from exc
        if run.info.lifecycle_stage == "deleted":
            raise ConfigError(KEY, f"run {self.run_id} (from the checkpoint) is deleted in "
                              f"{shown(self.uri)}; restore it in the MLflow UI to resume")
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
        new = source | {tag.ATTEMPTS: str(number)}
        for n, fields in attempts.items():
            new |= _attempt_tags(n, fields)
        items = [RunTag(k, v) for k, v in new.items() if tags.get(k) != v]
        for i in range(0, len(items), 100):  # log_batch takes at most 100 tags per call
            self._call(self.client.log_batch, self.run_id, tags=items[i : i + 100])
        # Source tags this attempt lacks (a Slurm job id, when resumed outside Slurm) are not its.
        stale = [key for key in SOURCE_KEYS if key in tags and key not in source]
        if tag.END_REASON in tags:  # from an interrupted attempt; no longer true
            stale.append(tag.END_REASON)
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
        retry_busy(self._send)

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
                    self._call(self.client.set_tag, self.run_id, tag.END_REASON, reason[:5000])
            finally:
                self._call(self.client.set_terminated, self.run_id, status=status)


def _attempt_tags(number: int, attempt: dict[str, str]) -> dict[str, str]:
    return {f"{tag.ATTEMPT}{number}.{key}": value for key, value in attempt.items()}


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
