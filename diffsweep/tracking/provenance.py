"""What every training, evaluation and fit run records about where it comes from: the git commit
and dirty flag (of the launch's code snapshot, when the code runs from one), the host and the Slurm
job (``source_tags``)."""

from __future__ import annotations

import os
import socket
import subprocess
from pathlib import Path

from diffsweep.rundir import read_snapshot_record
from diffsweep.tracking import tags as tag

SOURCE_KEYS = (tag.HOST, tag.GIT_COMMIT, tag.MLFLOW_GIT_COMMIT, tag.GIT_DIRTY, tag.CODE, tag.SLURM_JOB_ID,
               tag.SLURM_ARRAY_JOB_ID, tag.SLURM_ARRAY_TASK_ID)  # what ``source_tags`` may set: the attempt's origin


def source_tags() -> dict[str, str]:
    """Where this code and job come from: git commit and dirty flag, host, Slurm job."""
    tags = {tag.HOST: socket.gethostname()}
    root = Path(__file__).resolve().parents[2]  # the directory holding the diffsweep package
    snapshot = read_snapshot_record(root)  # a launched job runs a copy of the code, made from a checkout
    if snapshot is not None:
        return tags | {tag.GIT_COMMIT: snapshot.git_commit, tag.MLFLOW_GIT_COMMIT: snapshot.git_commit,
                       tag.GIT_DIRTY: snapshot.git_dirty, tag.CODE: str(root)} | _slurm_tags()
    try:
        commit = _git(root, "rev-parse", "HEAD")
        dirty = bool(_git(root, "status", "--porcelain", "--untracked-files=no"))
        tags |= {tag.GIT_COMMIT: commit, tag.MLFLOW_GIT_COMMIT: commit,
                 tag.GIT_DIRTY: str(dirty).lower()}
    except (OSError, subprocess.SubprocessError):
        tags |= {tag.GIT_COMMIT: "unknown", tag.GIT_DIRTY: "unknown"}
    return tags | _slurm_tags()


def _slurm_tags() -> dict[str, str]:
    # The job's own environment says which Slurm job runs it; a tag, not a scheduler query.
    tags = {}
    for env, name in (("SLURM_JOB_ID", tag.SLURM_JOB_ID), ("SLURM_ARRAY_JOB_ID", tag.SLURM_ARRAY_JOB_ID),
                      ("SLURM_ARRAY_TASK_ID", tag.SLURM_ARRAY_TASK_ID)):
        if os.environ.get(env):
            tags[name] = os.environ[env]
    return tags


def _git(root: Path, *args: str) -> str:
    out = subprocess.run(["git", "-C", str(root), *args], capture_output=True, text=True, timeout=10, check=True)
    return out.stdout.strip()
