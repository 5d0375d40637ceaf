"""The run directory's layout: the names of the files diffsweep keeps in it, and their readers and
writers. One place for them, so that the trainer, the launcher and ``status`` agree on a name
without importing each other.

A run directory (``<sweep output>/runs/<name>-<key>/``, or ``train --out``'s ``<out>/<name>``) holds
``run.json`` (so that a resume from any working directory continues the same MLflow run in the same
store), a launched job's ``launch_config.yaml``, ``launch_eval.json`` (both written at submission)
and ``job.json``, and the checkpoints (``diffsweep.train.checkpoint``); a launch's code snapshot
(``<sweep output>/code/<hash>/``) holds ``SNAPSHOT.json``. The constants below say what each holds;
``run.json`` and ``job.json`` are typed records (``RunRecord``, ``JobRecord``) read back strictly.
Light on purpose: no torch, no mlflow, no diffsweep module above ``config``.
See docs/training.md, '`diffsweep train`'.
"""

from __future__ import annotations

import dataclasses
import json
import socket
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from diffsweep.config import ConfigError
from diffsweep.config.decode import read_json_record
from diffsweep.fsutil import write_atomically

RUN_FILE = "run.json"  # the MLflow run of a run directory, written when the run is created
JOB_FILE = "job.json"  # the launched job's last state (running, finished, preempted, failed), job id and reason
LAUNCH_CONFIG = "launch_config.yaml"  # the resolved config a launched job trains
LAUNCH_EVAL = "launch_eval.json"  # the probes a launched job runs once it has trained (the sweep's eval:)
SNAPSHOT_FILE = "SNAPSHOT.json"  # in a launch's code snapshot: the commit and dirty flag it was made from
CHECKPOINTS = "checkpoints"  # the run's checkpoints, one ``step_XXXXXXXX`` directory each (diffsweep.train.checkpoint)


def checkpoint_dir(run_dir: Path, step: int) -> Path:
    """Where the run's checkpoint of ``step`` is once saved (what a cooldown branch starts from)."""
    return run_dir / CHECKPOINTS / f"step_{step:08d}"


@dataclass(frozen=True)
class RunRecord:
    """``run.json``: the run's MLflow run and the store it is in."""

    run_id: str
    tracking_uri: str
    run_key: str = ""  # absent from run directories of before run keys were recorded


@dataclass(frozen=True)
class EvalRequest:
    """``launch_eval.json``: the probes a launched job runs once its run has trained (the sweep's
    ``eval:`` section, ``diffsweep.sweep.spec.EvalSettings``), and what its job carries."""

    probes: tuple[str, ...]
    settings: dict[str, dict[str, Any]] = dataclasses.field(default_factory=dict)  # probe -> {setting: value}
    steps: tuple[int, ...] = ()  # also these checkpoints (if kept), besides the newest


@dataclass(frozen=True)
class JobRecord:
    """``job.json``: a launched job's last report on its run (rewritten as it goes)."""

    state: str  # running, finished, preempted or failed
    updated: str = ""  # when written (``now()``)
    host: str = ""
    job_id: str | None = None  # the scheduler's (None outside one)
    starts: int = 1  # this job's starts so far (a requeue starts it again)
    pid: int | None = None  # the training process (while running)
    started: str | None = None  # when this start began
    step: int | None = None  # the last step trained
    total: int | None = None  # of the run's steps
    seconds_per_step: float | None = None  # this start's pace (launch --wait's ETA)
    run_id: str | None = None  # the MLflow run (once finished)
    reason: str | None = None  # why it failed or stopped
    retryable: bool | None = None  # False: the same config fails again (it diverged)
    evaluating: tuple[str, ...] = ()  # the sweep's probes it runs now, having trained
    evaluated: tuple[str, ...] = ()  # the probes it ran once trained
    eval_error: str | None = None  # why they failed (the run trained; ``diffsweep eval`` retries)


@dataclass(frozen=True)
class SnapshotRecord:
    """``SNAPSHOT.json`` in a launch's code snapshot: the checkout it was copied from."""

    git_commit: str  # or "unknown" (not a git checkout)
    git_dirty: str  # "true", "false" or "unknown"


def _json(record: Any) -> str:
    """A record as one line of JSON, leaving out what is unset (None or empty)."""
    return json.dumps({k: v for k, v in dataclasses.asdict(record).items() if v is not None and v != ()}) + "\n"


def now() -> str:
    """The time now, UTC, to the second (ISO 8601): how every diffsweep file stamps times."""
    return datetime.now(UTC).isoformat(timespec="seconds")


def read_run_file(run_dir: Path) -> RunRecord | None:
    """The run directory's ``run.json`` (MLflow run id and store), None before the run has one;
    an unreadable one is a ``ConfigError`` saying what to do."""
    run_file = run_dir / RUN_FILE
    try:
        return read_json_record(RunRecord, run_file, "run record")
    except FileNotFoundError:
        return None
    except (OSError, ConfigError) as exc:
        why = str(exc)
        if isinstance(exc, ConfigError):  # the field at fault, without the file's name again
            field = exc.key.removeprefix(str(run_file)).removeprefix(": ")
            why = f"{field}: {exc.message}" if field else exc.message
        raise ConfigError(str(run_file), f"unreadable ({why}); it names the run's MLflow run and store: restore it, "
                          "or delete it to continue the run in the store MLFLOW_TRACKING_URI names (default "
                          "./mlflow.db)") from exc


def run_info(run_dir: Path) -> RunRecord | None:
    """The run directory's ``run.json``, or None before the job made it (or if it is unreadable):
    for ``status`` and the like, which show what they can rather than fail."""
    try:
        return read_json_record(RunRecord, run_dir / RUN_FILE, "run record")
    except (OSError, ConfigError):
        return None


def write_run_file(run_dir: Path, run_id: str, tracking_uri: str, run_key: str) -> None:
    """Record the run's MLflow run and store in ``run.json`` (atomically, synced)."""
    write_atomically(run_dir / RUN_FILE, _json(RunRecord(run_id, tracking_uri, run_key)), sync=True)


def write_snapshot_record(folder: Path, git_commit: str, git_dirty: str) -> None:
    """Record in a code snapshot which checkout it was copied from."""
    write_atomically(folder / SNAPSHOT_FILE, _json(SnapshotRecord(git_commit, git_dirty)))


def read_snapshot_record(folder: Path) -> SnapshotRecord | None:
    """The code snapshot's ``SNAPSHOT.json``, None when ``folder`` is no snapshot (a checkout)."""
    try:
        return read_json_record(SnapshotRecord, folder / SNAPSHOT_FILE, "snapshot record")
    except FileNotFoundError:
        return None


def write_launch_config(run_dir: Path, config: dict[str, Any]) -> None:
    """Write the resolved config (as plain data) that the run's launched job trains."""
    import yaml  # not at module level: most readers of the run directory never need it

    run_dir.mkdir(parents=True, exist_ok=True)
    (run_dir / LAUNCH_CONFIG).write_text(yaml.safe_dump(config, sort_keys=False))


def read_launch_config(run_dir: Path) -> dict[str, Any]:
    """The resolved config written by ``write_launch_config``."""
    import yaml

    return yaml.safe_load((run_dir / LAUNCH_CONFIG).read_text())


def write_launch_eval(run_dir: Path, request: EvalRequest | None) -> None:
    """Record the probes the launched job runs after training, or remove an earlier record
    (``None``: the sweep has no ``eval:`` now)."""
    if request is None:
        (run_dir / LAUNCH_EVAL).unlink(missing_ok=True)
        return
    run_dir.mkdir(parents=True, exist_ok=True)
    write_atomically(run_dir / LAUNCH_EVAL, json.dumps(dataclasses.asdict(request)) + "\n")


def read_launch_eval(run_dir: Path) -> EvalRequest | None:
    """The request ``write_launch_eval`` recorded, None if there is none."""
    try:
        return read_json_record(EvalRequest, run_dir / LAUNCH_EVAL, "evaluation request")
    except FileNotFoundError:
        return None


def write_job_state(run_dir: Path, state: str, **fields: Any) -> None:
    """Record the job's state and ``fields`` of ``JobRecord`` atomically (the launcher and
    ``status`` read it)."""
    run_dir.mkdir(parents=True, exist_ok=True)
    record = JobRecord(state=state, updated=now(), host=socket.gethostname(), **fields)
    write_atomically(run_dir / JOB_FILE, _json(record))


def read_job_state(run_dir: Path) -> JobRecord | None:
    """The job's last recorded state (``write_job_state``), None if it has written none (or one
    this version cannot read: status shows what it can rather than fail)."""
    try:
        return read_json_record(JobRecord, run_dir / JOB_FILE, "job record")
    except (OSError, ConfigError):
        return None
