"""A sweep's plan: every run with its estimate on the chosen profile and its current state, and
the runs in the ledger that the sweep no longer produces (orphans). ``diffsweep.launch.planning``
makes it; ``plan`` and ``status`` render it; ``launch`` submits the runs it marks as to be submitted.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

from diffsweep.launch.ledger import Entry, Ledger
from diffsweep.launch.profiles import Profile
from diffsweep.launch.resources import ResourceEstimate, Resources
from diffsweep.launch.run_state import CANCELLED, CHANGED, FAILED, NEW, RunState
from diffsweep.sweep import SweepRun, SweepSpec

SUBMITTABLE = (NEW, CHANGED, FAILED, CANCELLED)


@dataclass
class PlanRow:
    """One run: what it is, what it costs, where it stands."""

    run: SweepRun
    estimate: ResourceEstimate
    state: RunState
    run_dir: Path
    attempts: int  # submissions so far that were not cancelled
    ledger_entry: Entry | None = None


@dataclass
class Orphan:
    """A launched run that the sweep no longer produces: its row was removed or renamed, or its
    config changed. It keeps its run directory, ledger entry and MLflow run; it is shown so that
    it does not vanish silently, and ``cancel`` still reaches it."""

    entry: Entry
    state: RunState
    successor: str | None = None  # the key of the planned run that now has its name, if one does


@dataclass
class SweepPlan:
    spec: SweepSpec
    profile: Profile
    out: Path
    runs: list[PlanRow]
    ledger: Ledger | None
    warnings: list[str] = field(default_factory=list)
    orphans: list[Orphan] = field(default_factory=list)

    def run_dir(self, key: str, name: str) -> Path:
        """Where the sweep's run ``key`` (named ``name``) trains: its ledger entry's directory once
        launched (kept if a later edit renames it), else ``<out>/runs/<name>-<key>``."""
        entry = self.ledger.entries.get(key) if self.ledger else None
        return Path(entry.run_dir) if entry else run_dir_of(self.out, key, name)

    @property
    def gpu_hours(self) -> float:
        return sum(r.estimate.gpu_hours for r in self.runs)

    def counts(self) -> dict[str, int]:
        out: dict[str, int] = {}
        for r in self.runs:
            out[r.state.state] = out.get(r.state.state, 0) + 1
        return out


def run_dir_of(out: Path, key: str, name: str) -> Path:
    """A run's directory before it is launched: ``<out>/runs/<name>-<key>``."""
    return out / "runs" / f"{name}-{key}"


def submitted_resources(entry: Entry | None) -> tuple[Resources, str] | None:
    """What the run's latest submission asked for and on which profile (from the ledger), or None
    when it was never submitted or its ledger predates recording it."""
    a = entry.latest if entry else None
    if a is None or a.resources is None:
        return None
    try:
        return Resources(**a.resources), a.profile or "?"
    except TypeError:  # a hand-edited ledger, or one from a version with other fields
        return None
