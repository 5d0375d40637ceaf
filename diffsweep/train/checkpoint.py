"""Sharded, atomic checkpoints holding everything a resumed run needs to continue bit for bit.

A checkpoint is a directory ``step_XXXXXXXX/`` in the run's ``checkpoints/``: the model weights and
optimizer state as ``torch.distributed.checkpoint`` (DCP) shards written by every process (no process
holds the whole model; a run saved on N processes resumes on M), ``train_state.pt`` (the rest,
written by rank 0) and ``checksums.json`` (every other file's size and CRC-32, written last). It is
written into ``.step_XXXXXXXX.tmp/`` and renamed into place by rank 0 once every process has written
its shards; only the newest ``keep`` are kept, and those of ``train.checkpoint_at``. Loading never runs
code from a checkpoint, and checks every file before training resumes from it (``load_checkpoint``,
``verify_shards``).

See docs/training.md, 'Checkpoints, resume and preemption' (and the page it links for several processes).
"""

from __future__ import annotations

import dataclasses
import json
import os
import pickle
import re
import shutil
import warnings
import zlib
from dataclasses import dataclass
from pathlib import Path
from typing import Annotated, Any

import torch
import torch.distributed as dist
import torch.distributed.checkpoint as dcp
from torch.distributed.checkpoint.api import CheckpointException

from diffsweep.config import ConfigError
from diffsweep.config.decode import AtLeast, read_json_record
from diffsweep.fsutil import publish
from diffsweep.rundir import CHECKPOINTS, checkpoint_dir

FORMAT = "diffsweep-checkpoint/3"
UNVERIFIED_FORMAT = "diffsweep-checkpoint/2"  # sharded, without checksums.json (before checksums)
SINGLE_FILE_FORMAT = "diffsweep-checkpoint/1"  # one .pt file with the full state (before sharding)
# Step, tokens, schedule, data position, RNG, metric state, MLflow run id, the optimizer's hyperparameter
# groups, the config. Small; written by rank 0.
STATE_FILE = "train_state.pt"
METADATA_FILE = ".metadata"  # DCP's global metadata
CHECKSUMS_FILE = "checksums.json"
SHARD_SUFFIX = ".distcp"  # DCP's data files, ``__<rank>_<n>.distcp``
_CHUNK = 8 << 20  # bytes read per CRC update
_NAME = re.compile(r"^step_(\d{8})(\.pt)?$")
_ANSI = re.compile(r"\x1b\[[0-9;]*m")  # terminal colour codes, which torch puts in some errors
REQUIRED = ("format", "step", "tokens_seen", "optimizer_groups", "scheduler", "data", "rng", "run_key",
            "mlflow_run_id", "metrics_state")
SINGLE_FILE_REQUIRED = ("format", "step", "tokens_seen", "model", "optimizer", "scheduler", "data", "rng",
                        "run_key", "mlflow_run_id", "metrics_state")


@dataclass(frozen=True)
class FileSum:
    size: Annotated[int, AtLeast(0)]  # bytes
    crc32: Annotated[int, AtLeast(0)]


@dataclass(frozen=True)
class ChecksumsRecord:
    """``checksums.json``: every file of a checkpoint with its size and CRC-32 when written."""

    files: dict[str, FileSum]
    algorithm: str = "crc32"


class CorruptCheckpoint(ConfigError):
    """A checkpoint file whose size or checksum is not the one recorded when it was written
    (``key`` names the file): the caller may fall back to an older checkpoint."""


def checkpoint_path(directory: Path, step: int) -> Path:
    return checkpoint_dir(directory.parent, step) if directory.name == CHECKPOINTS else directory / f"step_{step:08d}"


def checkpoint_step(path: Path) -> int:
    """The step a checkpoint's name says (``step_00000040`` or ``step_00000040.pt``)."""
    m = _NAME.match(path.name)
    if m is None:
        raise ValueError(f"{path.name} is not a checkpoint's name (step_NNNNNNNN)")
    return int(m.group(1))


def is_checkpoint(path: Path) -> bool:
    """Whether ``path``'s name is a checkpoint's (``step_XXXXXXXX`` or ``step_XXXXXXXX.pt``)."""
    return _NAME.match(path.name) is not None


def list_checkpoints(directory: Path) -> list[Path]:
    """Checkpoints in ``directory``, oldest first (by step; a sharded one after a single file of
    the same step)."""
    if not directory.is_dir():
        return []
    found = [p for p in directory.iterdir() if _NAME.match(p.name) and (p.is_dir() == (p.suffix != ".pt"))]
    return sorted(found, key=lambda p: (checkpoint_step(p), p.is_dir()))


def save_checkpoint(directory: Path, state: dict[str, Any], tensors: dict[str, Any], *, keep: int,
                    pinned: frozenset[int] = frozenset()) -> Path:
    """Write the checkpoint of ``state["step"]``: ``tensors`` (state dicts of tensors, sharded
    ones as DTensors) with DCP, ``state`` as ``train_state.pt``; keep the newest ``keep`` and
    those of the ``pinned`` steps (``train.checkpoint_at``: cooldown branches start from them).

    Collective: every process calls it with its own shards; rank 0 writes ``state`` (the others'
    is ignored) and renames the finished directory into place before anyone returns."""
    distributed = dist.is_initialized()
    rank = dist.get_rank() if distributed else 0
    path = checkpoint_path(directory, state["step"])
    tmp = directory / f".{path.name}.tmp"
    if rank == 0:
        directory.mkdir(parents=True, exist_ok=True)
        shutil.rmtree(tmp, ignore_errors=True)  # left by a save that crashed
        tmp.mkdir()
    if distributed:
        dist.barrier()
    try:
        with warnings.catch_warnings():
            warnings.filterwarnings("ignore", message=".*assuming the intent is to save in a single process")
            dcp.save(tensors, storage_writer=dcp.FileSystemWriter(tmp, sync_files=True), no_dist=not distributed)
        # Each process checksums the shards it wrote, while they are in its page cache.
        sums = {file.name: _file_sum(file) for file in tmp.glob(f"__{rank}_*{SHARD_SUFFIX}")}
        if distributed:
            parts: list[dict] | None = [{} for _ in range(dist.get_world_size())] if rank == 0 else None
            dist.gather_object(sums, parts, dst=0)
        if rank == 0:
            if distributed:
                assert parts is not None  # gathered on rank 0
                sums = {name: entry for part in parts for name, entry in part.items()}
            with open(tmp / STATE_FILE, "wb") as f:
                torch.save({"format": FORMAT, **state}, f)
                f.flush()
                os.fsync(f.fileno())
            for file in sorted(tmp.iterdir()):  # the metadata, the state, any file DCP named otherwise
                if file.name not in sums:
                    sums[file.name] = _file_sum(file)
            with open(tmp / CHECKSUMS_FILE, "w") as f:
                json.dump({"algorithm": "crc32", "files": sums}, f, indent=1, sort_keys=True)
                f.flush()
                os.fsync(f.fileno())
            _fsync_dir(tmp)
            publish(tmp, path)  # replaces a checkpoint of the same step (a resumed run saving it again)
            _fsync_dir(directory)
    except BaseException:
        if rank == 0:
            shutil.rmtree(tmp, ignore_errors=True)  # a failed save leaves no torn checkpoint
        raise
    if rank == 0:
        # Keep the newest ``keep`` by step, and always the one just written (a run resumed from an
        # older checkpoint may share the directory with newer ones).
        for old in [p for p in list_checkpoints(directory) if checkpoint_step(p) not in pinned][:-keep]:
            if old != path:
                shutil.rmtree(old) if old.is_dir() else old.unlink()
    if distributed:
        dist.barrier()
    return path


def load_checkpoint(path: Path) -> dict[str, Any]:
    """Read a checkpoint's training state (a single-file one's whole state) and check its shards'
    metadata; a missing, truncated or foreign checkpoint is a ``ConfigError`` naming it.

    A checkpoint with checksums has every file's size and the checksums of all but the shards
    checked first (``verify_shards`` checks those); a mismatch is a ``CorruptCheckpoint``."""
    if path.is_dir():
        checksums = _read_checksums(path)
        if checksums is not None:
            _verify(path, checksums, [name for name in checksums if not name.endswith(SHARD_SUFFIX)])
        state = _load_torch(path / STATE_FILE, (FORMAT, UNVERIFIED_FORMAT), REQUIRED)
        if checksums is None and state["format"] == FORMAT:
            raise CorruptCheckpoint(str(path / CHECKSUMS_FILE), "missing (the checkpoint's checksums)")
        _check_metadata(path)
        return state
    if path.is_file():
        return _load_torch(path, (SINGLE_FILE_FORMAT,), SINGLE_FILE_REQUIRED)
    raise ConfigError(str(path), "checkpoint not found")


def verify_shards(path: Path) -> None:
    """Check the checksums of a checkpoint's shards (after ``load_checkpoint``; nothing to check in
    one from before checksums). Collective: the shards are split over the processes, and every
    process raises the same ``CorruptCheckpoint`` (naming the first bad file) or none."""
    checksums = _read_checksums(path)
    if checksums is None:
        return
    distributed = dist.is_initialized()
    rank, size = (dist.get_rank(), dist.get_world_size()) if distributed else (0, 1)
    shards = sorted(name for name in checksums if name.endswith(SHARD_SUFFIX))
    bad = _bad_files(path, checksums, shards[rank::size])
    if distributed:
        every: list[list[tuple[str, str]]] = [[] for _ in range(size)]
        dist.all_gather_object(every, bad)
        bad = sorted(found for part in every for found in part)
    if bad:
        raise CorruptCheckpoint(str(path / bad[0][0]), bad[0][1])


def load_tensors(path: Path, tensors: dict[str, Any]) -> None:
    """Fill ``tensors`` (state dicts shaped like those saved; DTensors get this process's shards)
    in place from the checkpoint at ``path``. Collective, like ``save_checkpoint``."""
    distributed = dist.is_initialized()
    try:
        with warnings.catch_warnings():
            warnings.filterwarnings("ignore", message=".*assuming the intent is to load in a single process")
            dcp.load(tensors, storage_reader=dcp.FileSystemReader(path), no_dist=not distributed)
    except (Exception, CheckpointException) as exc:  # DCP's gathers every rank's failure (a BaseException)
        raise ConfigError(str(path), f"corrupt or truncated checkpoint shards ({_dcp_error(exc)})") from exc


def _read_checksums(path: Path) -> dict[str, dict[str, int]] | None:
    """``checksums.json``'s files (name -> size and CRC-32), or None for a checkpoint without one."""
    file = path / CHECKSUMS_FILE
    if not file.exists():
        return None
    try:
        record = read_json_record(ChecksumsRecord, file, "checksums file")
    except FileNotFoundError:  # removed since it was found
        raise CorruptCheckpoint(str(file), "missing (the checkpoint's checksums)") from None
    except ConfigError as exc:  # not JSON, or not the record: the field's error, keyed by the file alone
        field = exc.key.removeprefix(str(file)).removeprefix(": ")
        raise CorruptCheckpoint(str(file), ((f"{field}: " if field else "") + exc.message)[:200]) from exc
    checksums = {name: dataclasses.asdict(entry) for name, entry in record.files.items()}
    outside = [name for name in checksums if Path(name).name != name or name in (".", "..")]
    if outside:  # only files of this directory are read
        raise CorruptCheckpoint(str(file), f"names a file outside the checkpoint ({outside[0][:100]})")
    return checksums


def _verify(path: Path, checksums: dict[str, dict[str, int]], names: list[str]) -> None:
    """Every file of the checkpoint has its recorded size, and ``names`` their checksums."""
    for name, entry in sorted(checksums.items()):
        file = path / name
        if not file.is_file():
            raise CorruptCheckpoint(str(file), f"missing (listed in {CHECKSUMS_FILE})")
        if file.stat().st_size != entry["size"]:
            raise CorruptCheckpoint(str(file), f"truncated or overwritten ({file.stat().st_size} bytes, "
                                    f"{entry['size']} when written)")
    bad = _bad_files(path, checksums, names)
    if bad:
        raise CorruptCheckpoint(str(path / bad[0][0]), bad[0][1])


def _bad_files(path: Path, checksums: dict[str, dict[str, int]], names: list[str]) -> list[tuple[str, str]]:
    """``(name, what is wrong)`` for each of ``names`` that does not match its recorded checksum."""
    bad = []
    for name in names:
        try:
            found = _file_sum(path / name)
        except OSError as exc:
            bad.append((name, f"unreadable ({exc.strerror})"))
            continue
        if found != checksums[name]:
            bad.append((name, (f"corrupt (CRC-32 {found['crc32']:08x}, {checksums[name]['crc32']:08x} when "
                              "written)")))
    return bad


def _file_sum(path: Path) -> dict[str, int]:
    """Size and CRC-32 of a file, read in chunks (zlib releases the GIL on them).

    CRC-32 (zlib, 4 GB/s on one core here, against 1.7 for SHA-256 and 0.9 for BLAKE2b) because the
    threat is accidental damage (a bad disk, a torn copy): it catches every burst of up to 32 bits and
    anything else but one time in 2^32; someone who can rewrite a shard can rewrite ``checksums.json``
    too, so a cryptographic hash would buy nothing."""
    crc, size = 0, 0
    buffer = bytearray(_CHUNK)
    view = memoryview(buffer)
    with open(path, "rb", buffering=0) as f:
        while n := f.readinto(buffer):
            crc = zlib.crc32(view[:n], crc)
            size += n
    return {"size": size, "crc32": crc}


def _load_torch(path: Path, expected: tuple[str, ...], required: tuple[str, ...]) -> dict[str, Any]:
    if not path.is_file():
        raise ConfigError(str(path), "checkpoint not found")
    try:
        state = torch.load(path, map_location="cpu", weights_only=True)
    except Exception as exc:  # torch raises several types (RuntimeError, EOFError, UnpicklingError)
        raise ConfigError(str(path), f"corrupt or truncated checkpoint ({_load_error(exc)})") from exc
    if not isinstance(state, dict) or state.get("format") not in expected:
        raise ConfigError(str(path), f"not a diffsweep checkpoint (expected format {expected[0]!r})")
    missing = [k for k in required if k not in state]
    if missing:
        raise ConfigError(str(path), f"checkpoint lacks {', '.join(missing)}")
    return state


class _MetadataUnpickler(pickle.Unpickler):
    """Unpickles DCP metadata only: its dataclasses, torch sizes, dtypes and layouts, paths."""

    _ALLOWED = {("torch", "Size"), ("torch.serialization", "_get_layout"), ("pathlib", "PosixPath"),
                ("collections", "OrderedDict")}

    def find_class(self, module: str, name: str) -> Any:
        if module in ("torch.distributed.checkpoint.metadata", "torch.distributed.checkpoint.filesystem") \
                or (module, name) in self._ALLOWED \
                or (module == "torch" and isinstance(getattr(torch, name, None), torch.dtype)):
            return super().find_class(module, name)
        raise pickle.UnpicklingError(f"unsupported global {module}.{name}")


def _check_metadata(path: Path) -> None:
    """The shards' metadata is there and holds nothing but DCP metadata."""
    metadata = path / METADATA_FILE
    if not metadata.is_file():
        raise ConfigError(str(path), f"checkpoint lacks {METADATA_FILE} (the shards' index)")
    try:
        with open(metadata, "rb") as f:
            found = _MetadataUnpickler(f).load()
    except Exception as exc:  # noqa: BLE001 (any unpickling failure means a bad file)
        raise ConfigError(str(path), f"corrupt checkpoint {METADATA_FILE} ({type(exc).__name__}: "
                          f"{str(exc).splitlines()[0][:200] if str(exc) else ''})") from exc
    if type(found).__name__ != "Metadata":
        raise ConfigError(str(path), f"{METADATA_FILE} is not torch.distributed.checkpoint metadata")
    untensors = [k for k, v in found.state_dict_metadata.items() if type(v).__name__ != "TensorStorageMetadata"]
    if untensors:  # DCP would unpickle these unsafely
        raise ConfigError(str(path), f"checkpoint shards hold a non-tensor entry ({untensors[0]})")


def _dcp_error(exc: BaseException) -> str:
    """The root cause inside DCP's multi-rank report (its last line), cleaned to one line."""
    lines = [line.strip() for line in _ANSI.sub("", str(exc)).splitlines() if line.strip()]
    return (lines[-1] if lines else type(exc).__name__)[:200]


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
