"""Tiny training runs for tests, in this process or launched as a user launches them.

In process: ``tiny`` configs, a ``recorder`` of the metrics each step logs, ``quiet`` output.
Launched: the ``torchrun`` and ``single`` command lines, the environment they run in
(``process_env``), and what they logged to MLflow (``only_run``, ``histories``), compared with
``reference_histories`` (the same run on one process, here) by ``assert_same``.

mlflow is imported only when a client is made (tests/helpers/tracking.py): the GPU machine has no
mlflow, and ``pytest -m gpu`` imports every test module to collect it (tests/test_gpu_selection.py).
"""

from __future__ import annotations

import os
import sys
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pytest

from diffsweep.config import load_config
from diffsweep.train.trainer import train
from tests.conftest import TINY_RUN
from tests.helpers.tracking import mlflow_client

if TYPE_CHECKING:
    from mlflow.tracking import MlflowClient

    from diffsweep.config import Config

KINDS = ("transformer", "diff_v1", "diff_v2")
TIMING = ("train/tokens_per_s", "train/compile_s")  # wall-clock: the only metrics allowed to differ between runs
# What a launched run is compared on with its one-process reference.
KEYS = ("train/loss", "train/grad_norm", "val/loss", "val/loss_ar_hit", "val/ar_hit_fraction")
# Loss and gradient norm agree to this, relative and absolute (fp32; gloo averages the two
# processes' gradients in another order than one process sums its micro-batches, and FSDP2 sums
# the gradient norm shard by shard). Measured on CPU: losses within 1e-6, grad norms within 5e-5.
REL, ABS = 1e-4, 2e-5

History = list[tuple[int, float]]


def tiny(dataset: Path, *extra: str) -> Config:
    """The ``TINY_RUN`` config on ``dataset``, with ``extra`` ``a.b=c`` overrides."""
    return load_config(None, [*TINY_RUN, f"data.path={dataset}", *extra])


def recorder(into: dict) -> Callable[[int, dict[str, float]], None]:
    """A training callback that stores each step's metrics (less the wall-clock ones) in ``into``."""
    def callback(step: int, metrics: dict[str, float]) -> None:
        into[step] = {k: v for k, v in metrics.items() if k not in TIMING}
    return callback


def quiet(line: str) -> None:
    """An ``echo`` that prints nothing."""


def history(client: MlflowClient, run_id: str, key: str) -> History:
    """The ``(step, value)`` pairs a run logged for ``key``, by step."""
    return sorted((m.step, m.value) for m in client.get_metric_history(run_id, key))


def histories(store: str, run_id: str) -> dict[str, History]:
    """``history`` of each of ``KEYS`` in the MLflow store at ``store``."""
    client = mlflow_client(store)
    return {key: history(client, run_id, key) for key in KEYS}


def _sets(dataset: Path, *extra: str) -> list[str]:
    return [f"--set={s}" for s in [*TINY_RUN, f"data.path={dataset}", *extra]]


def torchrun(dataset: Path, *extra: str, nproc: int = 2) -> list[str]:
    """``torchrun -m diffsweep train`` of a tiny run on ``nproc`` processes."""
    return [sys.executable, "-m", "torch.distributed.run", "--standalone", f"--nproc-per-node={nproc}",
            "-m", "diffsweep", "train", *_sets(dataset, *extra)]


def single(dataset: Path, *extra: str) -> list[str]:
    """``python -m diffsweep train`` of a tiny run (one process)."""
    return [sys.executable, "-m", "diffsweep", "train", *_sets(dataset, *extra)]


def process_env(store: str) -> dict[str, str]:
    """The environment of a launched run tracking to ``store``; without this process's rank, if any."""
    return {k: v for k, v in os.environ.items() if k not in ("RANK", "WORLD_SIZE")} | {
        "PYTHONUNBUFFERED": "1", "MLFLOW_TRACKING_URI": store}


def only_run(store: str) -> tuple[str, Any]:
    """The id and the MLflow run of the one run in the ``diffsweep`` experiment of ``store``."""
    client = mlflow_client(store)
    (run,) = client.search_runs([client.get_experiment_by_name("diffsweep").experiment_id])
    return run.info.run_id, run


def reference_histories(dataset: Path, tmp_path: Path, store: str, *extra: str) -> dict[str, History]:
    """One process, in this test process: the ground truth a launched run is compared with."""
    before = os.environ.get("MLFLOW_TRACKING_URI")
    os.environ["MLFLOW_TRACKING_URI"] = store
    try:
        result = train(tiny(dataset, *extra), tmp_path / "reference", experiment="reference", echo=quiet)
    finally:  # as it was: unset, or what the caller had set
        if before is None:
            del os.environ["MLFLOW_TRACKING_URI"]
        else:
            os.environ["MLFLOW_TRACKING_URI"] = before
    return histories(store, result.run_id)


def assert_same(got: dict[str, History], want: dict[str, History]) -> None:
    """``got`` and ``want`` logged the same steps of each of ``KEYS``, with values within ``REL``/``ABS``."""
    for key in KEYS:
        assert [s for s, _ in got[key]] == [s for s, _ in want[key]], key
        for (step, a), (_, b) in zip(got[key], want[key]):
            assert a == pytest.approx(b, rel=REL, abs=ABS), f"{key} at step {step}: {a} vs {b}"
