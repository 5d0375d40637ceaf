"""The sweep ledger: ``<sweep output>/ledger.json`` maps each run key to its name, run directory,
identity fields, and every submission (executor, Slurm job / array task or local process, code
snapshot, log paths, the profile and resources it asked for). Read-modify-write happens under an
exclusive lock and is atomic, so ``launch``, ``cancel`` and the local queue can share it.
"""

from __future__ import annotations

import contextlib
import json
from collections.abc import Iterator
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from diffsweep.config import ConfigError
from diffsweep.config.decode import decode
from diffsweep.fsutil import flocked, write_atomically
from diffsweep.launch.jobs.attempt import Attempt, AttemptStore
from diffsweep.rundir import now  # noqa: F401  (the ledger's time stamps; re-exported for the launcher)

FORMAT = "diffsweep-ledger/1"
LEDGER_FILE = "ledger.json"
LOCK_FILE = ".ledger.lock"
LAUNCH_LOCK = ".launch.lock"  # in the sweep directory: held by a launch or cancel of it


@dataclass
class Entry:
    """One run of the sweep, as launched."""

    key: str
    name: str
    run_dir: str
    identity: dict[str, Any]  # flattened resolved config (for "changed: <field>")
    attempts: list[Attempt] = field(default_factory=list)
    mlflow_run_id: str | None = None  # filled in by status once the job has created it

    @property
    def latest(self) -> Attempt | None:
        return self.attempts[-1] if self.attempts else None


@dataclass
class Ledger:
    """All entries of one sweep output directory."""

    sweep: str
    experiment: str
    tracking_uri: str
    entries: dict[str, Entry] = field(default_factory=dict)

    def by_name(self, name: str) -> list[Entry]:
        return [e for e in self.entries.values() if e.name == name]


def ledger_path(out: Path) -> Path:
    return out / LEDGER_FILE


def read_ledger(out: Path) -> Ledger | None:
    """The ledger of ``out``, or None when nothing was launched there."""
    path = ledger_path(out)
    if not path.is_file():
        return None
    try:
        raw = json.loads(path.read_text())
        if not isinstance(raw, dict) or raw.get("format") != FORMAT:
            raise ValueError(f"not a {FORMAT} file")
        return decode(Ledger, {k: v for k, v in raw.items() if k != "format"}, noun="ledger field")
    except (OSError, ValueError, ConfigError) as exc:  # the ledger is a file users can edit
        raise ConfigError(str(path), f"unreadable sweep ledger ({exc}); restore it or use another --out") from None


def write_ledger(out: Path, ledger: Ledger) -> None:
    """Write atomically (``write_atomically``, fsynced)."""
    out.mkdir(parents=True, exist_ok=True)
    data = {"format": FORMAT, "sweep": ledger.sweep, "experiment": ledger.experiment,
            "tracking_uri": ledger.tracking_uri,
            "entries": {k: asdict(e) for k, e in sorted(ledger.entries.items())}}
    write_atomically(ledger_path(out), json.dumps(data, indent=1) + "\n", sync=True)


@contextlib.contextmanager
def locked(out: Path) -> Iterator[None]:
    """Hold the sweep directory's ledger lock (blocking) for a read-modify-write."""
    out.mkdir(parents=True, exist_ok=True)
    with flocked(out / LOCK_FILE):
        yield


class SweepStore(AttemptStore):
    """The ledger as the store of a sweep's job arrays (its folder: the sweep's output directory)."""

    def locked(self) -> contextlib.AbstractContextManager[None]:
        return locked(self.folder)

    def read(self) -> Ledger | None:
        return read_ledger(self.folder)

    def write(self, record: Ledger) -> None:
        write_ledger(self.folder, record)

    def latest(self, record: Ledger) -> list[Attempt]:
        return [a for e in record.entries.values() if (a := e.latest) is not None]
