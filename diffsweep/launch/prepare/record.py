"""The launch folder of ``diffsweep data prepare --launch`` (``.OUT.prepare/``, beside the dataset
``OUT``) and its record, for ``diffsweep.launch.prepare.launch``:

- ``launch.json``: what was asked (inputs with their sizes and dates, settings, the shard plan:
  the ``request``), the profile, each task's shards and its submissions (job ids, log files);
- ``staging/``: the folder ``stage`` made (plan, tokenizer), where the tasks write the shards;
  ``finish`` turns it into ``OUT`` (renamed: nothing else of the launch folder ends up there);
- ``jobs/``: submitit's folders (pickles, logs); ``code/``: the code snapshot the tasks import;
  ``logs/``: the local queue's (tasks launched on this machine);
- ``finished.json``: written by the task that finished the dataset (its fingerprint).

The record is checked when read (the file may have been edited or damaged) and rewritten under
``record.lock`` (``PrepareStore``); the folder is locked by a launch or cancel, and emptied by
``--force`` only when it holds nothing but these.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterator
from contextlib import AbstractContextManager, contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Annotated, Any

from diffsweep import lockfile
from diffsweep.config import ConfigError
from diffsweep.config.decode import AtLeast, Check, decode_value, format_tag, read_json_record
from diffsweep.data.dataset import META_FILE, DatasetMeta, read_meta
from diffsweep.data.shards import write_json
from diffsweep.fsutil import empty_folder, flocked
from diffsweep.launch.jobs.attempt import Attempt, AttemptStore
from diffsweep.rundir import now

FORMAT = "diffsweep-prepare-launch/1"
LAUNCH_FILE = "launch.json"
STAGING = "staging"
FINISHED_FILE = "finished.json"
LOCK_FILE = "launch.lock"  # held by a launch or cancel
RECORD_LOCK = "record.lock"  # held for a read-modify-write of launch.json (a launch, cancel, the local queue)
LOGS = "logs"  # the local queue's
FINISH_LOCK = "finish.lock"  # held by the task that finishes the dataset
JOBS, CODE = "jobs", "code"  # submitit's folders, the code snapshot
# Everything a launch writes in its folder (with write_json's temporary ``.NAME.PID`` files):
# --force discards a folder of these only.
WRITTEN = (LAUNCH_FILE, STAGING, FINISHED_FILE, LOCK_FILE, RECORD_LOCK, FINISH_LOCK, JOBS, CODE, LOGS)


def launch_folder(out: Path) -> Path:
    """Where a launched prepare of the dataset ``out`` keeps its state: ``.OUT.prepare`` beside it."""
    out = out.absolute()
    return out.parent / f".{out.name}.prepare"


def _shards(value: Any, key: str) -> list[int]:
    shards = decode_value(list[Annotated[int, AtLeast(0)]], value, key)
    if not shards:
        raise ConfigError(key, "expected a list of shard numbers, got []")
    return shards


@dataclass
class TaskRecord:
    """One task of the array: its shards and its submissions (the latest last)."""

    shards: Annotated[list[int], Check(_shards)]
    attempts: list[Attempt] = field(default_factory=list)

    @property
    def latest(self) -> Attempt | None:
        return self.attempts[-1] if self.attempts else None


@dataclass
class LaunchRecord:
    """``launch.json``: what was asked and where each task stands."""

    format: Annotated[str, format_tag(FORMAT)]
    out: str  # the dataset folder
    request: dict[str, Any]  # inputs with their sizes and dates, settings, the shard plan (``request_of``)
    replace: bool  # launched with --force: the dataset replaces one that exists
    tasks: list[TaskRecord]
    profile: str | None = None  # as given on the first launch (a relaunch without --profile uses it)
    executor: str | None = None
    created: str | None = None


def read_record(folder: Path) -> LaunchRecord | None:
    """The launch record (None when there is none), checked (the file may have been edited or
    damaged): a ``ConfigError`` naming the file and the field."""
    try:
        return read_json_record(LaunchRecord, folder / LAUNCH_FILE, "launch record")
    except FileNotFoundError:
        return None


def write_record(folder: Path, record: LaunchRecord) -> None:
    write_json(folder / LAUNCH_FILE, dataclasses.asdict(record))


class PrepareStore(AttemptStore):
    """``launch.json`` as the store of the launch's job arrays (its folder: the launch folder)."""

    def locked(self) -> AbstractContextManager[None]:
        return flocked(self.folder / RECORD_LOCK)

    def read(self) -> LaunchRecord | None:
        return read_record(self.folder)

    def write(self, record: LaunchRecord) -> None:
        write_record(self.folder, record)

    def latest(self, record: LaunchRecord) -> list[Attempt]:
        return [a for task in record.tasks if (a := task.latest) is not None]


def require_record(out: Path) -> tuple[Path, LaunchRecord]:
    """The launch folder of ``out`` and its record; a ``ConfigError`` saying how to launch one when there is none."""
    folder = launch_folder(out)
    record = read_record(folder)
    if record is None:
        raise ConfigError(str(out), f"no launched prepare of it (no {folder / LAUNCH_FILE}); launch one with "
                          f"`diffsweep data prepare INPUTS --out {out} --launch`")
    return folder, record


@dataclass(frozen=True)
class FinishedRecord:
    """``finished.json``: written by the task that finished the dataset."""

    fingerprint: str  # the dataset's (``DatasetMeta.fingerprint``)
    finished: str  # when


def write_finished(folder: Path, fingerprint: str) -> None:
    write_json(folder / FINISHED_FILE, dataclasses.asdict(FinishedRecord(fingerprint, now())))


def finished_meta(folder: Path, out: Path) -> DatasetMeta | None:
    """The dataset's metadata if this launch finished it (and it is still the one there)."""
    try:
        done = read_json_record(FinishedRecord, folder / FINISHED_FILE, "finished record")
        meta = read_meta(out.absolute() / META_FILE)
    except (OSError, ValueError):  # ConfigError included: a damaged record finished nothing
        return None
    return meta if meta.fingerprint == done.fingerprint else None


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
