"""``job.json`` in a run directory: the state a launched job last reached (running, finished,
preempted, failed) with its job id and reason; ``diffsweep status`` reads it."""

from __future__ import annotations

import json
import os
import socket
from pathlib import Path
from typing import Any

from diffsweep.launch.ledger import now

JOB_FILE = "job.json"


def write_job_state(run_dir: Path, state: str, **extra: Any) -> None:
    """Record the job's state atomically (the launcher and ``status`` read it)."""
    run_dir.mkdir(parents=True, exist_ok=True)
    tmp = run_dir / f".{JOB_FILE}.tmp"
    tmp.write_text(json.dumps({"state": state, "updated": now(), "host": socket.gethostname(), **extra}) + "\n")
    os.replace(tmp, run_dir / JOB_FILE)


def read_job_state(run_dir: Path) -> dict[str, Any] | None:
    try:
        return json.loads((run_dir / JOB_FILE).read_text())
    except (OSError, ValueError):
        return None
