"""``diffsweep doctor``: a self-test of the cluster and the configuration a launch would use.

Each check is one function returning a ``Check`` (ok, what it found, and on failure the fix);
``run_doctor`` runs them in order and stops where later checks cannot run (no controller, no
partition). The checks of a cluster come from its scheduler (``Scheduler.doctor_checks``: Slurm's are
``diffsweep.launch.doctor.slurm``); a scheduler without any (``local``: jobs run on this machine)
gets the run directory and store checks, from here.

Doctor's jobs write under ``<out>/.doctor/<stamp>/`` (removed when every check passes) and its
MLflow runs go to the experiment ``diffsweep-doctor`` (deleted once read back). Every job it
submits goes through ``submit``; interrupted (Ctrl-C), ``run_doctor`` cancels those Slurm still
holds and raises ``DoctorInterrupted`` naming them.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import time
from collections.abc import Callable, Iterator
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from diffsweep.config import ConfigError
from diffsweep.launch.doctor.jobs import (
    Check,
    cancel_submitted,
    forget_submitted,
)
from diffsweep.launch.profiles import Profile


@dataclass
class DoctorReport:
    """Every check that ran, in order; ``workdir``: where the jobs' files are (kept on failure)."""

    profile: str
    executor: str
    checks: list[Check] = field(default_factory=list)
    workdir: str | None = None

    @property
    def ok(self) -> bool:
        return bool(self.checks) and all(c.ok for c in self.checks)

    def to_dict(self) -> dict[str, Any]:
        return {"profile": self.profile, "executor": self.executor, "ok": self.ok, "workdir": self.workdir,
                "checks": [asdict(c) for c in self.checks]}


class DoctorInterrupted(KeyboardInterrupt):
    """Ctrl-C during ``run_doctor``, raised once the jobs it had submitted are cancelled:
    ``cancelled``, those Slurm still held; ``problem``, what went wrong cancelling them, if anything."""

    def __init__(self, cancelled: list[str], problem: str = "") -> None:
        super().__init__(cancelled, problem)
        self.cancelled = cancelled
        self.problem = problem


@contextlib.contextmanager
def _sigint_ignored() -> Iterator[None]:
    """A second Ctrl-C neither stops this block nor the commands it runs (they inherit SIG_IGN)."""
    try:
        previous = signal.signal(signal.SIGINT, signal.SIG_IGN)
    except ValueError:  # not the main thread, where Ctrl-C does not arrive anyway
        yield
        return
    try:
        yield
    finally:
        signal.signal(signal.SIGINT, previous if previous is not None else signal.SIG_DFL)


def doctor_profile(profile: str | None, executor: str | None, slurm_overrides: list[str],
                   setup_lines: list[str]) -> Profile:
    """The profile doctor checks: ``--profile``, else ``--executor``'s default one, else the scheduler
    that answers here if it has cluster checks (Slurm), else Slurm's default profile (whose first
    check then says that no controller answers, and how to fix it); with ``--slurm`` and
    ``--setup`` applied as ``launch`` applies them."""
    from diffsweep.launch.profile_choice import pick_profile, with_overrides
    from diffsweep.launch.profiles import FILE_EXECUTOR
    from diffsweep.launch.scheduler import detect_scheduler, get_scheduler

    if profile is None and executor is None:
        found = detect_scheduler()
        chosen = (found if found.doctor_checks() is not None else get_scheduler(FILE_EXECUTOR)).default_profile()
    else:
        chosen = pick_profile(profile, executor)
    return with_overrides(chosen, slurm_overrides, setup_lines)


def run_doctor(profile: Profile, out: Path, *, preempt: bool = False, timeout_s: float = 120.0,
               echo: Callable[[Check], None] = lambda c: None) -> DoctorReport:
    """Run the checks of ``profile`` (``echo`` gets each as it completes). ``out``: the runs
    directory whose file system is checked (doctor's files go under ``out/.doctor``). On Ctrl-C,
    the jobs it submitted are cancelled and ``DoctorInterrupted`` raised (its files are kept)."""
    check_doctor_options(out, timeout_s)
    report = DoctorReport(profile=profile.name, executor=profile.executor)

    def add(check: Check) -> bool:
        report.checks.append(check)
        echo(check)
        return check.ok

    from diffsweep.launch.scheduler import get_scheduler

    suite = get_scheduler(profile.executor).doctor_checks()
    created = [p for p in (out.absolute(), *out.absolute().parents) if not p.exists()]  # deepest first
    work = _workdir(out, add)
    if work is None:
        return report
    report.workdir = str(work)
    if suite is None:  # e.g. local: jobs run on this machine, as this process does
        where = get_scheduler(profile.executor).runs_jobs
        add(Check("jobs", True, f"executor {profile.executor} runs jobs {where}: doctor has no checks of its jobs"))
        add(check_store_here())
    else:
        forget_submitted()
        try:
            suite(profile, work, add, preempt=preempt, timeout_s=timeout_s)
        except KeyboardInterrupt:
            with _sigint_ignored():
                cancelled, problem = cancel_submitted()
                if not any(work.iterdir()):  # else kept, as on failure
                    _remove_workdir(work, created)
            raise DoctorInterrupted(cancelled, problem) from None
    if report.ok or not any(work.iterdir()):  # kept when a job's logs may say why it failed
        _remove_workdir(work, created)
        report.workdir = None
    return report


def _remove_workdir(work: Path, created: list[Path]) -> None:
    """Remove doctor's own folder, then ``.doctor`` and the folders doctor made above it (``created``,
    deepest first) while they are empty: a passing doctor leaves the runs directory as it found it."""
    shutil.rmtree(work, ignore_errors=True)
    for folder in [work.parent, *created]:
        try:
            folder.rmdir()  # .doctor, unless another doctor run is using it
        except FileNotFoundError:
            continue
        except OSError:
            return


def check_doctor_options(out: Path, timeout_s: float) -> None:
    """``--out`` a folder (or a path where one can be made: no file on the way) and ``--timeout`` a
    finite number of seconds >= 1 (``not (x >= 1)`` also refuses NaN), before anything is created."""
    if not (1.0 <= timeout_s < float("inf")):
        raise ConfigError("timeout_s", f"expected a finite number of seconds >= 1, got {timeout_s}")
    blocking = next((p for p in (out.absolute(), *out.absolute().parents) if p.exists()), None)
    if blocking is not None and not blocking.is_dir():
        where = "is not a directory" if blocking == out.absolute() else f"lies under {blocking}, which is not one"
        raise ConfigError("out", f"{out} {where}; expected a runs directory")


# --- the store and the run directory, from here -----------------------------------------------------


def check_store_here() -> Check:
    """The MLflow store a launch would use is usable from this machine."""
    from diffsweep.tracking.store import check_tracking, shown, tracking_uri

    uri = tracking_uri()
    try:
        check_tracking(uri)
    except ConfigError as exc:
        return Check("mlflow", False, f"{shown(uri)}: {exc.message}",
                     "set MLFLOW_TRACKING_URI to a store every node reaches (sqlite:///<shared dir>/mlflow.db, "
                     "or an MLflow server's http(s):// address)")
    return Check("mlflow", True, f"{shown(uri)} is usable from this machine")


def _workdir(out: Path, add: Callable[[Check], bool]) -> Path | None:
    work = out.absolute() / ".doctor" / f"{time.strftime('%Y%m%d-%H%M%S')}-{os.getpid()}"
    try:
        work.mkdir(parents=True)
        probe = work / "write.test"
        probe.write_text("ok")
        probe.unlink()
    except OSError as exc:
        add(Check("run directory", False, f"cannot write under {out.absolute()} ({exc.strerror or exc})",
                  "pass --out DIR with a writable directory (on a file system every node shares)"))
        return None
    return work


