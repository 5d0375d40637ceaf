"""The scheduler interface and its registry: everything the launcher needs to know about where jobs
run (Slurm, this machine, or a scheduler a package adds) lives in one ``Scheduler`` subclass,
registered once under its name. Code elsewhere asks the scheduler of a profile or of a ledger
attempt (``get_scheduler(profile.executor)``) and never branches on the name.

Registration: the built-in schedulers are listed in ``BUILTIN``; ``register`` adds one at run
time (tests, a site's own ``sitecustomize``); a package adds one through the entry point group
``diffsweep.schedulers`` (``name = "package.module:Class"``). Implementations are imported when
first asked for, so naming a scheduler costs nothing at start-up (``diffsweep --help`` imports no
submitit).

See docs/extending.md for how to write one.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, ClassVar

from diffsweep.config import ConfigError
from diffsweep.config.registry import Registry
from diffsweep.launch.jobs.attempt import Attempt, AttemptStore

if TYPE_CHECKING:  # only for annotations (none of them imports this module)
    from diffsweep.launch.plan import SweepPlan
    from diffsweep.launch.profiles import Profile
    from diffsweep.launch.resources import Resources

ENTRY_POINT_GROUP = "diffsweep.schedulers"
# In this order: error messages list them so, and the automatic choice tries them so (by auto_rank).
BUILTIN: dict[str, str] = {
    "slurm": "diffsweep.launch.jobs.slurm_scheduler:SlurmScheduler",
    "local": "diffsweep.launch.jobs.local_scheduler:LocalScheduler",
}


def _quiet(line: str) -> None:
    return None


@dataclass
class JobArray:
    """What ``Scheduler.submit`` gets: jobs of one resource class to run as one job array (a sweep's
    runs of one class, a launched prepare's tasks), each a submitit-picklable callable."""

    calls: Sequence[Callable[[], Any]]
    names: list[str]  # each job's, for messages and logs (a run's name, "task 3")
    resources: Resources  # what each job asks for
    profile: Profile
    folder: Path  # submitit's folders go under it, one per job (``<folder>/<job id>``)
    job_name: str
    code_dir: str  # the launch's code snapshot: jobs put it first on PYTHONPATH
    store: AttemptStore
    # Adds (index into ``calls``, attempt) pairs to the store's record; the scheduler calls it
    # holding ``store.locked()`` as soon as it has the jobs, so a failure later cannot lose them.
    record: Callable[[list[tuple[int, Attempt]]], None]
    max_parallel: int | None = None  # jobs executing at once (None: the scheduler's default)
    noun: str = "jobs"  # what messages call them: "submitted 4 runs as Slurm array 17"
    echo: Callable[[str], None] = _quiet
    # Each job's gate: a path (a parent run's checkpoint) it must not start before; jobs with gates
    # are submitted held and released by ``release`` once it exists (none: every job may start).
    gates: Sequence[str | None] = ()

    def gate(self, index: int) -> str | None:
        return self.gates[index] if self.gates else None


class Scheduler(ABC):
    """Where jobs run: one subclass per scheduler, registered under ``name``.

    Job states are reported in Slurm's words (``PENDING``, ``RUNNING``, ``COMPLETED``,
    ``FAILED``, ``CANCELLED``, ``TIMEOUT``, ... ; ``diffsweep.launch.state``): a scheduler maps
    its own states onto them. A waiting job's state may carry why: ``PENDING (Resources)``.
    """

    name: ClassVar[str]  # as profiles (``executor:``), ``--executor`` and the ledger name it
    label: ClassVar[str]  # how messages name it: "launched 4 runs on Slurm", "... on the local queue"
    runs_jobs: ClassVar[str]  # where jobs run, as messages say it: "on this machine"
    # Jobs get what their resources say reserved (GPUs, memory per node, a time limit). False:
    # a process on this machine that takes what it finds (no GPUs estimated, no memory asked for).
    reserves_resources: ClassVar[bool] = True
    # Jobs get USR2 ``signal_delay_s`` before their time limit (the profile's timing is checked).
    time_limit_signal: ClassVar[bool] = True
    # ``--executor NAME`` may replace a sweep's declared profile of another scheduler by this
    # one's default profile (local: a sweep written for a cluster can be tried on this machine).
    replaces_declared_profile: ClassVar[bool] = False
    # Jobs run on other machines than the one launching, many at once: a tracking store they all
    # write must be safe from many nodes (``launch`` warns about an SQLite file on a network file
    # system). False: jobs run on this machine.
    jobs_on_other_hosts: ClassVar[bool] = True
    # Ctrl-C of ``launch --wait`` stops its jobs (``cancel``: they save a checkpoint; launching
    # again resumes them): processes of this machine, which end with the command that waits for
    # them. False: jobs outlive the launcher (as without --wait), and Ctrl-C only stops waiting.
    interrupt_stops_jobs: ClassVar[bool] = False
    # The automatic choice (no --profile, no --executor, no launch.profile) takes the available
    # scheduler of lowest rank.
    auto_rank: ClassVar[int] = 100

    def available(self) -> bool:
        """Whether this scheduler answers here (for the automatic choice; cheap, no errors)."""
        return False

    @abstractmethod
    def default_profile(self) -> Profile:
        """The profile used when the user names this scheduler but no profile."""

    def doctor_checks(self) -> Callable[..., None] | None:
        """The cluster checks ``diffsweep doctor`` runs on a profile of this scheduler, as a function
        ``(profile, work, add, *, preempt, timeout_s)`` that calls ``add(Check)`` for each and stops
        where later ones cannot run (see ``diffsweep.launch.doctor.slurm.slurm_suite``); None: no
        cluster to check (doctor checks the run directory and the store only)."""
        return None

    def parameter_names(self) -> frozenset[str] | None:
        """The keys a profile's ``executor_params:`` mapping and ``--slurm KEY=VALUE`` may set (the
        parameters its submitit executor takes); None: it takes no job settings (nor ``--setup``)."""
        return None

    def check_plan(self, plan: SweepPlan) -> None:
        """What ``diffsweep plan`` checks with the scheduler (cheap; a profile of another cluster
        is planned, not checked)."""
        return None  # nothing to check, unless the scheduler says otherwise

    def check_launch(self, plan: SweepPlan) -> None:
        """Everything ``launch`` checks with the scheduler before writing or submitting anything."""
        return None

    def parameters(self, resources: Resources, profile: Profile, *, job_name: str, code_dir: str,
                   max_parallel: int | None) -> dict[str, Any]:
        """The submitit executor parameters of one resource class (pure; golden-tested)."""
        return {}

    @abstractmethod
    def submit(self, array: JobArray) -> list[Attempt]:
        """Submit ``array.calls``; returns each one's attempt (``executor`` is ``self.name``), in
        order, recorded with ``array.record`` (holding ``array.store.locked()``) as soon as the
        scheduler has it."""

    @abstractmethod
    def states(self, attempts: list[Attempt]) -> dict[str, str]:
        """The scheduler's state of each attempt's job, by job id (attempts have a job id). Leave
        out ids it does not know; raise ``EnvironmentUnavailable`` if it cannot be asked."""

    @abstractmethod
    def cancel(self, attempts: list[Attempt]) -> tuple[dict[str, str], str]:
        """Stop the attempts' jobs (they save a checkpoint first). Returns the jobs still pending or
        running afterwards, by id with their states, and an error saying why ("" if none are)."""

    def release(self, attempts: list[Attempt]) -> str:
        """Let the held jobs of ``attempts`` start (their gates exist now). Returns what went wrong
        ("" if nothing). Default: nothing to do (a scheduler whose queue waits for gates itself)."""
        return ""

    def check_tasks(self, profile: Profile) -> None:
        """What ``data prepare --launch`` checks with the scheduler before anything is written
        (cheap): its CPU-only tasks run on ``profile``."""
        return None

    def log_files(self, attempt: Attempt) -> list[Path]:
        """The attempt's stdout and stderr files that exist (none before its job has started)."""
        paths = [attempt.stdout, attempt.stderr]
        if paths == [None, None] and attempt.job_id is not None:  # not recorded: where submitit writes them
            from submitit.core.utils import JobPaths

            job = JobPaths(attempt.folder, job_id=attempt.job_id)
            paths = [str(job.stdout), str(job.stderr)]
        return [Path(p) for p in paths if p and Path(p).is_file()]


SCHEDULERS: Registry[Scheduler] = Registry("scheduler", ENTRY_POINT_GROUP, Scheduler, BUILTIN, key="executor")


def register(name: str, scheduler: str | type[Scheduler]) -> None:
    """Register ``scheduler`` (a ``Scheduler`` subclass, or ``"module:Class"`` to import when first
    used) under ``name``, which no other scheduler may have."""
    SCHEDULERS.register(name, scheduler)


def scheduler_names() -> list[str]:
    """Every scheduler's name: built-in and registered ones, then those packages add."""
    return SCHEDULERS.names()


def get_scheduler(name: str, key: str = "executor") -> Scheduler:
    """The scheduler registered as ``name``; an unknown name is a ``ConfigError`` on ``key``
    listing the known ones."""
    return SCHEDULERS.get(name, key)


def detect_scheduler() -> Scheduler:
    """The scheduler the automatic choice takes: the available one of lowest ``auto_rank``."""
    candidates = sorted((get_scheduler(n) for n in scheduler_names()), key=lambda s: s.auto_rank)
    for scheduler in candidates:
        if scheduler.available():
            return scheduler
    raise ConfigError("executor", f"no scheduler is available here; expected one of [{', '.join(scheduler_names())}]")


# -- asking the schedulers about attempts: sweeps (the ledger), data prepare --launch (launch.json) -----


def attempt_states(attempts: Iterable[Attempt], key: Callable[[Attempt], str]) -> dict[tuple[str, str], str]:
    """The job state of each attempt that has a job id, by (scheduler name, job id), each scheduler
    asked once for its attempts (a record may hold local and Slurm attempts). A job its scheduler
    does not know is left out; ``key(attempt)`` names where an unknown scheduler name was read."""
    out: dict[tuple[str, str], str] = {}
    for name, group in _by_scheduler(a for a in attempts if a.job_id is not None).items():
        out |= {(name, job_id): state for job_id, state in get_scheduler(name, key(group[0])).states(group).items()}
    return out


def cancel_attempts(attempts: Iterable[Attempt]) -> list[str]:
    """Stop the attempts' jobs, each through its scheduler (they save a checkpoint first); those no
    longer pending or running afterwards are marked ``cancelled`` (also when a later scheduler
    fails). Returns what went wrong, one line per scheduler that left jobs running."""
    errors = []
    for name, group in _by_scheduler(attempts).items():
        running = {a.job_id for a in group}  # until the scheduler says otherwise
        why = ""
        try:
            still, why = get_scheduler(name).cancel(group)
            running = set(still)
        finally:
            for a in group:
                if a.job_id not in running:
                    a.state = "cancelled"
        if why:
            errors.append(why)
    return errors


def _by_scheduler(attempts: Iterable[Attempt]) -> dict[str, list[Attempt]]:
    groups: dict[str, list[Attempt]] = {}
    for a in attempts:
        groups.setdefault(a.executor, []).append(a)
    return groups
