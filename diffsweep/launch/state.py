"""Run states from the ledger, the scheduler (each attempt's, ``diffsweep.launch.scheduler``) and
the job's own ``job.json``; and reconciliation: a job that died without reporting gets its MLflow run
marked FAILED or KILLED with the scheduler's state as the reason.

States: ``new`` (never launched), ``changed`` (a run of the same name was launched with another
config; the differing fields are the detail), ``pending`` (queued: waiting in Slurm, with Slurm's
reason, requeued, or in the local queue), ``running`` (running, with its step, or still stopping
after a cancel), ``done`` (a done run whose job is submitted again to evaluate it, ``diffsweep
eval --launch``, is pending, then running, with the detail "evaluating"), ``failed`` (with the job's recorded reason), ``cancelled``, ``unknown``
(the scheduler has no record of the job and the job never reported). A state may be ``blocked``:
launch skips it.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

from diffsweep import slurm
from diffsweep.config import Config
from diffsweep.config.identity import identity_fields
from diffsweep.launch.jobs.local_scheduler import waiting_state
from diffsweep.launch.ledger import Attempt, Entry, Ledger
from diffsweep.launch.run_state import (
    ACTIVE_STATES,
    CANCELLED,
    CHANGED,
    DONE,
    FAILED,
    NEW,
    PENDING,
    RUNNING,
    UNKNOWN,
    UNKNOWN_STATE,
    RunState,
)
from diffsweep.launch.scheduler import attempt_states, get_scheduler
from diffsweep.rundir import JobRecord, read_job_state, run_info, write_job_state


def run_state(key: str, name: str, run_dir: Path | None, ledger: Ledger | None, scheduler: dict[str, str],
              config: Config) -> RunState:
    """The state of one planned run (see the module docstring); ``run_dir`` None: it does not exist."""
    job = read_job_state(run_dir) if run_dir is not None else None
    entry = ledger.entries.get(key) if ledger else None
    if job and job.state == "finished":
        if entry is not None and entry.latest is not None and job.updated < entry.latest.submitted:
            # A finished run's job submitted again (``diffsweep eval --launch``) and not started yet:
            # pending or running while the scheduler says so, then done as before.
            again = attempt_state(entry.latest, None, scheduler)
            if again.state in ACTIVE_STATES:
                return RunState(again.state, ", ".join(x for x in ("evaluating", again.detail) if x))
        return RunState(DONE, f"{_step(job)} steps")
    if entry is None or not entry.attempts:
        others = [e for e in (ledger.by_name(name) if ledger else []) if e.key != key]
        if others:
            fields = ", ".join(changed_fields(others[-1].identity, identity_fields(config))) or "config"
            running = [e for e in others if e.latest and attempt_state(
                e.latest, read_job_state(Path(e.run_dir)), scheduler).state in ACTIVE_STATES]
            if running:
                return RunState(CHANGED, fields, blocked=f"its previous version ({running[0].key}) is still "
                                "running; cancel it first (diffsweep cancel SWEEP --only NAME)")
            return RunState(CHANGED, fields)
        return RunState(NEW)
    latest = entry.latest
    assert latest is not None  # an entry with attempts has a latest one
    return attempt_state(latest, job, scheduler)


def entry_state(entry: Entry, scheduler: dict[str, str]) -> RunState:
    """The state of a launched run from its ledger entry alone (a run the sweep no longer plans)."""
    job = read_job_state(Path(entry.run_dir))
    if job and job.state == "finished":
        return RunState(DONE, f"{_step(job)} steps")
    return attempt_state(entry.latest, job, scheduler) if entry.latest else RunState(NEW)


def attempt_state(attempt: Attempt, job: JobRecord | None, scheduler: dict[str, str]) -> RunState:
    """The state of a run from its latest attempt, the scheduler and the job's own report."""
    waiting = waiting_state(attempt)  # not started by the local queue yet
    if waiting is not None:
        return RunState(PENDING if waiting[0] == "PENDING" else FAILED, waiting[1])
    sched = scheduler.get(attempt.job_id or "", UNKNOWN)
    word, reason = split_state(sched)
    if attempt.state == "cancelled":
        if word in slurm.LIVE:  # still saving its checkpoint: a new job must not start on its directory yet
            return RunState(RUNNING, "cancelling", blocked="it is still stopping")
        return RunState(CANCELLED)
    if word in slurm.WAITING:
        requeued = f"requeued at step {_step(job)}" if job and job.state == "preempted" else ""
        return RunState(PENDING, ", ".join(x for x in (word if word != "PENDING" else "", reason, requeued) if x))
    if word in slurm.LIVE:
        return RunState(RUNNING, ", ".join(x for x in (word if word != "RUNNING" else "", progress(job)) if x))
    if job and job.state == "failed":
        reason = (job.reason or "")[:200]
        if job.retryable is False:
            return RunState(FAILED, reason, blocked="it diverged; a rerun of the same config diverges again "
                            "(change the config, e.g. train.lr, which makes a new run)")
        return RunState(FAILED, reason)
    if job and job.state == "preempted":  # stopped by a signal (not diffsweep's cancel) and not requeued
        return RunState(FAILED, (job.reason or f"stopped at step {_step(job)}")[:200])
    if sched == UNKNOWN:
        return RunState(UNKNOWN_STATE, "the scheduler does not know job " + str(attempt.job_id),
                        blocked="its job's state is unknown (cancel it to allow a resubmission)")
    if sched.startswith("CANCELLED"):
        return RunState(CANCELLED, f"cancelled in {get_scheduler(attempt.executor, _key(attempt)).label}")
    if sched in ("COMPLETED", "EXITED"):
        return RunState(FAILED, "the job ended without finishing the run")
    return RunState(FAILED, sched)


def split_state(sched: str) -> tuple[str, str]:
    """``"PENDING (Resources)"`` -> ``("PENDING", "Resources")``: the scheduler's state and its reason."""
    word, _, rest = sched.partition(" ")
    return word, rest.strip().removeprefix("(").removesuffix(")")


def progress(job: JobRecord | None) -> str:
    """``step 40/400`` from a running job's ``job.json`` (its step callback updates it), or ""."""
    if not job or job.state != "running" or job.step is None:
        return ""
    return f"step {job.step}/{job.total}" if job.total else f"step {job.step}"


def _step(job: JobRecord) -> str:
    return "?" if job.step is None else str(job.step)


def changed_fields(old: dict[str, object], new: dict[str, object]) -> list[str]:
    return sorted(k for k in old.keys() | new.keys() if old.get(k) != new.get(k))


def scheduler_states(ledger: Ledger | None) -> dict[str, str]:
    """Scheduler state of every latest attempt's job id in the ledger, each asked of its own
    attempt's scheduler (a ledger may hold local and Slurm attempts)."""
    if ledger is None:
        return {}
    latest = [e.latest for e in ledger.entries.values() if e.latest is not None]
    return {job_id: state for (_, job_id), state in attempt_states(latest, _key).items()}


def _key(attempt: Attempt) -> str:
    """How an error names an attempt's scheduler (a ledger may name one no longer installed)."""
    return f"ledger: executor of job {attempt.job_id}" if attempt.job_id else "ledger: executor"


def reconcile(ledger: Ledger, out: Path, scheduler: dict[str, str],
              warn: Callable[[str], None] = print) -> list[tuple[Entry, str, str]]:
    """Mark runs whose job ended without reporting: MLflow run FAILED/KILLED (reason: the
    scheduler state), ``job.json`` failed. Also records each run's MLflow run id in the ledger.
    Returns (entry, scheduler state, MLflow status) for each run marked."""
    marked = []
    for entry in ledger.entries.values():
        run_dir = Path(entry.run_dir)
        if entry.mlflow_run_id is None:
            entry.mlflow_run_id = info.run_id if (info := run_info(run_dir)) else None
        a = entry.latest
        if a is None or a.job_id is None or a.reconciled:
            continue
        sched = scheduler.get(a.job_id)
        if sched is None or slurm.word(sched) in slurm.LIVE or sched == "COMPLETED":
            continue
        job = read_job_state(run_dir)
        if job and job.state in ("finished", "failed", "preempted"):
            continue  # the job reported how it ended
        where = f"{a.executor} job"
        cancelled = a.state == "cancelled" or slurm.word(sched) in slurm.KILLED
        reason = f"{where} {a.job_id} ended as {sched} without reporting" + (" (cancelled)" if a.state == "cancelled"
                                                                               else "")
        status = "KILLED" if cancelled else "FAILED"
        try:
            _mark_mlflow(run_dir, status, reason)
        except Exception as exc:  # noqa: BLE001 (a store hiccup must not break status; next time retries)
            warn(f"warning: could not mark {entry.name} {status} in MLflow ({type(exc).__name__}: {exc})")
            continue
        write_job_state(run_dir, "failed", job_id=a.job_id, reason=reason)
        a.reconciled = sched
        marked.append((entry, sched, status))
    return marked


def _mark_mlflow(run_dir: Path, status: str, reason: str) -> None:
    info = run_info(run_dir)
    if info is None:
        return  # the job died before creating its MLflow run
    from diffsweep.tracking.store import end_run

    end_run(info.tracking_uri, info.run_id, status, reason)
