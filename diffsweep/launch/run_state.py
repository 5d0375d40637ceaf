"""A run's state as ``plan``, ``status`` and ``launch`` see it (``diffsweep.launch.state`` works it
out from the ledger, the scheduler and the job's own report; its docstring lists the states).
"""

from __future__ import annotations

from dataclasses import dataclass

NEW, CHANGED, PENDING, RUNNING, DONE, FAILED, CANCELLED = (
    "new", "changed", "pending", "running", "done", "failed", "cancelled")
ACTIVE_STATES = (PENDING, RUNNING)  # a job exists and may still train: never submit another one
UNKNOWN_STATE = "unknown"  # launched, but neither the scheduler nor the job says what became of it
UNKNOWN = "UNKNOWN"  # scheduler state of a job id nobody reports
# Schedulers report states in Slurm's words (``Scheduler.states``), the vocabulary of ``diffsweep.slurm``:
# LIVE (a job may still run), of which WAITING (not executing; squeue's %r says why), and KILLED
# (its MLflow run ends KILLED; other failures FAILED).


@dataclass(frozen=True)
class RunState:
    state: str
    detail: str = ""
    blocked: str = ""  # why launch must not submit it now (e.g. its previous version still runs)
