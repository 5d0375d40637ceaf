"""Schedulers: where launched jobs run. ``base`` has the interface and the registry; ``slurm`` and
``local`` are the built-in ones (see docs/extending-schedulers.md to add one)."""

from diffsweep.launch.schedulers.base import (
    ENTRY_POINT_GROUP,
    Scheduler,
    Submission,
    detect_scheduler,
    get_scheduler,
    register,
    scheduler_names,
)

__all__ = ["ENTRY_POINT_GROUP", "Scheduler", "Submission", "detect_scheduler", "get_scheduler", "register",
           "scheduler_names"]
