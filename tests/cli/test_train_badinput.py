"""Bad input to ``diffsweep train``: one ``error:`` line naming the option, exit 2, and no store,
run directory or MLflow run made (the experiment name is checked before anything exists)."""

from __future__ import annotations

import pytest

from diffsweep.config import ConfigError
from tests.helpers.badinput import diffsweep, refused, untouched

from ..conftest import TINY_RUN

STORE = {"MLFLOW_TRACKING_URI": "sqlite:///mlflow.db"}  # in the working directory: a store made would show


def train_args(dataset, *extra: str) -> list[str]:
    return ["train", *(f"--set={s}" for s in [*TINY_RUN, f"data.path={dataset}"]), *extra]


@pytest.mark.parametrize(("experiment", "needle"), [
    ("", "expected a non-empty experiment name"),
    ("   ", "expected a non-empty experiment name"),
    ("a\nb", "control characters"),
    ("x" * 501, "at most 500 characters"),
])
def test_a_bad_experiment_name_is_refused_before_the_store_exists(tmp_path, text_dataset, experiment, needle):
    with untouched(tmp_path):
        r = diffsweep(*train_args(text_dataset, "--experiment", experiment), cwd=tmp_path, env=STORE)
    refused(r, "--experiment", needle)


@pytest.mark.parametrize(("out", "needle"), [("afile", "is not a directory"),
                                            ("afile/runs", "which is not a directory")])
def test_an_out_that_is_a_file_is_refused(tmp_path, text_dataset, out, needle):
    (tmp_path / "afile").write_text("x\n")
    with untouched(tmp_path):
        r = diffsweep(*train_args(text_dataset, "--out", out), cwd=tmp_path, env=STORE)
    refused(r, "--out", needle)


def test_ensure_experiment_checks_the_name_itself(tmp_path):
    """The library refuses the name before it creates the store, whoever calls it."""
    from diffsweep.tracking.store import ensure_experiment

    with untouched(tmp_path), pytest.raises(ConfigError, match="non-empty experiment name"):
        ensure_experiment(f"sqlite:///{tmp_path / 'mlflow.db'}", " ")
