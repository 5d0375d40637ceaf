"""``launch --wait`` (and ``eval SWEEP --wait``): follow a sweep's runs until none is pending or
running, as progress bars on a terminal or plain lines otherwise; Ctrl-C stops the waiting (and
the local queue's runs, which save a checkpoint)."""

from __future__ import annotations

import contextlib
import signal
import time
from pathlib import Path
from typing import TYPE_CHECKING

import typer

from diffsweep.cli.common import fail

if TYPE_CHECKING:
    from collections.abc import Iterator

    from rich.console import Console

    from diffsweep.launch.api import SweepTarget
    from diffsweep.launch.progress import Snapshot
    from diffsweep.launch.scheduler import Scheduler

WAIT_EVERY_S = 30.0  # printing plain lines: how often the summary is repeated without a change
EXIT_INTERRUPTED = 130  # Ctrl-C (as train's and doctor's)


def wait_for_sweep(target: SweepTarget, sweep: Path, *, scheduler: Scheduler | None = None, again: str = "") -> None:
    """Until no run is pending or running: progress bars on a terminal, plain lines otherwise.
    Ctrl-C: one line on stderr, exit 130 (``_interrupted``; ``scheduler``: the launch's, whose
    jobs it may stop; ``again``: the options that name the sweep's output in the commands shown)."""
    from rich.console import Console

    from diffsweep.launch.api import watch_sweep

    console = Console()
    watch = _wait_bars if console.is_terminal else _wait_lines
    seen: list[Snapshot] = []

    def watched() -> Iterator[Snapshot]:
        for now in watch_sweep(target):
            seen[:] = [now]
            yield now

    try:
        last = watch(watched(), console)
    except KeyboardInterrupt:
        with contextlib.suppress(ValueError):  # (not in the main thread)
            signal.signal(signal.SIGINT, signal.SIG_IGN)  # stopping: another Ctrl-C must not cut it short
        typer.echo(f"launch: {_interrupted(target, sweep, scheduler, again, seen[-1] if seen else None)}", err=True)
        raise typer.Exit(EXIT_INTERRUPTED) from None
    if any(s != "done" for s in last.counts):
        fail(f"not every run finished ({last.summary()}); see `diffsweep status {sweep}`", 1)


def _interrupted(target: SweepTarget, sweep: Path, scheduler: Scheduler | None, again: str,
                 last: Snapshot | None) -> str:
    """Ctrl-C while waiting: on Slurm (jobs that outlive the launcher) only the waiting stops;
    the local queue's runs are stopped (``stop_sweep``: each saves a checkpoint) before it exits,
    so launching again resumes them (no ``scheduler``: only the waiting stops). What happened, as
    one line."""
    from diffsweep.config import ConfigError, EnvironmentUnavailable
    from diffsweep.launch.api import plan_sweep, stop_sweep
    from diffsweep.launch.progress import snapshot
    from diffsweep.launch.run_state import ACTIVE_STATES

    follow, stop = f"diffsweep status {sweep}{again}", f"diffsweep cancel {sweep}{again}"
    stops = scheduler is not None and scheduler.interrupt_stops_jobs
    try:
        if not stops:
            runs = (last or snapshot(plan_sweep(target))).runs
            active = sum(r.state in ACTIVE_STATES for r in runs)
            where = f" on {scheduler.label}" if scheduler is not None else ""
            return (f"stopped waiting; {active} run(s) still queued or running{where}: follow with {follow}, "
                    f"stop with {stop}")
        stopped = stop_sweep(target)
    except (ConfigError, EnvironmentUnavailable) as exc:  # e.g. another launch or cancel holds the sweep's lock
        what = "stop" if stops else "count"
        return f"interrupted; could not {what} the runs ({exc}): see {follow}, stop them with {stop}"
    still = set(stopped.stopping)
    running, queued = len(set(stopped.running) - still), len(set(stopped.queued) - still)
    parts = [f"{running} run(s) stopped after saving a checkpoint"] if running else []
    parts += [f"{queued} queued run(s) not started"] if queued else []
    parts += [f"{len(still)} still stopping ({follow} shows when they have)"] if still else []
    if not parts:
        return "interrupted; no run was pending or running"
    return f"interrupted; {', '.join(parts)}; launch again to resume"


def _wait_lines(snapshots: Iterator[Snapshot], console: Console) -> Snapshot:
    """Plain lines (logs, pipes): each state change, and the counts with each running run's step
    on a change or at most every WAIT_EVERY_S seconds."""
    from diffsweep.launch.progress import changes

    before, printed = None, 0.0
    for now in snapshots:
        stamp = time.strftime("%H:%M:%S")
        moved = changes(before, now)
        for line in moved:
            typer.echo(f"[{stamp}] {line}")
        if before is None or moved or not now.active or time.monotonic() - printed >= WAIT_EVERY_S:
            typer.echo(f"[{stamp}] {now.summary()}")
            for line in now.running_lines():
                typer.echo(line)
            printed = time.monotonic()
        before = now
    assert before is not None  # watch_sweep yields the sweep as it is first
    return before


def _wait_bars(snapshots: Iterator[Snapshot], console: Console) -> Snapshot:
    """rich progress bars (a terminal): the sweep's ended runs, and one bar per running run."""
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TaskID, TextColumn

    from diffsweep.launch.progress import changes, duration
    from diffsweep.launch.run_state import ACTIVE_STATES, RUNNING

    columns = (TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(), TextColumn("{task.fields[note]}"))
    with Progress(*columns, console=console) as bars:
        sweep_bar, before = bars.add_task("sweep", total=None, note=""), None
        run_bars: dict[str, TaskID] = {}
        for now in snapshots:
            for line in changes(before, now):
                bars.console.print(f"[{time.strftime('%H:%M:%S')}] {line}", markup=False, highlight=False)
            ended = sum(r.state not in ACTIVE_STATES for r in now.runs)
            bars.update(sweep_bar, completed=ended, total=len(now.runs), note=now.summary())
            running = {r.name: r for r in now.runs if r.state == RUNNING}
            for name in [n for n in run_bars if n not in running]:
                bars.remove_task(run_bars.pop(name))
            for name, r in running.items():
                if name not in run_bars:
                    run_bars[name] = bars.add_task(f"  {name}", total=r.total, note="")
                bars.update(run_bars[name], completed=r.step or 0, total=r.total,
                            note=f"~{duration(r.hours_left)} left")
            before = now
    assert before is not None  # watch_sweep yields the sweep as it is first
    return before
