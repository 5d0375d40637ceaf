"""``diffsweep ui`` as a user runs it: two real tiny training runs, the UI started on their store,
both runs visible in a real (headless) Chromium, Ctrl-C stopping it cleanly; and its errors."""

from __future__ import annotations

import json
import re
import shutil
import signal
import socket
import sqlite3
import subprocess
import time
from pathlib import Path

import pytest

from tests.browser import (
    expect_artifact_visible,
    expect_model_training_view,
    expect_runs_visible,
    free_port,
    port_free,
    run_url,
    ui_server,
)
from tests.helpers.badinput import refused
from tests.helpers.cli import run

from ..conftest import TINY_RUN

# One xdist group: one worker trains the project and starts Chromium (tests/scaling/test_fit_ui.py, the
# other browser test, runs in the mini_ladder group, on the worker that has the ladder).
pytestmark = pytest.mark.xdist_group("browser")

KINDS = ("transformer", "diff_v1")
RUNS_PAGE = r"http://127\.0\.0\.1:{port}/#/experiments/\d+/runs\?workflowType=machine_learning"


def diffsweep(*args: str, cwd: Path, **extra_env: str) -> subprocess.CompletedProcess:
    """``diffsweep ARGS`` in this process, for a user without MLFLOW_TRACKING_URI (the store is
    ./mlflow.db) unless ``extra_env`` sets it."""
    env: dict = {"MLFLOW_TRACKING_URI": None, "MLFLOW_DISABLE_TELEMETRY": "true"} | extra_env  # None: unset
    return run(*args, cwd=cwd, env=env)


@pytest.fixture(scope="module")
def project(tmp_path_factory, text_dataset, store_template) -> dict:
    """A directory where `diffsweep train` made two tiny runs (transformer, DIFF V1) in ./mlflow.db
    (a copy of the session's empty store: how a store is created is tests/cli/test_train_store.py's);
    maps each MLflow run name to its run id."""
    root = tmp_path_factory.mktemp("project")
    shutil.copyfile(store_template, root / "mlflow.db")
    runs = {}
    for kind in KINDS:  # one after the other: a new SQLite store must not be created concurrently
        sets = [*TINY_RUN, "train.max_steps=4", f"data.path={text_dataset}", f"model.attention.kind={kind}"]
        result = diffsweep("train", *(f"--set={s}" for s in sets), cwd=root)
        assert result.returncode == 0, result.stdout + result.stderr
        name = re.search(r"^run (\S+) -> ", result.stdout, re.M)[1]
        runs[name] = json.loads((root / "runs" / name / "run.json").read_text())["run_id"]
    assert (root / "mlflow.db").is_file()
    return {"root": root, "runs": runs}


@pytest.mark.browser
@pytest.mark.slow
def test_both_training_runs_show_in_a_real_browser_and_ctrl_c_stops_the_ui(project, page, tmp_path):
    port = free_port()
    with ui_server(project["root"], port=port, experiment="diffsweep") as ui:
        assert ui.url == f"http://127.0.0.1:{port}"
        assert re.fullmatch(RUNS_PAGE.format(port=port), ui.experiment_url)
        assert f"store: sqlite:///{project['root'] / 'mlflow.db'}" in ui.lines[0]

        expect_runs_visible(page, ui.experiment_url, list(project["runs"]), screenshot=tmp_path / "runs.png")
        expect_model_training_view(page)  # not MLflow 3's default GenAI view
        # artifacts logged straight to the SQLite store (local mlruns/ paths) are served too
        name, run_id = next(iter(project["runs"].items()))
        expect_artifact_visible(page, run_url(ui.experiment_url, run_id), "config.yaml", text="vocab_size",
                                screenshot=tmp_path / "artifact.png")

        start = time.monotonic()
        rc = ui.stop(signal.SIGINT, timeout=30)
        stopped_after = time.monotonic() - start
        stderr = ui.proc.stderr.read()
    assert rc == 0, stderr
    assert "Traceback" not in stderr, stderr
    assert ui.lines[-1] == "MLflow UI stopped"
    assert stopped_after < 15, f"took {stopped_after:.1f} s to stop"
    assert port_free(port), f"port {port} still taken after the UI stopped"


def test_sigterm_stops_the_ui_and_its_server_and_a_tracking_server_uri_is_printed_not_served(project, tmp_path):
    """SIGTERM stops `diffsweep ui` and its MLflow server. Before that, while it serves, that real
    MLflow server on the project's store is what MLFLOW_TRACKING_URI names for a second `diffsweep ui`:
    its URL and the experiment's page are printed, nothing is started or written."""
    port = free_port()
    with ui_server(project["root"], port=port) as ui:
        result = diffsweep("ui", "--experiment", "diffsweep", cwd=tmp_path, MLFLOW_TRACKING_URI=f"{ui.url}/")
        rc = ui.stop(signal.SIGTERM, timeout=30)
    assert result.returncode == 0, result.stderr
    lines = result.stdout.splitlines()
    assert lines[0].startswith(f"MLflow UI: {ui.url}  "), lines
    assert re.fullmatch(rf"experiment diffsweep: {RUNS_PAGE.format(port=port)}", lines[1]), lines
    assert list(tmp_path.iterdir()) == []
    assert rc == 0, ui.proc.stderr.read()
    assert port_free(port)
    # without --experiment, every experiment's runs page is printed (MLflow's empty Default aside)
    links = [line for line in ui.lines if line.startswith("experiment ")]
    assert len(links) == 1 and re.fullmatch(rf"experiment diffsweep: {RUNS_PAGE.format(port=port)}", links[0]), ui.lines


def test_missing_store_is_a_one_line_error_and_creates_nothing(tmp_path):
    result = diffsweep("ui", "--port", str(free_port()), cwd=tmp_path)
    refused(result, str(tmp_path / "mlflow.db"), "no runs there yet")
    assert not (tmp_path / "mlflow.db").exists()

    elsewhere = tmp_path / "nowhere" / "store.db"
    result = diffsweep("ui", cwd=tmp_path, MLFLOW_TRACKING_URI=f"sqlite:///{elsewhere}")
    refused(result, str(elsewhere))
    assert list(tmp_path.iterdir()) == []


def test_port_in_use_is_a_one_line_error(tmp_path):
    (tmp_path / "mlflow.db").touch()  # the port is checked before the server starts: any file will do
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        result = diffsweep("ui", "--port", str(port), cwd=tmp_path)
    refused(result, f"port {port}", "--port")


def closed_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]  # closed again when this returns: connections are refused


@pytest.mark.parametrize("kind", ["unreachable", "scheme", "not-a-database"])
def test_an_unusable_tracking_uri_is_one_line_naming_it_and_starts_nothing(tmp_path, kind):
    if kind == "not-a-database":
        (tmp_path / "notes.txt").write_text("not a database\n")
    uri = {"unreachable": f"http://127.0.0.1:{closed_port()}", "scheme": "foo://x",
           "not-a-database": f"sqlite:///{tmp_path / 'notes.txt'}"}[kind]
    before = sorted(tmp_path.iterdir())
    port = free_port()
    start = time.monotonic()
    result = diffsweep("ui", "--port", str(port), cwd=tmp_path, MLFLOW_TRACKING_URI=uri)
    elapsed = time.monotonic() - start
    refused(result, "MLFLOW_TRACKING_URI")
    assert elapsed < 15, f"took {elapsed:.1f} s"
    assert sorted(tmp_path.iterdir()) == before and port_free(port)


def test_unknown_experiment_is_a_one_line_error_naming_the_known_ones(project):
    port = free_port()
    result = diffsweep("ui", "--port", str(port), "--experiment", "nope", cwd=project["root"])
    refused(result, "'nope'", "diffsweep")
    assert port_free(port)


def test_a_server_that_dies_at_start_is_reported_with_its_output(project, tmp_path):
    # a store whose schema is another MLflow version's: the server refuses it as it starts
    shutil.copy(project["root"] / "mlflow.db", tmp_path / "mlflow.db")
    with sqlite3.connect(tmp_path / "mlflow.db") as db:
        db.execute("UPDATE alembic_version SET version_num = 'ffffffffffff'")
    db.close()
    result = diffsweep("ui", "--port", str(free_port()), cwd=tmp_path)
    assert result.returncode == 1, result.stderr
    assert result.stderr.startswith("error: the MLflow server exited with status"), result.stderr
    assert "  | " in result.stderr  # its last output lines
    assert "Traceback (most recent call last)" not in result.stderr.splitlines()[0]
