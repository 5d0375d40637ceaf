"""The fit run and its source runs in the MLflow UI, in a real browser (headless Chromium)."""

from __future__ import annotations

import json

import pytest

from tests.browser import (
    expect_artifact_visible,
    expect_model_training_view,
    expect_runs_visible,
    run_url,
    search_runs,
    ui_server,
)
from tests.helpers.cli import run
from tests.scaling.conftest import MINI_LADDER


@MINI_LADDER
@pytest.mark.slow
@pytest.mark.browser
def test_demo_runs_and_the_fit_run_are_visible_in_the_ui(mini_ladder, page, tmp_path):
    from mlflow.tracking import MlflowClient
    from playwright.sync_api import expect

    d, env = mini_ladder["dir"], mini_ladder["env"]
    r = run("fit", str(mini_ladder["sweep"]), "--json", "--boot", "100", "--out", str(tmp_path / "fit"), cwd=d, env=env)
    assert r.returncode == 0, r.stderr
    fit_id = json.loads(r.stdout)["mlflow_run_id"]
    client = MlflowClient(mini_ladder["uri"])
    exp = client.get_experiment_by_name("mini-ladder")
    runs = client.search_runs([exp.experiment_id])  # other tests may have logged fits of this ladder too
    trained = [run.info.run_name for run in runs if run.data.tags.get("diffsweep.kind") != "fit"]
    assert len(trained) == 8
    runs = {run.info.run_id: run.info.run_name for run in runs}
    with ui_server(d, experiment="mini-ladder") as ui:
        expect_runs_visible(page, ui.experiment_url, [runs[fit_id], *trained], screenshot=tmp_path / "runs.png")
        expect_model_training_view(page)
        # the README's filters: the fit runs, then the sweep's training runs
        search_runs(page, "tags.diffsweep.kind = 'fit'")
        expect(page.get_by_role("link", name=runs[fit_id])).to_be_visible()
        expect(page.get_by_role("link", name=trained[0])).to_have_count(0)
        search_runs(page, "tags.diffsweep.sweep = 'mini-ladder'")
        expect(page.get_by_role("link", name=trained[0])).to_be_visible()
        expect(page.get_by_role("link", name=runs[fit_id])).to_have_count(0)
        expect_artifact_visible(page, run_url(ui.experiment_url, fit_id), "report.md", text="Scaling fit: mini-ladder")
        assert ui.stop() == 0
