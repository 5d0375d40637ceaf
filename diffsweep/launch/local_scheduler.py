"""This machine: a detached queue process (``diffsweep.launch.local_queue``) starts the runs through
submitit's ``LocalExecutor``, at most ``max_parallel`` at a time, so ``launch`` returns at once
here too. A later launch of the same sweep hands its runs to a live queue, so the limit holds for
the sweep.

A local job's id is the pid of submitit's controller process; the ledger also keeps the process's
start time, because pids are reused. States and cancelling use that pid: submitit's
``LocalJob`` can only tell the state of, and cancel, a job whose ``Popen`` it holds, and that
object lives in the queue process, not in ``status`` or ``cancel``.
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

from diffsweep.launch.ledger import Attempt, locked, now, read_ledger
from diffsweep.launch.plan import PlanRow
from diffsweep.launch.profiles import LOCAL, Profile
from diffsweep.launch.scheduler import Scheduler, Submission, TaskArray
from diffsweep.lockfile import pid_alive, proc_start

LOCAL_TIMEOUT_MIN = 7 * 24 * 60  # the local executor has no real time limit


def closed_marker(out: Path, pid: int) -> Path:
    """Written (under the ledger lock) when a queue has decided to exit: launch must not hand it runs."""
    return out / f".queue-{pid}.closed"


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

    def submit(self, submission: Submission) -> list[tuple[PlanRow, Attempt]]:
        plan = submission.plan
        parallel = submission.max_parallel or plan.spec.launch.max_parallel or 1
        logs = plan.out / "logs"
        logs.mkdir(parents=True, exist_ok=True)
        env = dict(os.environ)
        env["PYTHONPATH"] = submission.code_dir + (os.pathsep + env["PYTHONPATH"] if env.get("PYTHONPATH") else "")
        env.setdefault("OMP_NUM_THREADS", str(max(1, cpu_count() // parallel)))  # no oversubscription
        attempts = [(r, Attempt(executor=self.name, submitted=now(), code_dir=submission.code_dir,
                                folder=str(plan.out / "jobs"), state="queued")) for r in submission.runs]
        with locked(plan.out):  # the queue waits on this lock until its attempts are in the ledger
            live = _live_queue(plan.out)
            if live is None:  # one queue per sweep: --max-parallel holds across launches
                with open(logs / f"queue-{now().replace(':', '')}.log", "ab") as log:
                    proc = subprocess.Popen(  # noqa: S603 (fixed argv, no shell)
                        [sys.executable, "-m", "diffsweep.launch.local_queue", str(plan.out), str(parallel)],
                        stdin=subprocess.DEVNULL, stdout=log, stderr=subprocess.STDOUT, env=env,
                        start_new_session=True, cwd=plan.out)
                live = proc.pid, proc_start(proc.pid)
            for _, a in attempts:
                a.queue_pid, a.queue_start = live
            submission.record(attempts, lock=False)
        return attempts

    def submit_tasks(self, array: TaskArray) -> list[Attempt]:
        """Start every task at once, each a process (through submitit's local executor) that
        outlives this one; nothing limits them but their number (``--tasks``)."""
        import submitit

        executor = submitit.LocalExecutor(folder=array.folder / "%j", max_num_timeout=array.profile.max_num_timeout)
        executor.update_parameters(timeout_min=LOCAL_TIMEOUT_MIN)
        env = {"PYTHONPATH": os.pathsep.join(p for p in (array.code_dir, os.environ.get("PYTHONPATH")) if p),
               "OMP_NUM_THREADS": str(array.resources.cpus_per_task)}
        array.folder.mkdir(parents=True, exist_ok=True)
        # The tasks' controllers inherit this process's environment and standard streams: they get
        # the snapshot's PYTHONPATH, and a log file instead of the caller's terminal or pipe (a
        # pipe kept open by them would hold up whoever reads this command's output).
        with _environ(env), _stdio_to(array.folder / "local-controllers.log"):
            with executor.batch():
                handles = [executor.submit(call) for call in array.calls]
        return [Attempt(executor=self.name, submitted=now(), code_dir=array.code_dir, folder=str(job.paths.folder),
                        job_id=job.job_id, job_start=proc_start(int(job.job_id)), stdout=str(job.paths.stdout),
                        stderr=str(job.paths.stderr)) for job in handles]

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


@contextlib.contextmanager
def _environ(values: dict[str, str]) -> Iterator[None]:
    saved = {k: os.environ.get(k) for k in values}
    os.environ.update(values)
    try:
        yield
    finally:
        for k, v in saved.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v


@contextlib.contextmanager
def _stdio_to(log: Path) -> Iterator[None]:
    """File descriptors 1 and 2 point at ``log`` for the block (for the processes started in it)."""
    sys.stdout.flush()
    sys.stderr.flush()
    saved = [os.dup(1), os.dup(2)]
    try:
        with open(log, "ab") as f:
            os.dup2(f.fileno(), 1)
            os.dup2(f.fileno(), 2)
        yield
    finally:
        for fd, copy in zip((1, 2), saved):
            os.dup2(copy, fd)
            os.close(copy)


def _live_queue(out: Path) -> tuple[int, int | None] | None:
    """(pid, start time) of this sweep's local queue if one runs and has not decided to exit."""
    ledger = read_ledger(out)
    for entry in (ledger.entries.values() if ledger else []):
        a = entry.latest
        if (a is not None and a.executor == LocalScheduler.name and a.queue_pid is not None
                and pid_alive(a.queue_pid, a.queue_start) and not closed_marker(out, a.queue_pid).exists()):
            return a.queue_pid, a.queue_start
    return None


def cpu_count() -> int:
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:  # not Linux
        return os.cpu_count() or 1
