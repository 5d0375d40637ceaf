"""``diffsweep doctor``: check the cluster and the configuration a launch would use, one line per check."""

from __future__ import annotations

import contextlib
import signal
from pathlib import Path
from typing import Annotated

import typer

from diffsweep.cli.common import JsonOpt, handle_errors, name_choice, print_json
from diffsweep.cli.sweep import SetupOpt, SlurmOpt
from diffsweep.launch.scheduler import scheduler_names

EXIT_FAILED = 1  # a check failed (2: bad input, as every command)
EXIT_INTERRUPTED = 130  # Ctrl-C: the jobs doctor submitted were cancelled (as train's 130)


@handle_errors(flags={"timeout_s": "--timeout", "out": "--out"})
def doctor(
    profile: Annotated[str | None, typer.Option("--profile", help="Cluster profile: a name in slurm/profiles/ or a "
                                                "YAML path (default: Slurm's if a controller answers).",
                                                show_default=False)] = None,
    executor: Annotated[str | None, name_choice(scheduler_names, "--executor", "Check this scheduler with its "
                                                "default profile (local: this machine).", show_default=False)] = None,
    slurm: SlurmOpt = None,
    setup: SetupOpt = None,
    out: Annotated[Path, typer.Option("--out", help="Runs directory whose file system is checked "
                                      "(doctor's files go under OUT/.doctor, removed when all pass).")] = Path("runs"),
    preempt: Annotated[bool, typer.Option("--preempt", help="Also preempt a tiny training job and check it is "
                                          "requeued and resumes its MLflow run (a few minutes).")] = False,
    timeout: Annotated[float, typer.Option("--timeout", min=1, help="Seconds a probe job may take to start and "
                                           "end (--preempt: at least 300).")] = 120.0,
    json_: JsonOpt = False,
) -> None:
    """Self-test: Slurm and accounting answer, the profile's partition and GPUs exist, 1- and 2-task
    jobs start, see their GPUs and all-reduce, the run directory is shared, and the MLflow store
    takes writes from a compute node. Exit 0 when every check passes, 1 when one fails; on Ctrl-C
    the jobs it submitted are cancelled (exit 130)."""
    from diffsweep.launch.doctor.checks import doctor_profile, run_doctor

    def show(check) -> None:  # noqa: ANN001
        if not json_:
            typer.echo(check.render())

    try:
        chosen = doctor_profile(profile, executor, slurm or [], setup or [])
        if not json_:
            typer.echo(f"diffsweep doctor: profile {chosen.name} (executor {chosen.executor})")
        report = run_doctor(chosen, out, preempt=preempt, timeout_s=timeout, echo=show)
    except KeyboardInterrupt as exc:  # run_doctor's DoctorInterrupted once it had submitted jobs
        with contextlib.suppress(ValueError):  # (not in the main thread)
            signal.signal(signal.SIGINT, signal.SIG_IGN)  # exiting: another Ctrl-C changes nothing now
        cancelled, problem = getattr(exc, "cancelled", []), getattr(exc, "problem", "")
        jobs = f"cancelled job(s) {', '.join(cancelled)}" if cancelled else "no job to cancel"
        typer.echo(f"doctor: interrupted; {jobs}" + (f"; {problem}" if problem else ""), err=True)
        raise typer.Exit(EXIT_INTERRUPTED) from None
    if json_:
        print_json(report.to_dict())
    else:
        failed = [c for c in report.checks if not c.ok]
        kept = f"; doctor's job files are in {report.workdir}" if report.workdir else ""
        typer.echo(f"all {len(report.checks)} checks passed" if not failed else
                   f"{len(failed)} of {len(report.checks)} checks failed{kept}")
    if not report.ok:
        raise typer.Exit(EXIT_FAILED)
