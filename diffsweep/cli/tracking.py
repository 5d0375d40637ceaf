"""``diffsweep ui`` and ``diffsweep server``: the MLflow UI on the store the training runs log to,
and the MLflow tracking server a cluster's jobs log to (run it on the login node)."""

from __future__ import annotations

from typing import Annotated

import typer

from diffsweep.cli.common import fail, handle_errors

UiHostOpt = Annotated[str, typer.Option("--host", help="Interface to bind (0.0.0.0 exposes it to the network).")]
PortOpt = Annotated[int, typer.Option("--port", min=1, max=65535, help="Port to serve on.")]
ExperimentOpt = Annotated[str | None, typer.Option(
    "--experiment", help="Print only this experiment's runs page (e.g. diffsweep; default: every experiment's).",
    show_default=False)]


@handle_errors(flags={"experiment": "--experiment"})
def ui(host: UiHostOpt = "127.0.0.1", port: PortOpt = 5000, experiment: ExperimentOpt = None) -> None:
    """Browse the runs: start the MLflow UI on this project's store until Ctrl-C.

    The store is the one training logs to: MLFLOW_TRACKING_URI if set, else ./mlflow.db.

    Each experiment's runs page is printed, in MLflow's Model training view.

    An http(s) MLFLOW_TRACKING_URI is a server already: its URLs are printed and nothing starts.

    Exit status: 0 stopped by Ctrl-C/SIGTERM, 1 the server failed, 2 no store yet, an unusable
    MLFLOW_TRACKING_URI (unreachable server, unknown scheme, not a database) or port in use.
    """
    from diffsweep.tracking.store import tracking_uri
    from diffsweep.tracking.ui import UiError, serve

    try:
        serve(tracking_uri(), host=host, port=port, experiment=experiment, echo=typer.echo)
    except UiError as exc:
        fail(str(exc), exc.code)


StoreOpt = Annotated[str | None, typer.Option(
    "--backend-store-uri", help="The database to serve: sqlite:////PATH/mlflow.db on this machine's own disk, or "
    "postgresql://... / mysql://... (default: SQLite in $XDG_DATA_HOME/diffsweep, else ~/.local/share/diffsweep).",
    show_default=False)]
ArtifactsOpt = Annotated[str | None, typer.Option(
    "--artifacts-destination", help="Where artifacts uploaded through the server go: a directory or s3://... "
    "(default: mlartifacts/ beside an SQLite store).", show_default=False)]
ServerHostOpt = Annotated[str | None, typer.Option(
    "--host", help="Interface to bind, and the name jobs reach it by (default: this machine's host name; 0.0.0.0: "
    "every interface).", show_default=False)]
WorkersOpt = Annotated[int, typer.Option(
    "--workers", min=1, help="Server worker processes (one serves SQLite best: its writes are one at a time).")]


@handle_errors(flags={"MLFLOW_TRACKING_URI": "--backend-store-uri"})
def server(store: StoreOpt = None, artifacts: ArtifactsOpt = None, host: ServerHostOpt = None, port: PortOpt = 5000,
           workers: WorkersOpt = 1) -> None:
    """Serve MLflow tracking to a cluster's jobs from this (login) node until Ctrl-C.

    SQLite on a shared network file system is unsafe when many jobs write at once; with this
    server the jobs log over HTTP and one process writes the database. Once the server answers,
    it prints the line to run in the shell you launch from:

        export MLFLOW_TRACKING_URI=http://HOST:PORT

    Keep it running while jobs run (in tmux or screen, or with nohup). Anyone who can reach the
    port can read and write runs: MLflow's server has no login here.

    Exit status: 0 stopped by Ctrl-C/SIGTERM, 1 the server failed, 2 port in use or an unusable
    --backend-store-uri.
    """
    from diffsweep.tracking.server import run_server
    from diffsweep.tracking.ui import UiError

    def note(line: str) -> None:
        typer.echo(line, err=True)

    try:
        run_server(store, artifacts=artifacts, host=host, port=port, workers=workers, echo=typer.echo, warn=note)
    except UiError as exc:
        fail(str(exc), exc.code)
