"""Run states from the ledger, the scheduler (Slurm's squeue/sacct, or local process ids) and the
job's own ``job.json``; and reconciliation: a job that died without reporting gets its MLflow run
marked FAILED or KILLED with the scheduler's state as the reason.

States: ``new`` (never launched), ``changed`` (a run of the same name was launched with another
config; the differing fields are the detail), ``running`` (pending, running or requeued),
``done``, ``failed``, ``cancelled``.
"""

from __future__ import annotations

import json
import os
import subprocess
from dataclasses import dataclass
from pathlib import Path

from diffsweep.launch.jobfile import read_job_state, write_job_state
from diffsweep.launch.ledger import Attempt, Entry, Ledger

NEW, CHANGED, RUNNING, DONE, FAILED, CANCELLED = "new", "changed", "running", "done", "failed", "cancelled"
# Slurm job states (squeue %T / sacct State) in which a job may still run.
ACTIVE = frozenset({"PENDING", "RUNNING", "REQUEUED", "REQUEUE_HOLD", "REQUEUE_FED", "CONFIGURING", "COMPLETING",
                    "RESIZING", "SUSPENDED", "STOPPED", "SIGNALING", "STAGE_OUT", "RESV_DEL_HOLD", "SPECIAL_EXIT"})
KILLED_STATES = frozenset({"CANCELLED", "PREEMPTED", "REVOKED"})  # -> MLflow KILLED; other failures -> FAILED


@dataclass(frozen=True)
class RunState:
    state: str
    detail: str = ""


def run_state(key: str, name: str, run_dir: Path, ledger: Ledger | None, scheduler: dict[str, str],
              identity: dict[str, object]) -> RunState:
    """The state of one planned run (see the module docstring)."""
    job = read_job_state(run_dir)
    entry = ledger.entries.get(key) if ledger else None
    if job and job.get("state") == "finished":
        return RunState(DONE, f"{job.get('step', '?')} steps")
    if entry is None or not entry.attempts:
        others = [e for e in (ledger.by_name(name) if ledger else []) if e.key != key]
        if others:
            return RunState(CHANGED, ", ".join(changed_fields(others[-1].identity, identity)) or "config")
        return RunState(NEW)
    return attempt_state(entry.latest, job, scheduler)


def attempt_state(attempt: Attempt, job: dict | None, scheduler: dict[str, str]) -> RunState:
    if attempt.state == "cancelled":
        return RunState(CANCELLED)
    if attempt.state == "queued":
        if attempt.queue_pid is not None and pid_alive(attempt.queue_pid):
            return RunState(RUNNING, "QUEUED (local)")
        return RunState(FAILED, "the local queue stopped before starting it")
    sched = scheduler.get(attempt.job_id or "", "UNKNOWN")
    if sched in ACTIVE:
        return RunState(RUNNING, sched + (f", step {job['step']}" if job and "step" in job else ""))
    if job and job.get("state") == "failed":
        return RunState(FAILED, str(job.get("reason", ""))[:200])
    if sched == "UNKNOWN" and job and job.get("state") in ("running", "preempted"):
        return RunState(RUNNING, "scheduler state unknown; job last reported " + str(job.get("state")))
    if sched == "CANCELLED" or sched.startswith("CANCELLED"):
        return RunState(CANCELLED, "cancelled in Slurm")
    if sched in ("COMPLETED", "EXITED"):
        return RunState(FAILED, "the job ended without finishing the run")
    return RunState(FAILED, sched)


def changed_fields(old: dict[str, object], new: dict[str, object]) -> list[str]:
    return sorted(k for k in old.keys() | new.keys() if old.get(k) != new.get(k))


def pid_alive(pid: int) -> bool:
    """Whether a process exists and is not a zombie."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        try:
            os.kill(pid, 0)
        except (ProcessLookupError, PermissionError):
            return False
        return True
    return stat.rsplit(")", 1)[-1].split()[0] != "Z"


def scheduler_states(ledger: Ledger | None) -> dict[str, str]:
    """Scheduler state of every latest attempt's job id in the ledger."""
    if ledger is None:
        return {}
    slurm_ids, out = [], {}
    for entry in ledger.entries.values():
        a = entry.latest
        if a is None or a.job_id is None:
            continue
        if a.executor == "local":
            out[a.job_id] = "RUNNING" if pid_alive(int(a.job_id)) else "EXITED"
        else:
            slurm_ids.append(a.job_id)
    if slurm_ids:
        out |= slurm_states(slurm_ids)
    return out


def slurm_states(job_ids: list[str]) -> dict[str, str]:
    """Slurm states by job id (``123`` or ``123_4``): squeue for jobs slurmctld still holds,
    sacct for the rest. Ids neither knows are left out (state unknown)."""
    wanted = set(job_ids)
    states: dict[str, str] = {}
    try:
        out = subprocess.run(["squeue", "-h", "-r", "-t", "all", "-o", "%i|%T"], capture_output=True, text=True,
                             timeout=30)
        for line in out.stdout.splitlines():
            jid, _, state = line.partition("|")
            if jid in wanted:
                states[jid] = state.strip()
    except (OSError, subprocess.SubprocessError):
        pass
    missing = sorted(wanted - states.keys())
    if missing:
        try:
            out = subprocess.run(["sacct", "-n", "-P", "-X", "--format=JobID,State", "-j", ",".join(missing)],
                                 capture_output=True, text=True, timeout=30)
            for line in out.stdout.splitlines():
                jid, _, state = line.partition("|")
                if jid in wanted:
                    states[jid] = state.split()[0] if state.strip() else "UNKNOWN"
        except (OSError, subprocess.SubprocessError):
            pass
    return states


def reconcile(ledger: Ledger, out: Path, scheduler: dict[str, str]) -> list[tuple[Entry, str, str]]:
    """Mark runs whose job died without reporting: MLflow run FAILED/KILLED (reason: the scheduler
    state), ``job.json`` failed. Returns (entry, scheduler state, MLflow status) for each one marked."""
    marked = []
    for entry in ledger.entries.values():
        a = entry.latest
        if a is None or a.job_id is None or a.reconciled or a.state == "cancelled":
            continue
        sched = scheduler.get(a.job_id)
        if sched is None or sched in ACTIVE or sched == "COMPLETED":
            continue
        run_dir = Path(entry.run_dir)
        job = read_job_state(run_dir)
        if job and job.get("state") in ("finished", "failed"):
            continue
        where = "local job" if a.executor == "local" else "slurm"
        reason = f"{where} {a.job_id} ended as {sched} without reporting"
        status = "KILLED" if sched.split()[0] in KILLED_STATES else "FAILED"
        _mark_mlflow(run_dir, status, reason)
        write_job_state(run_dir, "failed", job_id=a.job_id, reason=reason)
        a.reconciled = sched
        marked.append((entry, sched, status))
    return marked


def _mark_mlflow(run_dir: Path, status: str, reason: str) -> None:
    try:
        info = json.loads((run_dir / "run.json").read_text())
    except (OSError, ValueError):
        return  # the job died before creating its MLflow run
    from mlflow.tracking import MlflowClient

    client = MlflowClient(info["tracking_uri"])
    run = client.get_run(info["run_id"])
    if run.info.status in ("RUNNING", "SCHEDULED"):
        client.set_tag(info["run_id"], "diffsweep.end_reason", reason)
        client.set_terminated(info["run_id"], status=status)
