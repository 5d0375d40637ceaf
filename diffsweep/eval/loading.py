"""A trained run's model, tokenizer and validation split, from its run directory or one checkpoint.

``diffsweep eval RUN_DIR`` evaluates the run's newest checkpoint; ``diffsweep eval
RUN_DIR/checkpoints/step_00000040`` that one. The checkpoint's own training state names the config
it was trained with (so a checkpoint needs nothing beside it), the dataset by path and fingerprint
(the validation split must be the one the run trained on), and the MLflow run it belongs to.

The model is rebuilt on this machine's device (a GPU if one is visible) with the backend it trained
with; where that backend cannot run here (flash or the fused Triton kernel without a GPU) it falls
back to SDPA, which computes the same attention, and says so.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from pathlib import Path

import torch

from diffsweep.config import Backend, Config, ConfigError, EnvironmentUnavailable
from diffsweep.config.loading import config_from_dict
from diffsweep.data.dataset import TokenDataset, open_dataset
from diffsweep.data.tokenizers import Tokenizer, load_tokenizer
from diffsweep.model.transformer import LanguageModel, build_model
from diffsweep.train import checkpoint as ckpt
from diffsweep.train.trainer import autocast_dtype


@dataclass
class Trained:
    """One checkpoint of a trained run, loaded for evaluation."""

    checkpoint: Path
    step: int
    config: Config
    model: LanguageModel  # eval mode, on ``device``
    tokenizer: Tokenizer
    dataset: TokenDataset
    device: torch.device
    autocast_dtype: torch.dtype | None
    run_dir: Path | None  # the run directory the checkpoint is in (None: a checkpoint copied elsewhere)
    mlflow_run_id: str | None  # the training run's MLflow run
    run_key: str
    notes: list[str]


def find_checkpoint(source: Path) -> tuple[Path, Path | None]:
    """The checkpoint ``source`` names and the run directory it belongs to: a run directory (its
    newest checkpoint), its ``checkpoints/`` directory, or one checkpoint (``step_XXXXXXXX``)."""
    if not source.exists():
        raise ConfigError(str(source), "not found; expected a run directory or a checkpoint (step_XXXXXXXX)")
    if ckpt.is_checkpoint(source):
        parent = source.absolute().parent
        return source, parent.parent if parent.name == "checkpoints" else None
    directory = source / "checkpoints" if (source / "checkpoints").is_dir() else source
    found = ckpt.list_checkpoints(directory)
    if not found:
        raise ConfigError(str(source), "has no checkpoint; expected a run directory with checkpoints/step_XXXXXXXX "
                          "(train it first) or a checkpoint")
    run_dir = directory.parent if directory.name == "checkpoints" else None
    return found[-1], run_dir.absolute() if run_dir is not None else None


def load_trained(source: Path, *, device: torch.device | None = None) -> Trained:
    """The model of the checkpoint ``source`` names (see ``find_checkpoint``), with the tokenizer
    and dataset it was trained on. A checkpoint without a config, whose dataset is missing or was
    replaced, or whose weights do not fit its config is a ``ConfigError`` naming the file."""
    path, run_dir = find_checkpoint(source)
    state = ckpt.load_checkpoint(path)
    if "config" not in state:
        raise ConfigError(str(path), "records no config (written by an older diffsweep); it cannot be evaluated")
    config = config_from_dict(state["config"])
    dataset = open_dataset(config.data.path, key=f"{path}: data.path")
    if state["data"]["fingerprint"] != dataset.meta.fingerprint:
        raise ConfigError(str(path), f"was trained on another dataset than the one now at {dataset.path} "
                          "(its fingerprint changed)")
    tokenizer = load_tokenizer(dataset.meta.tokenizer, dataset.path)
    device = device or torch.device("cuda" if torch.cuda.is_available() else "cpu")
    autocast = autocast_dtype(config.train.precision, device)
    notes: list[str] = []
    try:
        model = build_model(config.model, device=device, compute_dtype=autocast or torch.float32)
    except EnvironmentUnavailable as exc:
        if config.model.attention.backend in (Backend.SDPA, Backend.REFERENCE):
            raise
        notes.append(f"{exc}; evaluating with sdpa, which computes the same attention")
        attention = dataclasses.replace(config.model.attention, backend=Backend.SDPA)
        config = dataclasses.replace(config, model=dataclasses.replace(config.model, attention=attention))
        model = build_model(config.model, device=device, compute_dtype=autocast or torch.float32)
    _load_weights(model, path, state)
    model.eval().requires_grad_(False)  # evaluation only: no autograd graphs
    return Trained(checkpoint=path, step=int(state["step"]), config=config, model=model, tokenizer=tokenizer,
                   dataset=dataset, device=device, autocast_dtype=autocast, run_dir=run_dir,
                   mlflow_run_id=state.get("mlflow_run_id"), run_key=state["run_key"], notes=notes)


def _load_weights(model: LanguageModel, path: Path, state: dict) -> None:
    """The checkpoint's weights into ``model`` (its optimizer state is not read)."""
    if "model" in state:  # a single file with the whole state
        weights = state["model"]
    else:
        ckpt.verify_shards(path)
        weights = {"model": model.state_dict()}
        ckpt.load_tensors(path, weights)
        weights = weights["model"]
    try:
        model.load_state_dict(weights)
    except RuntimeError as exc:
        raise ConfigError(str(path), f"weights do not fit the config it records: {str(exc).splitlines()[0]}") from None

