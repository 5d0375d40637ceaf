"""The ``diffsweep`` command line: one Typer app per group, composed here.

The CLI only parses, calls one library function and renders. Heavy imports (torch, mlflow)
happen inside commands, so ``diffsweep --help`` stays fast.
"""

from __future__ import annotations

import typer

from diffsweep import __version__
from diffsweep.cli import bench as bench_cli
from diffsweep.cli import compare as compare_cli
from diffsweep.cli import config as config_cli
from diffsweep.cli import data as data_cli
from diffsweep.cli import doctor as doctor_cli
from diffsweep.cli import eval as eval_cli
from diffsweep.cli import fit as fit_cli
from diffsweep.cli import model as model_cli
from diffsweep.cli import suggest as suggest_cli
from diffsweep.cli import sweep as sweep_cli
from diffsweep.cli import tracking as tracking_cli
from diffsweep.cli import train as train_cli
from diffsweep.cli.usage import Root

app = typer.Typer(
    name="diffsweep",
    help="Sweeps, Slurm launching, MLflow tracking and scaling-law fits for the Differential Transformer.",
    no_args_is_help=True,
    pretty_exceptions_enable=False,
    add_completion=False,
    cls=Root,  # usage errors in one line; every option's value checked (diffsweep/cli/usage.py)
)
app.add_typer(model_cli.app, name="model")
app.add_typer(config_cli.app, name="config")
app.add_typer(data_cli.app, name="data")
app.add_typer(bench_cli.app, name="bench")
app.command("train")(train_cli.train)
app.command("ui")(tracking_cli.ui)
app.command("server")(tracking_cli.server)
app.command("fit")(fit_cli.fit)
app.command("compare")(compare_cli.compare)
app.command("eval")(eval_cli.eval_)
app.command("doctor")(doctor_cli.doctor)
app.command("suggest")(suggest_cli.suggest)
for _name in ("plan", "launch", "status", "cancel", "logs", "reconcile"):
    app.command(_name)(getattr(sweep_cli, _name))


def _version(value: bool) -> None:
    if value:
        typer.echo(__version__)
        raise typer.Exit()


@app.callback()
def _root(
    version: bool = typer.Option(False, "--version", callback=_version, is_eager=True, help="Print the version."),
) -> None:
    """diffsweep: how many parameters and tokens does DIFF attention save, with what confidence?"""


def main() -> None:
    """Console-script entry point (and ``python -m diffsweep``'s, named the same in messages)."""
    from diffsweep.startup import command_process

    command_process()  # a command's start-up imports may be frozen out of the garbage collector
    app(prog_name="diffsweep")
