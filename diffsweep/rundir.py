"""The run directory's layout: the names of the files diffsweep keeps in it, and their readers and
writers. One place for them, so that the trainer, the launcher and ``status`` agree on a name
without importing each other.

A run directory (``<sweep output>/runs/<name>-<key>/``, or ``train --out``'s ``<out>/<name>``) holds
``run.json`` (so that a resume from any working directory continues the same MLflow run in the same
store), a launched job's ``launch_config.yaml``, ``launch_eval.json`` (both written at submission)
and ``job.json``, and the checkpoints (``diffsweep.train.checkpoint``); a launch's code snapshot
(``<sweep output>/code/<hash>/``) holds ``SNAPSHOT.json``. The constants below say what each holds.
Light on purpose: no torch, no mlflow, no diffsweep module above ``config``.
See docs/training.md, '`diffsweep train`'.
"""

from __future__ import annotations

import json
import socket
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from diffsweep.config import ConfigError
from diffsweep.fsutil import write_atomically

RUN_FILE = "run.json"  # the MLflow run of a run directory, written when the run is created
JOB_FILE = "job.json"  # the launched job's last state (running, finished, preempted, failed), job id and reason
LAUNCH_CONFIG = "launch_config.yaml"  # the resolved config a launched job trains
LAUNCH_EVAL = "launch_eval.json"  # the probes a launched job runs once it has trained (the sweep's eval:)
SNAPSHOT_FILE = "SNAPSHOT.json"  # in a launch's code snapshot: the commit and dirty flag it was made from


def now() -> str:
    """The time now, UTC, to the second (ISO 8601): how every diffsweep file stamps times."""
    return datetime.now(UTC).isoformat(timespec="seconds")


def read_run_file(run_dir: Path) -> dict[str, str] | None:
    """The run directory's ``run.json`` (MLflow run id and store), None before the run has one;
    an unreadable one is a ``ConfigError`` saying what to do."""
    run_file = run_dir / RUN_FILE
    if not run_file.exists():
        return None
    try:
        found = json.loads(run_file.read_text())
        if not (isinstance(found, dict) and all(isinstance(found.get(k), str) for k in ("run_id", "tracking_uri"))):
            raise ValueError("not an object with run_id and tracking_uri")
    except (OSError, UnicodeDecodeError, ValueError) as exc:
        raise ConfigError(str(run_file), f"unreadable ({exc}); it names the run's MLflow run and store: restore it, "
                          "or delete it to continue the run in the store MLFLOW_TRACKING_URI names (default "
                          "./mlflow.db)") from exc
    return found


def run_info(run_dir: Path) -> dict[str, Any]:
    """The run directory's ``run.json``, or {} before the job made it (or if it is unreadable):
    for ``status`` and the like, which show what they can rather than fail."""
    try:
        info = json.loads((run_dir / RUN_FILE).read_text())
        return info if isinstance(info, dict) else {}
    except (OSError, ValueError):
        return {}


def write_run_file(run_dir: Path, run_id: str, tracking_uri: str, run_key: str) -> None:
    """Record the run's MLflow run and store in ``run.json`` (atomically, synced)."""
    data = {"run_id": run_id, "tracking_uri": tracking_uri, "run_key": run_key}
    write_atomically(run_dir / RUN_FILE, json.dumps(data) + "\n", sync=True)


def write_launch_config(run_dir: Path, config: dict[str, Any]) -> None:
    """Write the resolved config (as plain data) that the run's launched job trains."""
    import yaml  # not at module level: most readers of the run directory never need it

    run_dir.mkdir(parents=True, exist_ok=True)
    (run_dir / LAUNCH_CONFIG).write_text(yaml.safe_dump(config, sort_keys=False))


def read_launch_config(run_dir: Path) -> dict[str, Any]:
    """The resolved config written by ``write_launch_config``."""
    import yaml

    return yaml.safe_load((run_dir / LAUNCH_CONFIG).read_text())


def write_launch_eval(run_dir: Path, request: dict[str, Any] | None) -> None:
    """Record the probes the launched job runs after training (``{"probes", "settings", "steps"}``),
    or remove an earlier record (``None``: the sweep has no ``eval:`` now)."""
    if request is None:
        (run_dir / LAUNCH_EVAL).unlink(missing_ok=True)
        return
    run_dir.mkdir(parents=True, exist_ok=True)
    write_atomically(run_dir / LAUNCH_EVAL, json.dumps(request) + "\n")


def read_launch_eval(run_dir: Path) -> dict[str, Any] | None:
    """The request ``write_launch_eval`` recorded, None if there is none."""
    try:
        return json.loads((run_dir / LAUNCH_EVAL).read_text())
    except FileNotFoundError:
        return None


def write_job_state(run_dir: Path, state: str, **extra: Any) -> None:
    """Record the job's state atomically (the launcher and ``status`` read it)."""
    run_dir.mkdir(parents=True, exist_ok=True)
    record = {"state": state, "updated": now(), "host": socket.gethostname(), **extra}
    write_atomically(run_dir / JOB_FILE, json.dumps(record) + "\n")


def read_job_state(run_dir: Path) -> dict[str, Any] | None:
    """The job's last recorded state (``write_job_state``), None if it has written none."""
    try:
        return json.loads((run_dir / JOB_FILE).read_text())
    except (OSError, ValueError):
        return None
