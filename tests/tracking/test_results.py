"""A result run (``diffsweep.tracking.results``) on a real SQLite MLflow store: what its block logs
and attaches is there, and the run ends FINISHED, FAILED or KILLED as the block does."""

from __future__ import annotations

import pytest

from diffsweep.config import ConfigError
from diffsweep.tracking.results import METRICS_PER_BATCH, PARAMS_PER_BATCH, find_run, result_run, store_errors
from diffsweep.tracking.store import ensure_experiment, mlflow_client


@pytest.fixture
def uri(store) -> str:
    return store["MLFLOW_TRACKING_URI"]


def _open(uri: str):
    client = mlflow_client(uri)
    return client, ensure_experiment(uri, "results")


def test_what_the_block_logs_is_in_the_finished_run_in_batches_mlflow_takes(uri, tmp_path):
    client, experiment = _open(uri)
    files = tmp_path / "out"
    files.mkdir()
    (files / "report.md").write_text("# a report\n")
    metrics = [("curve", float(i), i) for i in range(METRICS_PER_BATCH * 2 + 5)]  # three batches
    params = {f"p{i}": i for i in range(PARAMS_PER_BATCH + 7)}  # two batches
    with result_run(client, experiment, "a result", {"diffsweep.kind": "fit"}) as run:
        run.log(metrics, params, timestamp_ms=0)
        run.log([("single", 2.5, 3)])
        run.set_tag("mlflow.note.content", "a note")
        run.attach(files)
    stored = client.get_run(run.run_id)
    assert stored.info.status == "FINISHED" and stored.info.run_name == "a result"
    assert stored.data.tags["diffsweep.kind"] == "fit" and stored.data.tags["mlflow.note.content"] == "a note"
    assert stored.data.params == {k: str(v) for k, v in params.items()}
    history = client.get_metric_history(run.run_id, "curve")
    assert sorted((m.step, m.value, m.timestamp) for m in history) == [(i, float(i), 0) for i in range(len(metrics))]
    assert [(m.step, m.value) for m in client.get_metric_history(run.run_id, "single")] == [(3, 2.5)]
    assert [a.path for a in client.list_artifacts(run.run_id)] == ["report.md"]


def test_an_empty_folder_attaches_nothing(uri, tmp_path):
    client, experiment = _open(uri)
    empty = tmp_path / "empty"
    empty.mkdir()
    with result_run(client, experiment, None, {}) as run:
        run.attach(empty)
    assert client.list_artifacts(run.run_id) == [] and client.get_run(run.run_id).info.status == "FINISHED"


@pytest.mark.parametrize(("error", "status"), [(ValueError("bad"), "FAILED"), (KeyboardInterrupt(), "KILLED")])
def test_a_block_that_raises_ends_its_run_and_the_error_goes_on(uri, error, status):
    client, experiment = _open(uri)
    with pytest.raises(type(error)), result_run(client, experiment, "doomed", {}) as run:
        run.log([("m", 1.0, 0)])
        raise error
    stored = client.get_run(run.run_id)
    assert stored.info.status == status and stored.data.metrics == {"m": 1.0}


def test_find_run_is_none_for_a_run_the_store_does_not_have(uri):
    client, experiment = _open(uri)
    with result_run(client, experiment, "here", {}) as run:
        pass
    assert find_run(client, run.run_id).info.run_name == "here"
    assert find_run(client, None) is None and find_run(client, "0" * 32) is None


def test_a_store_error_is_one_configerror_line_naming_the_store(uri):
    client, _ = _open(uri)
    with pytest.raises(ConfigError) as caught, store_errors(uri, "read the runs from"):
        client.get_run("0" * 32)
    assert caught.value.key == "MLFLOW_TRACKING_URI"
    message = str(caught.value)
    assert f"cannot read the runs from {uri} (" in message and "\n" not in message
