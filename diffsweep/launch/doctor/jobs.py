"""What a doctor check is (``Check``) and how the doctor's jobs are made and submitted, for
``diffsweep.launch.doctor.checks`` and its preemption check (``preempt``): every job goes through
``submit``, so that an interrupted doctor cancels those Slurm still holds (``cancel_submitted``)."""

from __future__ import annotations

import signal
import subprocess
import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from diffsweep import slurm
from diffsweep.launch.profiles import Profile
from diffsweep.launch.resources import Resources, slurm_parameters

JOB_TIME_MIN = 15  # doctor's jobs' time limit (they take seconds)


@dataclass(frozen=True)
class Check:
    """One line of the doctor's report: ``name``, whether it passed, what was found, and the fix."""

    name: str
    ok: bool
    line: str
    fix: str = ""

    def render(self) -> str:
        mark = "✓" if self.ok else "✗"
        return f"{mark} {self.name}: {self.line}" + (f"\n    fix: {self.fix}" if not self.ok and self.fix else "")


# The ids of the Slurm jobs this doctor run submitted (``submit``): cancelled if it is interrupted.
_submitted: list[str] = []


def forget_submitted() -> None:
    """Start a doctor run: no job of it submitted yet."""
    _submitted.clear()


def submit(executor: Any, fn: Callable[..., Any], *args: Any) -> Any:
    """``executor.submit(fn, *args)``, its job id kept for ``cancel_submitted``. Ctrl-C waits until
    the id is kept: one arriving after sbatch submitted the job but before its id was kept left the
    job running, unnamed and uncancelled."""
    with _ctrl_c_held():
        job = executor.submit(fn, *args)
        _submitted.append(job.job_id)
    return job


@contextmanager
def _ctrl_c_held() -> Iterator[None]:
    """Hold SIGINT for the block, then act on one that came. Blocked in this thread, so that the
    children it starts (sbatch) inherit the mask; and caught by a handler that only notes it, since
    the kernel hands a signal this thread blocks to any other thread of the process, and Python then
    runs the handler in the main thread all the same."""
    main = threading.current_thread() is threading.main_thread()
    came: list[int] = []
    previous = signal.signal(signal.SIGINT, lambda signum, frame: came.append(signum)) if main else None
    blocked = signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGINT})
    try:
        yield
    finally:
        signal.pthread_sigmask(signal.SIG_SETMASK, blocked)
        if main:
            signal.signal(signal.SIGINT, previous)  # runs a pending handler first: the note above
            if came and callable(previous):
                previous(signal.SIGINT, None)  # Python's default raises KeyboardInterrupt here
            elif came and previous == signal.SIG_DFL:
                signal.raise_signal(signal.SIGINT)


def cancel_submitted() -> tuple[list[str], str]:
    """Cancel the jobs this doctor run submitted that Slurm still holds (all of them if Slurm does
    not answer): their ids, and what went wrong, if anything."""
    from diffsweep.config import EnvironmentUnavailable

    ids = list(dict.fromkeys(_submitted))
    try:
        states = slurm.states(ids)
        ids = [j for j in ids if j not in states or slurm.word(states[j]) in slurm.LIVE]
    except EnvironmentUnavailable:
        pass  # cancelling an ended job is harmless
    if not ids:
        return [], ""
    try:
        still, said = slurm.cancel(ids)
    except (OSError, subprocess.SubprocessError, EnvironmentUnavailable) as exc:
        return ids, f"scancel failed ({exc})"
    if still:
        jobs = ", ".join(f"{j} ({state})" for j, state in sorted(still.items()))
        return ids, f"scancel did not stop job(s) {jobs} ({said})"
    return ids, ""


def code_root() -> str:
    """The directory holding the ``diffsweep`` package this process runs (jobs import the same)."""
    import diffsweep

    return str(Path(diffsweep.__file__).resolve().parents[1])


def doctor_resources(profile: Profile, tasks: int, gpus: int) -> Resources:
    """A small job: ``tasks`` tasks of one CPU, ``gpus`` GPUs, the profile's CPU-job memory."""
    return Resources(nodes=1, gpus_per_node=gpus, tasks_per_node=tasks, cpus_per_task=1,
                     mem_gb=profile.cpu_jobs.mem_gb, time_min=min(JOB_TIME_MIN, profile.max_time_minutes))


def doctor_executor(profile: Profile, folder: Path, resources: Resources, name: str) -> Any:
    """submitit's Slurm executor with the parameters a launch would give such a job."""
    import submitit

    executor = submitit.SlurmExecutor(folder=folder / "%j", max_num_timeout=profile.max_num_timeout)
    executor.update_parameters(**slurm_parameters(resources, profile, job_name=name, code_dir=code_root(),
                                                  max_parallel=None))
    return executor
