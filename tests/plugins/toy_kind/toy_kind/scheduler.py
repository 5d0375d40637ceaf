"""A scheduler from a user's package: this machine's queue under its own name, registered through the
entry point group ``diffsweep.schedulers`` (one file plus one line in pyproject.toml). A site's own
scheduler (PBS, Kubernetes) writes ``submit``, ``states`` and ``cancel`` too (docs/extending.md);
this one inherits them, so that a test can launch, follow and finish a sweep through it."""

from __future__ import annotations

import dataclasses

from diffsweep.launch.jobs.local_scheduler import LocalScheduler
from diffsweep.launch.profiles import LOCAL, Profile


class ToyScheduler(LocalScheduler):
    name = "toy"
    label = "the toy queue"
    runs_jobs = "on this machine, through the toy queue"
    auto_rank = 2000  # never the automatic choice while the local queue answers

    def default_profile(self) -> Profile:
        return dataclasses.replace(LOCAL, name="toy", executor=self.name)
