"""A result run: an MLflow run that holds what a command produced (a fit, a probe's evaluation, a
comparison, the doctor's check), created, logged to, given its files and ended in one place.

``result_run`` is a context manager: the run is created with its name and tags on entry, ends
``FINISHED`` when the block ends, and ``FAILED`` (``KILLED`` for a Ctrl-C) when it raises, so that
no command leaves a run ``RUNNING`` behind. Every store call retries while SQLite is busy
(``retry_busy``). The trainer's own run is ``tracking.logger``'s, which also resumes.
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import Iterable, Iterator, Mapping
from functools import partial
from pathlib import Path
from typing import TYPE_CHECKING, Any

from diffsweep.config import ConfigError
from diffsweep.tracking.store import retry_busy

if TYPE_CHECKING:
    from mlflow.entities import Run as Run  # re-exported: a run read from the store, for type hints

METRICS_PER_BATCH = 1000  # MLflow's limits for one log_batch call
PARAMS_PER_BATCH = 100


class ResultRun:
    """The run being written: its id, and what can be logged to it."""

    def __init__(self, client: Any, run_id: str) -> None:
        self.client = client
        self.run_id = run_id

    def log(self, metrics: Iterable[tuple[str, float, int]] = (), params: Mapping[str, str] | None = None,
            timestamp_ms: int | None = None) -> None:
        """Metrics as (name, value, step), in batches MLflow takes, and params; ``timestamp_ms``:
        every metric's time (default now)."""
        from mlflow.entities import Metric, Param

        stamp = int(time.time() * 1000) if timestamp_ms is None else timestamp_ms
        rows = [Metric(name, float(value), stamp, int(step)) for name, value, step in metrics]
        named = [Param(k, str(v)) for k, v in (params or {}).items()]
        batches = max(1, -(-len(rows) // METRICS_PER_BATCH), -(-len(named) // PARAMS_PER_BATCH))
        for i in range(batches):
            chunk = rows[i * METRICS_PER_BATCH: (i + 1) * METRICS_PER_BATCH]
            some = named[i * PARAMS_PER_BATCH: (i + 1) * PARAMS_PER_BATCH]
            if chunk or some:
                retry_busy(partial(self.client.log_batch, self.run_id, metrics=chunk, params=some))

    def set_tag(self, name: str, value: str) -> None:
        retry_busy(lambda: self.client.set_tag(self.run_id, name, value))

    def attach(self, folder: Path) -> None:
        """The files in ``folder`` as the run's artifacts (nothing when it is empty)."""
        if any(folder.iterdir()):
            retry_busy(lambda: self.client.log_artifacts(self.run_id, str(folder)))


@contextlib.contextmanager
def result_run(client: Any, experiment_id: str, name: str | None, tags: Mapping[str, str]) -> Iterator[ResultRun]:
    """A new run named ``name`` (None: MLflow names it) in the experiment ``experiment_id`` of the
    store behind ``client`` (``mlflow_client``; ``ensure_experiment`` gives the id), ended as its
    block ends."""
    run = retry_busy(lambda: client.create_run(experiment_id, run_name=name, tags=dict(tags)))
    handle = ResultRun(client, run.info.run_id)
    try:
        yield handle
    except BaseException as exc:
        status = "KILLED" if isinstance(exc, KeyboardInterrupt) else "FAILED"
        retry_busy(lambda: client.set_terminated(handle.run_id, status=status))
        raise
    retry_busy(lambda: client.set_terminated(handle.run_id, status="FINISHED"))


def find_run(client: Any, run_id: str | None) -> Run | None:
    """The run ``run_id`` of the store behind ``client``, or None if the store does not have it."""
    from mlflow.exceptions import MlflowException

    if run_id is None:
        return None
    try:
        return client.get_run(run_id)
    except MlflowException:
        return None


@contextlib.contextmanager
def store_errors(uri: str, doing: str) -> Iterator[None]:
    """A store that went away or broke after ``check_tracking`` passed: one line, not a traceback
    (``cannot <doing> <uri> (<MLflow's first line>)``)."""
    from mlflow.exceptions import MlflowException

    try:
        yield
    except MlflowException as exc:
        raise ConfigError("MLFLOW_TRACKING_URI", f"cannot {doing} {uri} ({str(exc).splitlines()[0][:300]})") from None
