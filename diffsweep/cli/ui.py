"""``diffsweep ui``: the MLflow UI on the store the training runs log to."""

from __future__ import annotations

from typing import Annotated

import typer

from diffsweep.cli.common import fail, handle_errors

HostOpt = Annotated[str, typer.Option("--host", help="Interface to bind (0.0.0.0 exposes it to the network).")]
PortOpt = Annotated[int, typer.Option("--port", min=1, max=65535, help="Port to serve on.")]
ExperimentOpt = Annotated[str | None, typer.Option(
    "--experiment", help="Print only this experiment's runs page (e.g. diffsweep; default: every experiment's).",
    show_default=False)]


@handle_errors(flags={"experiment": "--experiment"})
def ui(host: HostOpt = "127.0.0.1", port: PortOpt = 5000, experiment: ExperimentOpt = None) -> None:
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
