"""``diffsweep eval SWEEP.yaml``: after a local launch, every finished run's newest checkpoint is
evaluated, the evaluations are linked to their runs and tagged with the sweep, and evaluating again
runs nothing; a run not finished yet is reported, not evaluated."""

from __future__ import annotations

import json

from mlflow.tracking import MlflowClient

from tests.launch.conftest import cli, write_sweep


def test_a_sweep_is_evaluated_run_by_run_and_only_once(tmp_path, text_dataset, store):
    sweep = write_sweep(tmp_path / "t.yaml", text_dataset, steps=4)
    r = cli("launch", str(sweep), "--executor", "local", "--wait", cwd=tmp_path, env=store)
    assert r.returncode == 0, r.stderr
    args = ["eval", str(sweep), "--probe", "outliers", "--probe", "nll_position", "--probe-set", "outliers.tokens=64",
            "--probe-set", "nll_position.documents=2"]
    r = cli(*args, "--json", cwd=tmp_path, env=store)
    assert r.returncode == 0, r.stderr
    done = json.loads(r.stdout)
    assert len(done) == 4 and all(e["ran"] and e["step"] == 4 for e in done)
    assert "evaluated 2 finished runs" in r.stderr
    client = MlflowClient(store["MLFLOW_TRACKING_URI"])
    runs = {client.get_run(e["mlflow_run_id"]).data.tags["diffsweep.eval.sweep_run"] for e in done}
    assert runs == {"transformer-tiny-xs-s0", "diff_v1-tiny-xs-s0"}
    tags = client.get_run(done[0]["mlflow_run_id"]).data.tags
    assert tags["diffsweep.eval.sweep"] == "t" and tags["mlflow.parentRunId"] == tags["diffsweep.eval.source_run"]
    # the sweep's own comparison of training runs is not confused by the evaluation runs
    assert cli("compare", str(sweep), cwd=tmp_path, env=store).returncode == 0
    again = cli(*args, cwd=tmp_path, env=store)
    assert again.returncode == 0 and again.stdout.count("already evaluated") == 4

    # a new row, not launched: reported as not finished, the others skipped
    sweep.write_text(sweep.read_text().replace("[transformer, diff_v1]", "[transformer, diff_v1, diff_v2]"))
    r = cli(*args, "--only", "diff_v2", cwd=tmp_path, env=store)
    assert r.returncode == 0 and "evaluated 0 finished runs; 1 not finished yet" in r.stdout, r.stdout
