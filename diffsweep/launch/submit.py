"""``launch``: check everything, then submit the plan's new, changed, failed (within the retry
budget) and cancelled runs through submitit, and return. Finished runs are skipped and running
ones left alone, so launching again is always safe.

Slurm: one job array per resource class, chunked under the cluster's MaxArraySize.
Local: a detached queue process starts the runs through submitit's local executor, at most
``max_parallel`` at a time, so ``launch`` returns at once here too.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import subprocess
import sys
from collections import defaultdict
from collections.abc import Iterator
from dataclasses import asdict, dataclass, field
from pathlib import Path

import yaml

from diffsweep import lockfile
from diffsweep.config import ConfigError, to_dict
from diffsweep.config.identity import identity_fields
from diffsweep.launch.cluster import check_cluster
from diffsweep.launch.ledger import Attempt, Entry, Ledger, ledger_path, locked, now, read_ledger, write_ledger
from diffsweep.launch.plan import SUBMITTABLE, RunPlan, SweepPlan, cpu_count
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
            sel.skip.append((r, state + (f" ({r.state.detail})" if r.state.detail else "")))
        elif r.state.blocked:
            sel.skip.append((r, f"{state}: {r.state.blocked}"))
        elif state == "failed" and r.attempts > max_retries:
            sel.skip.append((r, f"failed {r.attempts} times; retry budget ({max_retries}) spent, raise it with --retries"))
        else:
            sel.submit.append(r)
    return sel


def check_launch(plan: SweepPlan, sel: Selection, budget: float | None) -> None:
    """Everything that can be checked before submitting; raises ConfigError/EnvironmentUnavailable."""
    cost = sum(r.estimate.gpu_hours for r in sel.submit)
    if budget is not None and cost > budget:
        raise ConfigError("--budget", f"launching {len(sel.submit)} runs needs about {cost:,.1f} GPU-hours, over "
                          f"the budget of {budget:,.1f}")
    if plan.profile.executor is ExecutorKind.SLURM:
        check_cluster(plan)
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


LAUNCH_LOCK = ".launch.lock"  # in the sweep directory: held by a launch or cancel of it


@contextlib.contextmanager
def launch_lock(out: Path, what: str = "launch") -> Iterator[None]:
    """One launch (or cancel) of a sweep directory at a time, from any machine: a second one,
    planned from the same ledger, would submit the same runs again. The lock file lives in the
    sweep directory, on the file system every login node shares (``diffsweep.lockfile``).

    A sweep directory this creates is removed again if nothing was launched into it (no
    ledger), so a refused or failed launch leaves nothing behind."""
    fresh = not out.exists()
    with lockfile.hold(out / LAUNCH_LOCK, what, "--out", f"another launch or cancel of {out} is in progress"):
        try:
            yield
        finally:
            if fresh and not ledger_path(out).exists():  # still ours alone: the lock keeps others out
                for child in out.iterdir():
                    if child.name == LAUNCH_LOCK:
                        continue
                    if child.is_dir() and not child.is_symlink():
                        shutil.rmtree(child)
                    else:
                        child.unlink()


def launch(plan: SweepPlan, sel: Selection, *, max_parallel: int | None, tracking_uri: str,
           echo=print) -> list[tuple[RunPlan, Attempt]]:
    """Submit ``sel.submit`` (already checked; call under ``launch_lock``). Each submission is in
    the ledger as soon as the scheduler has it. If the first submission fails, ``launch_lock``
    removes a sweep directory it created."""
    from diffsweep.launch.job import TrainJob
    from diffsweep.launch.snapshot import snapshot_code
    from diffsweep.train.store import check_tracking, ensure_experiment

    check_tracking(tracking_uri)
    out = plan.out
    ensure_experiment(tracking_uri, plan.spec.experiment)
    code_dir = str(snapshot_code(out))
    jobs = {r.run.key: TrainJob(_config_dict(r), str(r.run_dir), plan.spec.experiment, tracking_uri,
                                {"diffsweep.sweep": plan.spec.name, "diffsweep.sweep_run": r.run.name})
            for r in sel.submit}
    submitted: list[tuple[RunPlan, Attempt]] = []
    if plan.profile.executor is ExecutorKind.SLURM:
        _launch_slurm(plan, sel, jobs, code_dir, max_parallel, echo, submitted, tracking_uri)
    else:
        _launch_local(plan, sel, code_dir, max_parallel, submitted, tracking_uri)
    return submitted


def _config_dict(r: RunPlan) -> dict:
    """The run's resolved config as plain data: what its job trains (same key when reloaded)."""
    return to_dict(r.run.config)


def _launch_slurm(plan: SweepPlan, sel: Selection, jobs: dict, code_dir: str, max_parallel: int | None,
                  echo, submitted: list, tracking_uri: str) -> None:
    import submitit

    classes: dict[Resources, list[RunPlan]] = defaultdict(list)
    for r in sel.submit:
        classes[r.estimate.resources].append(r)
    size = max_array_size(plan)
    folder = plan.out / "jobs" / "%j"
    for i, (resources, runs) in enumerate(sorted(classes.items(), key=lambda kv: kv[0].time_min)):
        executor = submitit.SlurmExecutor(folder=folder, max_num_timeout=plan.profile.max_num_timeout)
        executor.update_parameters(**slurm_parameters(resources, plan.profile, job_name=f"{plan.spec.name}-{i}",
                                                      code_dir=code_dir, max_parallel=max_parallel))
        for part in chunks(len(runs), size):
            batch = [runs[j] for j in part]
            try:
                with executor.batch():
                    handles = [executor.submit(jobs[r.run.key]) for r in batch]
            except Exception as exc:  # sbatch refused (bad partition, account, limits)
                done = f" ({len(submitted)} runs were submitted before; launch again after fixing it)" if submitted else ""
                raise ConfigError("slurm", f"sbatch refused the job array: {_first_line(exc)}{done}") from None
            attempts = [(r, Attempt(executor="slurm", submitted=now(), code_dir=code_dir,
                                    folder=str(job.paths.folder), job_id=job.job_id,
                                    stdout=str(job.paths.stdout), stderr=str(job.paths.stderr)))
                        for r, job in zip(batch, handles)]
            _record(plan, attempts, tracking_uri)
            submitted += attempts
            echo(f"submitted {len(batch)} runs as Slurm array {handles[0].job_id.split('_')[0]} "
                 f"({resources.describe()})")


def _first_line(exc: BaseException) -> str:
    text = str(exc).strip()
    for line in text.splitlines():
        if "error" in line.lower():
            return line.strip()
    return (text.splitlines() or [type(exc).__name__])[0][:300]


def _launch_local(plan: SweepPlan, sel: Selection, code_dir: str, max_parallel: int | None, submitted: list,
                  tracking_uri: str) -> None:
    from diffsweep.lockfile import proc_start

    parallel = max_parallel or plan.spec.launch.max_parallel or 1
    logs = plan.out / "logs"
    logs.mkdir(parents=True, exist_ok=True)
    env = dict(os.environ)
    env["PYTHONPATH"] = code_dir + (os.pathsep + env["PYTHONPATH"] if env.get("PYTHONPATH") else "")
    env.setdefault("OMP_NUM_THREADS", str(max(1, cpu_count() // parallel)))  # no oversubscription
    attempts = [(r, Attempt(executor="local", submitted=now(), code_dir=code_dir, folder=str(plan.out / "jobs"),
                            state="queued")) for r in sel.submit]
    with locked(plan.out):  # the queue waits on this lock until its attempts are in the ledger
        live = _live_queue(plan.out)
        if live is not None:  # one queue per sweep: --max-parallel holds across launches
            for _, a in attempts:
                a.queue_pid, a.queue_start = live
            _record(plan, attempts, tracking_uri, lock=False)
            submitted += attempts
            return
        with open(logs / f"queue-{now().replace(':', '')}.log", "ab") as log:
            proc = subprocess.Popen(  # noqa: S603 (fixed argv, no shell)
                [sys.executable, "-m", "diffsweep.launch.local_queue", str(plan.out), str(parallel)],
                stdin=subprocess.DEVNULL, stdout=log, stderr=subprocess.STDOUT, env=env, start_new_session=True,
                cwd=plan.out)
        start = proc_start(proc.pid)
        for _, a in attempts:
            a.queue_pid, a.queue_start = proc.pid, start
        _record(plan, attempts, tracking_uri, lock=False)
        submitted += attempts


def _live_queue(out: Path) -> tuple[int, int | None] | None:
    """(pid, start time) of this sweep's local queue if one runs and has not decided to exit."""
    from diffsweep.launch.local_queue import closed_marker
    from diffsweep.lockfile import pid_alive

    ledger = read_ledger(out)
    for entry in (ledger.entries.values() if ledger else []):
        a = entry.latest
        if (a is not None and a.executor == "local" and a.queue_pid is not None
                and pid_alive(a.queue_pid, a.queue_start) and not closed_marker(out, a.queue_pid).exists()):
            return a.queue_pid, a.queue_start
    return None


def _record(plan: SweepPlan, attempts: list[tuple[RunPlan, Attempt]], tracking_uri: str, lock: bool = True) -> None:
    """Add the attempts (and their runs' entries and launch configs) to the ledger."""
    for r, _ in attempts:  # what the job trains, readable (the local queue reads it back)
        r.run_dir.mkdir(parents=True, exist_ok=True)
        (r.run_dir / LAUNCH_CONFIG).write_text(yaml.safe_dump(_config_dict(r), sort_keys=False))
    with locked(plan.out) if lock else contextlib.nullcontext():
        ledger = read_ledger(plan.out) or Ledger(sweep=plan.spec.name, experiment=plan.spec.experiment,
                                                 tracking_uri=tracking_uri)
        for r, a in attempts:
            a.profile, a.resources = plan.profile.name, asdict(r.estimate.resources)  # status shows what was asked
            entry = ledger.entries.setdefault(r.run.key, Entry(key=r.run.key, name=r.run.name, run_dir=str(r.run_dir),
                                                               identity=identity_fields(r.run.config)))
            entry.attempts.append(a)
        write_ledger(plan.out, ledger)
