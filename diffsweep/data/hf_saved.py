"""A folder written by Hugging Face's ``save_to_disk``, as ``data prepare`` takes it: how one is
recognised (a ``Dataset``'s ``state.json`` + ``dataset_info.json``, or a ``DatasetDict``'s
``dataset_dict.json``), and the checks of its JSON files that ``datasets`` reads without checking."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from diffsweep.config import ConfigError
from diffsweep.data.errors import json_type, one_line

HF_SAVED = ("state.json", "dataset_info.json")  # a Dataset.save_to_disk directory
HF_SAVED_DICT = "dataset_dict.json"  # a DatasetDict.save_to_disk directory


def is_saved_dataset(path: Path) -> bool:
    """Whether the directory ``path`` is a ``save_to_disk`` folder (of a ``Dataset`` or a ``DatasetDict``)."""
    return all((path / name).is_file() for name in HF_SAVED) or (path / HF_SAVED_DICT).is_file()


def check_saved(path: Path, split: str) -> None:
    """The JSON files of a ``save_to_disk`` folder that ``datasets`` reads without checking (a
    damaged one is a ``KeyError`` deep inside it): each error names the file."""
    if (path / HF_SAVED_DICT).is_file():
        splits = _json_file(path / HF_SAVED_DICT).get("splits")
        if not isinstance(splits, list) or not all(isinstance(s, str) for s in splits):
            raise ConfigError(str(path / HF_SAVED_DICT), f"splits: expected a list of split names, got {splits!r}")
        if split not in splits:
            raise ConfigError(str(path), f"no split {split!r} (it has: {', '.join(splits)})")
        path = path / split
    state = _json_file(path / HF_SAVED[0])
    files = state.get("_data_files")
    if not isinstance(files, list) or not files or not all(
            isinstance(f, dict) and isinstance(f.get("filename"), str) for f in files):
        raise ConfigError(str(path / HF_SAVED[0]), f"_data_files: expected a list of {{'filename': ...}}, got {files!r}")
    _json_file(path / HF_SAVED[1])


def _json_file(path: Path) -> dict[str, Any]:
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError) as exc:
        raise ConfigError(str(path), f"not a readable JSON file ({one_line(exc)})") from exc
    if not isinstance(data, dict):
        raise ConfigError(str(path), f"expected a JSON object, got {json_type(data)}")
    return data
