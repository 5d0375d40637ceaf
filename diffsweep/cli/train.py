"""``diffsweep train``: train one config, resumably, logging to MLflow."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Annotated

import typer

from diffsweep.cli.common import ArchOpt, ConfigArg, SetOpt, SizeOpt, cli_config, handle_errors

EXIT_DIVERGED = 4  # the run failed: non-finite loss or gradient norm (see the MLflow run's end reason)

OutOpt = Annotated[Path, typer.Option("--out", help="Runs directory; the run's is OUT/<run name>.")]
ExperimentOpt = Annotated[str, typer.Option("--experiment", help="MLflow experiment name.")]
ResumeOpt = Annotated[Path | None, typer.Option("--resume", help="Resume from this checkpoint (a step_XXXXXXXX "
                                                "directory; default: the run's newest, if any).", show_default=False)]
BranchOpt = Annotated[Path | None, typer.Option("--branch-from", help="Start from this checkpoint of another run (a "
                                                "cooldown branch: its config may differ only in the schedule's "
                                                "length and cooldown, and the two learning rates must agree up to "
                                                "the checkpoint's step); once the run has checkpoints of its own, it "
                                                "resumes from them.", show_default=False)]


@handle_errors(flags={"experiment": "--experiment", "out": "--out"})  # the store's field at fault, as the flag that sets it
def train(
    config: ConfigArg = None,
    size: SizeOpt = None,
    arch: ArchOpt = None,
    set_: SetOpt = None,
    out: OutOpt = Path("runs"),
    experiment: ExperimentOpt = "diffsweep",
    resume: ResumeOpt = None,
    branch_from: BranchOpt = None,
) -> None:
    """Train a model: picks up where the run directory's newest checkpoint left off.

    Exit status: 0 finished, 2 bad input, 3 missing GPU/package, 4 diverged, 75 preempted by
    SIGUSR2/SIGTERM after saving a checkpoint (run the same command again to continue).
    """
    from diffsweep.tracking.store import check_experiment_name

    check_experiment_name(experiment)  # before the store (which the run creates) exists
    _check_out(out)
    cfg = cli_config(config, size, arch, set_)  # before importing torch: bad input fails in a blink
    if resume is not None and branch_from is not None:
        from diffsweep.config import ConfigError

        raise ConfigError("--branch-from", "a run resumes from its own checkpoint (--resume) or starts from "
                          "another run's (--branch-from), not both")

    from diffsweep.config.identity import run_name
    from diffsweep.startup import imports_frozen
    from diffsweep.tracking.store import import_mlflow, tracking_uri
    from diffsweep.train.preemption import EXIT_PREEMPTED

    with imports_frozen():
        from diffsweep.train.trainer import Diverged
        from diffsweep.train.trainer import train as run_training

        import_mlflow(tracking_uri())

    run_dir = out / run_name(cfg)
    typer.echo(f"run {run_dir.name} -> {run_dir}")
    try:
        result = run_training(cfg, run_dir, experiment=experiment, resume_from=resume, branch_from=branch_from,
                              echo=lambda line: typer.echo(line))
    except Diverged as exc:
        typer.echo(f"error: diverged: {exc} (run marked FAILED; last good checkpoint kept)", err=True)
        raise typer.Exit(EXIT_DIVERGED) from None
    except KeyboardInterrupt:
        typer.echo("interrupted: run marked KILLED; the same command resumes from the newest checkpoint", err=True)
        raise typer.Exit(130) from None
    if result.status == "preempted":
        raise typer.Exit(EXIT_PREEMPTED)
    uri = tracking_uri()
    if not os.environ.get("MLFLOW_TRACKING_URI"):
        typer.echo("view the runs: diffsweep ui  (then open http://127.0.0.1:5000)")
    else:
        typer.echo(f"view the runs at {uri}")


def _check_out(out: Path) -> None:
    """``--out``: a folder for run directories, or a path where one can be made (no file on the way)."""
    from diffsweep.config import ConfigError

    blocking = next((p for p in (out, *out.absolute().parents) if p.exists()), None)
    if blocking is not None and not blocking.is_dir():
        where = "is not a directory" if blocking == out else f"lies under {blocking}, which is not a directory"
        raise ConfigError("out", f"{out} {where}; expected a folder for run directories")
