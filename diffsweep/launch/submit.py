"""``launch``: check everything, then submit the plan's new, changed, failed (within the retry
budget) and cancelled runs through submitit, and return. Finished runs are skipped and running
ones left alone, so launching again is always safe.

Slurm: one job array per resource class, chunked under the cluster's MaxArraySize.
Local: a detached queue process starts the runs through submitit's local executor, at most
``max_parallel`` at a time, so ``launch`` returns at once here too.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from collections import defaultdict
from dataclasses import dataclass, field
from pathlib import Path

import yaml

from diffsweep.config import ConfigError
from diffsweep.launch.ledger import Attempt, Entry, Ledger, locked, now, read_ledger, write_ledger
from diffsweep.launch.plan import SUBMITTABLE, RunPlan, SweepPlan, cpu_count, identity_of
from diffsweep.launch.profiles import ExecutorKind
from diffsweep.launch.resources import Resources, chunks, slurm_parameters

DEFAULT_ARRAY_SIZE = 1001  # Slurm's default MaxArraySize
LAUNCH_CONFIG = "launch_config.yaml"  # in each run directory: the resolved config its job trains


@dataclass
class Selection:
    """What a launch would do with each run."""

    submit: list[RunPlan] = field(default_factory=list)
    skip: list[tuple[RunPlan, str]] = field(default_factory=list)  # (run, why)


def select(plan: SweepPlan, max_retries: int) -> Selection:
    sel = Selection()
    for r in plan.runs:
        state = r.state.state
        if state not in SUBMITTABLE:
            sel.skip.append((r, state))
        elif state == "failed" and r.attempts > max_retries:
            sel.skip.append((r, f"failed {r.attempts} times; retry budget ({max_retries}) spent, raise it with --retries"))
        else:
            sel.submit.append(r)
    return sel


def check_launch(plan: SweepPlan, sel: Selection, budget: float | None) -> None:
    """Everything that can be checked before submitting; raises ConfigError/EnvironmentUnavailable."""
    multi = [r for r in sel.submit if r.estimate.resources.gpus > 1]
    if multi:
        r = multi[0]
        raise ConfigError(r.run.name, f"needs {r.estimate.resources.gpus} GPUs (about {r.estimate.memory_gb:.0f} GB "
                          f"of training state) on profile {plan.profile.name!r}; sharded multi-GPU training is not "
                          "available yet, so select runs that fit one GPU with --only")
    cost = sum(r.estimate.gpu_hours for r in sel.submit)
    if budget is not None and cost > budget:
        raise ConfigError("--budget", f"launching {len(sel.submit)} runs needs about {cost:,.1f} GPU-hours, over "
                          f"the budget of {budget:,.1f}")
    if plan.profile.executor is ExecutorKind.SLURM:
        check_slurm()
    if not sel.submit:
        return
    from diffsweep.data.dataset import META_FILE, check_compatible, read_meta

    checked: set[tuple] = set()
    for r in sel.submit:
        c = r.run.config
        signature = (c.data.path, c.data.tokenizer, c.model.vocab_size, c.train.seq_len)
        if signature in checked:
            continue
        checked.add(signature)
        meta_path = Path(c.data.path) / META_FILE
        if not meta_path.is_file():
            raise ConfigError("data.path", f"{c.data.path} is not a prepared dataset (no {META_FILE}; make it with "
                              f"`diffsweep data prepare`) (in {r.run.name})")
        try:
            check_compatible(read_meta(meta_path), c.data.tokenizer, c.model.vocab_size, c.train.seq_len)
        except ConfigError as exc:
            raise ConfigError(exc.key, f"{exc.message} (in {r.run.name})") from None


def check_slurm() -> None:
    """A Slurm controller must answer before anything is written or submitted."""
    for tool in ("sbatch", "squeue", "scancel", "sinfo"):
        if shutil.which(tool) is None:
            raise ConfigError("--executor", f"slurm: {tool} is not on PATH (no Slurm client here); use --executor "
                              "local, or run where Slurm is installed")
    try:
        out = subprocess.run(["sinfo", "-h", "-o", "%P"], capture_output=True, text=True, timeout=30)
    except (OSError, subprocess.SubprocessError) as exc:
        raise ConfigError("--executor", f"slurm: sinfo failed ({exc})") from None
    if out.returncode != 0:
        first = (out.stderr.strip().splitlines() or ["no output"])[0]
        raise ConfigError("--executor", f"slurm: cannot reach the Slurm controller ({first}); is SLURM_CONF set?")


def max_array_size(plan: SweepPlan) -> int:
    if plan.profile.max_array_size is not None:
        return plan.profile.max_array_size
    try:
        out = subprocess.run(["scontrol", "show", "config"], capture_output=True, text=True, timeout=30)
        for line in out.stdout.splitlines():
            if line.split("=")[0].strip() == "MaxArraySize":
                return int(line.split("=", 1)[1].strip())
    except (OSError, subprocess.SubprocessError, ValueError):
        pass
    return DEFAULT_ARRAY_SIZE


def launch(plan: SweepPlan, sel: Selection, *, max_parallel: int | None, tracking_uri: str,
           echo=print) -> list[tuple[RunPlan, Attempt]]:
    """Submit ``sel.submit`` (already checked). Returns each submitted run with its attempt."""
    from diffsweep.launch.job import TrainJob
    from diffsweep.launch.snapshot import snapshot_code
    from diffsweep.train.tracking import check_tracking, ensure_experiment

    check_tracking(tracking_uri)
    ensure_experiment(tracking_uri, plan.spec.experiment)
    out = plan.out
    code_dir = str(snapshot_code(out))
    jobs = {r.run.key: TrainJob(_config_dict(r), str(r.run_dir), plan.spec.experiment, tracking_uri,
                                {"diffsweep.sweep": plan.spec.name, "diffsweep.sweep_run": r.run.name})
            for r in sel.submit}
    for r in sel.submit:  # what the job trains, readable (the local queue reads it back)
        r.run_dir.mkdir(parents=True, exist_ok=True)
        (r.run_dir / LAUNCH_CONFIG).write_text(yaml.safe_dump(_config_dict(r), sort_keys=False))
    with locked(out):
        ledger = read_ledger(out) or Ledger(sweep=plan.spec.name, experiment=plan.spec.experiment,
                                            tracking_uri=tracking_uri)
        for r in sel.submit:
            ledger.entries.setdefault(r.run.key, Entry(key=r.run.key, name=r.run.name, run_dir=str(r.run_dir),
                                                       identity=identity_of(r.run)))
        write_ledger(out, ledger)
    if plan.profile.executor is ExecutorKind.SLURM:
        return _launch_slurm(plan, sel, jobs, code_dir, max_parallel, echo)
    return _launch_local(plan, sel, code_dir, max_parallel)


def _config_dict(r: RunPlan) -> dict:
    from diffsweep.sweep.expand import resolved_dict

    return resolved_dict(r.run)


def _launch_slurm(plan: SweepPlan, sel: Selection, jobs: dict, code_dir: str, max_parallel: int | None,
                  echo) -> list[tuple[RunPlan, Attempt]]:
    import submitit

    classes: dict[Resources, list[RunPlan]] = defaultdict(list)
    for r in sel.submit:
        classes[r.estimate.resources].append(r)
    size = max_array_size(plan)
    folder = plan.out / "jobs" / "%j"
    submitted: list[tuple[RunPlan, Attempt]] = []
    for i, (resources, runs) in enumerate(sorted(classes.items(), key=lambda kv: kv[0].time_min)):
        executor = submitit.SlurmExecutor(folder=folder, max_num_timeout=plan.profile.max_num_timeout)
        executor.update_parameters(**slurm_parameters(resources, plan.profile, job_name=f"{plan.spec.name}-{i}",
                                                      code_dir=code_dir, max_parallel=max_parallel))
        for part in chunks(len(runs), size):
            batch = [runs[j] for j in part]
            with executor.batch():
                handles = [executor.submit(jobs[r.run.key]) for r in batch]
            attempts = []
            for r, job in zip(batch, handles):
                attempts.append((r, Attempt(executor="slurm", submitted=now(), code_dir=code_dir,
                                            folder=str(job.paths.folder), job_id=job.job_id,
                                            stdout=str(job.paths.stdout), stderr=str(job.paths.stderr))))
            _record(plan.out, attempts)
            submitted += attempts
            echo(f"submitted {len(batch)} runs as Slurm array {handles[0].job_id.split('_')[0]} "
                 f"({resources.describe()})")
    return submitted


def _launch_local(plan: SweepPlan, sel: Selection, code_dir: str,
                  max_parallel: int | None) -> list[tuple[RunPlan, Attempt]]:
    parallel = max_parallel or plan.spec.launch.max_parallel or 1
    logs = plan.out / "logs"
    logs.mkdir(parents=True, exist_ok=True)
    env = dict(os.environ)
    env["PYTHONPATH"] = code_dir + (os.pathsep + env["PYTHONPATH"] if env.get("PYTHONPATH") else "")
    env.setdefault("OMP_NUM_THREADS", str(max(1, cpu_count() // parallel)))  # no oversubscription
    attempts = [(r, Attempt(executor="local", submitted=now(), code_dir=code_dir, folder=str(plan.out / "jobs"),
                            state="queued")) for r in sel.submit]
    with locked(plan.out):
        log = open(logs / f"queue-{now().replace(':', '')}.log", "ab")
        proc = subprocess.Popen(  # noqa: S603 (fixed argv, no shell)
            [sys.executable, "-m", "diffsweep.launch.local_queue", str(plan.out), str(parallel)],
            stdin=subprocess.DEVNULL, stdout=log, stderr=subprocess.STDOUT, env=env, start_new_session=True,
            cwd=plan.out)
        log.close()
        for _, a in attempts:
            a.queue_pid = proc.pid
        ledger = read_ledger(plan.out)
        assert ledger is not None
        for r, a in attempts:
            ledger.entries[r.run.key].attempts.append(a)
        write_ledger(plan.out, ledger)
    return attempts


def _record(out: Path, attempts: list[tuple[RunPlan, Attempt]]) -> None:
    with locked(out):
        ledger = read_ledger(out)
        assert ledger is not None
        for r, a in attempts:
            ledger.entries[r.run.key].attempts.append(a)
        write_ledger(out, ledger)
