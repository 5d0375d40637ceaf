"""``diffsweep fit`` on input it must refuse, or clean, before anything is written or logged: a
CSV path that is a folder, numbers no run can have, names that would break MLflow's search filter,
and tracking stores it cannot use. Each refusal is one line, exit 2, within seconds."""

from __future__ import annotations

import json
import math
import re
import shutil
import socket
import sqlite3
import time

import numpy as np
import pytest

from diffsweep.config import ConfigError
from diffsweep.scaling.table import COUNT_COLUMNS, from_csv
from tests.helpers.badinput import refused
from tests.helpers.cli import run
from tests.scaling.synthetic import ladder

FAST = 60.0  # seconds: a hang guard, not a benchmark (an unchecked store retried for minutes; a refusal
# takes ~2 s, 25-35 s on a 2-core machine at load 12)


@pytest.fixture
def points():
    return ladder(noise_sd=0.003, seeds=2, rng=np.random.default_rng(1))


def refuses(tmp_path, *args: str, env: dict | None = None, needles: tuple[str, ...] = ()):
    """Run ``fit ARGS --out out`` in ``tmp_path``: one line naming ``needles``, quickly, and no
    fit folder and no MLflow store left behind."""
    before = sorted(p.name for p in tmp_path.iterdir())
    start = time.monotonic()
    r = run("fit", *args, "--out", "out", cwd=tmp_path, env=env)
    elapsed = time.monotonic() - start
    refused(r, *needles)
    assert elapsed < FAST, f"took {elapsed:.1f} s"
    assert sorted(p.name for p in tmp_path.iterdir()) == before
    return r


def no_nan(text: str) -> dict:
    """Parse JSON, failing on NaN or Infinity anywhere in it."""
    def refuse(token: str):
        raise AssertionError(f"{token} in the fit's JSON")
    return json.loads(text, parse_constant=refuse)


def test_a_csv_whose_lr_is_not_a_number_is_refused_naming_the_column(tmp_path, new_store, points):
    points["lr"] = "3e-4"
    points.loc[3, "lr"] = "fast"
    points.to_csv(tmp_path / "p.csv", index=False)
    refuses(tmp_path, "--csv", "p.csv", env=new_store, needles=("p.csv: lr", "expected a number (or nothing)"))
    points["lr"] = np.nan  # blank: unknown, not compared
    points.loc[3, "lr"] = 3e-4
    points.to_csv(tmp_path / "p.csv", index=False)
    r = run("fit", "--csv", "p.csv", "--no-log", "--boot", "50", "--out", "ok", cwd=tmp_path, env=new_store)
    assert r.returncode == 0, r.stderr


def test_a_csv_that_is_a_directory_is_refused(tmp_path, new_store):
    (tmp_path / "points.csv").mkdir()
    refuses(tmp_path, "--csv", "points.csv", env=new_store, needles=("points.csv", "is a directory"))


@pytest.mark.parametrize(("column", "value"), [("num_params", 1e305), ("tokens", 0.0),
                                             ("num_non_embedding_params", math.nan)])
def test_a_count_no_run_can_have_is_refused_naming_column_and_line(tmp_path, new_store, points, column, value):
    points.loc[3, column] = value
    points.to_csv(tmp_path / "p.csv", index=False)
    r = refuses(tmp_path, "--csv", "p.csv", env=new_store,
                needles=(f"p.csv: {column}", "line 5", points.loc[3, "run_name"]))
    assert "from 1 to 1e+18" in r.stderr


@pytest.mark.parametrize("column", COUNT_COLUMNS)
@pytest.mark.parametrize("value", [1e305, 1e19, 0.0, 0.5, -5.0, 1e-320, math.nan, math.inf])
def test_every_count_column_refuses_every_impossible_value(tmp_path, points, column, value):
    points.loc[7, column] = value
    points.to_csv(tmp_path / "p.csv", index=False)
    with pytest.raises(ConfigError, match=rf"p\.csv: {column}: .* on line 9 "):
        from_csv(tmp_path / "p.csv")


def test_counts_at_the_limits_and_unused_rows_of_a_frozen_table_are_accepted(tmp_path, points):
    points.loc[0, "tokens"], points.loc[1, "num_params"] = 1.0, 1e18
    points["used"], points["reason"] = True, ""
    points.loc[2, ["num_params", "used", "reason"]] = [0.0, False, "dropped"]  # not refitted, so not checked
    points.to_csv(tmp_path / "p.csv", index=False)
    assert len(from_csv(tmp_path / "p.csv")) == len(points) - 1


@pytest.mark.parametrize("value", [1e305, 1e-320], ids=["1e305", "1e-320"])
def test_an_absurd_loss_is_dropped_with_a_warning_and_the_fit_stays_finite(tmp_path, points, value):
    points.loc[3, "loss"] = value
    points.to_csv(tmp_path / "p.csv", index=False)
    r = run("fit", "--csv", "p.csv", "--boot", "100", "--json", "--no-log", "--out", "out", cwd=tmp_path)
    assert r.returncode == 0, r.stderr
    result = no_nan(r.stdout)
    assert result["points_used"] == len(points) - 1
    assert any("dropped 1 point" in w and points.loc[3, "run_name"] in w for w in result["warnings"])
    no_nan((tmp_path / "out" / "fit.json").read_text())
    figures = [line for line in (tmp_path / "out" / "report.md").read_text().splitlines() if "dropped" not in line]
    assert not re.search(r"\b(nan|inf|infinity)\b", "\n".join(figures), flags=re.IGNORECASE), figures
    ratio = result["ratios"][0]
    assert 0.4 < ratio["ratio"] < 0.8 and ratio["lo"] < ratio["ratio"] < ratio["hi"]  # the truth is 0.62


def test_every_loss_absurd_is_refused(tmp_path, new_store, points):
    points["loss"] = 1e305
    points.to_csv(tmp_path / "p.csv", index=False)
    refuses(tmp_path, "--csv", "p.csv", env=new_store, needles=("loss", "outside"))


@pytest.mark.parametrize("args", [["--noise-sd", "1e305"], ["--noise-sd", "nan"], ["--at", "1e400"]],
                         ids=lambda a: " ".join(a))
def test_extreme_flag_values_are_refused(tmp_path, store, points, args):
    points.to_csv(tmp_path / "p.csv", index=False)
    refuses(tmp_path, "--csv", "p.csv", *args, env=store, needles=(args[0],))


@pytest.mark.parametrize("name", ["x' OR '1'='1", "with space"], ids=["quote", "space"])
def test_a_sweep_name_outside_the_sweep_alphabet_is_refused(tmp_path, mlflow_store, name):
    refuses(tmp_path, "--experiment", "warm-up", "--sweep", name, env={"MLFLOW_TRACKING_URI": mlflow_store},
            needles=("--sweep", "A-Za-z0-9._-"))


def test_quotes_in_experiment_and_where_values_are_plain_text(tmp_path, mlflow_store):
    env = {"MLFLOW_TRACKING_URI": mlflow_store}
    refuses(tmp_path, "--experiment", "it's", env=env, needles=("--experiment", "it's"))
    refuses(tmp_path, "--experiment", "warm-up", "--where", "tags.x=a' OR '1'='1", env=env,
            needles=("--where", "no runs match"))


# -- tracking stores -----------------------------------------------------------------------------

def closed_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]  # closed again when this returns: connections are refused


def bad_store(kind: str, tmp_path) -> str:
    if kind == "unreachable":
        return f"http://127.0.0.1:{closed_port()}"
    if kind == "scheme":
        return "foo://x"
    (tmp_path / "notes.txt").write_text("not a database\n")
    return f"sqlite:///{tmp_path / 'notes.txt'}"


@pytest.mark.parametrize("kind", ["unreachable", "scheme", "not-a-database"])
@pytest.mark.parametrize("source", ["csv", "experiment"])
def test_an_unusable_tracking_store_is_one_line_naming_it(tmp_path, points, kind, source):
    points.to_csv(tmp_path / "p.csv", index=False)
    env = {"MLFLOW_TRACKING_URI": bad_store(kind, tmp_path)}
    args = ["--csv", "p.csv"] if source == "csv" else ["--experiment", "demo"]
    refuses(tmp_path, *args, env=env, needles=("MLFLOW_TRACKING_URI",))


def test_a_csv_fit_without_logging_does_not_need_the_store(tmp_path, points):
    points.to_csv(tmp_path / "p.csv", index=False)
    env = {"MLFLOW_TRACKING_URI": f"http://127.0.0.1:{closed_port()}"}
    r = run("fit", "--csv", "p.csv", "--no-log", "--boot", "100", "--out", "out", cwd=tmp_path, env=env)
    assert r.returncode == 0, r.stderr
    assert (tmp_path / "out" / "report.md").is_file()


def test_a_store_made_by_another_mlflow_version_is_one_line_saying_what_to_do(tmp_path, mlflow_store):
    (tmp_path / "store").mkdir()  # the store's lock file appears beside it (tracking.store's lock)
    db = tmp_path / "store" / "mlflow.db"
    shutil.copy(mlflow_store.removeprefix("sqlite:///"), db)
    with sqlite3.connect(db) as connection:
        connection.execute("UPDATE alembic_version SET version_num = 'ffffffffffff'")
    connection.close()
    refuses(tmp_path, "--experiment", "warm-up", env={"MLFLOW_TRACKING_URI": f"sqlite:///{db}"},
            needles=("MLFLOW_TRACKING_URI", "schema version ffffffffffff", "mlflow db upgrade"))
