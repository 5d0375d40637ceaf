"""An MLflow client for tests that read back what a run logged.

mlflow is imported when a client is made, not when a test module is: the GPU machine has no mlflow,
and ``pytest -m gpu`` imports every test module to collect it (tests/test_gpu_selection.py)."""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from mlflow.tracking import MlflowClient


def mlflow_client(uri: str) -> MlflowClient:
    """``MlflowClient(uri)``."""
    from mlflow.tracking import MlflowClient

    return MlflowClient(uri)
