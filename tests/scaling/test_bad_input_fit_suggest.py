"""``diffsweep fit`` and ``suggest`` on malformed input, as a user meets it (issue #29): one ``error:``
line naming the file, column, line or field, exit 2, no traceback, and nothing created, changed or
deleted, the user's files above all (``fit --out`` writes only into a new or empty folder, or over
an earlier fit's outputs). The CLI runs in this process (tests/helpers/cli.run): what is tested is
what the command does, not the process around it."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from tests.helpers.badinput import refused, untouched
from tests.helpers.cli import run
from tests.scaling.synthetic import ladder

FAST = ("--no-log", "--boot", "50")  # nothing to log, few draws: the refusals are what is tested


def _points() -> pd.DataFrame:
    frame = ladder(noise_sd=0.003, seeds=2, rng=np.random.default_rng(1))
    return frame[["arch", "num_params", "tokens", "loss", "seed", "run_name"]]


@pytest.fixture
def csv(tmp_path) -> Path:
    path = tmp_path / "p.csv"
    _points().to_csv(path, index=False)
    return path


def _edit(path: Path, line: int, column: str, value: str) -> None:
    """Set one cell of the CSV at ``path`` (line 1 is the header) to the text ``value``."""
    rows = [r.split(",") for r in path.read_text().splitlines()]
    rows[line - 1][rows[0].index(column)] = value
    path.write_text("\n".join(",".join(r) for r in rows) + "\n")


@pytest.fixture(scope="module")
def fit_folder(tmp_path_factory) -> Path:
    """A fit's outputs (fit.json, points.csv, report.md, plots/), made in-process once."""
    from diffsweep.scaling.analysis import FitRequest
    from diffsweep.scaling.pipeline import Source, run_fit

    root = tmp_path_factory.mktemp("fit")
    _points().to_csv(root / "p.csv", index=False)
    run_fit(Source(uri="", csv=root / "p.csv"), FitRequest(n_boot=50), root / "fit", log=False)
    return root / "fit"


# -- fit --csv --------------------------------------------------------------------------------------


def test_a_repeated_column_is_refused_naming_file_and_column(tmp_path, csv):
    lines = csv.read_text().splitlines()
    csv.write_text("\n".join([lines[0].replace("seed", "loss"), *lines[1:]]) + "\n")  # loss twice
    with untouched(tmp_path):
        r = run("fit", "--csv", "p.csv", *FAST, cwd=tmp_path)
    refused(r, "p.csv: loss", "2 times")


@pytest.mark.parametrize("column", ["arch", "loss", "num_params", "tokens"])
def test_an_empty_required_cell_names_file_line_and_column(tmp_path, csv, column):
    _edit(csv, 5, column, "")
    with untouched(tmp_path):
        r = run("fit", "--csv", "p.csv", *FAST, cwd=tmp_path)
    refused(r, f"p.csv: {column}", "empty cell on line 5", "transformer-1.4e+09-s1")


@pytest.mark.parametrize(("column", "value", "needles"), [
    ("num_params", "big", ("p.csv: num_params", "'big' on line 4")),
    ("tokens", "-5", ("p.csv: tokens", "-5 on line 4")),
    ("tokens", "0", ("p.csv: tokens", "0 on line 4")),
    ("arch", "$\\oops$", ("p.csv: arch", "line 4")),  # would break the plot legends' math text
    ("arch", "diff/v1", ("p.csv: arch", "'diff/v1'")),  # would nest MLflow metric names
    ("point", "middle", ("p.csv: point", "'middle' on line 4")),
    ("used", "maybe", ("p.csv: used", "'maybe' on line 4")),
], ids=lambda v: v if isinstance(v, str) else None)
def test_a_cell_no_run_can_have_is_refused_naming_file_line_and_column(tmp_path, csv, column, value, needles):
    if column in ("point", "used"):  # optional columns: add them
        frame = pd.read_csv(csv).assign(**{column: "final" if column == "point" else True})
        frame.to_csv(csv, index=False)
    _edit(csv, 4, column, value)
    with untouched(tmp_path):
        r = run("fit", "--csv", "p.csv", *FAST, cwd=tmp_path)
    refused(r, *needles)


@pytest.mark.parametrize("case", ["header-only", "more-cells-than-header", "empty-file"])
def test_a_csv_without_a_table_is_refused(tmp_path, csv, case):
    lines = csv.read_text().splitlines()
    text = {"header-only": lines[0] + "\n", "more-cells-than-header": "\n".join([lines[0], lines[1] + ",9", *lines[2:]]),
            "empty-file": ""}[case]
    csv.write_text(text)
    with untouched(tmp_path):
        r = run("fit", "--csv", "p.csv", *FAST, cwd=tmp_path)
    refused(r, "p.csv")


def test_a_byte_order_mark_and_an_inf_loss_are_read_as_meant(tmp_path, csv):
    """Not refusals: a BOM (Excel's UTF-8) is not part of the first column's name, and an explicit
    inf loss is a diverged run, dropped with a warning naming it."""
    _edit(csv, 5, "loss", "inf")
    csv.write_text(csv.read_text(), encoding="utf-8-sig")
    r = run("fit", "--csv", "p.csv", *FAST, "--json", "--out", "out", cwd=tmp_path)
    assert r.returncode == 0, r.stderr
    result = json.loads(r.stdout)
    assert result["points_used"] == len(_points()) - 1
    assert any("transformer-1.4e+09-s1 (inf)" in w for w in result["warnings"])


@pytest.mark.parametrize(("args", "flag"), [
    (["--boot", "10"], "--boot"), (["--boot", "1000000"], "--boot"), (["--boot", "-1"], "--boot"),
    (["--seed", "-1"], "--seed"), (["--level", "1"], "--level"), (["--level", "0.2"], "--level"),
    (["--noise-sd", "0"], "--noise-sd"), (["--run-sd", "-0.1"], "--run-sd"), (["--at", "0"], "--at"),
    (["--at", "-3B"], "--at"),
], ids=lambda v: " ".join(v) if isinstance(v, list) else None)
def test_a_number_option_out_of_range_is_refused(tmp_path, csv, args, flag):
    with untouched(tmp_path):
        r = run("fit", "--csv", "p.csv", "--no-log", *args, cwd=tmp_path)
    refused(r, flag)


def test_a_refused_fit_creates_no_store(tmp_path, csv):
    _edit(csv, 3, "arch", "")
    with untouched(tmp_path):  # logging on: the store is checked, but not created, before the CSV
        r = run("fit", "--csv", "p.csv", cwd=tmp_path, env={"MLFLOW_TRACKING_URI": f"sqlite:///{tmp_path}/m.db"})
    refused(r, "p.csv: arch")


# -- fit --out: never the user's files ---------------------------------------------------------------


@pytest.mark.parametrize("case", ["the-input", "holds-the-input", "user-folder", "fit-plus-user-file", "user-plots",
                                  "fake-fit-json", "link"])
def test_out_never_replaces_what_fit_did_not_write(tmp_path, csv, fit_folder, case):
    out = tmp_path / "out"
    if case == "the-input":
        out = csv
    elif case == "holds-the-input":
        out = tmp_path
    elif case == "user-folder":
        out.mkdir()
        (out / "notes.txt").write_text("mine\n")
    elif case == "fit-plus-user-file":  # an earlier fit's folder the user added to
        shutil.copytree(fit_folder, out)
        (out / "my-notes.md").write_text("mine\n")
    elif case == "user-plots":
        shutil.copytree(fit_folder, out)
        (out / "plots" / "figure-1.pdf").write_bytes(b"%PDF")
    elif case == "fake-fit-json":  # a fit's file names, not a fit's document
        out.mkdir()
        (out / "fit.json").write_text('{"mine": 1}\n')
        (out / "report.md").write_text("my report\n")
    elif case == "link":
        (tmp_path / "elsewhere").mkdir()
        out.symlink_to(tmp_path / "elsewhere")
    with untouched(tmp_path):
        r = run("fit", "--csv", "p.csv", *FAST, "--out", str(out), cwd=tmp_path)
    refused(r, "--out", str(out))


def test_out_replaces_an_earlier_fit_and_fills_an_empty_folder(tmp_path, csv, fit_folder):
    shutil.copytree(fit_folder, tmp_path / "earlier")
    (tmp_path / "empty").mkdir()
    (tmp_path / "empty").chmod(0o750)
    for out in ("earlier", "empty"):
        r = run("fit", "--csv", "p.csv", *FAST, "--out", out, cwd=tmp_path)
        assert r.returncode == 0, r.stderr
        assert sorted(p.name for p in (tmp_path / out).iterdir()) == ["fit.json", "plots", "points.csv", "report.md"]
    assert (tmp_path / "empty").stat().st_mode & 0o777 == 0o750  # the user's folder itself is kept
    assert sorted(p.name for p in tmp_path.iterdir()) == ["earlier", "empty", "p.csv"]  # no staging left behind


def test_refitting_a_frozen_table_into_its_own_folder_is_refused(tmp_path, fit_folder):
    shutil.copytree(fit_folder, tmp_path / "fit")
    with untouched(tmp_path):
        r = run("fit", "--csv", "fit/points.csv", *FAST, "--out", "fit", cwd=tmp_path)
    refused(r, "--out", "fit/points.csv")


# -- suggest: a fit folder read back -----------------------------------------------------------------


def _damage(doc: dict, case: str) -> str | dict:
    """fit.json damaged as ``case``: the new document, or text."""
    doc = json.loads(json.dumps(doc))
    edits = {
        "level-5": lambda: doc.update(level=5), "level-nan": lambda: doc.update(level=float("nan")),
        "level-text": lambda: doc.update(level="high"), "no-level": lambda: doc.pop("level"),
        "no-baseline": lambda: doc.pop("baseline"), "baseline-number": lambda: doc.update(baseline=3),
        "candidates-text": lambda: doc.update(candidates="diff_v1"),
        "candidate-unknown": lambda: doc.update(candidates=["mamba"]),
        "axis": lambda: doc.update(axis="Q"), "form": lambda: doc.update(form="kaplan"),
        "objective": lambda: doc.update(objective="l3"), "count": lambda: doc.update(count=None),
        "shared-e-text": lambda: doc.update(shared_e="no"), "noise-list": lambda: doc.update(noise=[1]),
        "noise-source": lambda: doc["noise"].update(source="magic"),
        "given-sd-negative": lambda: doc["noise"].update(source="given", sd=-0.1),
        "given-sd-huge": lambda: doc["noise"].update(source="given", sd=50.0),
    }
    if case in edits:
        edits[case]()
        return doc
    return {"empty": "", "invalid": '{"axis": ', "a-list": "[1, 2]"}[case]


FIELDS = {"level-5": "level", "level-nan": "level", "level-text": "level", "no-level": "level",
          "no-baseline": "baseline", "baseline-number": "baseline", "candidates-text": "candidates",
          "candidate-unknown": "candidates[0]", "axis": "axis", "form": "form", "objective": "objective",
          "count": "count", "shared-e-text": "shared_e", "noise-list": "noise", "noise-source": "noise.source",
          "given-sd-negative": "noise.sd", "given-sd-huge": "noise.sd", "empty": "", "invalid": "", "a-list": ""}


@pytest.mark.parametrize("case", list(FIELDS))
def test_a_damaged_fit_json_is_one_line_naming_file_and_field(tmp_path, fit_folder, case):
    shutil.copytree(fit_folder, tmp_path / "fit")
    damaged = _damage(json.loads((fit_folder / "fit.json").read_text()), case)
    text = damaged if isinstance(damaged, str) else json.dumps(damaged)
    (tmp_path / "fit" / "fit.json").write_text(text)
    with untouched(tmp_path):
        r = run("suggest", "fit", "--boot", "50", "--draws", "8", cwd=tmp_path)
    field = FIELDS[case]
    refused(r, "fit/fit.json" + (f": {field}" if field else ""))


@pytest.mark.parametrize("case", ["no-fit-json", "points-damaged"])
def test_a_fit_folder_missing_or_damaging_its_table_is_one_line(tmp_path, fit_folder, case):
    shutil.copytree(fit_folder, tmp_path / "fit")
    if case == "no-fit-json":
        (tmp_path / "fit" / "fit.json").unlink()
        needles = ("fit", "no fit.json")
    else:
        _edit(tmp_path / "fit" / "points.csv", 3, "loss", "")
        needles = ("fit/points.csv: loss", "line 3")
    with untouched(tmp_path):
        r = run("suggest", "fit", "--boot", "50", "--draws", "8", cwd=tmp_path)
    refused(r, *needles)


@pytest.mark.parametrize(("args", "flag"), [
    (["--top", "0"], "--top"), (["--top", "-1"], "--top"), (["--draws", "0"], "--draws"),
    (["--boot", "10"], "--boot"), (["--seed", "-1"], "--seed"), (["--max-runs", "0"], "--max-runs"),
    (["--budget", "0"], "--budget"), (["--budget", "-5"], "--budget"), (["--at", "0"], "--at"),
    (["--sizes", "-1B"], "--sizes"),
], ids=lambda v: " ".join(v) if isinstance(v, list) else None)
def test_a_suggest_count_or_number_out_of_range_is_refused(tmp_path, fit_folder, args, flag):
    shutil.copytree(fit_folder, tmp_path / "fit")
    with untouched(tmp_path):
        r = run("suggest", "fit", "--draws", "8", *args, cwd=tmp_path)
    refused(r, flag)


def test_suggest_top_shows_exactly_that_many_rows(tmp_path, fit_folder):
    r = run("suggest", str(fit_folder), "--boot", "50", "--draws", "8", "--top", "1", cwd=tmp_path)
    assert r.returncode == 0, r.stderr
    lines = r.stdout.splitlines()
    header = next(i for i, line in enumerate(lines) if line.startswith("candidate "))
    assert lines[header + 2].startswith("... ")  # one row, then how many more


# -- a sweep with no runs ----------------------------------------------------------------------------


@pytest.mark.parametrize("command", ["fit", "suggest"])
def test_a_sweep_with_no_runs_names_the_sweep_file(tmp_path, store, command):
    from diffsweep.tracking.store import ensure_experiment
    from tests.scaling.conftest import tiny_ladder_sweep

    tiny_ladder_sweep(tmp_path, "lad", ("tiny-xs", "tiny-s"), tmp_path / "data")
    uri = store["MLFLOW_TRACKING_URI"]  # tmp_path/mlflow.db, a copy of a migrated store
    ensure_experiment(uri, "other")
    args = ("--no-log",) if command == "fit" else ()
    with untouched(tmp_path):
        r = run(command, "lad.yaml", *args, cwd=tmp_path, env={"MLFLOW_TRACKING_URI": uri})
    refused(r, "lad.yaml", "no experiment 'lad'")


@pytest.mark.parametrize(("tag", "value"), [("diffsweep.params", "many"), ("diffsweep.flops_per_token", "-3")])
def test_a_run_whose_tag_was_edited_in_the_store_is_one_line_naming_run_and_tag(tmp_path, store, tag, value):
    from mlflow.tracking import MlflowClient

    from tests.scaling.conftest import tiny_ladder_sweep
    from tests.scaling.synthetic import baseline_loss, log_runs

    sweep = tiny_ladder_sweep(tmp_path, "lad", ("tiny-xs", "tiny-s", "tiny-m"), tmp_path / "data")
    uri = store["MLFLOW_TRACKING_URI"]  # tmp_path/mlflow.db, a copy of a migrated store
    log_runs(uri, sweep, lambda arch, n, d: float(baseline_loss(n)))
    client = MlflowClient(uri)
    edited = client.search_runs([client.get_experiment_by_name("lad").experiment_id], max_results=1)[0]
    client.set_tag(edited.info.run_id, tag, value)
    with untouched(tmp_path):
        r = run("fit", "lad.yaml", *FAST, cwd=tmp_path, env={"MLFLOW_TRACKING_URI": uri})
    refused(r, edited.info.run_name, f"tag {tag} is '{value}'")
