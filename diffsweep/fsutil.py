"""File-system helpers for commands that must leave the file system as they found it when they fail:
the atomic writers of the files the project writes (``write_atomically``, ``written_atomically``),
the ways a staged folder is put in place (``publish``, ``put_folder``, ``publish_once``), and the
one lock for a record's read-modify-write (``flocked``). Every rename of the package is here."""

from __future__ import annotations

import contextlib
import fcntl
import os
import shutil
import tempfile
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import BinaryIO


@contextlib.contextmanager
def flocked(path: Path) -> Iterator[None]:
    """Hold an exclusive ``flock`` on ``path`` (created if missing; blocking) for a read-modify-write
    of a record beside it. The lock is of the open file: a second ``flocked`` of the same path in
    one process waits for the first."""
    with open(path, "a") as f:
        fcntl.flock(f, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(f, fcntl.LOCK_UN)


@contextlib.contextmanager
def parents_made_for(path: Path) -> Iterator[None]:
    """Create the missing parent folders of ``path`` for the block; if the block raises (Ctrl-C
    included), remove the folders made here again, deepest first and only while they are empty.

    Raises ``OSError`` when a parent cannot be created (having removed what it made).
    """
    missing = [p for p in reversed(path.absolute().parents) if not p.exists()]
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        yield
    except BaseException:
        for folder in reversed(missing):
            try:
                folder.rmdir()
            except FileNotFoundError:
                continue
            except OSError:  # something else was put there meanwhile: keep it, and so its parents
                break
        raise


def temporary_name(name: str) -> str:
    """The temporary file ``write_atomically`` writes ``name`` through: one per process, so two
    writers never share one."""
    return f".{name}.{os.getpid()}.tmp"


def is_temporary(entry: str, name: str) -> bool:
    """Whether ``entry`` is a temporary file of ``name`` (``temporary_name``: a writer may have
    been killed before its rename)."""
    middle = entry.removeprefix(f".{name}.").removesuffix(".tmp")
    return entry.startswith(f".{name}.") and entry.endswith(".tmp") and middle.isdigit()


def write_atomically(path: Path, text: str, *, sync: bool = False) -> None:
    """Write ``text`` to a temporary file beside ``path`` and rename it over ``path``: readers see
    the old or the new file, never half of one. ``sync``: fsync before the rename, so a crash
    right after cannot leave an empty file behind the rename."""
    tmp = path.with_name(temporary_name(path.name))
    with open(tmp, "w") as f:
        f.write(text)
        if sync:
            f.flush()
            os.fsync(f.fileno())
    os.replace(tmp, path)


@contextlib.contextmanager
def written_atomically(paths: Sequence[Path]) -> Iterator[list[BinaryIO]]:
    """Binary files open for writing, one beside each of ``paths`` under its temporary name; when
    the block ends each is flushed, fsynced and renamed over its path (readers see an old file or a
    whole new one); if the block raises, they are removed and no path changes."""
    temps = [path.with_name(temporary_name(path.name)) for path in paths]
    files: list[BinaryIO] = []
    try:
        try:
            for temp in temps:
                files.append(open(temp, "wb"))  # noqa: SIM115 (closed below, after the block)
            yield files
        finally:
            for f in files:
                f.flush()
                os.fsync(f.fileno())
                f.close()
        for temp, path in zip(temps, paths, strict=True):
            os.replace(temp, path)
    except BaseException:
        for temp in temps:
            temp.unlink(missing_ok=True)
        raise


def publish(staged: Path, target: Path, *, fill_empty: bool = False) -> None:
    """Put the finished folder ``staged`` (beside ``target``: one file system) at ``target``, so
    that readers find the earlier folder or the new one, never a mix:

    - no ``target``: ``staged`` is renamed to it;
    - anything there (an earlier folder; a link, which is replaced, not followed): it is renamed
      aside (into ``.NAME.old.*`` beside it), ``staged`` is renamed into place, and only then is
      the old one removed;
    - with ``fill_empty``, an empty folder (one the user made for the outputs) is kept, with its
      permissions, and receives ``staged``'s entries one by one.
    """
    if fill_empty and target.is_dir() and not target.is_symlink() and not any(target.iterdir()):
        for entry in sorted(staged.iterdir()):
            os.replace(entry, target / entry.name)
        staged.rmdir()
    elif target.exists() or target.is_symlink():
        aside = Path(tempfile.mkdtemp(prefix=f".{target.name}.old.", dir=target.parent))
        os.replace(target, aside / target.name)
        os.replace(staged, target)
        shutil.rmtree(aside, ignore_errors=True)
    else:
        os.replace(staged, target)


def put_folder(staged: Path, target: Path) -> None:
    """Rename the finished folder ``staged`` to ``target``, which must be missing or an empty folder:
    what is in a folder there is never replaced (``OSError``)."""
    os.replace(staged, target)


def publish_once(staged: Path, target: Path) -> bool:
    """Rename the finished folder ``staged`` to ``target`` unless another writer put one there first
    (then ``staged`` is removed): whether this call put it there."""
    try:
        os.rename(staged, target)
        return True
    except OSError:  # another writer's folder is there
        shutil.rmtree(staged, ignore_errors=True)
        return False


def empty_folder(folder: Path, *, keep: str) -> None:
    """Remove everything in ``folder`` but the entry named ``keep`` (a lock its caller holds). Only
    for a folder the caller knows diffsweep wrote: links are removed, never followed."""
    for child in folder.iterdir():
        if child.name == keep:
            continue
        if child.is_dir() and not child.is_symlink():
            shutil.rmtree(child)
        else:
            child.unlink()
