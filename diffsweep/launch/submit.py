"""``launch``: check everything, then submit the plan's new, changed, failed (within the retry
budget) and cancelled runs through submitit, and return. Finished runs are skipped and running
ones left alone, so launching again is always safe.

How jobs are submitted is the profile's scheduler's (``diffsweep.launch.scheduler``): Slurm
arrays, or a local queue process; this module checks, snapshots the code, and records each
submission in the ledger.
"""

from __future__ import annotations

import contextlib
from collections import defaultdict
from collections.abc import Callable, Iterator
from dataclasses import asdict, dataclass, field
from pathlib import Path

from diffsweep import lockfile
from diffsweep.config import ConfigError, to_dict
from diffsweep.config.identity import identity_fields
from diffsweep.fsutil import empty_folder
from diffsweep.launch.jobs.attempt import Attempt
from diffsweep.launch.ledger import LAUNCH_LOCK, Entry, Ledger, SweepStore, ledger_path, read_ledger, write_ledger
from diffsweep.launch.plan import SUBMITTABLE, PlanRow, SweepPlan
from diffsweep.launch.resources import Resources
from diffsweep.launch.run_state import ACTIVE_STATES
from diffsweep.launch.scheduler import JobArray, get_scheduler
from diffsweep.rundir import EvalRequest, checkpoint_dir, read_launch_config, write_launch_config, write_launch_eval
from diffsweep.sweep.spec import EvalSettings
from diffsweep.tracking import tags as tag


@dataclass
class Selection:
    """What a launch would do with each run."""

    submit: list[PlanRow] = field(default_factory=list)
    skip: list[tuple[PlanRow, str]] = field(default_factory=list)  # (run, why)


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
        raise ConfigError("budget", f"launching {len(sel.submit)} runs needs about {cost:,.1f} GPU-hours, over "
                          f"the budget of {budget:,.1f}")
    get_scheduler(plan.profile.executor).check_launch(plan)
    _check_parents(plan, sel)
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




@contextlib.contextmanager
def launch_lock(out: Path, what: str = "launch") -> Iterator[None]:
    """One launch (or cancel) of a sweep directory at a time, from any machine: a second one,
    planned from the same ledger, would submit the same runs again. The lock file lives in the
    sweep directory, on the file system every login node shares (``diffsweep.lockfile``).

    A sweep directory this creates is removed again if nothing was launched into it (no
    ledger), so a refused or failed launch leaves nothing behind."""
    fresh = not out.exists()
    with lockfile.hold(out / LAUNCH_LOCK, what, "out", f"another launch or cancel of {out} is in progress"):
        try:
            yield
        finally:
            if fresh and not ledger_path(out).exists():  # still ours alone: the lock keeps others out
                empty_folder(out, keep=LAUNCH_LOCK)


def launch(plan: SweepPlan, sel: Selection, *, max_parallel: int | None, tracking_uri: str,
           echo: Callable[[str], None] = print) -> list[tuple[PlanRow, Attempt]]:
    """Submit ``sel.submit`` (already checked; call under ``launch_lock``) with the profile's
    scheduler: one job array per resource class, shortest first. Each submission is in the ledger
    as soon as the scheduler has it. If the first submission fails, ``launch_lock`` removes a sweep
    directory it created."""
    from diffsweep.launch.jobs.job import TrainJob
    from diffsweep.launch.snapshot import snapshot_code
    from diffsweep.tracking.store import check_tracking, ensure_experiment

    check_tracking(tracking_uri)
    ensure_experiment(tracking_uri, plan.spec.experiment)
    code_dir = str(snapshot_code(plan.out))
    scheduler = get_scheduler(plan.profile.executor)
    store = SweepStore(plan.out)
    starts = _branch_starts(plan)
    # One array per resource class, shortest first; the cooldown branches whose parents have not
    # saved their branch points yet after all others (held until they have: diffsweep.launch.gates).
    classes: dict[tuple[bool, Resources], list[PlanRow]] = defaultdict(list)
    for r in sel.submit:
        start = starts.get(r.run.key)
        classes[(start is not None and not start.exists(), r.estimate.resources)].append(r)
    submitted: list[tuple[PlanRow, Attempt]] = []  # as recorded in the ledger
    order = sorted(classes.items(), key=lambda kv: (kv[0][0], kv[0][1].time_min))
    for i, ((gated, resources), runs) in enumerate(order):
        calls = [TrainJob(_config_dict(r), str(r.run_dir), plan.spec.experiment, tracking_uri,
                          {tag.SWEEP: plan.spec.name, tag.SWEEP_RUN: r.run.name},
                          evals=eval_request(plan.spec.eval),
                          branch_from=str(starts[r.run.key]) if r.run.key in starts else None,
                          store=store.spec() if r.run.config.train.checkpoint_at else None) for r in runs]

        def record(attempts: list[tuple[int, Attempt]], runs: list[PlanRow] = runs) -> None:
            pairs = [(runs[j], a) for j, a in attempts]
            _record(plan, pairs, tracking_uri)
            submitted.extend(pairs)

        try:
            scheduler.submit(JobArray(
                calls=calls, names=[r.run.name for r in runs], resources=resources, profile=plan.profile,
                folder=plan.out / "jobs", job_name=f"{plan.spec.name}-{i}", code_dir=code_dir,
                store=store, record=record, max_parallel=max_parallel, noun="runs", echo=echo,
                gates=[str(starts[r.run.key]) for r in runs] if gated else ()))
        except ConfigError as exc:
            if not submitted:
                raise
            raise ConfigError(exc.key, f"{exc.message} ({len(submitted)} runs were submitted before; launch again "
                              "after fixing it)") from None
    return submitted


def _check_parents(plan: SweepPlan, sel: Selection) -> None:
    """A cooldown branch is launched with its parent, or once the parent's checkpoint it starts from
    exists, or while the parent trains towards that checkpoint and keeps it: refuse one that would
    wait for a checkpoint nothing writes."""
    submitting = {r.run.key for r in sel.submit}
    rows = {r.run.key: r for r in plan.runs}
    for r in sel.submit:
        b = r.run.branch
        if b is None or b.parent_key in submitting:
            continue
        parent_dir = plan.run_dir(b.parent_key, b.parent_name)
        if checkpoint_dir(parent_dir, b.step).exists():
            continue
        entry = plan.ledger.entries.get(b.parent_key) if plan.ledger else None
        if entry is None:
            raise ConfigError("only", f"{r.run.name} is a cooldown branch of {b.parent_name}, which is neither "
                              "launched nor selected; select both (e.g. --only with a pattern matching the parent's "
                              "name) or launch the parent first")
        pins = _launched_pins(parent_dir)
        parent = rows.get(b.parent_key)
        active = parent is None or parent.state.state in ACTIVE_STATES
        if b.step not in pins or not active:
            why = ("was launched before this branch was declared, so it neither keeps nor hands on its checkpoint "
                   f"at step {b.step}" if b.step not in pins else
                   f"is {parent.state.state if parent else 'not running'} without its checkpoint at step {b.step}")
            raise ConfigError(f"{plan.spec.path}: branches", f"{r.run.name} starts from {b.parent_name}'s checkpoint "
                              f"at step {b.step}, and {b.parent_name} {why}; relaunch the parent (cancel it first if it "
                              "runs) or remove the branch")


def _launched_pins(run_dir: Path) -> tuple[int, ...]:
    """The ``train.checkpoint_at`` steps the run's launched job keeps (none if unknown)."""
    try:
        pins = read_launch_config(run_dir).get("train", {}).get("checkpoint_at") or ()
    except (ConfigError, OSError, AttributeError):
        return ()
    return tuple(pins)


def _branch_starts(plan: SweepPlan) -> dict[str, Path]:
    """The parent checkpoint each cooldown branch of the plan starts from, by the branch's key."""
    return {r.run.key: checkpoint_dir(plan.run_dir(r.run.branch.parent_key, r.run.branch.parent_name),
                                      r.run.branch.step)
            for r in plan.runs if r.run.branch is not None}


def eval_request(settings: EvalSettings) -> EvalRequest | None:
    """What a launched job evaluates once trained (the sweep's ``eval:``); None without probes."""
    if not settings.probes:
        return None
    return EvalRequest(probes=settings.probes, settings=settings.settings, steps=settings.steps)


def _config_dict(r: PlanRow) -> dict:
    """The run's resolved config as plain data: what its job trains (same key when reloaded)."""
    return to_dict(r.run.config)


def _record(plan: SweepPlan, attempts: list[tuple[PlanRow, Attempt]], tracking_uri: str) -> None:
    """Add the attempts (and their runs' entries and launch configs) to the ledger (call holding its
    lock: ``SweepStore.locked``)."""
    for r, _ in attempts:  # what the job trains and evaluates, readable (the local queue reads them back)
        write_launch_config(r.run_dir, _config_dict(r))
        write_launch_eval(r.run_dir, eval_request(plan.spec.eval))
    ledger = read_ledger(plan.out) or Ledger(sweep=plan.spec.name, experiment=plan.spec.experiment,
                                             tracking_uri=tracking_uri)
    for r, a in attempts:
        a.profile, a.resources = plan.profile.name, asdict(r.estimate.resources)  # status shows what was asked
        entry = ledger.entries.setdefault(r.run.key, Entry(key=r.run.key, name=r.run.name, run_dir=str(r.run_dir),
                                                           identity=identity_fields(r.run.config)))
        entry.attempts.append(a)
    write_ledger(plan.out, ledger)
