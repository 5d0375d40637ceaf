"""Acting on launched runs: cancel them, find and follow their logs."""

from __future__ import annotations

import sys
import time
from collections.abc import Callable
from pathlib import Path

from diffsweep.config import ConfigError, EnvironmentUnavailable
from diffsweep.config.identity import run_name_of
from diffsweep.launch.ledger import Attempt, Entry, Ledger, ledger_path, locked, read_ledger, write_ledger
from diffsweep.launch.plan import SweepPlan
from diffsweep.launch.run_state import ACTIVE_STATES, PENDING, RunState
from diffsweep.launch.scheduler import cancel_attempts, get_scheduler
from diffsweep.launch.state import attempt_state, entry_state, scheduler_states
from diffsweep.rundir import read_job_state


def cancel(plan: SweepPlan) -> list[str]:
    """Cancel the plan's pending and running runs, orphans included (each job through its
    attempt's scheduler: Slurm's scancel, a local job's SIGTERM; queued ones are dropped); returns
    their names. A running job saves a checkpoint at the step boundary first, so launching again
    resumes it. A job that is still running after its scheduler was told to stop (checked with the
    scheduler, not from scancel's exit status) stays running in the ledger, and the error names
    it. A sweep never launched is an error: there is nothing to cancel."""
    require_launched(plan)
    cancelled = []
    with locked(plan.out):
        ledger = read_ledger(plan.out)
        if ledger is None:
            return []
        jobs: list[tuple[str, Attempt]] = []  # marked once their scheduler has stopped them
        targets = [(r.run.key, r.run.name, r.state) for r in plan.runs]
        targets += [(o.entry.key, o.entry.name, o.state) for o in plan.orphans]
        for key, name, state in targets:
            entry = ledger.entries.get(key)
            if state.state not in ACTIVE_STATES or entry is None or entry.latest is None:
                continue
            a = entry.latest
            if a.state == "cancelled":  # already stopping
                continue
            if a.state == "submitted" and a.job_id is not None:
                jobs.append((name, a))
                continue
            a.state = "cancelled"  # queued: the local queue drops it
            cancelled.append(name)
        try:
            errors = cancel_attempts(a for _, a in jobs)
            cancelled += [name for name, a in jobs if a.state == "cancelled"]
        finally:
            write_ledger(plan.out, ledger)
    if errors:
        raise EnvironmentUnavailable(f"{'; '.join(errors)}; run `diffsweep cancel` again")
    return cancelled


def require_launched(plan: SweepPlan) -> None:
    """``ConfigError`` (naming the sweep file) if the sweep was never launched in ``plan.out``."""
    if not ledger_path(plan.out).is_file():
        raise ConfigError(str(plan.spec.path), f"sweep {plan.spec.name} was never launched (no ledger in "
                          f"{plan.out}); nothing to cancel")


def find_entry(run: str, outs: list[Path]) -> tuple[Path, Entry]:
    """The ledger entry that ``run`` names, searching the sweep directories ``outs``: the run's
    name in its sweep, its key (or a prefix), its run directory's name, or its MLflow run name."""
    matches = []  # (sweep directory, sweep name, entry)
    for out in outs:
        ledger = read_ledger(out)
        if ledger is None:
            continue
        for e in ledger.entries.values():
            if run in (e.name, f"{e.name}-{e.key}", run_name_of(e.identity, e.key)) or e.key.startswith(run):
                matches.append((out, ledger.sweep, e))
    if not matches:
        where = ", ".join(str(o) for o in outs) or "no sweep directories"
        raise ConfigError("RUN", f"no launched run named {run!r} (searched {where}); name its sweep with "
                          "--sweep SWEEP.yaml (see `diffsweep status SWEEP.yaml`)")
    sweeps = sorted({(sweep, str(out)) for out, sweep, _ in matches})
    if len(sweeps) > 1:
        names = ", ".join(f"{sweep} ({out})" for sweep, out in sweeps[:5])
        raise ConfigError("RUN", f"{run!r} is a run of several sweeps: {names}; pick one with --sweep SWEEP.yaml")
    if len(matches) > 1:
        names = ", ".join(f"{e.name} ({e.key})" for _, _, e in matches[:5])
        raise ConfigError("RUN", f"{run!r} matches several runs: {names}; give the full name or key")
    out, _, entry = matches[0]
    return out, entry


def select_attempts(entry: Entry, which: str | None) -> list[int]:
    """1-based numbers of the attempts (submissions) ``--attempt`` picks: N, ``all``, or (None) the latest."""
    n = len(entry.attempts)
    if which is None:
        return [n]
    if which == "all":
        return list(range(1, n + 1))
    if not which.isdigit() or not 1 <= int(which) <= n:
        raise ConfigError("attempt", f"expected a number from 1 to {n} (the attempts of {entry.name}) or 'all', "
                          f"got {which!r}")
    return [int(which)]


def latest_state(entry: Entry) -> RunState | None:
    """The run's state now, from its latest attempt (for the logs' header and messages); None
    when the scheduler cannot be asked here (the logs are still worth showing)."""
    try:
        return entry_state(entry, _scheduler(entry))
    except EnvironmentUnavailable:
        return None


def _scheduler(entry: Entry) -> dict[str, str]:
    """The scheduler's state of this one run's job (not the whole sweep's)."""
    return scheduler_states(Ledger(sweep="", experiment="", tracking_uri="", entries={entry.key: entry}))


def header(entry: Entry, number: int, state: RunState | None) -> str:
    """One line above an attempt's logs: which run, which submission, where, and (latest) its state."""
    a = entry.attempts[number - 1]
    job = f"{a.executor} job {a.job_id}" if a.job_id else f"{a.executor} ({a.state})"
    now = ""
    if state is not None:
        now = f"; now {state.state}" + (f" ({state.detail})" if state.detail else "")
    elif a.state == "cancelled" or a.reconciled:
        now = f"; {'cancelled' if a.state == 'cancelled' else 'ended as ' + str(a.reconciled)}"
    return (f"==> {entry.name} ({entry.key}), attempt {number} of {len(entry.attempts)}: {job}, "
            f"submitted {a.submitted}{now} <==")


def log_files(attempt: Attempt) -> list[Path]:
    """The attempt's stdout and stderr files that exist (none before its job has started)."""
    return get_scheduler(attempt.executor, "ledger: executor").log_files(attempt)


def no_logs(entry: Entry, attempt: Attempt, state: RunState | None) -> str:
    """What to say instead of logs when an attempt has none (yet)."""
    if attempt.job_id is None:
        return f"{entry.name}: waiting in the local queue; no logs yet"
    if state is not None and state.state == PENDING:
        return f"{entry.name}: job {attempt.job_id} is pending ({state.detail or 'queued'}); no logs yet"
    if state is not None and state.state in ACTIVE_STATES:
        return f"{entry.name}: job {attempt.job_id} has written no logs yet"
    return f"{entry.name}: job {attempt.job_id} left no logs (expected {attempt.stdout})"


def follow(out: Path, entry_key: str, number: int, poll_s: float = 1.0,
           echo: Callable[[str], None] = print) -> None:
    """Print attempt ``number``'s log files as they grow until its job is no longer pending or
    running (saying so once while it is pending)."""
    offsets: dict[Path, int] = {}
    ended = said_pending = False
    while True:
        ledger = read_ledger(out)
        entry = ledger.entries.get(entry_key) if ledger else None
        if entry is None or len(entry.attempts) < number:
            return
        a = entry.attempts[number - 1]
        for f in log_files(a):
            with open(f, "rb") as handle:
                handle.seek(offsets.get(f, 0))
                chunk = handle.read()
            if chunk:
                offsets[f] = offsets.get(f, 0) + len(chunk)
                sys.stdout.write(chunk.decode(errors="replace"))
                sys.stdout.flush()
        if ended:  # one last read after the job ended, for its final lines
            return
        # the job's process, not job.json, decides: it may still be writing its last lines
        state = attempt_state(a, read_job_state(Path(entry.run_dir)), _scheduler(entry))
        if state.state == PENDING and not offsets and not said_pending:
            echo(no_logs(entry, a, state))
            said_pending = True
        ended = number != len(entry.attempts) or state.state not in ACTIVE_STATES
        if not ended:
            time.sleep(poll_s)
