"""This machine: a detached queue process (``diffsweep.launch.jobs.local_queue``) starts the jobs of a
record (a sweep's runs, a launched prepare's tasks) through submitit's ``LocalExecutor``, at most
``max_parallel`` at a time, so the command that submits returns at once here too. A later submission
to the same record hands its jobs to the live queue, so the limit holds for the record.

Each queued job waits as a pickle (its name and callable) in ``<array folder>/queued/`` until the
queue starts it and records the job in the store. A local job's id is the pid of submitit's
controller process; the record also keeps the process's start time, because pids are reused.
States and cancelling use that pid: submitit's ``LocalJob`` can only tell the state of, and cancel,
a job whose ``Popen`` it holds, and that object lives in the queue process, not in ``status`` or
``cancel``.
"""

from __future__ import annotations

import os
import pickle
import re
import signal
import subprocess
import sys
from pathlib import Path

from diffsweep.launch.jobs.attempt import Attempt, AttemptStore
from diffsweep.launch.profiles import LOCAL, Profile
from diffsweep.launch.scheduler import JobArray, Scheduler
from diffsweep.lockfile import pid_alive, proc_start
from diffsweep.rundir import now

LOCAL_TIMEOUT_MIN = 7 * 24 * 60  # the local executor has no real time limit
QUEUED = "queued"  # under an array's folder: the pickles of the jobs the queue has not started
LOGS = "logs"  # under the store's folder: the queue's log, and its marker when it has decided to exit


def closed_marker(store: AttemptStore, pid: int) -> Path:
    """Written (under the store's lock) when a queue has decided to exit: no job may be handed to it."""
    return store.folder / LOGS / f".queue-{pid}.closed"


def waiting_state(attempt: Attempt) -> tuple[str, str] | None:
    """Where a local attempt that has no job yet stands, in Slurm's words and why: waiting in a live
    queue, or failed (the queue could not start it, or stopped first); None for any other attempt."""
    if attempt.state == "failed-to-start":
        return "FAILED", "the local queue could not start it (see its log, logs/queue-*.log)"
    if attempt.state == "queued":
        if attempt.queue_pid is not None and pid_alive(attempt.queue_pid, attempt.queue_start):
            gate = Path(attempt.gate) if attempt.gate is not None else None
            if gate is not None and not gate.exists():  # a cooldown branch: its parent's checkpoint
                return "PENDING", f"waits for {gate.parent.parent.name} to checkpoint {gate.name}"
            return "PENDING", "local queue"
        return "FAILED", "the local queue stopped before starting it"
    return None


class LocalScheduler(Scheduler):
    """Processes on this machine through submitit's local executor."""

    name = "local"
    label = "the local queue"
    runs_jobs = "on this machine"
    reserves_resources = False  # a process takes the machine's CPUs as it finds them
    time_limit_signal = False  # no time limit, so no USR2 before one
    replaces_declared_profile = True
    jobs_on_other_hosts = False  # one machine: its SQLite store is written from one host
    interrupt_stops_jobs = True  # launch --wait's Ctrl-C: a laptop's runs stop with it (resumable)
    auto_rank = 1000  # the fallback: always available

    def available(self) -> bool:
        return True

    def default_profile(self) -> Profile:
        return LOCAL

    def submit(self, array: JobArray) -> list[Attempt]:
        """Queue the jobs for the store's queue process (started if none is live), which starts at
        most ``array.max_parallel`` of them at a time (default 1)."""
        store = array.store
        parallel = array.max_parallel or 1
        (store.folder / LOGS).mkdir(parents=True, exist_ok=True)
        queued = array.folder / QUEUED
        queued.mkdir(parents=True, exist_ok=True)
        stamp = now().replace(":", "")
        attempts = []
        for i, (call, name) in enumerate(zip(array.calls, array.names)):
            item = queued / f"{stamp}-{os.getpid()}-{i}-{re.sub(r'[^A-Za-z0-9_.-]+', '_', name)}.pkl"
            item.write_bytes(pickle.dumps((name, call)))
            attempts.append(Attempt(executor=self.name, submitted=now(), code_dir=array.code_dir,
                                    folder=str(array.folder), state="queued", queue_item=str(item),
                                    gate=array.gate(i)))
        env = dict(os.environ)
        env["PYTHONPATH"] = os.pathsep.join(p for p in (array.code_dir, env.get("PYTHONPATH")) if p)
        env.setdefault("OMP_NUM_THREADS", str(max(1, cpu_count() // parallel)))  # no oversubscription
        with store.locked():  # the queue waits on this lock until its attempts are recorded
            live = self._live_queue(store)
            if live is None:  # one queue per record: max_parallel holds across submissions
                with open(store.folder / LOGS / f"queue-{stamp}.log", "ab") as log:
                    proc = subprocess.Popen(  # noqa: S603 (fixed argv, no shell)
                        [sys.executable, "-m", "diffsweep.launch.jobs.local_queue", *store.spec(), str(parallel)],
                        stdin=subprocess.DEVNULL, stdout=log, stderr=subprocess.STDOUT, env=env,
                        start_new_session=True)  # in this directory, as sbatch runs jobs
                live = proc.pid, proc_start(proc.pid)
            for a in attempts:
                a.queue_pid, a.queue_start = live
            array.record(list(enumerate(attempts)))
        return attempts

    def _live_queue(self, store: AttemptStore) -> tuple[int, int | None] | None:
        """(pid, start time) of the store's queue if one runs and has not decided to exit."""
        record = store.read()
        for a in store.latest(record) if record is not None else []:
            if (a.executor == self.name and a.queue_pid is not None and pid_alive(a.queue_pid, a.queue_start)
                    and not closed_marker(store, a.queue_pid).exists()):
                return a.queue_pid, a.queue_start
        return None

    def states(self, attempts: list[Attempt]) -> dict[str, str]:
        return {a.job_id: "RUNNING" if pid_alive(int(a.job_id), a.job_start) else "EXITED"
                for a in attempts if a.job_id is not None}

    def cancel(self, attempts: list[Attempt]) -> tuple[dict[str, str], str]:
        for a in attempts:
            if a.job_id is not None and pid_alive(int(a.job_id), a.job_start):
                # submitit's local controller forwards SIGTERM: the trainer saves and stops (the
                # start time tells the job from a later process that got its pid)
                os.kill(int(a.job_id), signal.SIGTERM)
        return {}, ""


def cpu_count() -> int:
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:  # not Linux
        return os.cpu_count() or 1
