"""The launch folder of ``diffsweep data prepare --launch`` (``.OUT.prepare/``, beside the dataset
``OUT``) and its record, for ``diffsweep.launch.prepare``:

- ``launch.json``: what was asked (inputs with their sizes and dates, settings, the shard plan:
  the ``request``), the profile, each task's shards and its submissions (job ids, log files);
- ``staging/``: the folder ``stage`` made (plan, tokenizer), where the tasks write the shards;
  ``finish`` turns it into ``OUT`` (renamed: nothing else of the launch folder ends up there);
- ``jobs/``: submitit's folders (pickles, logs); ``code/``: the code snapshot the tasks import;
- ``finished.json``: written by the task that finished the dataset (its fingerprint).

The record is checked when read (the file may have been edited or damaged); the folder is locked
by a launch or cancel, and emptied by ``--force`` only when it holds nothing but these.
"""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from diffsweep import lockfile
from diffsweep.config import ConfigError
from diffsweep.data.dataset import META_FILE, DatasetMeta, read_meta
from diffsweep.fsutil import empty_folder
from diffsweep.launch.ledger import Attempt

FORMAT = "diffsweep-prepare-launch/1"
LAUNCH_FILE = "launch.json"
STAGING = "staging"
FINISHED_FILE = "finished.json"
LOCK_FILE = "launch.lock"  # held by a launch or cancel
FINISH_LOCK = "finish.lock"  # held by the task that finishes the dataset
JOBS, CODE = "jobs", "code"  # submitit's folders, the code snapshot
# Everything a launch writes in its folder (with write_json's temporary ``.NAME.PID`` files):
# --force discards a folder of these only.
WRITTEN = (LAUNCH_FILE, STAGING, FINISHED_FILE, LOCK_FILE, FINISH_LOCK, JOBS, CODE)


def launch_folder(out: Path) -> Path:
    """Where a launched prepare of the dataset ``out`` keeps its state: ``.OUT.prepare`` beside it."""
    out = out.absolute()
    return out.parent / f".{out.name}.prepare"


def read_record(folder: Path) -> dict[str, Any] | None:
    """The launch record (None when there is none)."""
    try:
        record = json.loads((folder / LAUNCH_FILE).read_text())
    except FileNotFoundError:
        return None
    except (OSError, ValueError) as exc:
        raise ConfigError(str(folder / LAUNCH_FILE), f"not a readable launch record ({exc})") from None
    if not isinstance(record, dict) or record.get("format") != FORMAT:
        raise ConfigError(str(folder / LAUNCH_FILE), f"format is not {FORMAT!r}")
    _check_record(record, folder / LAUNCH_FILE)
    return record


def _check_record(record: dict[str, Any], path: Path) -> None:
    """What the launch code reads from a launch record, checked (the file may have been edited or
    damaged): a ``ConfigError`` naming the file and the field."""
    def bad(key: str, expected: str, value: Any) -> ConfigError:
        return ConfigError(str(path), f"{key}: expected {expected}, got {value!r}")

    for key, kind, expected in (("request", dict, "an object"), ("tasks", list, "a list of tasks"),
                                ("replace", bool, "true or false"), ("out", str, "a path")):
        if not isinstance(record.get(key), kind):
            raise bad(key, expected, record.get(key))
    for key in ("profile", "executor"):
        if record.get(key) is not None and not isinstance(record[key], str):
            raise bad(key, "a name or null", record[key])
    fields = {f.name for f in dataclasses.fields(Attempt)}
    for t, task in enumerate(record["tasks"]):
        shards = task.get("shards") if isinstance(task, dict) else None
        if not isinstance(shards, list) or not shards or not all(
                isinstance(i, int) and not isinstance(i, bool) and i >= 0 for i in shards):
            raise bad(f"tasks[{t}].shards", "a list of shard numbers", shards)
        attempts = task.get("attempts")
        if not isinstance(attempts, list) or not all(
                isinstance(a, dict) and {"executor", "submitted", "code_dir", "folder"} <= set(a) <= fields for a in attempts):
            raise bad(f"tasks[{t}].attempts", "a list of submissions", attempts)
        for a in attempts:
            if not isinstance(a["executor"], str) or not isinstance(a["folder"], str) or not (
                    a.get("job_id") is None or isinstance(a["job_id"], str)):
                raise bad(f"tasks[{t}].attempts", "submissions with an executor, job_id and folder", a)


def require_record(out: Path) -> tuple[Path, dict[str, Any]]:
    """The launch folder of ``out`` and its record; a ``ConfigError`` saying how to launch one when there is none."""
    folder = launch_folder(out)
    record = read_record(folder)
    if record is None:
        raise ConfigError(str(out), f"no launched prepare of it (no {folder / LAUNCH_FILE}); launch one with "
                          f"`diffsweep data prepare INPUTS --out {out} --launch`")
    return folder, record


def finished_meta(folder: Path, out: Path) -> DatasetMeta | None:
    """The dataset's metadata if this launch finished it (and it is still the one there)."""
    try:
        done = json.loads((folder / FINISHED_FILE).read_text())
        meta = read_meta(out.absolute() / META_FILE)
    except (OSError, ValueError, ConfigError):
        return None
    return meta if meta.fingerprint == done.get("fingerprint") else None


@contextmanager
def locked(folder: Path, out: Path, what: str) -> Iterator[None]:
    """One launch or cancel of a prepare at a time (``diffsweep.lockfile``: works on NFS)."""
    with lockfile.hold(folder / LOCK_FILE, what, "out", f"another launch or cancel of {out} is in progress"):
        yield


def discard(folder: Path) -> None:
    """Empty the launch folder (its lock, held by the caller, stays), if it holds only what a launch
    writes: a folder of the user's that happens to have its name is refused, never emptied."""
    foreign = sorted(c.name for c in folder.iterdir() if c.name not in WRITTEN and not _temporary(c.name))
    if foreign:
        raise ConfigError(str(folder), f"holds {foreign[0]!r}, which a launched prepare does not write: not a launch "
                          "folder of diffsweep; move it away yourself (nothing was deleted)")
    empty_folder(folder, keep=LOCK_FILE)


def _temporary(name: str) -> bool:
    """A temporary file of ``write_json`` (``.launch.json.PID``), left by a process killed while writing."""
    return any(name.startswith(f".{written}.") and name.rsplit(".", 1)[-1].isdigit() for written in WRITTEN)
