"""Slurm: each job array (one resource class) through submitit's ``SlurmExecutor``, chunked under the
cluster's MaxArraySize. submitit does the submitting (sbatch scripts, arrays, requeue on USR2);
states, cancelling and what the cluster has come from ``diffsweep.slurm``, the one module that
runs Slurm's commands (its notes say why states are not submitit's ``Job.state``)."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from diffsweep import slurm
from diffsweep.config import ConfigError
from diffsweep.launch.jobs import cluster
from diffsweep.launch.jobs.attempt import Attempt
from diffsweep.launch.plan import SweepPlan
from diffsweep.launch.profiles import Profile
from diffsweep.launch.resources import Resources, chunks, slurm_parameters
from diffsweep.launch.scheduler import JobArray, Scheduler
from diffsweep.rundir import now


class SlurmScheduler(Scheduler):
    """sbatch job arrays through submitit."""

    name = "slurm"
    label = "Slurm"
    runs_jobs = "on a Slurm cluster"
    auto_rank = 10  # chosen automatically wherever a Slurm controller answers

    def available(self) -> bool:
        """Whether a Slurm controller answers here."""
        return slurm.answers()

    def doctor_checks(self) -> Callable[..., None]:
        from diffsweep.launch.doctor.slurm import slurm_suite

        return slurm_suite

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

    def check_tasks(self, profile: Profile) -> None:
        slurm.check_controller()
        cluster.check_partition(profile)

    def submit(self, array: JobArray) -> list[Attempt]:
        """One sbatch array (several under the cluster's MaxArraySize), each part recorded as soon
        as Slurm has it."""
        import submitit

        executor = submitit.SlurmExecutor(folder=array.folder / "%j", max_num_timeout=array.profile.max_num_timeout)
        params = self.parameters(array.resources, array.profile, job_name=array.job_name, code_dir=array.code_dir,
                                 max_parallel=array.max_parallel)
        if any(array.gates):  # held until released (``diffsweep.launch.gates``): one array of gated jobs
            params["additional_parameters"] = {**params.get("additional_parameters", {}), "hold": True}
        executor.update_parameters(**params)
        attempts: list[Attempt] = []
        for part in chunks(len(array.calls), max_array_size(array.profile)):
            try:
                with executor.batch():
                    handles = [executor.submit(array.calls[j]) for j in part]
            except Exception as exc:  # noqa: BLE001 (sbatch refused: bad partition, account, limits)
                # the parts before are recorded: the caller says how many jobs were submitted
                raise ConfigError("slurm", f"sbatch refused the job array: {slurm.sbatch_error(exc)}") from None
            new = [(j, Attempt(executor=self.name, submitted=now(), code_dir=array.code_dir,
                               folder=str(job.paths.folder), job_id=job.job_id, stdout=str(job.paths.stdout),
                               stderr=str(job.paths.stderr), gate=array.gate(j))) for j, job in zip(part, handles)]
            with array.store.locked():
                array.record(new)
            attempts += [a for _, a in new]
            array.echo(f"submitted {len(part)} {array.noun} as Slurm array {handles[0].job_id.split('_')[0]} "
                       f"({array.resources.describe()})")
        return attempts

    def states(self, attempts: list[Attempt]) -> dict[str, str]:
        return slurm.states([a.job_id for a in attempts if a.job_id is not None])

    def release(self, attempts: list[Attempt]) -> str:
        ids = [a.job_id for a in attempts if a.job_id is not None]
        return slurm.release(ids) if ids else ""

    def cancel(self, attempts: list[Attempt]) -> tuple[dict[str, str], str]:
        ids = [a.job_id for a in attempts if a.job_id is not None]
        still, why = dict.fromkeys(ids, "unknown"), ""  # until Slurm says otherwise
        if ids:
            still, why = slurm.cancel(ids)
        if not still:
            return {}, ""
        jobs = ", ".join(f"{j} ({state})" for j, state in sorted(still.items()))
        return still, f"scancel did not stop Slurm jobs {jobs} ({why})"


def max_array_size(profile: Profile) -> int:
    """The profile's ``max_array_size``, else the cluster's MaxArraySize."""
    return profile.max_array_size if profile.max_array_size is not None else slurm.max_array_size()
