"""Resources per run and the submitit parameters of a resource class. Pure functions: a planned
run and a profile in, plain data out (golden-tested; no submitit, no subprocess).

Estimates (stated because plans and budgets depend on them):
- memory: ``diffsweep.model.memory`` (per-GPU weights, gradients, AdamW state, FSDP gathers or
  DDP buckets, activations of one micro-batch with or without checkpointing, logits, CUDA
  overhead; calibrated on CPU, see analysis/benchmarks/RESULTS.md). A run gets the fewest GPUs
  (one node, then whole nodes) on which its config as written fits in 90% of each GPU and over
  which its global batch splits evenly; a run that fits nowhere is refused with the change that
  would make it fit (e.g. ``train.activation_checkpointing``, a smaller ``micro_batch_size``).
- time: training FLOPs (diffsweep.model.counting) / (GPUs x peak x MFU), plus 30% and 15 minutes
  of slack for evaluation, checkpoints and start-up, plus ``COMPILE_MINUTES`` where the run
  compiles (``train.compile``: each start of the job compiles its block again), within the
  profile's min/max job time.
"""

from __future__ import annotations

import math
import shlex
from dataclasses import dataclass
from typing import Any

from diffsweep.config import ConfigError, Parallel
from diffsweep.config.enums import compiles
from diffsweep.launch.profiles import Profile
from diffsweep.model import memory
from diffsweep.sweep.expand import SweepRun

# Minutes a job start spends compiling (train.compile): the goal for a 1.4B block on an H100/H200 is
# at most 1 (issue #50); counted twice until a GPU window measures it (analysis/gpu, train-speed).
COMPILE_MINUTES = 2


@dataclass(frozen=True)
class Resources:
    """What one run's job asks for. Equal resources = one resource class = one job array."""

    nodes: int
    gpus_per_node: int  # 0: CPU-only
    tasks_per_node: int  # one task per GPU (one for CPU jobs)
    cpus_per_task: int
    mem_gb: int  # per node
    time_min: int

    @property
    def gpus(self) -> int:
        return self.nodes * self.gpus_per_node

    def describe(self) -> str:
        hours, minutes = divmod(self.time_min, 60)
        if self.mem_gb == 0:  # the local executor: a process on this machine, no limits asked for
            return "local process"
        cpus = f"{self.cpus_per_task} CPUs" if self.cpus_per_task > 1 else "CPU"
        where = f"{self.gpus} GPU" + ("s" if self.gpus != 1 else "") if self.gpus else cpus
        nodes = f" on {self.nodes} nodes" if self.nodes > 1 else ""
        return f"{where}{nodes}, {hours}:{minutes:02d} h, {self.mem_gb} GB"


@dataclass(frozen=True)
class ResourceEstimate:
    """A run's resources and cost on a profile."""

    resources: Resources
    memory_gb: float  # estimated peak per GPU on its GPUs (per process on CPU)
    hours: float  # estimated wall-clock training hours
    gpu_hours: float  # hours x GPUs (0 on CPU)


def gpus_for(run: SweepRun, profile: Profile, gpus: int | None = None) -> memory.MemoryEstimate:
    """The per-GPU memory estimate on the fewest GPUs that fit ``run`` as configured, or on exactly
    ``gpus`` (pure); ``ConfigError`` naming the run, what it needs and what would make it fit, if
    none do."""
    config, t = run.config, run.config.train
    gpu_bytes = int(profile.gpu.memory_gb * 1e9)
    sequences = t.batch_tokens // t.seq_len
    if gpus is not None:
        if gpus > profile.gpus_per_node and gpus % profile.gpus_per_node:
            raise ConfigError("launch.gpus_per_run", f"{gpus} GPUs are not whole nodes of {profile.gpus_per_node} "
                              f"(profile {profile.name})")
        if sequences % (gpus * t.micro_batch_size):
            raise ConfigError("launch.gpus_per_run", f"{gpus} GPUs x micro-batch {t.micro_batch_size} do not divide "
                              f"the {sequences} sequences of run {run.name}'s global batch")
    for world in [gpus] if gpus is not None else memory.world_sizes(profile.gpus_per_node):
        if sequences % (world * t.micro_batch_size):
            continue  # the global batch would not split evenly over the processes
        e = memory.estimate_memory(config, world_size=world, gpu_memory_bytes=gpu_bytes)
        if e.fits:
            return e
        if t.parallel is Parallel.DDP and world > 1:
            break  # replicas: more GPUs do not lower the need per GPU
    plan = memory.plan_memory(config, gpu_bytes, profile.gpus_per_node)
    if plan.fits:
        hint = (f"it fits on {plan.world_size} GPU{'s' if plan.world_size > 1 else ''} with "
                f"train.micro_batch_size={plan.micro_batch_size}"
                + (" and train.activation_checkpointing=true" if plan.activation_checkpointing else ""))
    else:
        hint = plan.reason or "no layout fits"
    needed = memory.estimate_memory(config, world_size=1, gpu_memory_bytes=gpu_bytes)
    raise ConfigError(f"run {run.name}", f"does not fit on {profile.name}'s {profile.gpu.name} GPUs "
                      f"({profile.gpu.memory_gb:g} GB) as configured (needs {memory.gb(needed.total)} on one); {hint}")


def estimate_resources(run: SweepRun, profile: Profile, gpus: int | None = None, *, reserves: bool
                       ) -> ResourceEstimate:
    """Resources and time of ``run`` on ``profile`` (pure); ``gpus`` fixes the GPU count
    (``launch.gpus_per_run``) instead of the fewest that fit. ``reserves``: the profile's scheduler
    reserves what jobs ask for (``Scheduler.reserves_resources``; False: no GPUs, no memory asked)."""
    if not reserves or profile.gpus_per_node == 0:
        gpus, nodes, per_node = 0, 1, 0
        need_gb = memory.estimate_memory(run.config, world_size=1, gpu_memory_bytes=0, device="cpu").total / 1e9
    else:
        e = gpus_for(run, profile, gpus)
        gpus, need_gb = e.world_size, e.total / 1e9
        nodes = math.ceil(gpus / profile.gpus_per_node)
        per_node = min(gpus, profile.gpus_per_node)
    rate = profile.gpu.peak_tflops * 1e12 * profile.gpu.mfu * max(gpus, 1)
    hours = run.flops / rate / 3600
    if compiles(run.config.train.compile, run.config.model.attention.backend, cuda=gpus > 0):
        hours += COMPILE_MINUTES / 60
    time_min = math.ceil(hours * 60 * 1.3 + 15)
    time_min = min(max(time_min, profile.min_time_minutes), profile.max_time_minutes)
    tasks = max(per_node, 1)
    cpus = profile.cpus_per_gpu  # per task: one task per GPU, or the one CPU task
    mem = profile.mem_per_gpu_gb * max(per_node, 1) if reserves else 0
    resources = Resources(nodes=nodes, gpus_per_node=per_node, tasks_per_node=tasks, cpus_per_task=cpus,
                          mem_gb=mem, time_min=time_min)
    return ResourceEstimate(resources=resources, memory_gb=need_gb, hours=hours, gpu_hours=hours * gpus)


def cpu_resources(profile: Profile, *, reserves: bool) -> Resources:
    """What one CPU-only job (a ``data prepare --launch`` task) asks for on ``profile`` (pure): its
    ``cpu_jobs`` CPUs, memory and time (default: the profile's ``max_time_hours``), no GPUs; on a
    scheduler that reserves nothing (``reserves`` False: local), a process that takes what it finds."""
    jobs = profile.cpu_jobs
    hours = jobs.time_hours if jobs.time_hours is not None else profile.max_time_hours
    time_min = max(1, math.floor(hours * 60 + 1e-6))
    mem = jobs.mem_gb if reserves else 0
    return Resources(nodes=1, gpus_per_node=0, tasks_per_node=1, cpus_per_task=jobs.cpus, mem_gb=mem,
                     time_min=time_min)


def slurm_parameters(resources: Resources, profile: Profile, *, job_name: str, code_dir: str,
                     max_parallel: int | None) -> dict[str, Any]:
    """submitit ``SlurmExecutor.update_parameters`` keywords for one resource class (pure)."""
    params: dict[str, Any] = dict(profile.executor_params)
    params.update(
        job_name=job_name,
        nodes=resources.nodes,
        ntasks_per_node=resources.tasks_per_node,
        cpus_per_task=resources.cpus_per_task,
        mem=f"{resources.mem_gb}GB",
        time=resources.time_min,
        signal_delay_s=profile.signal_delay_s,
        setup=[*thread_lines(profile.setup), *profile.setup, code_path_line(code_dir)],
        # Preempted and timed-out jobs requeue themselves (submitit runs ``scontrol requeue``),
        # which sites with requeueing off by default (JobRequeue=0) refuse unless a job asks.
        additional_parameters={"requeue": True, **profile.executor_params.get("additional_parameters", {})},
    )
    if resources.gpus_per_node:
        params["gpus_per_node"] = resources.gpus_per_node
    if resources.nodes * resources.tasks_per_node > 1:
        # One task per GPU training together: if one dies (out of memory, a lost node), Slurm
        # ends the others at once instead of leaving them blocked in a collective until it
        # times out. Tasks other than the first exit 0 when preempted (diffsweep.launch.jobs.job).
        params["srun_args"] = [*params.get("srun_args", []), "--kill-on-bad-exit=1"]
    if max_parallel is not None:
        params["array_parallelism"] = max_parallel
    return params


def thread_lines(setup: tuple[str, ...]) -> list[str]:
    """Setup lines giving each task's math libraries one thread per CPU it was given (else a job
    inherits the login shell's ``OMP_NUM_THREADS``, or torch takes every core of the node); a
    variable the profile's own setup lines set is left to them."""
    return [f"export {var}=${{SLURM_CPUS_PER_TASK:-1}}" for var in ("OMP_NUM_THREADS", "MKL_NUM_THREADS")
            if not any(var in line for line in setup)]


def code_path_line(code_dir: str) -> str:
    """The setup line that makes a job import the snapshot of the code it was launched with."""
    return f"export PYTHONPATH={shlex.quote(code_dir)}${{PYTHONPATH:+:$PYTHONPATH}}"


def chunks(n: int, size: int) -> list[range]:
    """Index ranges of at most ``size`` (Slurm's MaxArraySize bounds array indices 0..size-1)."""
    return [range(i, min(i + size, n)) for i in range(0, n, size)]
