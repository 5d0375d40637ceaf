"""Slurm: one job array per resource class through submitit's ``SlurmExecutor``, chunked under the
cluster's MaxArraySize; states from squeue and sacct; cancel with scancel.

submitit does the submitting (sbatch scripts, arrays, requeue on USR2). Two things it cannot
answer, so diffsweep asks Slurm itself:

- States: ``submitit.Job(folder, job_id).state`` reads only ``sacct``, which answers nothing
  without accounting (slurmdbd), and never says why a job waits. ``squeue -r -t all`` knows every
  job slurmctld still holds, with its reason (``PENDING (Resources)``); sacct then covers the
  jobs slurmctld has forgotten.
- Cancelling: ``Job.cancel()`` runs one scancel per job and trusts its exit status; one scancel
  for a whole sweep's array tasks is one call, and its exit status is not the answer (it can fail
  although the jobs were signalled), so Slurm is asked afterwards.
"""

from __future__ import annotations

import shutil
import subprocess
import time
from collections import defaultdict
from typing import Any

from diffsweep.config import ConfigError, EnvironmentUnavailable
from diffsweep.launch import cluster
from diffsweep.launch.ledger import Attempt, now
from diffsweep.launch.plan import PlanRow, SweepPlan
from diffsweep.launch.profiles import Profile
from diffsweep.launch.resources import Resources, chunks, slurm_parameters
from diffsweep.launch.scheduler import Scheduler, Submission, TaskArray
from diffsweep.launch.state import WAITING

DEFAULT_ARRAY_SIZE = 1001  # Slurm's default MaxArraySize
# Slurm states of a job that scancel has not stopped (a cancelled one reads COMPLETING, then CANCELLED).
_NOT_STOPPED = frozenset({"PENDING", "RUNNING", "REQUEUED", "REQUEUE_HOLD", "REQUEUE_FED", "CONFIGURING",
                          "SUSPENDED", "STOPPED", "RESIZING"})


class SlurmScheduler(Scheduler):
    """sbatch job arrays through submitit."""

    name = "slurm"
    label = "Slurm"
    runs_jobs = "on a Slurm cluster"
    auto_rank = 10  # chosen automatically wherever a Slurm controller answers

    def available(self) -> bool:
        """Whether a Slurm controller answers here."""
        if shutil.which("sinfo") is None:
            return False
        try:
            return subprocess.run(["sinfo", "-h", "-o", "%P"], capture_output=True, timeout=10).returncode == 0
        except (OSError, subprocess.SubprocessError):
            return False

    def default_profile(self) -> Profile:
        return Profile(name="slurm", executor=self.name, gpus_per_node=8)  # a cluster we know nothing of

    def parameter_names(self) -> frozenset[str]:
        """Parameters of submitit's SlurmExecutor (read from submitit itself)."""
        import submitit

        return frozenset(submitit.SlurmExecutor._valid_parameters())

    def check_plan(self, plan: SweepPlan) -> None:
        cluster.check_planned(plan)

    def check_launch(self, plan: SweepPlan) -> None:
        cluster.check_cluster(plan)

    def parameters(self, resources: Resources, profile: Profile, *, job_name: str, code_dir: str,
                   max_parallel: int | None) -> dict[str, Any]:
        return slurm_parameters(resources, profile, job_name=job_name, code_dir=code_dir, max_parallel=max_parallel)

    def submit(self, submission: Submission) -> list[tuple[PlanRow, Attempt]]:
        import submitit

        plan = submission.plan
        submitted: list[tuple[PlanRow, Attempt]] = []
        classes: dict[Resources, list[PlanRow]] = defaultdict(list)
        for r in submission.runs:
            classes[r.estimate.resources].append(r)
        size = max_array_size(plan.profile)
        folder = plan.out / "jobs" / "%j"
        for i, (resources, runs) in enumerate(sorted(classes.items(), key=lambda kv: kv[0].time_min)):
            executor = submitit.SlurmExecutor(folder=folder, max_num_timeout=plan.profile.max_num_timeout)
            executor.update_parameters(**self.parameters(resources, plan.profile, job_name=f"{plan.spec.name}-{i}",
                                                         code_dir=submission.code_dir,
                                                         max_parallel=submission.max_parallel))
            for part in chunks(len(runs), size):
                batch = [runs[j] for j in part]
                try:
                    with executor.batch():
                        handles = [executor.submit(submission.job(r)) for r in batch]
                except Exception as exc:  # noqa: BLE001 (sbatch refused: bad partition, account, limits)
                    done = (f" ({len(submitted)} runs were submitted before; launch again after fixing it)"
                            if submitted else "")
                    raise ConfigError("slurm", f"sbatch refused the job array: {_first_line(exc)}{done}") from None
                attempts = [(r, Attempt(executor=self.name, submitted=now(), code_dir=submission.code_dir,
                                        folder=str(job.paths.folder), job_id=job.job_id,
                                        stdout=str(job.paths.stdout), stderr=str(job.paths.stderr)))
                            for r, job in zip(batch, handles)]
                submission.record(attempts)
                submitted += attempts
                submission.echo(f"submitted {len(batch)} runs as Slurm array {handles[0].job_id.split('_')[0]} "
                                f"({resources.describe()})")
        return submitted

    def check_tasks(self, profile: Profile) -> None:
        cluster.check_slurm()
        cluster.check_partition(profile)

    def submit_tasks(self, array: TaskArray) -> list[Attempt]:
        import submitit

        executor = submitit.SlurmExecutor(folder=array.folder / "%j", max_num_timeout=array.profile.max_num_timeout)
        executor.update_parameters(**self.parameters(array.resources, array.profile, job_name=array.job_name,
                                                     code_dir=array.code_dir, max_parallel=None))
        attempts: list[Attempt] = []
        for part in chunks(len(array.calls), max_array_size(array.profile)):
            try:
                with executor.batch():
                    handles = [executor.submit(array.calls[j]) for j in part]
            except Exception as exc:  # noqa: BLE001 (sbatch refused: bad partition, account, limits)
                raise ConfigError("slurm", f"sbatch refused the job array: {_first_line(exc)}") from None
            attempts += [Attempt(executor=self.name, submitted=now(), code_dir=array.code_dir,
                                 folder=str(job.paths.folder), job_id=job.job_id, stdout=str(job.paths.stdout),
                                 stderr=str(job.paths.stderr)) for job in handles]
        return attempts

    def states(self, attempts: list[Attempt]) -> dict[str, str]:
        return slurm_states([a.job_id for a in attempts if a.job_id is not None])

    def cancel(self, attempts: list[Attempt]) -> tuple[dict[str, str], str]:
        ids = [a.job_id for a in attempts if a.job_id is not None]
        still, why = dict.fromkeys(ids, "unknown"), ""  # until Slurm says otherwise
        if ids:
            still, why = scancel(ids)
        if not still:
            return {}, ""
        jobs = ", ".join(f"{j} ({state})" for j, state in sorted(still.items()))
        return still, f"scancel did not stop Slurm jobs {jobs} ({why})"


def max_array_size(profile: Profile) -> int:
    """The profile's ``max_array_size``, else the cluster's MaxArraySize (``scontrol show config``),
    else Slurm's default."""
    if profile.max_array_size is not None:
        return profile.max_array_size
    try:
        out = subprocess.run(["scontrol", "show", "config"], capture_output=True, text=True, timeout=30)
        for line in out.stdout.splitlines():
            if line.split("=")[0].strip() == "MaxArraySize":
                return int(line.split("=", 1)[1].strip())
    except (OSError, subprocess.SubprocessError, ValueError):
        pass
    return DEFAULT_ARRAY_SIZE


def _first_line(exc: BaseException) -> str:
    text = str(exc).strip()
    for line in text.splitlines():
        if "error" in line.lower():
            return line.strip()
    return (text.splitlines() or [type(exc).__name__])[0][:300]


def slurm_states(job_ids: list[str]) -> dict[str, str]:
    """Slurm states by job id (``123`` or ``123_4``): squeue for jobs slurmctld still holds,
    sacct for the rest; a waiting job's state carries squeue's reason: ``PENDING (Resources)``.
    Ids neither knows are left out. If squeue itself fails, nothing can be told apart (a pending
    job would look lost), so that is an error, not a guess. (Not submitit's ``Job.state``: see
    the module's notes.)"""
    wanted = set(job_ids)
    states: dict[str, str] = {}
    if not wanted:
        return states
    out = _slurm(["squeue", "-h", "-r", "-t", "all", "-o", "%i|%T|%r"])
    for line in out.splitlines():
        jid, state, reason = (line.split("|") + ["", ""])[:3]
        if jid in wanted:
            states[jid] = state.strip()
            if state.strip() in WAITING and reason.strip() not in ("", "None"):
                states[jid] += f" ({reason.strip()})"  # Resources, Priority, BeginTime, JobArrayTaskLimit, ...
    missing = sorted(wanted - states.keys())
    if missing:
        try:  # sacct fails without accounting; jobs slurmctld forgot then stay unknown
            out = _slurm(["sacct", "-n", "-P", "-X", "--format=JobID,State", "-j", ",".join(missing)])
        except EnvironmentUnavailable:
            out = ""
        for line in out.splitlines():
            jid, _, state = line.partition("|")
            if jid in wanted and state.strip():
                states[jid] = state.split()[0]
    return states


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


def _slurm(argv: list[str]) -> str:
    try:
        out = subprocess.run(argv, capture_output=True, text=True, timeout=60)
    except (OSError, subprocess.SubprocessError) as exc:
        raise EnvironmentUnavailable(f"{argv[0]} failed ({exc}); cannot tell the sweep's job states") from None
    if out.returncode != 0:
        first = (out.stderr.strip().splitlines() or [f"exit {out.returncode}"])[0]
        raise EnvironmentUnavailable(f"{argv[0]} failed ({first}); cannot tell the sweep's job states")
    return out.stdout
