"""What ``launch --wait`` shows while a sweep runs: how many runs are pending, running and ended,
each running run's step out of its total (from its ``job.json``, which the job updates while it
trains), and an ETA: the steps left at the pace the job measured, or, before it has measured one,
the planner's estimate scaled by the fraction of steps left."""

from __future__ import annotations

from dataclasses import dataclass

from diffsweep.launch.plan import SweepPlan
from diffsweep.launch.run_state import ACTIVE_STATES, RUNNING
from diffsweep.rundir import read_job_state

ORDER = ("pending", "running", "done", "failed", "cancelled", "unknown", "new", "changed")  # how counts read


@dataclass(frozen=True)
class RunProgress:
    """One run of the sweep as ``--wait`` shows it."""

    name: str
    state: str
    detail: str
    step: int | None  # the latest step its job reported (running runs)
    total: int | None
    hours_left: float  # steps left x the measured pace, else the planner's estimate x the fraction left


@dataclass(frozen=True)
class Snapshot:
    """The whole sweep at one moment."""

    runs: list[RunProgress]

    @property
    def counts(self) -> dict[str, int]:
        out: dict[str, int] = {}
        for r in self.runs:
            out[r.state] = out.get(r.state, 0) + 1
        return dict(sorted(out.items(), key=lambda kv: ORDER.index(kv[0]) if kv[0] in ORDER else len(ORDER)))

    @property
    def active(self) -> bool:
        """Whether any run is still pending or running (``--wait`` goes on)."""
        return any(r.state in ACTIVE_STATES for r in self.runs)

    @property
    def eta_hours(self) -> float | None:
        """Hours until every pending and running run has trained, if as many as run now keep
        running side by side (a pending run's time is the planner's estimate)."""
        active = [r for r in self.runs if r.state in ACTIVE_STATES]
        if not active:
            return None
        side_by_side = max(1, sum(r.state == RUNNING for r in active))
        return sum(r.hours_left for r in active) / side_by_side

    def summary(self) -> str:
        """``2 pending, 1 running, 3 done; ETA ~0:12 h``."""
        text = ", ".join(f"{n} {s}" for s, n in self.counts.items())
        eta = self.eta_hours
        return text + (f"; ETA ~{duration(eta)}" if eta is not None else "")

    def running_lines(self) -> list[str]:
        """One line per running run: ``name: step 40/400 (10%), ~0:10 h left``."""
        lines = []
        for r in self.runs:
            if r.state != RUNNING:
                continue
            lines.append(f"  {r.name}: {step_text(r)}, ~{duration(r.hours_left)} left"
                         + (f" ({r.detail})" if r.detail and not r.detail.startswith("step ") else ""))
        return lines


def snapshot(plan: SweepPlan) -> Snapshot:
    """Where every run of ``plan`` stands (reads each running run's ``job.json``)."""
    runs = []
    for r in plan.runs:
        step = total = None
        hours_left = r.estimate.hours if r.state.state in ACTIVE_STATES else 0.0
        job = read_job_state(r.run_dir) if r.state.state == RUNNING else None
        if job and job.state == "running" and job.step is not None:
            step = job.step
            total = job.total
            pace = job.seconds_per_step
            if total and pace is not None:
                hours_left = max(0, total - step) * pace / 3600
            elif total:
                hours_left = r.estimate.hours * max(0.0, 1 - step / total)
        runs.append(RunProgress(r.run.name, r.state.state, r.state.detail, step, total, hours_left))
    return Snapshot(runs)


def changes(before: Snapshot | None, after: Snapshot) -> list[str]:
    """``name: pending -> running`` for each run whose state changed."""
    if before is None:
        return []
    old = {r.name: r.state for r in before.runs}
    return [f"{r.name}: {old[r.name]} -> {r.state}" + (f" ({r.detail})" if r.detail and r.state != RUNNING else "")
            for r in after.runs if r.name in old and old[r.name] != r.state]


def step_text(r: RunProgress) -> str:
    if r.step is None:
        return "starting"
    if not r.total:
        return f"step {r.step}"
    return f"step {r.step}/{r.total} ({100 * r.step // r.total}%)"


def duration(hours: float) -> str:
    """``1:05 h``, ``12 min``, ``<1 min``."""
    minutes = round(hours * 60)
    if minutes < 1:
        return "<1 min"
    if minutes < 60:
        return f"{minutes} min"
    return f"{minutes // 60}:{minutes % 60:02d} h"
