"""``diffsweep plan | launch | status | cancel | logs | reconcile``: sweeps on Slurm or locally."""

from __future__ import annotations

import time
from pathlib import Path
from typing import Annotated

import typer

from diffsweep.cli.common import JsonOpt, fail, handle_errors
from diffsweep.config.units import human

SweepArg = Annotated[Path, typer.Argument(help="Sweep YAML (see sweeps/).", show_default=False)]
ProfileOpt = Annotated[str | None, typer.Option("--profile", help="Cluster profile: a name in slurm/profiles/ or a "
                                                "YAML path (default: the sweep's launch.profile, else automatic).",
                                                show_default=False)]
ExecutorOpt = Annotated[str | None, typer.Option("--executor", help="slurm | local (default: the profile's; without "
                                                 "a profile, slurm if sbatch is on PATH, else local).",
                                                 show_default=False)]
OnlyOpt = Annotated[str | None, typer.Option("--only", help="Only runs whose name or key matches this regex.",
                                             show_default=False)]
OutOpt = Annotated[Path | None, typer.Option("--out", help="Sweep output directory (ledger, run dirs, logs) "
                                             "(default: the sweep's launch.output, else runs/<sweep name>).",
                                             show_default=False)]
BudgetOpt = Annotated[float | None, typer.Option("--budget", help="Refuse to launch runs needing more GPU-hours.",
                                                 show_default=False)]
SlurmOpt = Annotated[list[str] | None, typer.Option("--slurm", help="Override the profile's Slurm settings: KEY=VALUE "
                                                    "with a key of its slurm: mapping (partition, account, qos, ...) "
                                                    "or time, the longest job (e.g. time=4:00:00) (repeatable).",
                                                    show_default=False)]
SetupOpt = Annotated[list[str] | None, typer.Option("--setup", help="A shell line each job runs after the profile's "
                                                    "setup lines (repeatable).", show_default=False)]
ROWS = 200  # table rows shown before "... more" (use --all or --json)


def _plan(sweep: Path, profile: str | None, executor: str | None, only: str | None, out: Path | None,
          slurm: list[str] | None = None, setup: list[str] | None = None):
    from diffsweep.launch.plan import choose_profile, make_plan, output_dir
    from diffsweep.launch.profiles import with_overrides
    from diffsweep.sweep import load_sweep

    spec = load_sweep(sweep)
    chosen = with_overrides(choose_profile(spec, profile, executor), slurm, setup)
    return make_plan(spec, chosen, output_dir(spec, out), only=only)


def _row(r) -> dict:
    e = r.estimate
    return {
        "key": r.run.key, "name": r.run.name, "arch": r.run.kind, "size": r.run.size,
        "params": r.run.num_params, "non_embedding_params": r.run.num_non_embedding_params, "tokens": r.run.tokens,
        "flops": r.run.flops, "hours": round(e.hours, 4), "gpu_hours": round(e.gpu_hours, 4),
        "memory_gb": round(e.memory_gb, 2), "gpus": e.resources.gpus, "nodes": e.resources.nodes,
        "time_min": e.resources.time_min, "mem_gb": e.resources.mem_gb, "state": r.state.state,
        "detail": r.state.detail, "run_dir": str(r.run_dir), "origin": r.run.origin,
        "job_id": None, "mlflow_run_id": None,
    } | _ids(r)


def _ids(r) -> dict:
    entry = r.ledger_entry
    if entry is None:
        return {}
    run_id = entry.mlflow_run_id
    if run_id is None:  # status records it in the ledger; until then the run directory knows it
        from diffsweep.launch.state import run_info

        run_id = run_info(r.run_dir).get("run_id")
    return {"job_id": entry.latest.job_id if entry.latest else None, "mlflow_run_id": run_id}


def _render(plan, all_rows: bool) -> None:
    from rich.console import Console
    from rich.table import Table

    console = Console()
    if not console.is_terminal:
        console = Console(width=200)  # piped or logged: do not squeeze the table into 80 columns
    gpu = plan.profile.gpus_per_node > 0
    table = Table(title=f"sweep {plan.spec.name}: {len(plan.runs)} runs on profile {plan.profile.name} "
                        f"({plan.profile.executor.value})")
    for col in ("key", "name", "arch", "size", "params", "tokens", "FLOPs", "GPU-h" if gpu else "hours",
                "mem/GPU" if gpu else "memory", "resources", "state"):
        table.add_column(col, justify="right" if col in ("params", "tokens", "FLOPs", "GPU-h", "hours", "mem/GPU",
                                                         "memory") else "left")
    shown = plan.runs if all_rows else plan.runs[:ROWS]
    for r in shown:
        e = r.estimate
        state = r.state.state + (f" ({r.state.detail})" if r.state.detail else "")
        table.add_row(r.run.key, r.run.name, r.run.kind, r.run.size, human(r.run.num_params), human(r.run.tokens),
                      f"{r.run.flops:.2e}", f"{e.gpu_hours if gpu else e.hours:,.2f}", f"{e.memory_gb:,.1f} GB",
                      e.resources.describe(), state)
    console.print(table)
    if len(shown) < len(plan.runs):
        console.print(f"... {len(plan.runs) - len(shown)} more runs (--all, or --json)")
    counts = ", ".join(f"{n} {s}" for s, n in sorted(plan.counts().items()))
    total = f"{plan.gpu_hours:,.1f} GPU-hours" if gpu else f"{sum(r.estimate.hours for r in plan.runs):,.2f} hours"
    console.print(f"total: {len(plan.runs)} runs, {total}; states: {counts}; output: {plan.out}")


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
) -> None:
    """Show a sweep's runs, cost and states; submits nothing.

    Each run: key, name, size, params, tokens, FLOPs, GPU-hours, resources and state (new, done,
    failed, running, cancelled, changed, unknown), plus the sweep's total GPU-hours.
    """
    from diffsweep.launch.cluster import check_planned

    p = _plan(sweep, profile, executor, only, out, slurm, setup)
    check_planned(p)
    _warn(p)
    if json_:
        _print_compact({"sweep": p.spec.name, "profile": p.profile.name, "executor": p.profile.executor.value,
                    "out": str(p.out), "gpu_hours": p.gpu_hours, "counts": p.counts(), "runs": [_row(r) for r in p.runs]})
    else:
        _render(p, all_)
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
    wait: Annotated[bool, typer.Option("--wait", help="Wait until the launched runs end (exit 1 if any failed).")] = False,
    slurm: SlurmOpt = None,
    setup: SetupOpt = None,
) -> None:
    """Submit the runs that need it (Slurm arrays or local) and return.

    New, changed, failed (within the retry budget) and cancelled runs are submitted; finished runs
    are skipped and running ones left alone, so launching again is always safe.
    """
    from diffsweep.launch.plan import output_dir
    from diffsweep.launch.submit import launch_lock
    from diffsweep.sweep import load_sweep

    with launch_lock(output_dir(load_sweep(sweep), out)):
        _launch(sweep, executor, profile, dry_run, max_parallel, only, out, budget, retries, slurm, setup)
    if wait:
        _wait(sweep, profile, executor, only, out, slurm, setup)


def _launch(sweep, executor, profile, dry_run, max_parallel, only, out, budget, retries, slurm, setup) -> None:
    import os

    from diffsweep.launch.submit import check_launch, launch as submit, select
    from diffsweep.train.tracking import tracking_uri

    os.environ.setdefault("MLFLOW_LOGGING_LEVEL", "WARNING")  # not its "creating tables" chatter

    if not dry_run:
        _reconcile(sweep, profile, executor, out)  # jobs that died unreported become failed (retryable)
    p = _plan(sweep, profile, executor, only, out, slurm, setup)
    _warn(p)
    sel = select(p, p.spec.launch.max_retries if retries is None else retries)
    check_launch(p, sel, budget)
    for r, why in sel.skip:
        typer.echo(f"skip {r.run.name}: {why}")
    cost = sum(r.estimate.gpu_hours for r in sel.submit)
    if dry_run:
        for r in sel.submit:
            typer.echo(f"would submit {r.run.name} ({r.run.key}, {r.state.state}): {r.estimate.resources.describe()}")
        typer.echo(f"dry run: {len(sel.submit)} runs, {cost:,.1f} GPU-hours on {p.profile.name}; nothing submitted")
        return
    if not sel.submit:
        typer.echo(f"nothing to submit ({', '.join(f'{n} {s}' for s, n in sorted(p.counts().items()))})")
    else:
        parallel = max_parallel or p.spec.launch.max_parallel
        submitted = submit(p, sel, max_parallel=parallel, tracking_uri=tracking_uri(), echo=typer.echo)
        where = "Slurm" if p.profile.executor.value == "slurm" else "the local queue"
        typer.echo(f"launched {len(submitted)} runs on {where}; follow with: diffsweep status {sweep}")


def _wait(sweep: Path, profile: str | None, executor: str | None, only: str | None, out: Path | None,
          slurm: list[str] | None, setup: list[str] | None) -> None:
    last = None
    while True:
        p = _plan(sweep, profile, executor, only, out, slurm, setup)
        counts = p.counts()
        line = ", ".join(f"{n} {s}" for s, n in sorted(counts.items()))
        if line != last:
            typer.echo(f"[{time.strftime('%H:%M:%S')}] {line}")
            last = line
        if not counts.get("running"):
            break
        time.sleep(2)
    if any(s != "done" for s in counts):
        fail(f"not every run finished ({line}); see `diffsweep status {sweep}`", 1)


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
) -> None:
    """Show each run's state and the summary counts.

    States come from the ledger, the scheduler and each job's report. Runs whose job died without
    reporting are reconciled first (their MLflow run is marked FAILED or KILLED).
    """
    marked = _reconcile(sweep, profile, executor, out)
    p = _plan(sweep, profile, executor, only, out, slurm, setup)
    if json_:
        _print_compact({"sweep": p.spec.name, "out": str(p.out), "counts": p.counts(), "reconciled": marked,
                    "runs": [_row(r) for r in p.runs]})
    else:
        _render(p, all_)


def _reconcile(sweep: Path, profile: str | None, executor: str | None, out: Path | None) -> list[dict]:
    from diffsweep.launch.ledger import locked, read_ledger, write_ledger
    from diffsweep.launch.plan import output_dir
    from diffsweep.launch.state import reconcile as mark, scheduler_states
    from diffsweep.sweep import load_sweep

    spec = load_sweep(sweep)
    directory = output_dir(spec, out)
    if read_ledger(directory) is None:
        return []
    with locked(directory):
        ledger = read_ledger(directory)
        marked = mark(ledger, directory, scheduler_states(ledger), warn=lambda m: typer.echo(m, err=True))
        write_ledger(directory, ledger)  # also records MLflow run ids
    for entry, state, status_ in marked:
        typer.echo(f"reconciled {entry.name}: job {entry.latest.job_id} ended as {state}; MLflow run marked {status_}",
                   err=True)
    return [{"name": e.name, "key": e.key, "scheduler_state": s, "mlflow_status": m} for e, s, m in marked]


@handle_errors
def reconcile(sweep: SweepArg, out: OutOpt = None) -> None:
    """Mark runs whose job died unreported as FAILED/KILLED in MLflow.

    The reason recorded is the scheduler's state for the job (e.g. NODE_FAIL, OUT_OF_MEMORY).
    """
    marked = _reconcile(sweep, None, None, out)
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
) -> None:
    """Cancel running and queued runs (all, or those matching --only).

    Jobs save a checkpoint at the step boundary before they stop: launching again resumes them.
    """
    from diffsweep.launch.control import cancel as stop
    from diffsweep.launch.submit import launch_lock

    p = _plan(sweep, profile, executor, only, out, slurm, setup)
    with launch_lock(p.out, "cancel"):
        cancelled = stop(p)
    for r in cancelled:
        typer.echo(f"cancelled {r.run.name}")
    typer.echo(f"cancelled {len(cancelled)} runs")


@handle_errors
def logs(
    run: Annotated[str, typer.Argument(help="Run name or key (prefix), as shown by plan/status.", show_default=False)],
    sweep: Annotated[Path | None, typer.Option("--sweep", help="The run's sweep YAML (default: search runs/*/).",
                                               show_default=False)] = None,
    out: OutOpt = None,
    follow_: Annotated[bool, typer.Option("--follow", "-f", help="Keep printing until the job ends.")] = False,
) -> None:
    """Print a launched run's job logs (stdout, then stderr)."""
    from diffsweep.launch.control import find_entry, follow, log_files
    from diffsweep.launch.plan import output_dir
    from diffsweep.sweep import load_sweep

    if out is not None or sweep is not None:
        outs = [output_dir(load_sweep(sweep), out) if sweep is not None else out.absolute()]
    else:
        outs = sorted(p.parent for p in Path("runs").glob("*/ledger.json"))
    directory, entry = find_entry(run, outs)
    files = log_files(entry)
    if follow_:
        follow(directory, entry.key, files)
        return
    for f in files:
        if f.is_file():
            typer.echo(f.read_text(errors="replace"), nl=False)
