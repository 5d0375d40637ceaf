"""One submission of a job (``Attempt``), and where a job array's attempts are kept
(``AttemptStore``): the sweep ledger and a launched prepare's record are the two stores; the
schedulers (``diffsweep.launch.scheduler``) submit into one and ask about the attempts in it."""

from __future__ import annotations

import importlib
from abc import ABC, abstractmethod
from contextlib import AbstractContextManager
from dataclasses import dataclass
from pathlib import Path
from typing import Any


@dataclass
class Attempt:
    """One submission of a job (a sweep's run, a launched prepare's task)."""

    executor: str  # the scheduler's name (diffsweep.launch.scheduler): slurm, local, ...
    submitted: str
    code_dir: str
    folder: str  # submitit folder of the job (pickles, logs)
    job_id: str | None = None  # Slurm "<array>_<task>" or "<job>"; local: the controller's pid
    state: str = "submitted"  # local: queued -> submitted; any: cancelled (by diffsweep cancel)
    stdout: str | None = None
    stderr: str | None = None
    reconciled: str | None = None  # the scheduler state a dead job was marked with in MLflow
    queue_pid: int | None = None  # local: the queue process that starts this attempt
    queue_start: int | None = None  # ... and its start time (pids get reused)
    job_start: int | None = None  # local: the start time of the job's process (job_id is its pid)
    queue_item: str | None = None  # local, queued: the pickle of the job the queue starts (then None)
    profile: str | None = None  # the profile it was submitted with (None: a ledger from before it was recorded)
    resources: dict[str, Any] | None = None  # what it asked for (``Resources`` fields), as submitted
    # A cooldown branch: the parent's checkpoint it starts from. Its job is held until that exists
    # (Slurm: submitted held, released by ``diffsweep.launch.gates``; local: the queue waits for it).
    gate: str | None = None
    released: str | None = None  # when its held job was released


class AttemptStore(ABC):
    """Where a job array's submissions are recorded: a record file of tasks, each with its attempts
    (the latest last), read-modify-written under ``locked()``. Two exist: the sweep ledger
    (``diffsweep.launch.ledger.SweepStore``) and a launched prepare's ``launch.json``
    (``diffsweep.launch.prepare.record.PrepareStore``). A scheduler records through it the moment it
    has jobs; the local queue (``diffsweep.launch.jobs.local_queue``), given the store's class and
    folder, starts the queued attempts it finds there and records their jobs."""

    def __init__(self, folder: Path) -> None:
        self.folder = Path(folder)  # the record's folder (the local queue keeps its log under it)

    @abstractmethod
    def locked(self) -> AbstractContextManager[None]:
        """Hold the record's lock (blocking) for a read-modify-write."""

    @abstractmethod
    def read(self) -> Any:
        """The record (None when there is none yet)."""

    @abstractmethod
    def write(self, record: Any) -> None:
        """Write the record back (atomically)."""

    @abstractmethod
    def latest(self, record: Any) -> list[Attempt]:
        """Each task's latest attempt (the objects of ``record``: changing one changes the record)."""

    def spec(self) -> list[str]:
        """How a process started elsewhere finds this store again (``load_store``)."""
        return [f"{type(self).__module__}:{type(self).__qualname__}", str(self.folder)]


def load_store(spec: list[str]) -> AttemptStore:
    """The store of ``AttemptStore.spec()``."""
    module, _, name = spec[0].partition(":")
    store: AttemptStore = getattr(importlib.import_module(module), name)(Path(spec[1]))
    return store
