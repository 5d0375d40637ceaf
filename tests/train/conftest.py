"""Fixtures for the training tests.

``store_client``: these tests train in process and read back what the run logged (tests/conftest.py's
``store`` is the environment of a CLI process instead).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import pytest

from tests.helpers.tracking import mlflow_client

if TYPE_CHECKING:
    from mlflow.tracking import MlflowClient


@pytest.fixture
def store_client(mlflow_store: str, monkeypatch: pytest.MonkeyPatch) -> MlflowClient:
    """A client of the session's MLflow store, which in-process training tracks to (``MLFLOW_TRACKING_URI``)."""
    monkeypatch.setenv("MLFLOW_TRACKING_URI", mlflow_store)
    return mlflow_client(mlflow_store)
