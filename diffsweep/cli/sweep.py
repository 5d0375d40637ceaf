"""``diffsweep plan | launch | status | cancel | logs | reconcile``: sweeps on Slurm or locally."""

from __future__ import annotations

from dataclasses import asdict
from pathlib import Path
from typing import TYPE_CHECKING, Annotated

import typer

from diffsweep.cli.common import JsonOpt, fail, handle_errors, name_choice
from diffsweep.cli.sweep_wait import wait_for_sweep
from diffsweep.config.units import human
from diffsweep.launch.scheduler import scheduler_names

if TYPE_CHECKING:
    from diffsweep.launch.api import LaunchReport, Reconciled

SweepArg = Annotated[Path, typer.Argument(help="Sweep YAML (see sweeps/).", show_default=False)]
ProfileOpt = Annotated[str | None, typer.Option("--profile", help="Cluster profile: a name in slurm/profiles/ or a "
                                                "YAML path (default: the sweep's launch.profile, else automatic).",
                                                show_default=False)]
ExecutorOpt = Annotated[str | None, name_choice(scheduler_names, "--executor", "Where jobs run: a registered "
                                                "scheduler, a package's included (default: the profile's; without a "
                                                "profile, slurm if a Slurm controller answers, else local).",
                                                show_default=False)]
OnlyOpt = Annotated[str | None, typer.Option("--only", help="Only runs whose name or key matches this regex.",
                                             show_default=False)]
OutOpt = Annotated[Path | None, typer.Option("--out", help="Sweep output directory (ledger, run dirs, logs) "
                                             "(default: the sweep's launch.output, else runs/<sweep name> beside "
                                             "the sweep file).", show_default=False)]
BudgetOpt = Annotated[float | None, typer.Option("--budget", help="Refuse to launch runs needing more GPU-hours.",
                                                 show_default=False)]
SlurmOpt = Annotated[list[str] | None, typer.Option("--slurm", help="Override the profile's Slurm settings: KEY=VALUE "
                                                    "with a key of its slurm: mapping (partition, account, qos, ...) "
                                                    "or time, the longest job (e.g. time=4:00:00) (repeatable).",
                                                    show_default=False)]
SetupOpt = Annotated[list[str] | None, typer.Option("--setup", help="A shell line each job runs after the profile's "
                                                    "setup lines (repeatable).", show_default=False)]
SweepSetOpt = Annotated[list[str] | None, typer.Option("--set", help="Override a run config value in every run: "
                                                       "--set model.size=tiny-m (repeatable; not a key the sweep's "
                                                       "grid, zip, runs, seeds or derive set).", show_default=False)]
AuditOpt = Annotated[float, typer.Option("--audit-threshold", min=0.0, max=0.99, help="Arm audit: the relative "
                                         "difference in parameters or FLOPs/token between a kind's runs and the "
                                         "baseline's of the same size that is flagged (tokens, batch, lr schedule "
                                         "and seeds: any difference).")]
ROWS = 200  # table rows shown before "... more" (use --all or --json)


def _stderr(line: str) -> None:
    typer.echo(line, err=True)


def _submitted(r, status: bool):
    """(resources, profile) the run's latest submission asked for, where that is what to show:
    ``status`` shows it for every launched run; ``plan`` (what a launch would do) for runs whose
    job stands (pending, running, done), and the current estimate for those it would submit."""
    from diffsweep.launch.plan import SUBMITTABLE, submitted_resources

    submitted = submitted_resources(r.ledger_entry)
    return submitted if submitted and (status or r.state.state not in SUBMITTABLE) else None


def _row(r, status: bool) -> dict:
    e = r.estimate
    submitted = _submitted(r, status)
    res = submitted[0] if submitted else e.resources
    return {
        "key": r.run.key, "name": r.run.name, "arch": r.run.kind, "size": r.run.size,
        "params": r.run.num_params, "non_embedding_params": r.run.num_non_embedding_params, "tokens": r.run.tokens,
        "flops": r.run.flops, "hours": round(e.hours, 4), "gpu_hours": round(e.gpu_hours, 4),
        "memory_gb": round(e.memory_gb, 2), "gpus": res.gpus, "nodes": res.nodes,
        "time_min": res.time_min, "mem_gb": res.mem_gb, "resources_source": "submitted" if submitted else "estimate",
        "submitted_profile": submitted[1] if submitted else None, "state": r.state.state,
        "detail": r.state.detail, "run_dir": str(r.run_dir), "origin": r.run.origin,
        "branch": asdict(r.run.branch) if r.run.branch else None,
    } | _ids(r.ledger_entry, r.run_dir)


def _ids(entry, run_dir: Path) -> dict:
    """The run's Slurm job (array task) or local process and its MLflow run, once launched."""
    if entry is None:
        return {"job_id": None, "mlflow_run_id": None}
    run_id = entry.mlflow_run_id
    if run_id is None:  # status records it in the ledger; until then the run directory knows it
        from diffsweep.rundir import run_info

        run_id = info.run_id if (info := run_info(run_dir)) else None
    return {"job_id": entry.latest.job_id if entry.latest else None, "mlflow_run_id": run_id}


def _orphan_row(o) -> dict:
    return {"key": o.entry.key, "name": o.entry.name, "state": o.state.state, "detail": o.state.detail,
            "run_dir": o.entry.run_dir, "successor": o.successor} | _ids(o.entry, Path(o.entry.run_dir))


def _job(entry) -> str:
    a = entry.latest if entry else None
    if a is None:
        return ""
    return a.job_id or ("queued" if a.state == "queued" else "")


def _orphan_why(o) -> str:
    if o.successor:
        return f"an earlier config of this name (now run {o.successor})"
    return "no row of the sweep makes it now (removed, or renamed with a new config)"


def _render(plan, all_rows: bool, status: bool) -> None:
    from rich.console import Console
    from rich.table import Table

    console = Console()
    if not console.is_terminal:
        console = Console(width=200)  # piped or logged: do not squeeze the table into 80 columns
    gpu = plan.profile.gpus_per_node > 0
    launched = plan.ledger is not None
    table = Table(title=f"sweep {plan.spec.name}: {len(plan.runs)} runs on profile {plan.profile.name} "
                        f"({plan.profile.executor})")
    for col in ("key", "name", "arch", "size", "params", "tokens", "FLOPs", "GPU-h" if gpu else "hours",
                "mem/GPU" if gpu else "memory", "resources", *(["job"] if launched else []), "state"):
        table.add_column(col, justify="right" if col in ("params", "tokens", "FLOPs", "GPU-h", "hours", "mem/GPU",
                                                         "memory") else "left")
    shown = plan.runs if all_rows else plan.runs[:ROWS]
    for r in shown:
        e = r.estimate
        submitted = _submitted(r, status)
        resources = submitted[0].describe() if submitted else e.resources.describe()
        table.add_row(r.run.key, r.run.name, r.run.kind, r.run.size, human(r.run.num_params), human(r.run.tokens),
                      f"{r.run.flops:.2e}", f"{e.gpu_hours if gpu else e.hours:,.2f}", f"{e.memory_gb:,.1f} GB",
                      resources, *([_job(r.ledger_entry)] if launched else []), _state(r.state))
    console.print(table)
    if len(shown) < len(plan.runs):
        console.print(f"... {len(plan.runs) - len(shown)} more runs (--all, or --json)")
    if plan.orphans:
        orphans = Table(title=f"{len(plan.orphans)} launched runs that the sweep no longer makes (orphaned)")
        for col in ("key", "name", "job", "state", "why"):
            orphans.add_column(col)
        for o in plan.orphans:
            orphans.add_row(o.entry.key, o.entry.name, _job(o.entry), _state(o.state), _orphan_why(o))
        console.print(orphans)
        console.print(f"Orphaned runs keep their run directories and MLflow runs. To continue one, give the sweep its "
                      f"config back; to stop one that still runs: diffsweep cancel {plan.spec.path} --only KEY")
    counts = ", ".join(f"{n} {s}" for s, n in sorted(plan.counts().items()))
    total = f"{plan.gpu_hours:,.1f} GPU-hours" if gpu else f"{sum(r.estimate.hours for r in plan.runs):,.2f} hours"
    orphaned = f"; {len(plan.orphans)} orphaned" if plan.orphans else ""
    console.print(f"total: {len(plan.runs)} runs, {total}; states: {counts}{orphaned}; output: {plan.out}")


def _state(state) -> str:
    return state.state + (f" ({state.detail})" if state.detail else "")


def _print_compact(data: dict) -> None:
    """One JSON document, one run per line (sweeps can have 10,000 runs: no pretty-printing)."""
    import json
    import sys

    runs = data.pop("runs")
    head = json.dumps(data)[:-1]
    sys.stdout.write(head + ', "runs": [\n' + ",\n".join(json.dumps(r) for r in runs) + "\n]}\n")


def _warn(plan) -> None:
    for w in plan.warnings:
        typer.echo(f"warning: {w}", err=True)


@handle_errors
def plan(
    sweep: SweepArg,
    profile: ProfileOpt = None,
    executor: ExecutorOpt = None,
    only: OnlyOpt = None,
    out: OutOpt = None,
    budget: BudgetOpt = None,
    json_: JsonOpt = False,
    all_: Annotated[bool, typer.Option("--all", help=f"Show every run (default: the first {ROWS}).")] = False,
    slurm: SlurmOpt = None,
    setup: SetupOpt = None,
    sets: SweepSetOpt = None,
    audit_threshold: AuditOpt = 0.01,
) -> None:
    """Show a sweep's runs, cost and states; submits nothing.

    Each run: key, name, size, params, tokens, FLOPs, GPU-hours, resources (as submitted, once
    launched), job and state (new, pending, running, done, failed, cancelled, changed, unknown),
    plus the sweep's total GPU-hours, and the launched runs the sweep no longer makes (orphaned).
    Then the arm audit: each kind's runs against the baseline's of the same size (parameters,
    FLOPs/token, tokens, batch, lr schedule, seeds), with the setting that matches a difference.
    """
    from diffsweep.launch.api import SweepTarget, audit_plan, check_launch_options, plan_sweep
    from diffsweep.sweep import branches, tune

    check_launch_options(budget=budget, audit_threshold=audit_threshold)
    p = plan_sweep(SweepTarget.load(sweep, profile, executor, only, out, slurm, setup, sets), check=True)
    _warn(p)
    audit = audit_plan(p, audit_threshold)
    cells = tune.cells([r.run for r in p.runs], list(p.spec.tune)) if p.spec.tune else []
    if json_:
        _print_compact({"sweep": p.spec.name, "profile": p.profile.name, "executor": p.profile.executor,
                        "out": str(p.out), "gpu_hours": p.gpu_hours, "counts": p.counts(), "set": p.spec.overrides,
                        "audit": audit.to_dict(), "orphaned": [_orphan_row(o) for o in p.orphans],
                        "runs": [_row(r, False) for r in p.runs]}
                       | ({"tune": tune.to_dict(cells, p.spec.tune)} if p.spec.tune else {}))
    else:
        if p.spec.overrides:
            typer.echo("--set in every run: " + ", ".join(f"{k}={v}" for k, v in p.spec.overrides.items()))
        _render(p, all_, status=False)
        for line in tune.describe(cells, p.spec.tune) if p.spec.tune else []:
            typer.echo(line)
        for line in branches.describe([r.run for r in p.runs], p.spec.branches) if p.spec.branches else []:
            typer.echo(line)
        for line in audit.lines():
            typer.echo(line)
    if budget is not None and p.gpu_hours > budget:
        typer.echo(f"over budget: {p.gpu_hours:,.1f} GPU-hours > --budget {budget:,.1f}", err=True)


@handle_errors
def launch(
    sweep: SweepArg,
    executor: ExecutorOpt = None,
    profile: ProfileOpt = None,
    dry_run: Annotated[bool, typer.Option("--dry-run", help="Show what would be submitted; submit nothing.")] = False,
    max_parallel: Annotated[int | None, typer.Option("--max-parallel", min=1, help="Runs executing at once "
                                                     "(default: the sweep's launch.max_parallel; local: 1).",
                                                     show_default=False)] = None,
    only: OnlyOpt = None,
    out: OutOpt = None,
    budget: BudgetOpt = None,
    retries: Annotated[int | None, typer.Option("--retries", min=0, help="Retry budget for failed runs "
                                                "(default: the sweep's launch.max_retries).",
                                                show_default=False)] = None,
    wait: Annotated[bool, typer.Option("--wait", help="Wait until the launched runs end (exit 1 if any failed). "
                                       "Ctrl-C: Slurm's jobs go on (only the waiting stops); the local queue's "
                                       "runs stop after saving a checkpoint, and launching again resumes them "
                                       "(exit 130).")] = False,
    slurm: SlurmOpt = None,
    setup: SetupOpt = None,
    sets: SweepSetOpt = None,
    audit_threshold: AuditOpt = 0.01,
    strict: Annotated[bool, typer.Option("--strict", help="Refuse to launch (exit 2, nothing submitted) when the "
                                         "arm audit finds a difference (see `diffsweep plan`).")] = False,
) -> None:
    """Submit the runs that need it (Slurm arrays or local) and return.

    New, changed, failed (within the retry budget) and cancelled runs are submitted; finished runs
    are skipped and running ones left alone, so launching again is always safe. The arm audit's
    differences are printed as warnings first (``--strict``: refused).
    """
    import os

    from diffsweep.launch.api import SweepTarget, launch_sweep
    from diffsweep.launch.scheduler import get_scheduler

    os.environ.setdefault("MLFLOW_LOGGING_LEVEL", "WARNING")  # not its "creating tables" chatter
    target = SweepTarget.load(sweep, profile, executor, only, out, slurm, setup, sets)
    report = launch_sweep(target, dry_run=dry_run, max_parallel=max_parallel, budget=budget, retries=retries,
                          warn=_stderr, echo=typer.echo, on_reconciled=_echo_reconciled, on_planned=_warn,
                          on_selected=_render_selection, on_audit=_warn_audit, audit_threshold=audit_threshold,
                          strict=strict)
    again = "".join([f" --out {out}" if out else "", *(f" --set {s}" for s in sets or [])])
    if not dry_run and report.selection.submit:
        typer.echo(f"launched {len(report.submitted)} runs on {report.where}; follow with: diffsweep status "
                   f"{sweep}{again}")
    if wait:
        wait_for_sweep(target, sweep, scheduler=get_scheduler(report.plan.profile.executor), again=again)


def _warn_audit(audit) -> None:
    """The arm audit's differences, as warnings (a launch's matched pairs are shown by ``plan``)."""
    if audit.flagged:
        for line in audit.lines(matched=False):
            typer.echo(f"warning: {line.strip()}", err=True)


def _render_selection(report: LaunchReport) -> None:
    """What a launch is about to do, before it submits: skipped and orphaned runs, and in a dry run
    what it would submit; else "nothing to submit" when that is so."""
    p, sel = report.plan, report.selection
    for r, why in sel.skip:
        typer.echo(f"skip {r.run.name}: {why}")
    for o in p.orphans:
        typer.echo(f"orphaned {o.entry.name} ({o.entry.key}, {_state(o.state)}): {_orphan_why(o)}; left as it is")
    if report.dry_run:
        for r in sel.submit:
            typer.echo(f"would submit {r.run.name} ({r.run.key}, {r.state.state}): {r.estimate.resources.describe()}")
        typer.echo(f"dry run: {len(sel.submit)} runs, {report.gpu_hours:,.1f} GPU-hours on {p.profile.name}; "
                   "nothing submitted")
    elif not sel.submit:
        typer.echo(f"nothing to submit ({', '.join(f'{n} {s}' for s, n in sorted(p.counts().items()))})")


@handle_errors
def status(
    sweep: SweepArg,
    profile: ProfileOpt = None,
    executor: ExecutorOpt = None,
    only: OnlyOpt = None,
    out: OutOpt = None,
    json_: JsonOpt = False,
    all_: Annotated[bool, typer.Option("--all", help=f"Show every run (default: the first {ROWS}).")] = False,
    slurm: SlurmOpt = None,
    setup: SetupOpt = None,
    sets: SweepSetOpt = None,
) -> None:
    """Show each run's state, job and resources as submitted, the counts, and orphaned runs.

    States come from the ledger, the scheduler and each job's report: pending with Slurm's
    reason, running with its step, failed with the reason the job recorded. Runs whose job died without
    reporting are reconciled first (their MLflow run is marked FAILED or KILLED).
    """
    from diffsweep.launch.api import SweepTarget, sweep_status

    report = sweep_status(SweepTarget.load(sweep, profile, executor, only, out, slurm, setup, sets), warn=_stderr,
                          on_reconciled=_echo_reconciled)
    p = report.plan
    if json_:
        _print_compact({"sweep": p.spec.name, "out": str(p.out), "counts": p.counts(),
                        "reconciled": [m.to_dict() for m in report.reconciled],
                        "orphaned": [_orphan_row(o) for o in p.orphans], "runs": [_row(r, True) for r in p.runs]})
    else:
        _render(p, all_, status=True)


def _echo_reconciled(marked: list[Reconciled]) -> None:
    for m in marked:
        typer.echo(f"reconciled {m.name}: job {m.job_id} ended as {m.scheduler_state}; MLflow run marked "
                   f"{m.mlflow_status}", err=True)


@handle_errors
def reconcile(sweep: SweepArg, out: OutOpt = None) -> None:
    """Mark runs whose job died unreported as FAILED/KILLED in MLflow.

    The reason recorded is the scheduler's state for the job (e.g. NODE_FAIL, OUT_OF_MEMORY).
    """
    from diffsweep.launch.api import SweepTarget, reconcile_sweep

    marked = reconcile_sweep(SweepTarget.load(sweep, out=out), warn=_stderr)
    _echo_reconciled(marked)
    typer.echo(f"reconciled {len(marked)} runs")


@handle_errors
def cancel(
    sweep: SweepArg,
    only: OnlyOpt = None,
    out: OutOpt = None,
    profile: ProfileOpt = None,
    executor: ExecutorOpt = None,
    slurm: SlurmOpt = None,
    setup: SetupOpt = None,
    sets: SweepSetOpt = None,
) -> None:
    """Cancel pending and running runs (all, or those matching --only), orphaned ones included.

    Jobs save a checkpoint at the step boundary before they stop: launching again resumes them.
    """
    from diffsweep.launch.api import SweepTarget, cancel_sweep

    report = cancel_sweep(SweepTarget.load(sweep, profile, executor, only, out, slurm, setup, sets))
    for name in report.cancelled:
        typer.echo(f"cancelled {name}")
    typer.echo(f"cancelled {len(report.cancelled)} runs")


@handle_errors
def logs(
    run: Annotated[str, typer.Argument(help="The run: its name or key (prefix) as plan/status show them, its run "
                                       "directory's name, or its MLflow run name.", show_default=False)],
    sweep: Annotated[Path | None, typer.Option("--sweep", help="The run's sweep YAML (default: search runs/*/ "
                                               "and */runs/*/ here).",
                                               show_default=False)] = None,
    out: OutOpt = None,
    attempt: Annotated[str | None, typer.Option("--attempt", help="Which submission: N (1 is the first) or all "
                                                "(default: the latest).", show_default=False)] = None,
    follow_: Annotated[bool, typer.Option("--follow", "-f", help="Keep printing until the job ends.")] = False,
) -> None:
    """Print a launched run's job logs: per attempt (submission) a header, then stdout and stderr.

    Slurm requeues (preemption, time limits) continue the same attempt's files, where a line
    "==> diffsweep: job ... started ..." marks each start. A run with no logs yet says so.
    """
    from diffsweep.launch.api import run_logs
    from diffsweep.launch.control import follow
    from diffsweep.sweep import load_sweep

    report = run_logs(run, spec=load_sweep(sweep) if sweep is not None else None, out=out, attempt=attempt)
    latest = len(report.entry.attempts)
    if follow_ and [a.number for a in report.attempts] != [latest]:
        fail(f"--follow: follows the latest attempt ({latest}); leave out --attempt")
    for logs_ in report.attempts:
        typer.echo(logs_.header)
        if follow_:
            follow(report.out, report.entry.key, logs_.number, echo=typer.echo)
            return
        if logs_.no_logs is not None:
            typer.echo(logs_.no_logs)
        for f in logs_.files:
            text = f.read_text(errors="replace")
            if logs_.attempt.stderr and f == Path(logs_.attempt.stderr) and text:
                typer.echo(f"--- stderr ({f}) ---")
            typer.echo(text + ("" if not text or text.endswith("\n") else "\n"), nl=False)
