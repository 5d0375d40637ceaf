"""One tiny trained run per test session for the evaluation tests (training costs seconds)."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.conftest import TINY_RUN


@pytest.fixture(scope="session")
def trained_run(text_dataset, mlflow_store, tmp_path_factory) -> Path:
    """The run directory of a tiny DIFF V1 run trained 12 steps of 2 x 128 tokens on the session's
    English text (checkpoints every 2 steps; long enough for needle prompts), tracked in the
    session's MLflow store."""
    import os

    from diffsweep.config import load_config
    from diffsweep.train.trainer import train

    before = os.environ.get("MLFLOW_TRACKING_URI")
    os.environ["MLFLOW_TRACKING_URI"] = mlflow_store
    try:
        cfg = load_config(None, [*TINY_RUN, f"data.path={text_dataset}", "model.attention.kind=diff_v1",
                                    "train.seq_len=128", "train.batch_tokens=256", "train.micro_batch_size=2"])
        run_dir = tmp_path_factory.mktemp("trained") / "run"
        train(cfg, run_dir, experiment="eval-tests", echo=lambda line: None)
    finally:
        if before is None:
            os.environ.pop("MLFLOW_TRACKING_URI")
        else:
            os.environ["MLFLOW_TRACKING_URI"] = before
    return run_dir
