"""Lock files that work on a shared file system (NFS), for work that must happen once: a launch
or cancel of a sweep directory, a trainer in a run directory. Imports no torch (``train`` and
``launch`` both use it).

A lock is a small JSON file naming its holder (``Holder``: host, pid and its start time, when, what
for, the Slurm job and restart count), written in full and then hard-linked to the lock's name
(``_create``). A holder known to be gone (``_gone``: a dead pid on this host, an earlier run of this
requeued Slurm job, a Slurm job that no longer runs) loses its lock, taken over with a warning under
a second lock (``_take_over``); any other holder is refused, naming it and the file to delete if it
is gone. There is deliberately no heartbeat or timeout (``_gone`` says why). See docs/training.md,
'`diffsweep train`', and docs/sweeps.md, 'Launching and following a sweep'.
"""

from __future__ import annotations

import contextlib
import json
import os
import socket
import sys
import time
import uuid
from collections.abc import Callable, Iterator
from dataclasses import asdict, dataclass
from datetime import UTC, datetime
from pathlib import Path

from diffsweep import slurm
from diffsweep.config import ConfigError
from diffsweep.config.decode import decode

_TRIES = 20  # a take-over by another process in progress is waited for this many times 50 ms


@dataclass(frozen=True)
class Holder:
    """Who holds a lock."""

    host: str
    pid: int
    start: int | None  # the pid's start time (clock ticks since boot), to tell it from a later one
    created: str
    what: str  # e.g. "launch", "train"
    job: str | None = None  # Slurm job ("123" or "123_4" for an array task) the holder runs in
    restarts: int = 0  # SLURM_RESTART_COUNT: how many times that job was requeued

    def describe(self) -> str:
        job = f", Slurm job {self.job}" + (f" (restart {self.restarts})" if self.restarts else "") if self.job else ""
        return f"{self.what} on host {self.host}, pid {self.pid}{job}, since {self.created}"


class LockBusy(ConfigError):
    """The lock is held by a live holder (or one that cannot be checked from here)."""

    def __init__(self, key: str, message: str, holder: Holder | None) -> None:
        super().__init__(key, message)
        self.holder = holder


def this_process(what: str) -> Holder:
    """The holder record of the calling process."""
    return Holder(host=socket.gethostname(), pid=os.getpid(), start=proc_start(os.getpid()),
                  created=datetime.now(UTC).isoformat(timespec="seconds"), what=what,
                  job=slurm_job(), restarts=int(os.environ.get("SLURM_RESTART_COUNT") or 0))


@contextlib.contextmanager
def hold(path: Path, what: str, key: str, busy: str, *,
         warn: Callable[[str], None] | None = None) -> Iterator[Holder]:
    """Hold the lock file ``path`` for the block. A live holder: ``LockBusy`` (a ConfigError with
    ``key``, saying ``busy`` and naming the holder). A gone holder: taken over, after ``warn``
    (default: a ``warning:`` line on stderr). Missing parent directories are created, and
    removed on release if they are then empty (so a refused command leaves nothing behind)."""
    created = _missing_parents(path)
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        mine = this_process(what)
        raw = _acquire(path, mine, key, busy, warn or _stderr)
    except BaseException:
        _remove_empty(created)
        raise
    try:
        yield mine
    finally:
        with contextlib.suppress(FileNotFoundError):
            if path.read_bytes() == raw:  # never remove a lock that is not ours
                path.unlink()
        _remove_empty(created)


def _acquire(path: Path, mine: Holder, key: str, busy: str, warn: Callable[[str], None]) -> bytes:
    raw = _encode(mine)
    theirs = None
    for _ in range(_TRIES):
        if _create(path, raw, key):
            return raw
        try:
            held = path.read_bytes()
        except FileNotFoundError:  # released (or taken over) meanwhile: try again
            continue
        theirs = _decode(held)
        gone = _gone(theirs) if theirs is not None else None
        if theirs is None or gone is None:
            raise LockBusy(key, _refusal(path, theirs, busy), theirs)
        if _take_over(path, held, key):
            warn(f"warning: {path}: took over the lock of {theirs.describe()}: {gone}")
        else:
            time.sleep(0.05)  # another process is taking it over: give it a moment
    raise LockBusy(key, _refusal(path, theirs, busy), theirs)


def _refusal(path: Path, theirs: Holder | None, busy: str) -> str:
    if theirs is None:
        return f"{busy}; its lock file {path} is unreadable (not a diffsweep lock?); delete it if nothing uses it"
    if theirs.host == socket.gethostname():
        hint = "wait for it to end"
    else:
        hint = f"that host cannot be checked from here: wait for it to end, or if that process is gone, delete {path}"
    return f"{busy} ({theirs.describe()}); {hint}"


def takes(name: str, lock: str) -> bool:
    """Whether a file named ``name`` is one that taking the lock file ``lock`` writes beside it for
    a moment (its temporary file, its ``.break``): another process's launch may be taking it now."""
    return name == f"{lock}.break" or name.startswith(f".{lock}.")


def _create(path: Path, raw: bytes, key: str) -> bool:
    """Make ``path`` hold ``raw`` if it does not exist (atomically: write in full, then link).

    Written in full under a temporary name and then hard-linked to the lock's name: ``link`` is
    atomic on every NFS version (``O_EXCL`` only from NFSv3), and a lock is never seen half-written."""
    tmp = path.with_name(f".{path.name}.{socket.gethostname()}.{os.getpid()}.{uuid.uuid4().hex[:8]}")
    try:
        with open(tmp, "wb") as f:
            f.write(raw)
            f.flush()
            os.fsync(f.fileno())
        try:
            os.link(tmp, path)
            return True
        except FileExistsError:
            return False
        except OSError:
            if os.stat(tmp).st_nlink == 2:  # NFS can report a failure although the link was made (a lost reply)
                return True
            raise  # e.g. a file system without hard links
    except OSError as exc:
        raise ConfigError(key, f"cannot create the lock file {path} ({exc.strerror or exc})") from None
    finally:
        with contextlib.suppress(OSError):
            tmp.unlink()


def _take_over(path: Path, stale: bytes, key: str) -> bool:
    """Remove ``path`` if it still holds ``stale``, under ``NAME.break``; False if another process
    is taking it over now (or already did). The second lock is held for milliseconds: the lock is
    re-read and removed only if it is still the stale one, so two processes that both found it
    stale cannot remove each other's fresh lock."""
    breaker = path.with_name(path.name + ".break")
    raw = _encode(this_process("take-over"))
    if not _create(breaker, raw, key):
        with contextlib.suppress(FileNotFoundError):  # its taker died in those milliseconds
            held = breaker.read_bytes()
            other = _decode(held)
            if other is not None and _gone(other) is not None and breaker.read_bytes() == held:
                breaker.unlink()
        return False
    try:
        if path.read_bytes() == stale:
            path.unlink()
            return True
        return False
    except FileNotFoundError:
        return False
    finally:
        with contextlib.suppress(FileNotFoundError):
            breaker.unlink()


def _gone(holder: Holder) -> str | None:
    """Why ``holder`` is known to be gone, or None if it may still live.

    A holder is gone (its lock stale, taken over with a warning) when:

    - it ran on this host and its pid is dead or now belongs to a later process (pids get reused:
      the record keeps the pid's start time, from ``/proc/PID/stat``);
    - it was an earlier run of this very Slurm job (requeued: Slurm runs one at a time);
    - it was another Slurm job that Slurm no longer runs (``squeue``).

    Any other holder on another host cannot be checked from here, so the lock is refused, naming the
    holder and the file to delete if it is gone. There is deliberately no heartbeat and timeout: a
    holder that lives but is stopped (Slurm suspend, SIGSTOP) or stalled on I/O would lose its lock,
    which is the double work the lock prevents; and comparing file times across hosts needs
    synchronized clocks."""
    job = slurm_job()
    restarts = int(os.environ.get("SLURM_RESTART_COUNT") or 0)
    if holder.job is not None and holder.job == job and holder.restarts < restarts:
        return f"that was an earlier run of this Slurm job {job}, requeued since"
    if holder.host == socket.gethostname():
        if pid_alive(holder.pid, holder.start):
            return None
        return f"pid {holder.pid} is no longer running on {holder.host}"
    if holder.job is not None and slurm.job_ended(holder.job):
        return f"Slurm job {holder.job} is no longer running"
    return None


def slurm_job() -> str | None:
    """The Slurm job this process runs in: ``ARRAY_TASK`` for an array task (as ``squeue`` and the
    sweep ledger name it), else the job id; None outside Slurm."""
    env = os.environ
    if env.get("SLURM_ARRAY_JOB_ID") and env.get("SLURM_ARRAY_TASK_ID"):
        return f"{env['SLURM_ARRAY_JOB_ID']}_{env['SLURM_ARRAY_TASK_ID']}"
    return env.get("SLURM_JOB_ID") or None


def proc_start(pid: int) -> int | None:
    """A process's start time (clock ticks since boot), to tell it from a later one with its pid."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    return int(stat.rsplit(")", 1)[-1].split()[19])


def pid_alive(pid: int, start: int | None = None) -> bool:
    """Whether process ``pid`` (started at ``start``, when known) exists on this host and is not a zombie."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        try:
            os.kill(pid, 0)
        except ProcessLookupError:
            return False
        except PermissionError:  # another user's process
            return True
        return True
    fields = stat.rsplit(")", 1)[-1].split()
    return fields[0] != "Z" and (start is None or int(fields[19]) == start)


def _encode(holder: Holder) -> bytes:
    return (json.dumps(asdict(holder)) + "\n").encode()


def _decode(raw: bytes) -> Holder | None:
    try:
        return decode(Holder, json.loads(raw), noun="lock holder field")
    except (ValueError, ConfigError):  # not JSON, not a mapping, other fields or types: no holder
        return None


def _missing_parents(path: Path) -> list[Path]:
    """The parent directories of ``path`` that do not exist yet, deepest first."""
    missing = []
    parent = path.parent
    while not parent.exists():
        missing.append(parent)
        parent = parent.parent
    return missing


def _remove_empty(directories: list[Path]) -> None:
    for d in directories:  # deepest first; stops at the first one something else now uses
        try:
            d.rmdir()
        except OSError:
            return


def _stderr(line: str) -> None:
    print(line, file=sys.stderr)
