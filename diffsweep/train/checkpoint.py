"""Atomic checkpoints holding everything a resumed run needs to continue bit for bit.

A checkpoint is one ``torch.save`` file ``step_XXXXXXXX.pt`` in the run's ``checkpoints/``
directory. It is written to a temporary file, fsynced, renamed into place and the directory
fsynced, so a crash leaves either the old set of checkpoints or the new one, never a torn file.
Only the newest ``keep`` are kept. Loading uses ``weights_only=True``: a checkpoint holds only
tensors, numbers, strings, lists and dicts.
"""

from __future__ import annotations

import os
import re
from pathlib import Path
from typing import Any

import torch

from diffsweep.config import ConfigError

FORMAT = "diffsweep-checkpoint/1"
_NAME = re.compile(r"^step_(\d{8})\.pt$")
_ANSI = re.compile(r"\x1b\[[0-9;]*m")  # terminal colour codes, which torch puts in some errors
REQUIRED = ("format", "step", "tokens_seen", "model", "optimizer", "scheduler", "data", "rng", "run_key",
            "mlflow_run_id", "metrics_state")


def checkpoint_path(directory: Path, step: int) -> Path:
    return directory / f"step_{step:08d}.pt"


def list_checkpoints(directory: Path) -> list[Path]:
    """Checkpoints in ``directory``, oldest first (by step)."""
    if not directory.is_dir():
        return []
    return sorted((p for p in directory.iterdir() if _NAME.match(p.name)), key=lambda p: p.name)


def save_checkpoint(directory: Path, state: dict[str, Any], *, keep: int) -> Path:
    """Write ``state`` atomically as the checkpoint of ``state["step"]``; keep the newest ``keep``."""
    directory.mkdir(parents=True, exist_ok=True)
    path = checkpoint_path(directory, state["step"])
    tmp = path.with_name(f".{path.name}.tmp")
    try:
        with open(tmp, "wb") as f:
            torch.save({"format": FORMAT, **state}, f)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        tmp.unlink(missing_ok=True)  # a failed save (disk full, unpicklable state) leaves no torn file
        raise
    _fsync_dir(directory)
    # Keep the newest ``keep`` by step, and always the one just written (a run resumed from an
    # older checkpoint may share the directory with newer ones).
    for old in list_checkpoints(directory)[:-keep]:
        if old != path:
            old.unlink()
    return path


def load_checkpoint(path: Path) -> dict[str, Any]:
    """Read a checkpoint; a missing, truncated or foreign file is a ``ConfigError`` naming it."""
    if not path.is_file():
        raise ConfigError(str(path), "checkpoint not found")
    try:
        state = torch.load(path, map_location="cpu", weights_only=True)
    except Exception as exc:  # torch raises several types (RuntimeError, EOFError, UnpicklingError)
        raise ConfigError(str(path), f"corrupt or truncated checkpoint ({_load_error(exc)})") from exc
    if not isinstance(state, dict) or state.get("format") != FORMAT:
        raise ConfigError(str(path), f"not a diffsweep checkpoint (expected format {FORMAT!r})")
    missing = [k for k in REQUIRED if k not in state]
    if missing:
        raise ConfigError(str(path), f"checkpoint lacks {', '.join(missing)}")
    return state


def _load_error(exc: Exception) -> str:
    """One clean line saying why ``torch.load`` failed. Its weights-only errors are paragraphs of
    advice (with ANSI escapes) to load unsafely; only the unpickler's own reason is kept."""
    text = _ANSI.sub("", str(exc)).strip()
    found = re.search(r"WeightsUnpickler error:\s*(.+?)(?:\.\s|\n|$)", text, re.S)
    if found:
        text = f"weights-only load: {found.group(1).strip()}"
    first = text.splitlines()[0].strip() if text else type(exc).__name__
    return first[:200]


def _fsync_dir(directory: Path) -> None:
    fd = os.open(directory, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)
