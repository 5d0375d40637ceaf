"""Gated jobs: a cooldown branch (``diffsweep.sweep.branches``) is submitted with its parent, held
until the parent's checkpoint at its branch point exists (its *gate*), and then released, so it
starts as soon as that checkpoint is saved, not when the parent ends.

On Slurm the branch's array is submitted held (``sbatch --hold``) and ``release_ready`` runs
``scontrol release`` for each held job whose gate exists. It is called by the parent's job after
it saves a checkpoint of ``train.checkpoint_at`` and when it starts (a requeued parent may have
saved it before it was preempted), and by every ``launch`` of the sweep (a parent that saved it
earlier, or a release that failed). The local queue waits for gates itself (``diffsweep.launch.jobs.local_queue``).
"""

from __future__ import annotations

from pathlib import Path

from diffsweep.launch.jobs.attempt import Attempt, AttemptStore
from diffsweep.launch.scheduler import get_scheduler
from diffsweep.rundir import now


def release_ready(store: AttemptStore) -> tuple[list[Attempt], list[str]]:
    """Release every held job of ``store`` whose gate exists now. Returns the attempts released and
    what went wrong (one line per scheduler that failed)."""
    with store.locked():
        record = store.read()
        if record is None:
            return [], []
        ready = [a for a in store.latest(record) if a.gate is not None and a.released is None and a.job_id is not None
                 and a.state == "submitted" and Path(a.gate).exists()]
        if not ready:
            return [], []
        errors = []
        by_scheduler: dict[str, list[Attempt]] = {}
        for a in ready:
            by_scheduler.setdefault(a.executor, []).append(a)
        released: list[Attempt] = []
        for name, group in by_scheduler.items():
            why = get_scheduler(name, "executor").release(group)
            if why:
                errors.append(why)
                continue
            for a in group:
                a.released = now()
            released += group
        if released:
            store.write(record)
    return released, errors
