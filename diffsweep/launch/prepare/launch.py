"""``diffsweep data prepare --launch``: the shards of ``diffsweep.data.prepare`` written by one job
array (Slurm, or processes on this machine), resumable; and ``data status | logs | cancel``.

Everything lives in a launch folder beside the dataset, ``.OUT.prepare/`` (``record``):
its record ``launch.json`` (the request, the profile, each task's shards and submissions), the
``staging/`` folder the tasks write the shards into, submitit's ``jobs/`` and the ``code/`` snapshot.

Task ``t`` always writes the same contiguous group of shards (``write_shards``: a written shard
is skipped, so a task run again redoes only its unwritten shards). A task whose shards are
written checks all of them; one that finds every shard written takes ``finish.lock`` and
finishes the dataset, so exactly one does (the others find the lock held, or the plan gone). No
dependency between jobs is needed, and the same works with the local executor.

Launching again with the same inputs and settings resumes: the tasks with unwritten shards are
submitted again, unless some task is still pending or running (then nothing is). Other inputs or
settings are refused unless ``force``, which discards the launch folder and starts over.
"""

from __future__ import annotations

import os
import pickle
import signal
import time
import warnings
from collections.abc import Callable
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from diffsweep import lockfile, slurm
from diffsweep.config import ConfigError, ConfigWarning, EnvironmentUnavailable, TokenizerKind
from diffsweep.data.dataset import DatasetMeta, check_replaceable
from diffsweep.data.prepare import check_apart, finish, input_paths, stage
from diffsweep.data.shards import PLAN_FILE, read_plan, shard_record, write_shards
from diffsweep.data.sources import Corpus, Source, plan_shards
from diffsweep.launch.jobs.attempt import Attempt
from diffsweep.launch.jobs.local_scheduler import cpu_count, waiting_state
from diffsweep.launch.prepare.record import (
    FINISH_LOCK,
    FORMAT,
    JOBS,
    STAGING,
    LaunchRecord,
    PrepareStore,
    TaskRecord,
    discard,
    finished_meta,
    launch_folder,
    locked,
    read_record,
    require_record,
    write_finished,
    write_record,
)
from diffsweep.launch.profile_choice import pick_profile
from diffsweep.launch.profiles import Profile
from diffsweep.launch.resources import cpu_resources
from diffsweep.launch.scheduler import JobArray, Scheduler, attempt_states, cancel_attempts, get_scheduler
from diffsweep.rundir import now

MAX_TASKS = 16  # default array size on a cluster (fewer when there are fewer shards)
# How the request's keys read in an error (the flags of `data prepare` that set them).
_SETTINGS = {"tokenizer": "--tokenizer", "vocab_size": "--vocab-size", "val_fraction": "--val-fraction",
             "val_split": "--val-split", "max_tokens": "--max-tokens", "sample": "--sample", "seed": "--seed",
             "shard_size": "--shard-size", "shards": "INPUTS (files, their sizes or dates)",
             "cwd": "the working directory (INPUTS are relative paths)"}


# --- the job -----------------------------------------------------------------------------------------


@dataclass(frozen=True)
class PrepareTask:
    """One array task: write its shards, then finish the dataset if every shard is written."""

    folder: str  # the launch folder
    out: str
    shards: tuple[int, ...]
    replace: bool  # the launch was asked to replace an existing dataset (--force)
    workers: int = 1  # processes writing its shards: the CPUs a Slurm task is given (locally 1 per task)

    def __call__(self) -> str:
        # Cancelling sends SIGTERM, which submitit's job wrapper ignores: stop here (a shard being
        # written removes its temporary files on the way out).
        signal.signal(signal.SIGTERM, _stop)
        folder = Path(self.folder)
        staging = folder / STAGING
        if not (staging / PLAN_FILE).is_file():
            return "the dataset was already finished"
        processes = min(self.workers, len(self.shards))
        print(f"writing shards {_span(list(self.shards))} (those not written yet) in {processes} "
              f"process{'es' if processes > 1 else ''}", flush=True)
        records = write_shards(staging, self.shards, workers=self.workers)
        tokens = sum(r.num_tokens for r in records)
        print(f"shards {_span(list(self.shards))} written: {tokens:,} tokens", flush=True)
        meta = finalize(folder, Path(self.out), self.replace)
        done = f"; finished {self.out}" if meta is not None else ""
        if meta is not None:
            print(f"every shard is written: finished {self.out}", flush=True)
        return f"shards {_span(list(self.shards))}: {tokens:,} tokens{done}"


def _stop(signum: int, frame: Any) -> None:
    raise SystemExit(128 + signum)


def finalize(folder: Path, out: Path, replace: bool) -> DatasetMeta | None:
    """If every shard is written and nobody else is at it, finish the dataset (``finish``) and
    record it; returns its metadata, or None when there is nothing to do (yet)."""
    staging = folder / STAGING
    if not (staging / PLAN_FILE).is_file():
        return None  # finished meanwhile: the staging folder is the dataset now
    plan = read_plan(staging)
    if any(shard_record(staging, i) is None for i in range(len(plan.shards))):
        return None
    try:
        with lockfile.hold(folder / FINISH_LOCK, "finish", "out", "another task is finishing the dataset"):
            if not (staging / PLAN_FILE).is_file():
                return None
            for partial in staging.iterdir():  # left by a task killed while writing a shard
                if partial.name.startswith(".") and partial.is_file():
                    partial.unlink()
            meta = finish(staging, out, force=replace)
            write_finished(folder, meta.fingerprint)
            return meta
    except lockfile.LockBusy:
        return None


# --- launching ---------------------------------------------------------------------------------------


@dataclass
class Launched:
    """What ``launch_prepare`` did."""

    folder: Path
    submitted: list[int]  # task numbers submitted now
    num_tasks: int
    num_shards: int
    active: list[int]  # tasks found pending or running (nothing was submitted)
    finished: DatasetMeta | None  # finished now (every shard was already written) or before


def request_of(corpus: Corpus, tokenizer: TokenizerKind, *, vocab_size: int, val_fraction: float, val_split: str,
               max_tokens: int | None, shard_size: int) -> dict[str, Any]:
    """What a launch is asked to make, as plain data: a relaunch resumes only the same request.
    The inputs are named by their shard plan, with each file's size and modification time."""
    shards = [[{**s.recipe(), **_stamp(s)} for s in group] for group in plan_shards(corpus.sources, shard_size)]
    request: dict[str, Any] = {
        "tokenizer": tokenizer.value, "vocab_size": vocab_size, "val_fraction": val_fraction,
        "val_split": val_split, "max_tokens": max_tokens, "sample": corpus.sample, "seed": corpus.seed,
        "shard_size": shard_size, "shards": shards}
    if any(s.get("path") and not Path(s["path"]).is_absolute() for group in shards for s in group):
        request["cwd"] = os.getcwd()  # the tasks read relative paths from where they were launched
    return request


def _stamp(source: Source) -> dict[str, Any]:
    path = source.recipe().get("path")
    if path and Path(path).is_file():
        st = Path(path).stat()
        return {"bytes": st.st_size, "mtime_ns": st.st_mtime_ns}
    return {"bytes": source.stored_bytes}


def launch_prepare(corpus: Corpus, out: Path, tokenizer: TokenizerKind, *, vocab_size: int, val_fraction: float,
                   val_split: str, max_tokens: int | None, shard_size: int, profile: str | None = None,
                   executor: str | None = None, tasks: int | None = None, force: bool = False,
                   echo: Callable[[str], None] = print) -> Launched:
    """Stage the corpus (the tokenizer is trained here) and submit one job array that writes the
    shards and finishes the dataset ``out``; or resume a launch of the same request. Returns at
    once (``wait`` follows it). See the module's notes."""
    if tasks is not None and tasks < 1:
        raise ConfigError("tasks", f"expected at least 1 task, got {tasks}")
    out = out.absolute()
    folder = launch_folder(out)
    inputs = input_paths(corpus)
    check_apart(out, inputs, "out")
    check_apart(folder, inputs, "out")  # its launch folder, .OUT.prepare, is replaced by --force
    if force and (out.exists() or out.is_symlink()):
        check_replaceable(out)
    request = request_of(corpus, tokenizer, vocab_size=vocab_size, val_fraction=val_fraction, val_split=val_split,
                         max_tokens=max_tokens, shard_size=shard_size)
    record = read_record(folder)
    if record is None or force:  # a relaunch without --profile/--executor uses the first launch's
        chosen_profile, chosen_executor = profile, executor
    else:
        chosen_profile = profile if profile is not None or executor is not None else record.profile
        chosen_executor = executor if profile is not None or executor is not None else record.executor
    chosen = pick_profile(chosen_profile, chosen_executor)
    scheduler = get_scheduler(chosen.executor)
    with locked(folder, out, "launch"):
        record = read_record(folder)
        if record is not None:
            active = active_tasks(record)
            if active and force:
                raise ConfigError("force", f"tasks {_span(active)} of the launched prepare of {out} are still pending "
                                  f"or running; stop them first (diffsweep data cancel {out})")
            if not force:
                if record.request != request and out.exists():
                    raise ConfigError(str(out), "already exists (pass --force to replace it)")
                if record.request != request:
                    differ = [_SETTINGS.get(k, k) for k in sorted(set(request) | set(record.request))
                              if request.get(k) != record.request.get(k)]
                    raise ConfigError(str(out), f"a launched prepare of other {', '.join(differ)} is in {folder}; "
                                      "pass --force to discard it and start over")
                return _resume(record, folder, out, scheduler, chosen, tasks, active, echo)
        if out.exists() and not force:
            raise ConfigError(str(out), "already exists (pass --force to replace it)")
        if not os.access(out.parent, os.W_OK):
            raise ConfigError(str(out), f"cannot write in {out.parent}")
        scheduler.check_tasks(chosen)
        discard(folder)  # --force, or the remains of a launch that recorded nothing
        try:
            staging = folder / STAGING
            staging.mkdir()
            staged = stage(corpus, staging, tokenizer, vocab_size=vocab_size, val_fraction=val_fraction,
                           val_split=val_split, max_tokens=max_tokens, shard_size=shard_size)
            size = tasks or min(MAX_TASKS if scheduler.reserves_resources else cpu_count(), staged.num_shards)
            if profile is not None and Path(profile).is_file():  # a relaunch from elsewhere finds it too
                profile = str(Path(profile).absolute())
            record = LaunchRecord(format=FORMAT, out=str(out), request=request, replace=force, profile=profile,
                                  executor=executor, created=now(),
                                  tasks=[TaskRecord(g) for g in task_groups(staged.num_shards, size)])
            write_record(folder, record)
            submitted = _submit(record, folder, out, list(range(len(record.tasks))), chosen, echo)
        except BaseException:
            discard(folder)  # nothing was launched: leave nothing behind
            raise
        return Launched(folder, submitted, len(record.tasks), staged.num_shards, [], None)


def _resume(record: LaunchRecord, folder: Path, out: Path, scheduler: Scheduler, profile: Profile, tasks: int | None,
            active: list[int], echo: Callable[[str], None]) -> Launched:
    num_tasks, num_shards = len(record.tasks), sum(len(t.shards) for t in record.tasks)
    if tasks is not None and tasks != num_tasks:
        warnings.warn(ConfigWarning(f"tasks: ignored; this prepare was launched as {num_tasks} tasks, which "
                                    "keep their shards (pass --force to start over)"), stacklevel=2)
    done = finished_meta(folder, out)
    if done is not None:
        return Launched(folder, [], num_tasks, num_shards, [], done)
    staging = folder / STAGING
    if not (staging / PLAN_FILE).is_file():
        raise ConfigError(str(out), f"the launched prepare in {folder} was finished, but {out} is not the dataset it "
                          "made (replaced or removed since); pass --force to prepare it again")
    if active:
        return Launched(folder, [], num_tasks, num_shards, active, None)
    if out.exists() and not record.replace:
        raise ConfigError(str(out), "already exists (pass --force to replace it)")
    todo = [t for t, task in enumerate(record.tasks) if any(shard_record(staging, i) is None for i in task.shards)]
    if not todo:  # every shard is written, but the task that would have finished did not (killed)
        echo("every shard is written; finishing the dataset here")
        meta = finalize(folder, out, record.replace)
        if meta is None:
            raise ConfigError(str(out), f"another process is finishing the dataset (lock {folder / FINISH_LOCK})")
        return Launched(folder, [], num_tasks, num_shards, [], meta)
    scheduler.check_tasks(profile)
    submitted = _submit(record, folder, out, todo, profile, echo)
    return Launched(folder, submitted, num_tasks, num_shards, [], None)


def _submit(record: LaunchRecord, folder: Path, out: Path, todo: list[int], profile: Profile,
            echo: Callable[[str], None]) -> list[int]:
    """Submit the tasks ``todo`` as one job array, their attempts recorded as soon as the scheduler
    has them (locally every task starts at once)."""
    from diffsweep.launch.snapshot import snapshot_code

    scheduler = get_scheduler(profile.executor)
    resources = cpu_resources(profile, reserves=scheduler.reserves_resources)
    code_dir = str(snapshot_code(folder))
    # Locally there is one task per core already; a Slurm task uses the CPUs it asked for.
    workers = resources.cpus_per_task if scheduler.reserves_resources else 1
    store = PrepareStore(folder)

    def add(attempts: list[tuple[int, Attempt]]) -> None:  # called holding the store's lock
        current = store.read()
        assert current is not None  # written before submitting
        for j, a in attempts:
            a.profile, a.resources = profile.name, asdict(resources)
            current.tasks[todo[j]].attempts.append(a)
            record.tasks[todo[j]].attempts.append(a)
        store.write(current)

    calls: list[Callable[[], Any]] = [PrepareTask(str(folder), str(out), tuple(record.tasks[t].shards),
                                                  record.replace, workers) for t in todo]
    attempts = scheduler.submit(JobArray(
        calls=calls, names=[f"task {t}" for t in todo], resources=resources, profile=profile, folder=folder / JOBS,
        job_name=f"prepare-{out.name}", code_dir=code_dir, store=store, record=add, noun="tasks",
        max_parallel=None if scheduler.reserves_resources else len(todo)))
    ids = [a.job_id or "queued" for a in attempts]
    echo(f"launched {len(todo)} of {len(record.tasks)} tasks {scheduler.runs_jobs} ({resources.describe()}): "
         + (f"jobs {ids[0]}" + (f" .. {ids[-1]}" if len(ids) > 1 else "") if attempts[0].job_id else "queued"))
    return todo


def task_groups(num_shards: int, num_tasks: int) -> list[list[int]]:
    """Shards 0..num_shards-1 in ``num_tasks`` contiguous groups of (almost) equal count (pure)."""
    num_tasks = max(1, min(num_tasks, num_shards))
    per, extra = divmod(num_shards, num_tasks)
    groups, start = [], 0
    for t in range(num_tasks):
        n = per + (1 if t < extra else 0)
        groups.append(list(range(start, start + n)))
        start += n
    return groups


# --- status, logs, cancel ----------------------------------------------------------------------------


@dataclass
class TaskStatus:
    task: int
    shards: list[int]
    written: int
    attempts: int
    executor: str | None
    job_id: str | None
    state: str  # the scheduler's (Slurm's words), COMPLETED/FAILED from the job's result when it says only EXITED
    error: str | None  # the last line of the job's exception, when it failed


@dataclass
class PrepareStatus:
    out: Path
    folder: Path
    num_shards: int
    written: int
    finished: bool
    tasks: list[TaskStatus]

    @property
    def active(self) -> list[int]:
        return [t.task for t in self.tasks if slurm.word(t.state) in slurm.LIVE]

    def to_json(self) -> dict[str, Any]:
        return {"out": str(self.out), "folder": str(self.folder), "shards": self.num_shards, "written": self.written,
                "finished": self.finished, "tasks": [asdict(t) for t in self.tasks]}


def _states(record: LaunchRecord) -> dict[int, tuple[str, str | None]]:
    """Each task's state (and error) from its latest attempt's scheduler, by task number."""
    latest = {t: a for t, a in enumerate(task.latest for task in record.tasks) if a is not None}
    known = attempt_states(latest.values(), lambda a: "launch.json: executor")
    states: dict[int, tuple[str, str | None]] = {}
    for t, a in latest.items():
        waiting = waiting_state(a)  # not started by the local queue yet
        if waiting is not None:
            states[t] = (waiting[0], waiting[1] if waiting[0] == "FAILED" else None)
            continue
        state = known.get((a.executor, a.job_id or ""), "UNKNOWN")
        error = None
        if slurm.word(state) not in slurm.LIVE:
            outcome = _outcome(a)
            if outcome is not None:
                state = "COMPLETED" if outcome[0] == "success" else "FAILED"
                error = None if outcome[0] == "success" else _last_line(outcome[1])
            elif a.state == "cancelled":
                state = "CANCELLED"
        states[t] = (state, error)
    return states


def _outcome(a: Attempt) -> tuple[str, Any] | None:
    """What submitit recorded of the job's function: ("success", result) or ("error", traceback)."""
    from submitit.core.utils import JobPaths

    if a.job_id is None:
        return None
    try:
        with open(JobPaths(a.folder, job_id=a.job_id, task_id=0).result_pickle, "rb") as f:
            return pickle.load(f)  # noqa: S301 (written by this launch's own job)
    except (OSError, pickle.UnpicklingError, EOFError, AttributeError, ModuleNotFoundError):
        return None


def _last_line(text: Any) -> str:
    lines = [line for line in str(text).strip().splitlines() if line.strip()]
    return lines[-1].strip() if lines else ""


def active_tasks(record: LaunchRecord) -> list[int]:
    return [t for t, (state, _) in _states(record).items() if slurm.word(state) in slurm.LIVE]


def prepare_status(out: Path) -> PrepareStatus:
    """Where the launched prepare of ``out`` stands: shards written, each task's job, finished."""
    folder, record = require_record(out)
    staging = folder / STAGING
    finished = finished_meta(folder, out) is not None
    states = _states(record)
    tasks, written = [], 0
    for t, task in enumerate(record.tasks):
        done = len(task.shards) if finished else sum(shard_record(staging, i) is not None for i in task.shards)
        written += done
        a = task.latest
        state, error = states.get(t, ("not submitted", None))
        tasks.append(TaskStatus(task=t, shards=task.shards, written=done, attempts=len(task.attempts),
                                executor=a.executor if a else None, job_id=a.job_id if a else None, state=state,
                                error=error))
    total = sum(len(t.shards) for t in record.tasks)
    return PrepareStatus(out=out.absolute(), folder=folder, num_shards=total, written=written, finished=finished,
                         tasks=tasks)


def wait(out: Path, poll_s: float = 1.0, on_change: Callable[[PrepareStatus], None] | None = None) -> PrepareStatus:
    """Follow the launched prepare until none of its tasks is pending or running: a finished dataset's last task
    has exited too (it finishes the dataset just before it exits, so "finished" alone returned while it ran)."""
    seen = None
    while True:
        status = prepare_status(out)
        summary = (status.written, status.finished, [t.state for t in status.tasks])
        if on_change is not None and summary != seen:
            on_change(status)
        seen = summary
        if not status.active:
            return status
        time.sleep(poll_s)


def task_logs(out: Path, task: int | None) -> list[tuple[str, list[Path]]]:
    """(header, log files that exist) of the latest attempt of ``task`` (None: of every task)."""
    folder, record = require_record(out)
    num = len(record.tasks)
    if task is not None and not 0 <= task < num:
        raise ConfigError("task", f"expected a task from 0 to {num - 1}, got {task}")
    result: list[tuple[str, list[Path]]] = []
    for t in [task] if task is not None else range(num):
        entry = record.tasks[t]
        a = entry.latest
        head = f"==> task {t} (shards {_span(entry.shards)})"
        if a is None:
            result.append((f"{head}: not submitted <==", []))
            continue
        files = get_scheduler(a.executor, "launch.json: executor").log_files(a)
        line = f"{head}: {a.executor} job {a.job_id}, attempt {len(entry.attempts)}, submitted {a.submitted} <=="
        result.append((line, files))
    return result


def cancel_prepare(out: Path) -> list[int]:
    """Stop the pending and running tasks of the launched prepare of ``out`` (those still queued on
    this machine are dropped); returns their numbers. Their written shards stay: launching again
    resumes."""
    folder, _ = require_record(out)
    store = PrepareStore(folder)
    with locked(folder, out, "cancel"), store.locked():
        record = store.read()
        assert record is not None
        pairs = [(t, a) for t in active_tasks(record) if (a := record.tasks[t].latest) is not None]
        for _, a in pairs:
            if a.job_id is None:  # queued: the local queue drops it
                a.state = "cancelled"
        try:
            errors = cancel_attempts(a for _, a in pairs if a.job_id is not None)  # marks them, recorded below
        finally:
            store.write(record)
        cancelled = [t for t, a in pairs if a.state == "cancelled"]
    if errors:
        raise EnvironmentUnavailable(f"{'; '.join(errors)}; run `diffsweep data cancel {out}` again")
    return cancelled


# --- helpers -----------------------------------------------------------------------------------------


def _span(indices: list[int]) -> str:
    if not indices:
        return "none"
    if indices == list(range(indices[0], indices[-1] + 1)) and len(indices) > 1:
        return f"{indices[0]}-{indices[-1]}"
    return ", ".join(str(i) for i in indices)
