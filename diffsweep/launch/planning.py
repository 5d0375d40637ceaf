"""Making a sweep's plan (``diffsweep.launch.plan``): its output directory (``--out``, the sweep's
``launch.output`` or beside the sweep file; a folder that is not a sweep's is refused), its runs
selected with ``--only``, each estimated on the profile and given its state from the ledger, the
scheduler and its own ``job.json``.
"""

from __future__ import annotations

from pathlib import Path

from diffsweep import lockfile
from diffsweep.config import ConfigError
from diffsweep.fsutil import is_temporary
from diffsweep.launch.ledger import LAUNCH_LOCK, LEDGER_FILE, LOCK_FILE, read_ledger
from diffsweep.launch.plan import Orphan, PlanRow, SweepPlan, run_dir_of
from diffsweep.launch.profiles import Profile
from diffsweep.launch.resources import estimate_resources
from diffsweep.launch.scheduler import get_scheduler
from diffsweep.launch.state import entry_state, run_state, scheduler_states
from diffsweep.sweep import SweepSpec, expand
from diffsweep.sweep.expand import only_pattern


def output_dir(spec: SweepSpec, out: Path | None) -> Path:
    """``--out``, else the sweep's ``launch.output``, else ``runs/<sweep name>`` beside the sweep
    file (absolute)."""
    if out is not None:
        path, key = out.absolute(), "out"
    elif spec.launch.output is not None:
        path, key = Path(spec.launch.output).absolute(), f"{spec.path}: launch.output"
    else:
        path, key = spec.path.absolute().parent.resolve() / "runs" / spec.name, f"{spec.path}: launch.output"
        _refuse_former_default(spec, path)
    if path.exists() and not path.is_dir():
        raise ConfigError(key, f"{path} exists and is not a directory; expected a sweep output directory")
    _refuse_foreign(path, key)
    return path


# What diffsweep writes in a sweep output directory (the ledger, its lock and temporary file, the
# launch lock, code snapshots, job files, logs, run directories, the local queue's markers).
SWEEP_OUTPUT_NAMES = frozenset({LEDGER_FILE, LOCK_FILE, LAUNCH_LOCK, "code", "jobs", "logs", "runs",
                                f".{LEDGER_FILE}.tmp"})  # the ledger's temporary file before fsutil.temporary_name


def _refuse_foreign(path: Path, key: str) -> None:
    """An existing folder with no ledger that holds anything diffsweep does not write there (a
    user's folder, a dataset, a checkout) is not made a sweep output: launching would mix run
    directories and job files into it. Refused, before anything is read, locked or created."""
    if not path.is_dir() or (path / LEDGER_FILE).exists():
        return
    try:
        foreign = sorted(p.name for p in path.iterdir() if p.name not in SWEEP_OUTPUT_NAMES
                         and not is_temporary(p.name, LEDGER_FILE)
                         and not (p.name.startswith(".queue-") and p.name.endswith(".closed"))
                         and not any(lockfile.takes(p.name, lock) for lock in (LOCK_FILE, LAUNCH_LOCK)))
    except OSError as exc:
        raise ConfigError(key, f"cannot read {path} ({exc.strerror}); expected a sweep output directory") from None
    if foreign:
        raise ConfigError(key, f"{path} holds files that are not a sweep's ({', '.join(foreign[:3])}"
                          f"{', ...' if len(foreign) > 3 else ''}); expected a sweep output directory (one with "
                          "ledger.json), an empty folder or a new path")


def _refuse_former_default(spec: SweepSpec, path: Path) -> None:
    """A sweep without ``launch.output`` used to write to ``runs/<name>`` in the working directory.
    Refuse to start afresh beside the sweep file while that old ledger holds this sweep: every
    run would be trained again."""
    former = (Path("runs") / spec.name).absolute()
    if former == path or read_ledger(path) is not None:
        return
    ledger = read_ledger(former)
    if ledger is not None and ledger.sweep == spec.name:
        raise ConfigError(f"{spec.path}: launch.output", f"{former} holds this sweep's runs (the default output "
                          f"was once runs/<name> in the working directory; it is now {path}); pass --out "
                          f"{former} or set launch.output to it in the sweep (relative to the sweep file)")


def make_plan(spec: SweepSpec, profile: Profile, out: Path, only: str | None = None) -> SweepPlan:
    """Expand, select with ``only`` (a regex searched in run names and keys), estimate, and read
    states; also the ledger's runs that the expansion no longer has (``orphans``)."""
    expansion = expand(spec)
    pattern = only_pattern(only)
    runs = [r for r in expansion.runs if pattern.search(r.name) or pattern.search(r.key)]
    ledger = read_ledger(out)
    if ledger is not None and ledger.sweep != spec.name:
        raise ConfigError("out", f"{out} holds sweep {ledger.sweep!r}, not {spec.name!r}; use another --out")
    planned = {r.key for r in expansion.runs}
    gone = sorted((e for e in (ledger.entries.values() if ledger else []) if e.key not in planned
                   and (pattern.search(e.name) or pattern.search(e.key))), key=lambda e: (e.name, e.key))
    if not runs and not gone:
        raise ConfigError("only", f"{only!r} matches no run of {spec.path}")
    scheduler = scheduler_states(ledger)
    reserves = get_scheduler(profile.executor).reserves_resources
    runs_dir = out / "runs"
    existing = {p.name for p in runs_dir.iterdir()} if runs_dir.is_dir() else set()
    plans = []
    for r in runs:
        entry = ledger.entries.get(r.key) if ledger else None
        # A launched run keeps its directory even if a later edit of the sweep renames it.
        run_dir = Path(entry.run_dir) if entry else run_dir_of(out, r.key, r.name)
        known = entry is not None or run_dir.name in existing
        attempts = sum(a.state != "cancelled" for a in entry.attempts) if entry else 0
        plans.append(PlanRow(run=r, estimate=estimate_resources(r, profile, spec.launch.gpus_per_run, reserves=reserves), run_dir=run_dir, attempts=attempts,
                             ledger_entry=entry, state=run_state(r.key, r.name, run_dir if known else None, ledger, scheduler,
                                             r.config)))
    names = {r.name: r.key for r in expansion.runs}
    orphans = [Orphan(e, entry_state(e, scheduler), names.get(e.name)) for e in gone]
    return SweepPlan(spec=spec, profile=profile, out=out, runs=plans, ledger=ledger, warnings=expansion.warnings,
                     orphans=orphans)
