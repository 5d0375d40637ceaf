"""Acting on launched runs: cancel them, find and follow their logs."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

from diffsweep.config import ConfigError, EnvironmentUnavailable
from diffsweep.launch.ledger import Attempt, Entry, locked, read_ledger, write_ledger
from diffsweep.launch.plan import RunPlan, SweepPlan
from diffsweep.launch.state import RUNNING, attempt_state, pid_alive, scheduler_states, slurm_states
from diffsweep.launch.jobfile import read_job_state


def cancel(plan: SweepPlan) -> list[RunPlan]:
    """Cancel the plan's running runs (Slurm: scancel; local: SIGTERM; queued: dropped). A running
    job saves a checkpoint at the step boundary first, so launching again resumes it. A Slurm job
    that is still running after scancel (checked with Slurm, not from scancel's exit status)
    stays running in the ledger, and the error names it."""
    cancelled = []
    with locked(plan.out):
        ledger = read_ledger(plan.out)
        if ledger is None:
            return []
        slurm: dict[str, tuple[RunPlan, Attempt]] = {}
        for r in plan.runs:
            entry = ledger.entries.get(r.run.key)
            if r.state.state != RUNNING or entry is None or entry.latest is None:
                continue
            a = entry.latest
            if a.state == "cancelled":  # already stopping
                continue
            if a.executor == "slurm" and a.state == "submitted" and a.job_id is not None:
                slurm[a.job_id] = (r, a)  # marked once Slurm has stopped it
                continue
            if a.state == "submitted" and a.job_id is not None and pid_alive(int(a.job_id), a.job_start):
                # submitit's local controller forwards SIGTERM: the trainer saves and stops (the
                # start time tells the job from a later process that got its pid)
                os.kill(int(a.job_id), signal.SIGTERM)
            a.state = "cancelled"
            cancelled.append(r)
        still, why = dict.fromkeys(slurm, "unknown"), ""  # until Slurm says otherwise
        try:
            if slurm:
                still, why = scancel(list(slurm))
        finally:
            for job_id, (r, a) in slurm.items():
                if job_id not in still:
                    a.state = "cancelled"
                    cancelled.append(r)
            write_ledger(plan.out, ledger)
    if still:
        jobs = ", ".join(f"{j} ({state})" for j, state in sorted(still.items()))
        raise EnvironmentUnavailable(f"scancel did not stop Slurm jobs {jobs} ({why}); run `diffsweep cancel` again")
    return cancelled


# Slurm states of a job that scancel has not stopped (a cancelled one reads COMPLETING, then CANCELLED).
_NOT_STOPPED = frozenset({"PENDING", "RUNNING", "REQUEUED", "REQUEUE_HOLD", "REQUEUE_FED", "CONFIGURING",
                          "SUSPENDED", "STOPPED", "RESIZING"})


def scancel(job_ids: list[str], wait_s: float = 15.0) -> tuple[dict[str, str], str]:
    """Cancel Slurm jobs. Returns those Slurm still shows pending or running, with their states,
    and what scancel said. Its exit status is not the answer: it can fail although the jobs were
    signalled, and fails for a job that ended meanwhile; so on failure Slurm is asked, for up to
    ``wait_s`` (a job takes a moment to stop)."""
    out = subprocess.run(["scancel", *job_ids], capture_output=True, text=True, timeout=60)
    if out.returncode == 0:
        return {}, ""
    said = (out.stderr.strip().splitlines() or [f"scancel exited {out.returncode}"])[0]
    deadline = time.monotonic() + wait_s
    while True:
        states = slurm_states(job_ids)  # a job Slurm no longer knows has stopped
        live = {j: states[j] for j in job_ids if j in states and states[j].split()[0] in _NOT_STOPPED}
        if not live or time.monotonic() > deadline:
            return live, said
        time.sleep(1)


def find_entry(run: str, outs: list[Path]) -> tuple[Path, Entry]:
    """The ledger entry whose name or key (prefix) is ``run``, searching the sweep directories ``outs``."""
    matches = []
    for out in outs:
        ledger = read_ledger(out)
        if ledger is None:
            continue
        for e in ledger.entries.values():
            if e.name == run or e.key.startswith(run) or f"{e.name}-{e.key}" == run:
                matches.append((out, e))
    if not matches:
        where = ", ".join(str(o) for o in outs) or "no sweep directories"
        raise ConfigError("RUN", f"no launched run named {run!r} (searched {where}); see `diffsweep status SWEEP`")
    if len(matches) > 1:
        names = ", ".join(f"{e.name} ({e.key})" for _, e in matches[:5])
        raise ConfigError("RUN", f"{run!r} matches several runs: {names}; give the full name or key")
    return matches[0]


def log_files(entry: Entry) -> list[Path]:
    a = entry.latest
    if a is None or a.stdout is None:
        raise ConfigError("RUN", f"{entry.name} has not started yet (no logs)")
    return [Path(p) for p in (a.stdout, a.stderr) if p]


def follow(out: Path, entry_key: str, files: list[Path], poll_s: float = 1.0) -> None:
    """Print the files as they grow until the run's job is no longer running."""
    offsets = {f: 0 for f in files}
    ended = False
    while True:
        for f in files:
            try:
                with open(f, "rb") as handle:
                    handle.seek(offsets[f])
                    chunk = handle.read()
            except FileNotFoundError:
                continue
            if chunk:
                offsets[f] += len(chunk)
                sys.stdout.write(chunk.decode(errors="replace"))
                sys.stdout.flush()
        if ended:  # one last read after the job ended, for its final lines
            return
        ledger = read_ledger(out)
        entry = ledger.entries.get(entry_key) if ledger else None
        ended = entry is None or entry.latest is None or attempt_state(
            entry.latest, read_job_state(Path(entry.run_dir)), scheduler_states(ledger)).state != RUNNING
        if not ended:
            time.sleep(poll_s)
