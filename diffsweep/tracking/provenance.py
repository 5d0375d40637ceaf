"""What every training, evaluation and fit run records about where it comes from: the git commit
and dirty flag (of the launch's code snapshot, when the code runs from one), the host and the Slurm
job (``source_tags``)."""

from __future__ import annotations

import os
import socket
import subprocess
from pathlib import Path

from diffsweep.rundir import read_snapshot_record

SOURCE_KEYS = ("diffsweep.host", "diffsweep.git_commit", "mlflow.source.git.commit", "diffsweep.git_dirty",
               "diffsweep.code", "diffsweep.slurm_job_id", "diffsweep.slurm_array_job_id",
               "diffsweep.slurm_array_task_id")  # what ``source_tags`` may set: the attempt's origin


def source_tags() -> dict[str, str]:
    """Where this code and job come from: git commit and dirty flag, host, Slurm job."""
    tags = {"diffsweep.host": socket.gethostname()}
    root = Path(__file__).resolve().parents[2]  # the directory holding the diffsweep package
    snapshot = read_snapshot_record(root)  # a launched job runs a copy of the code, made from a checkout
    if snapshot is not None:
        return tags | {"diffsweep.git_commit": snapshot.git_commit, "mlflow.source.git.commit": snapshot.git_commit,
                       "diffsweep.git_dirty": snapshot.git_dirty, "diffsweep.code": str(root)} | _slurm_tags()
    try:
        commit = _git(root, "rev-parse", "HEAD")
        dirty = bool(_git(root, "status", "--porcelain", "--untracked-files=no"))
        tags |= {"diffsweep.git_commit": commit, "mlflow.source.git.commit": commit,
                 "diffsweep.git_dirty": str(dirty).lower()}
    except (OSError, subprocess.SubprocessError):
        tags |= {"diffsweep.git_commit": "unknown", "diffsweep.git_dirty": "unknown"}
    return tags | _slurm_tags()


def _slurm_tags() -> dict[str, str]:
    # The job's own environment says which Slurm job runs it; a tag, not a scheduler query.
    tags = {}
    for env, tag in (("SLURM_JOB_ID", "diffsweep.slurm_job_id"), ("SLURM_ARRAY_JOB_ID", "diffsweep.slurm_array_job_id"),
                     ("SLURM_ARRAY_TASK_ID", "diffsweep.slurm_array_task_id")):
        if os.environ.get(env):
            tags[tag] = os.environ[env]
    return tags


def _git(root: Path, *args: str) -> str:
    out = subprocess.run(["git", "-C", str(root), *args], capture_output=True, text=True, timeout=10, check=True)
    return out.stdout.strip()
