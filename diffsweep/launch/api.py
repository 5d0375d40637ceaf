"""The sweep commands as library functions over a sweep parsed once.

``plan_sweep``, ``sweep_status``, ``reconcile_sweep``, ``launch_sweep``, ``cancel_sweep``,
``watch_sweep`` and ``stop_sweep`` (Ctrl-C of ``launch --wait``) take a ``SweepTarget`` (the
parsed sweep and where it runs) and return typed reports; ``run_logs`` finds one launched run's logs. ``diffsweep plan | launch | status | cancel |
reconcile | logs`` parse the command line, call one of them and render the report. Errors name the argument at fault (``executor``, ``out``,
``only``, ``budget``); the CLI shows them as its flags.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

from diffsweep.config import ConfigError
from diffsweep.launch.ledger import Attempt, Entry, locked, read_ledger, write_ledger
from diffsweep.launch.plan import PlanRow, SweepPlan
from diffsweep.launch.planning import make_plan, output_dir
from diffsweep.launch.profile_choice import choose_profile, with_overrides
from diffsweep.launch.progress import Snapshot, snapshot
from diffsweep.launch.run_state import ACTIVE_STATES, PENDING, RUNNING
from diffsweep.launch.scheduler import get_scheduler
from diffsweep.launch.state import reconcile as mark_ended
from diffsweep.launch.state import scheduler_states
from diffsweep.launch.submit import Selection, check_launch, launch_lock, select
from diffsweep.launch.submit import launch as submit
from diffsweep.sweep import SweepSpec, load_sweep
from diffsweep.sweep.audit import DEFAULT_THRESHOLD, Audit, audit_runs

WATCH_POLL_S = 2.0  # watch_sweep: how often it looks at the sweep
STOP_WAIT_S = 60.0  # stop_sweep: how long it waits for the stopped runs to save a checkpoint and exit


@dataclass(frozen=True)
class SweepTarget:
    """A sweep, parsed once per command, and the command line's choices about where it runs.

    ``out``: the sweep output directory (default: the sweep's ``launch.output``, else
    ``runs/<name>`` beside the sweep file); ``profile``/``executor``: the cluster profile or
    scheduler (default: the sweep's, else automatic); ``only``: a regex selecting runs by name or
    key; ``slurm_overrides``/``setup_lines``: the profile's ``KEY=VALUE`` overrides and extra setup lines."""

    spec: SweepSpec
    out: Path | None = None
    profile: str | None = None
    executor: str | None = None
    only: str | None = None
    slurm_overrides: tuple[str, ...] = ()
    setup_lines: tuple[str, ...] = ()

    @classmethod
    def load(cls, sweep: Path, profile: str | None = None, executor: str | None = None, only: str | None = None,
             out: Path | None = None, slurm: Sequence[str] | None = None, setup: Sequence[str] | None = None,
             sets: Sequence[str] | None = None) -> SweepTarget:
        """The sweep file ``sweep`` (``sets``: its --set overrides), parsed once for the whole command,
        and the command line's choices."""
        return cls(spec=load_sweep(sweep, sets or ()), out=out, profile=profile, executor=executor, only=only,
                   slurm_overrides=tuple(slurm or ()), setup_lines=tuple(setup or ()))

    def output_dir(self) -> Path:
        """The sweep output directory (ledger, run directories, logs), absolute."""
        return output_dir(self.spec, self.out)


@dataclass(frozen=True)
class Reconciled:
    """A run whose job ended without reporting, now marked in MLflow."""

    name: str
    key: str
    job_id: str | None
    scheduler_state: str  # the scheduler's word for how the job ended (NODE_FAIL, OUT_OF_MEMORY, ...)
    mlflow_status: str  # FAILED or KILLED

    def to_dict(self) -> dict[str, str]:
        return {"name": self.name, "key": self.key, "scheduler_state": self.scheduler_state,
                "mlflow_status": self.mlflow_status}


@dataclass(frozen=True)
class StatusReport:
    """``sweep_status``: each run's state (the plan), after reconciling jobs that died unreported."""

    plan: SweepPlan
    reconciled: list[Reconciled]


@dataclass
class LaunchReport:
    """``launch_sweep``: what was selected (``selection.submit``; ``selection.skip`` with why) and,
    unless a dry run or nothing needed it, what was submitted (run, ledger attempt)."""

    plan: SweepPlan
    selection: Selection
    reconciled: list[Reconciled]
    dry_run: bool
    where: str  # the scheduler as messages name it ("Slurm", "the local queue")
    submitted: list[tuple[PlanRow, Attempt]] = field(default_factory=list)
    audit: Audit | None = None  # the matched-arm audit of the planned runs

    @property
    def gpu_hours(self) -> float:
        """The selected runs' estimated GPU-hours."""
        return sum(r.estimate.gpu_hours for r in self.selection.submit)


@dataclass(frozen=True)
class StopReport:
    """``stop_sweep``: the runs it stopped, by what they were doing (``running``: each saves a
    checkpoint first; ``queued``: never started), and those still stopping when it gave up waiting."""

    running: list[str]
    queued: list[str]
    stopping: list[str]


@dataclass(frozen=True)
class CancelReport:
    """``cancel_sweep``: the names of the runs told to stop."""

    plan: SweepPlan
    cancelled: list[str]


def plan_sweep(target: SweepTarget, *, check: bool = False) -> SweepPlan:
    """Expand, estimate and read the state of every run (submits nothing). ``check``: also what
    ``diffsweep plan`` checks with the scheduler (a profile of another cluster is planned only)."""
    chosen = choose_profile(target.spec, target.profile, target.executor)
    chosen = with_overrides(chosen, list(target.slurm_overrides), list(target.setup_lines))
    plan = make_plan(target.spec, chosen, target.output_dir(), only=target.only)
    check_eval(plan)
    if check:
        get_scheduler(plan.profile.executor).check_plan(plan)
    return plan


def check_eval(plan: SweepPlan) -> None:
    """The sweep's ``eval:`` probes and settings, checked against every planned run's config (a
    ``ConfigError`` naming the sweep file's key: nothing is launched with a probe that cannot run)."""
    spec = plan.spec
    if not spec.eval.probes:
        return
    from diffsweep.eval.probe import sweep_requests

    requests = sweep_requests(list(spec.eval.probes), spec.eval.settings, str(spec.path))
    for row in plan.runs:
        for probe, settings in requests:
            try:
                probe.check(settings, row.run.config)
            except ConfigError as exc:
                raise ConfigError(f"{spec.path}: eval.settings.{exc.key}", f"{exc.message} (run {row.run.name})") \
                    from None


def audit_plan(plan: SweepPlan, threshold: float = DEFAULT_THRESHOLD) -> Audit:
    """The matched-arm audit (``diffsweep.sweep.audit``) of the plan's runs: each kind's runs
    against the baseline's of the same size and other axes."""
    check_threshold(threshold)
    return audit_runs([r.run for r in plan.runs], threshold, tuned=tuple(plan.spec.tune))


def check_threshold(threshold: float) -> None:
    """The arm audit's threshold (``audit_threshold``): a relative difference in [0, 0.99]
    (``not (a <= x <= b)`` also refuses NaN)."""
    if not (0.0 <= threshold <= 0.99):
        raise ConfigError("audit_threshold", f"expected a relative difference in [0, 0.99], got {threshold}")


def check_launch_options(*, budget: float | None = None, max_parallel: int | None = None,
                         retries: int | None = None, audit_threshold: float = DEFAULT_THRESHOLD) -> None:
    """The numbers a launch (or plan) is given, checked before anything is read, locked or created:
    ``budget`` a finite number of GPU-hours >= 0 (NaN compares false with everything, so a bound
    is written ``not (x >= 0)``), ``max_parallel`` at least 1, ``retries`` at least 0."""
    if budget is not None and not (0.0 <= budget < float("inf")):
        raise ConfigError("budget", f"expected a finite number of GPU-hours >= 0, got {budget}")
    if max_parallel is not None and not max_parallel >= 1:
        raise ConfigError("max_parallel", f"expected at least 1 run at once, got {max_parallel}")
    if retries is not None and not retries >= 0:
        raise ConfigError("retries", f"expected 0 or more retries, got {retries}")
    check_threshold(audit_threshold)


def refuse_mismatched(audit: Audit) -> None:
    """``--strict``: a ``ConfigError`` (key ``strict``) when the audit flagged a difference."""
    flagged = audit.flagged
    if not flagged:
        return
    pair, first = flagged[0]
    pairs = len({id(p) for p, _ in flagged})
    fix = f" (set {first.suggestion})" if first.suggestion else ""
    raise ConfigError("strict", f"the arm audit found differences in {pairs} pair(s) of arms, e.g. {pair.group} "
                      f"{pair.candidate}: {first.describe()}{fix}; nothing submitted (see `diffsweep plan`)")


def reconcile_sweep(target: SweepTarget, warn: Callable[[str], None] = print) -> list[Reconciled]:
    """Mark the runs whose job ended without reporting as FAILED/KILLED in MLflow (the reason: the
    scheduler's state for the job) and record MLflow run ids in the ledger; a sweep never
    launched has none. ``warn`` gets what could not be marked."""
    directory = target.output_dir()
    if read_ledger(directory) is None:
        return []
    with locked(directory):
        ledger = read_ledger(directory)
        if ledger is None:  # removed since it was read above
            return []
        marked = mark_ended(ledger, directory, scheduler_states(ledger), warn=warn)
        write_ledger(directory, ledger)  # also records MLflow run ids
    return [Reconciled(name=e.name, key=e.key, job_id=e.latest.job_id if e.latest else None, scheduler_state=s,
                       mlflow_status=m) for e, s, m in marked]


def sweep_status(target: SweepTarget, warn: Callable[[str], None] = print,
                 on_reconciled: Callable[[list[Reconciled]], None] | None = None) -> StatusReport:
    """Each run's state, job and resources as submitted, and the orphaned runs; jobs that died
    without reporting are reconciled first (``on_reconciled`` gets them then, before planning)."""
    reconciled = reconcile_sweep(target, warn)
    if on_reconciled is not None:
        on_reconciled(reconciled)
    return StatusReport(plan=plan_sweep(target), reconciled=reconciled)


def launch_sweep(target: SweepTarget, *, dry_run: bool = False, max_parallel: int | None = None,
                 budget: float | None = None, retries: int | None = None, tracking_uri: str | None = None,
                 warn: Callable[[str], None] = print, echo: Callable[[str], None] = print,
                 on_reconciled: Callable[[list[Reconciled]], None] | None = None,
                 on_planned: Callable[[SweepPlan], None] | None = None,
                 on_selected: Callable[[LaunchReport], None] | None = None,
                 on_audit: Callable[[Audit], None] | None = None, audit_threshold: float = DEFAULT_THRESHOLD,
                 strict: bool = False) -> LaunchReport:
    """Submit the runs that need it: new, changed, failed (within ``retries``, default the sweep's
    ``launch.max_retries``) and cancelled ones; finished runs are skipped and running ones left
    alone, so launching again is always safe. Refuses a launch over ``budget`` GPU-hours.

    Holds the sweep's launch lock throughout. Jobs that died unreported are reconciled first (not
    in a ``dry_run``, which submits nothing). A caller that shows progress as it happens gets each
    step's result before the next step can fail: ``on_reconciled`` the runs reconciled,
    ``on_planned`` the plan (its ``warnings``), ``on_selected`` the report once the runs are
    selected and checked, before anything is submitted; ``echo`` the scheduler's lines while it
    submits. The matched-arm audit of the planned runs (``audit_threshold``) goes to ``on_audit``
    before the runs are selected; with ``strict`` a flagged difference refuses the launch
    (``ConfigError``, nothing submitted). ``warn`` gets a warning when jobs on other machines would
    write an SQLite store on a network file system (``diffsweep.tracking.filesystems.shared_store_warning``), in a
    dry run too."""
    check_launch_options(budget=budget, max_parallel=max_parallel, retries=retries, audit_threshold=audit_threshold)
    with launch_lock(target.output_dir()):
        reconciled = [] if dry_run else reconcile_sweep(target, warn)  # died unreported: failed, retryable
        if on_reconciled is not None and not dry_run:
            on_reconciled(reconciled)
        plan = plan_sweep(target)
        if on_planned is not None:
            on_planned(plan)
        audit = audit_plan(plan, audit_threshold)
        if on_audit is not None:
            on_audit(audit)
        if strict:
            refuse_mismatched(audit)
        selection = select(plan, plan.spec.launch.max_retries if retries is None else retries)
        check_launch(plan, selection, budget)
        scheduler = get_scheduler(plan.profile.executor)
        if tracking_uri is None:
            from diffsweep.tracking.store import tracking_uri as default_uri

            tracking_uri = default_uri()
        if selection.submit and scheduler.jobs_on_other_hosts:
            from diffsweep.tracking.filesystems import shared_store_warning

            if (note := shared_store_warning(tracking_uri)) is not None:
                warn(note)
        report = LaunchReport(plan=plan, selection=selection, reconciled=reconciled, dry_run=dry_run,
                              where=scheduler.label, audit=audit)
        if on_selected is not None:
            on_selected(report)
        if dry_run:
            return report
        if selection.submit:
            report.submitted = submit(plan, selection, max_parallel=max_parallel or plan.spec.launch.max_parallel,
                                      tracking_uri=tracking_uri, echo=echo)
        if any(r.run.branch is not None for r in plan.runs):  # held branches whose parent has saved their start
            release_branches(plan, echo)
    return report


def release_branches(plan: SweepPlan, echo: Callable[[str], None]) -> None:
    """Release the sweep's held cooldown branches whose parent checkpoint exists (a release their
    parent's job could not make is retried by every launch)."""
    from diffsweep.launch.gates import release_ready
    from diffsweep.launch.ledger import SweepStore

    if plan.ledger is None and not (plan.out / "ledger.json").is_file():
        return
    released, errors = release_ready(SweepStore(plan.out))
    if released:
        echo(f"released {len(released)} held cooldown branch(es) whose parent checkpoint exists")
    for line in errors:
        echo(f"warning: {line}; launch again to retry")


def cancel_sweep(target: SweepTarget) -> CancelReport:
    """Cancel the pending and running runs (those ``only`` selects), orphaned ones included; jobs
    save a checkpoint first, so launching again resumes them. A sweep never launched is an error."""
    from diffsweep.launch.control import cancel, require_launched

    plan = plan_sweep(target)
    require_launched(plan)  # before the lock: a sweep never launched is refused with nothing created
    with launch_lock(plan.out, "cancel"):
        cancelled = cancel(plan)
    return CancelReport(plan=plan, cancelled=cancelled)


def stop_sweep(target: SweepTarget, *, timeout_s: float = STOP_WAIT_S, poll_s: float = 0.5) -> StopReport:
    """Ctrl-C of ``launch --wait`` where its scheduler's jobs are processes of this machine
    (``Scheduler.interrupt_stops_jobs``): cancel the pending and running runs that ``--wait``
    shows (not orphans, which launch leaves alone; only jobs of such a scheduler), as
    ``cancel_sweep`` does, then wait up to ``timeout_s`` until they have saved their checkpoint and
    exited, so that launching again at once resumes them (a run still stopping is skipped)."""
    from diffsweep.launch.control import cancel

    out = target.output_dir()
    if read_ledger(out) is None:
        return StopReport([], [], [])
    with launch_lock(out, "cancel"):
        plan = plan_sweep(target)
        active = [r for r in plan.runs if r.state.state in ACTIVE_STATES and r.ledger_entry is not None
                  and r.ledger_entry.latest is not None
                  and get_scheduler(r.ledger_entry.latest.executor).interrupt_stops_jobs]
        stopped = set(cancel(replace(plan, runs=active, orphans=[]))) if active else set()
    running = [r.run.name for r in active if r.run.name in stopped and r.state.state == RUNNING]
    queued = [r.run.name for r in active if r.run.name in stopped and r.state.state == PENDING]
    deadline = time.monotonic() + timeout_s
    while True:
        stopping = [r.run.name for r in plan_sweep(target).runs
                    if r.run.name in stopped and r.state.state in ACTIVE_STATES]
        if not stopping or time.monotonic() >= deadline:
            return StopReport(running=running, queued=queued, stopping=stopping)
        time.sleep(poll_s)


def watch_sweep(target: SweepTarget, poll_s: float = WATCH_POLL_S) -> Iterator[Snapshot]:
    """Where every run stands, every ``poll_s`` seconds, until no run is pending or running (the
    last snapshot is the first with none)."""
    while True:
        now = snapshot(plan_sweep(target))
        yield now
        if not now.active:
            return
        time.sleep(poll_s)


@dataclass(frozen=True)
class AttemptLogs:
    """One submission of a run: its header line, its log files (stdout, then stderr; only those
    that exist) and, when there are none, the line saying why."""

    number: int  # 1 is the first submission
    attempt: Attempt
    header: str
    files: list[Path]
    no_logs: str | None


@dataclass(frozen=True)
class LogsReport:
    """A launched run's logs: the sweep output directory it was found in, its ledger entry and
    the attempts asked for."""

    out: Path
    entry: Entry
    attempts: list[AttemptLogs]


def run_logs(run: str, *, spec: SweepSpec | None = None, out: Path | None = None, attempt: str | None = None,
             search: Path | None = None) -> LogsReport:
    """The logs of ``run`` (its name or key prefix, run directory name or MLflow run name) in the
    sweep output ``out`` (default: ``spec``'s), or, with neither, in every sweep output under
    ``search`` (default: here): ``runs/*/`` and ``*/runs/*/``. ``attempt`` is ``N`` (1 is the
    first), ``all`` or None (the latest)."""
    from diffsweep.launch.control import find_entry, header, latest_state, log_files, no_logs, select_attempts

    if spec is not None:
        outs = [output_dir(spec, out)]
    elif out is not None:
        outs = [out.absolute()]
    else:
        # sweep outputs here: runs/<name> (the shipped sweeps') and <folder>/runs/<name> (the default
        # beside a sweep file in a folder, e.g. sweeps/)
        base = search if search is not None else Path()
        outs = sorted(p.parent for pattern in ("runs/*/ledger.json", "*/runs/*/ledger.json")
                      for p in base.glob(pattern))
    directory, entry = find_entry(run, outs)
    state, latest = latest_state(entry), len(entry.attempts)
    attempts = []
    for n in select_attempts(entry, attempt):
        a = entry.attempts[n - 1]
        now = state if n == latest else None
        files = log_files(a)
        attempts.append(AttemptLogs(number=n, attempt=a, header=header(entry, n, now), files=files,
                                    no_logs=None if files else no_logs(entry, a, now)))
    return LogsReport(out=directory, entry=entry, attempts=attempts)


@dataclass(frozen=True)
class RunEvaluations:
    """The evaluations of one finished run of a sweep (``diffsweep.eval.runner.Evaluation``s, one
    per probe)."""

    name: str
    run_dir: Path
    evaluations: list[Any]


def eval_sweep(target: SweepTarget, probes: list[tuple[Any, Any]], *, force: bool = False,
               echo: Callable[[str], None] = print) -> tuple[list[RunEvaluations], list[str]]:
    """Run ``probes`` (``diffsweep.eval.probe.probe_requests``) on the newest checkpoint of every
    finished run of the sweep (those ``only`` selects), one after another in this process; what
    is already evaluated is skipped. Returns the evaluations and the names of the runs not
    finished yet (evaluated by a later call). Every probe is checked against every run's config
    before anything runs."""
    from diffsweep.eval.loading import load_trained
    from diffsweep.eval.runner import Detail, evaluate
    from diffsweep.launch.run_state import DONE

    plan = plan_sweep(target)
    finished = [row for row in plan.runs if row.state.state == DONE]
    for row in finished:
        for probe, settings in probes:
            probe.check(settings, row.run.config)
    done = []
    for row in finished:
        echo(Detail(f"== {row.run.name}"))  # each summary line names its run: a header is detail
        trained = load_trained(row.run_dir)
        done.append(RunEvaluations(row.run.name, row.run_dir, evaluate(trained, probes, force=force, echo=echo)))
        del trained
    return done, [row.run.name for row in plan.runs if row.state.state != DONE]


def eval_target(target: Path, probes: list[tuple[Any, Any]], *, force: bool = False, echo: Callable[[str], None] = print,
                only: str | None = None, out: Path | None = None, sets: list[str] | None = None
                ) -> tuple[list[Any], int, list[str]]:
    """``probes`` here on a run directory's newest checkpoint, on one checkpoint, or on every finished
    run of a sweep YAML (``eval_sweep``, with ``only``, ``out`` and ``sets``): the evaluations, the
    number of runs they are of, and a sweep's runs not finished yet."""
    if target.suffix in (".yaml", ".yml"):
        runs, waiting = eval_sweep(SweepTarget.load(target, only=only, out=out, sets=sets, executor="local"), probes,
                                   force=force, echo=echo)
        return [e for run in runs for e in run.evaluations], len(runs), waiting
    from diffsweep.eval.loading import load_trained
    from diffsweep.eval.runner import evaluate

    trained = load_trained(target)
    echo(f"checkpoint {trained.checkpoint} (step {trained.step}, {trained.config.model.attention.kind}) "
         f"on {trained.device}")
    return evaluate(trained, probes, force=force, echo=echo), 1, []


def launch_eval(target: SweepTarget, probes: tuple[str, ...], settings: dict[str, dict[str, Any]],
                steps: tuple[int, ...] = (), *, tracking_uri: str | None = None,
                echo: Callable[[str], None] = print) -> tuple[dict[str, Path], list[str]]:
    """Evaluate the sweep's finished runs as jobs of its scheduler (Slurm arrays, or the local
    queue), each with the resources its training had (the memory planner's estimate): the run's
    job is submitted again with these probes as its evaluation request; its trainer finds the run
    finished and returns at once, then the job evaluates (``TrainJob``), skipping what the store
    already has. Returns the runs submitted (name: run directory, whose ``job.json`` says what
    the job evaluated once it ends: ``evaluated`` or ``eval_error``) and the names of those not
    finished yet. The probes and settings are checked against every run before anything is
    submitted."""
    from dataclasses import replace

    from diffsweep.launch.run_state import DONE
    from diffsweep.sweep.spec import EvalSettings

    spec = replace(target.spec, eval=EvalSettings(probes=probes, settings=settings, steps=steps))
    target = replace(target, spec=spec)
    with launch_lock(target.output_dir(), "eval"):
        plan = plan_sweep(target)  # checks the probes against every run (check_eval)
        finished = [r for r in plan.runs if r.state.state == DONE]
        waiting = [r.run.name for r in plan.runs if r.state.state != DONE]
        if not finished:
            return {}, waiting
        selection = Selection(submit=finished)
        check_launch(plan, selection, None)
        if tracking_uri is None:
            from diffsweep.tracking.store import tracking_uri as default_uri

            tracking_uri = default_uri()
        submitted = submit(plan, selection, max_parallel=plan.spec.launch.max_parallel, tracking_uri=tracking_uri,
                           echo=echo)
    return {r.run.name: r.run_dir for r, _ in submitted}, waiting
