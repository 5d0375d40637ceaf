"""``diffsweep bench ... --out FILE``: the results as JSON, rewritten after every measured row.

A benchmark on a GPU may be killed by a time limit, so the file is written while it runs, not
only at the end: each write replaces the whole file atomically (a temporary file beside it, then a
rename), so a reader, or a killed run, always leaves one complete JSON document of everything
measured so far, with ``"complete": false`` until the benchmark has finished (``true`` then).
Standard library only (the CLI checks ``--out`` before loading torch).
"""

from __future__ import annotations

import json
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from diffsweep.config import ConfigError
from diffsweep.config.decode import read_json_fields
from diffsweep.fsutil import write_atomically


def check_out(out: Path | None) -> None:
    """``--out`` must name a file in an existing folder (checked before the benchmark runs): a new
    file, or an earlier benchmark's results (``is_result``), never another file of the user's."""
    if out is None:
        return
    if not str(out).strip() or out.is_dir() or not out.parent.is_dir():
        raise ConfigError("out", f"expected a file in an existing folder, got '{out}'")
    if out.exists() and out.stat().st_size and not is_result(out):  # (an empty file holds nothing to lose)
        raise ConfigError("out", f"{out} exists and is not a diffsweep benchmark's results; expected a new file "
                          "(or one an earlier `diffsweep bench --out` wrote, which is replaced)")


@dataclass(frozen=True)
class _Result:
    """What tells a result file of this module (``bench model``: rows; ``bench attention``: cases)."""

    complete: bool
    rows: list[Any] | None = None
    cases: list[Any] | None = None


def is_result(path: Path) -> bool:
    """Whether ``path`` is a file this module wrote (so ``--out`` may replace it)."""
    try:
        result = read_json_fields(_Result, path, "bench result")
    except (OSError, ConfigError):
        return False
    return result.rows is not None or result.cases is not None


def write_result(out: Path, result: dict) -> None:
    """Replace ``out`` with ``result`` as JSON (the same text as ``--json`` prints)."""
    write_atomically(out, json.dumps(result, indent=2) + "\n")


def result_writer(out: Path | None) -> Callable[[dict], None] | None:
    """The ``on_progress`` hook of ``run_attention``/``run_model`` that keeps ``out`` up to date."""
    if out is None:
        return None
    return lambda result: write_result(out, result)
