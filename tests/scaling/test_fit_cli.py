"""``diffsweep fit`` as a user runs it: on a CSV, and on real runs in MLflow; bad input."""

from __future__ import annotations

import json

import numpy as np
import pytest

from tests.conftest import SEEDS_SWEEP
from tests.helpers.badinput import refused
from tests.helpers.cli import run
from tests.scaling.conftest import MINI_LADDER, outputs
from tests.scaling.synthetic import TRUE_RATIO, ladder

OUTPUTS = ["fit.json", "plots/loss.png", "plots/ratio.png", "plots/residuals.png", "points.csv", "report.md"]


@pytest.fixture
def csv_file(tmp_path):
    path = tmp_path / "ladder.csv"
    ladder(noise_sd=0.003, seeds=2, rng=np.random.default_rng(1),
           ratios={"diff_v1": TRUE_RATIO, "diff_v2": 0.7}).to_csv(path, index=False)
    return path


def test_fit_of_a_csv_writes_report_plots_and_a_frozen_table_that_refits_identically(tmp_path, csv_file, store):
    r = run("fit", "--csv", str(csv_file), "--out", "fit1", "--holdout", "largest", "--at", "11B", "--json",
            cwd=tmp_path, env=store)
    assert r.returncode == 0, r.stderr
    result = json.loads(r.stdout)
    assert outputs(tmp_path / "fit1") == OUTPUTS
    assert result["candidates"] == ["diff_v1", "diff_v2"] and result["noise"]["source"] == "seeds"
    at_11b = [row for row in result["ratios"] if row["at"] == 11e9]
    assert [row["candidate"] for row in at_11b] == ["diff_v1", "diff_v2"]
    assert all(row["lo"] < row["ratio"] < row["hi"] for row in at_11b)
    assert set(result["holdout"]["predictions"]) == {"transformer", "diff_v1", "diff_v2"}
    report = (tmp_path / "fit1" / "report.md").read_text()
    assert "of the Transformer's parameters to match its loss at 11B" in report
    # the fit is an MLflow run of its own, in the fits experiment, with the outputs attached
    from mlflow.tracking import MlflowClient

    client = MlflowClient(store["MLFLOW_TRACKING_URI"])
    fit_run = client.get_run(result["mlflow_run_id"])
    assert fit_run.data.tags["diffsweep.kind"] == "fit" and fit_run.info.status == "FINISHED"
    assert {a.path for a in client.list_artifacts(fit_run.info.run_id)} >= {"report.md", "points.csv", "plots", "fit.json"}
    # the frozen table reproduces the fit exactly
    r2 = run("fit", "--csv", str(tmp_path / "fit1" / "points.csv"), "--out", "fit2", "--holdout", "largest",
             "--at", "11B", "--json", "--no-log", cwd=tmp_path, env=store)
    assert r2.returncode == 0, r2.stderr
    again = json.loads(r2.stdout)
    assert again["ratios"] == result["ratios"] and again["fits"] == result["fits"]


def test_terminal_output_speaks_the_papers_language(tmp_path, csv_file, store):
    r = run("fit", "--csv", str(csv_file), "--no-log", "--candidate", "diff_v1", cwd=tmp_path, env=store)
    assert r.returncode == 0, r.stderr
    assert "DIFF V1 needs" in r.stdout and "of the Transformer's parameters to match its loss at" in r.stdout
    assert "report: " in r.stdout and "DIFF V2" not in r.stdout


def _write(tmp_path, frame, name="bad.csv"):
    path = tmp_path / name
    frame.to_csv(path, index=False)
    return path


@pytest.mark.parametrize("case", ["missing-candidate", "baseline-only", "too-few-sizes", "all-nan", "far-at",
                                  "bad-at", "missing-columns", "no-file", "bad-form", "bad-holdout"])
def test_bad_input_is_one_line_exit_2_and_nothing_written(tmp_path, new_store, case):
    points = ladder(noise_sd=0.003, seeds=2, rng=np.random.default_rng(1))
    args, needles = [], []
    if case == "missing-candidate":
        args, needles = ["--candidate", "diff_v2"], ["--candidate", "diff_v2", "diff_v1, transformer"]
    elif case == "baseline-only":  # one architecture alone is fitted; comparing it with itself is refused
        points = points[points["arch"] == "transformer"]
        args, needles = ["--candidate", "transformer"], ["--candidate", "'transformer' is the baseline"]
    elif case == "too-few-sizes":
        points = points[points["num_params"] < 2e9]
        needles = ["2 distinct sizes", "3 parameters"]
    elif case == "all-nan":  # written as nan (an empty cell is refused as a value never filled in)
        points = points.assign(loss="nan")
        needles = ["non-finite"]
    elif case == "far-at":
        args, needles = ["--at", "1T"], ["--at", "outside the measured range"]
    elif case == "bad-at":
        args, needles = ["--at", "eleven"], ["--at", "eleven"]
    elif case == "missing-columns":
        points = points.drop(columns=["tokens"])
        needles = ["missing column(s) tokens"]
    elif case == "bad-form":
        args, needles = ["--form", "kaplan"], ["--form", "offset, pure, chinchilla"]
    elif case == "bad-holdout":
        args, needles = ["--holdout", "smallest"], ["--holdout"]
    path = tmp_path / "nope.csv" if case == "no-file" else _write(tmp_path, points)
    if case == "no-file":
        needles = ["nope.csv", "no such file"]
    r = run("fit", "--csv", str(path), "--out", "out", *args, cwd=tmp_path, env=new_store)
    refused(r, *needles)
    assert not (tmp_path / "out").exists() and not (tmp_path / "fits").exists()
    assert not (tmp_path / "mlflow.db").exists()  # no fit run was created


def test_non_finite_losses_are_dropped_with_a_warning(tmp_path, store):
    points = ladder(noise_sd=0.003, seeds=2, rng=np.random.default_rng(1))
    points.loc[3, "loss"] = np.inf
    r = run("fit", "--csv", str(_write(tmp_path, points)), "--no-log", "--json", cwd=tmp_path, env=store)
    assert r.returncode == 0, r.stderr
    result = json.loads(r.stdout)
    assert result["points_used"] == len(points) - 1
    assert any("non-finite" in w and points.loc[3, "run_name"] in w for w in result["warnings"])


# -- real runs in MLflow -------------------------------------------------------------------------

@MINI_LADDER
@pytest.mark.slow
def test_fit_of_a_launched_sweep_logs_a_fit_run_linked_to_its_sources(mini_ladder):
    from mlflow.tracking import MlflowClient

    d, env = mini_ladder["dir"], mini_ladder["env"]
    r = run("fit", str(mini_ladder["sweep"]), "--json", "--boot", "200", cwd=d, env=env)
    assert r.returncode == 0, r.stderr
    result = json.loads(r.stdout)
    assert result["axis"] == "N" and result["points_used"] == 8 and result["candidates"] == ["diff_v1"]
    assert outputs(d / "fits" / "mini-ladder-N") == OUTPUTS
    client = MlflowClient(mini_ladder["uri"])
    exp = client.get_experiment_by_name("mini-ladder")
    runs = client.search_runs([exp.experiment_id])
    trained = {r.info.run_id for r in runs if r.data.tags.get("diffsweep.kind") != "fit"}
    fit_run = client.get_run(result["mlflow_run_id"])
    assert fit_run.data.tags["diffsweep.kind"] == "fit"
    assert set(fit_run.data.tags["diffsweep.source_runs"].split(",")) == trained and len(trained) == 8
    assert "fit/transformer/alpha" in fit_run.data.metrics
    frozen = (d / "fits" / "mini-ladder-N" / "points.csv").read_text()
    assert all(run_id in frozen for run_id in trained)
    # what the arm audit compares comes from each run's params
    import pandas as pd

    from tests.launch.conftest import TINY_SET

    table = pd.read_csv(d / "fits" / "mini-ladder-N" / "points.csv")
    lrs = {float(r.data.params["train.lr"]) for r in runs if r.info.run_id in trained}
    assert set(table["lr"]) == lrs and len(lrs) == 1, table["lr"]
    assert set(table["batch_tokens"]) == {int(TINY_SET["train.batch_tokens"])}, table["batch_tokens"]
    assert table["min_lr"].notna().all() and len(result["audit"]["pairs"]) == 4
    # a second fit does not take the first fit run as an input; --where filters on config keys
    r = run("fit", "--experiment", "mini-ladder", "--where", "model.size!=tiny-xs", "--noise-sd", "0.01", "--json",
            "--boot", "100", "--no-log", "--out", "subset", cwd=d, env=env)
    assert r.returncode == 0, r.stderr
    assert json.loads(r.stdout)["points_used"] == 6


@MINI_LADDER
@pytest.mark.slow
@pytest.mark.parametrize("case", ["where-nothing", "experiment", "bad-where", "no-store"])
def test_fit_of_runs_refuses_bad_sources(mini_ladder, tmp_path, case):
    d, env = mini_ladder["dir"], mini_ladder["env"]
    args = {"where-nothing": [str(mini_ladder["sweep"]), "--where", "model.size=tiny-xxl"],
            "experiment": ["--experiment", "nope"],
            "bad-where": ["--experiment", "mini-ladder", "--where", "model.size"],
            "no-store": ["--experiment", "mini-ladder"]}[case]
    needles = {"where-nothing": ["--where", "no runs match"], "experiment": ["no experiment 'nope'", "mini-ladder"],
               "bad-where": ["KEY=VALUE"], "no-store": ["no MLflow store"]}[case]
    cwd = tmp_path if case == "no-store" else d
    before = len(list((d / "fits").glob("*"))) if (d / "fits").exists() else 0
    r = run("fit", *args, "--out", str(tmp_path / "out"), cwd=cwd, env={} if case == "no-store" else env)
    refused(r, *needles)
    assert not (tmp_path / "out").exists()
    assert (len(list((d / "fits").glob("*"))) if (d / "fits").exists() else 0) == before


@SEEDS_SWEEP
@pytest.mark.slow
def test_token_scan_fits_loss_against_tokens_from_each_runs_evaluations(seeds_sweep, tmp_path):
    """One size per architecture (2 seeds each), evaluated every 2 steps: a D fit from the
    evaluations after warmup (as the paper's Fig. 3b reads its token curve), saying which points it
    used. The launched sweep is ``seeds_sweep`` (tests/conftest.py), which tests/cli/test_compare_cli.py
    compares too."""
    root, sweep, env = seeds_sweep
    r = run("fit", str(sweep), "--json", "--boot", "100", "--no-log", "--out", str(tmp_path / "fit"), cwd=root, env=env)
    assert r.returncode == 0, r.stderr
    result = json.loads(r.stdout)
    assert result["axis"] == "D" and all(row["axis"] == "D" for row in result["ratios"])
    assert any("intermediate evaluations" in w for w in result["warnings"])
    import pandas as pd

    points = pd.read_csv(tmp_path / "fit" / "points.csv")
    assert len(points) == 4 * 8  # evaluations at steps 2, 4, ..., 16 for each of the 4 runs (2 kinds x 2 seeds)
    assert sorted(points.loc[~points["used"], "reason"].unique()) == ["in warmup"]
    assert points["used"].sum() == 4 * 7 and result["points_used"] == 28
    assert (points.loc[points["used"], "tokens"] == points.loc[points["used"], "step"] * 128).all()


@MINI_LADDER
@pytest.mark.slow
def test_a_sweep_file_fits_only_its_current_runs(mini_ladder, tmp_path):
    """Editing the sweep (here: dropping a size) and refitting leaves the other runs out, saying so."""
    d, env = mini_ladder["dir"], mini_ladder["env"]
    edited = d / "mini-ladder-edited.yaml"
    edited.write_text(mini_ladder["sweep"].read_text().replace(", tiny-s]", "]"))
    r = run("fit", str(edited), "--noise-sd", "0.01", "--boot", "100", "--no-log", "--json", "--out",
            str(tmp_path / "fit"), cwd=d, env=env)
    assert r.returncode == 0, r.stderr
    result = json.loads(r.stdout)
    assert result["points_used"] == 6
    assert any("left out 2 run(s) that are not in the sweep file's current expansion" in w for w in result["warnings"])


def test_an_unwritable_output_folder_is_one_line_and_leaves_nothing(tmp_path, csv_file, new_store):
    (tmp_path / "taken").write_text("a file, not a folder\n")
    r = run("fit", "--csv", str(csv_file), "--out", "taken", cwd=tmp_path, env=new_store)
    refused(r, "--out", "not a directory")
    assert (tmp_path / "taken").read_text() == "a file, not a folder\n"
    assert not (tmp_path / "mlflow.db").exists() and sorted(p.name for p in tmp_path.iterdir()) == ["ladder.csv", "taken"]
