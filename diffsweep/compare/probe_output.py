"""Where ``diffsweep compare SWEEP --probes`` writes: the ``--out`` folder, checked before anything
is read or written, then filled atomically, and the comparison's MLflow run.

The folder is replaced only when diffsweep wrote it: its ``probes.json`` is a probe comparison
that lists every other file in the folder among the files it wrote. Anything else that exists at
``--out`` (a file, a link, a folder holding any file diffsweep did not write) is refused with one
line and left as it is; an empty folder is used. Only the files the old ``probes.json`` lists are
ever deleted, so a file of the user's is never removed, even one added while the comparison ran.
"""

from __future__ import annotations

import json
import os
import shutil
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from diffsweep.config import ConfigError
from diffsweep.config.decode import read_json_fields
from diffsweep.fsutil import parents_made_for, put_folder
from diffsweep.tracking import tags as tag
from diffsweep.tracking.provenance import source_tags
from diffsweep.tracking.results import result_run
from diffsweep.tracking.store import ensure_experiment, mlflow_client

if TYPE_CHECKING:
    from diffsweep.compare.probe_tables import ProbeComparison

REPORT = "probes.json"
# The keys of a probes.json that ``ProbeComparison.to_dict`` wrote (how an earlier comparison is known).


def check_out(folder: Path) -> tuple[Path, ...]:
    """Whether the comparison may write ``folder`` (the ``--out`` option's one check): it does
    not exist (its first existing parent must be a folder), is an empty folder, or is a folder an
    earlier comparison wrote. Returns the earlier comparison's files there (to replace); raises
    ``ConfigError`` naming ``out`` otherwise. Reads only."""
    for parent in folder.absolute().parents:
        if parent.exists() or parent.is_symlink():
            if not parent.is_dir():
                raise ConfigError("out", f"{parent} is not a folder, so {folder} cannot be made in it")
            break
    if folder.is_symlink():
        raise ConfigError("out", f"{folder} is a link; give a folder path (diffsweep writes a folder there)")
    if not folder.exists():
        return ()
    if not folder.is_dir():
        raise ConfigError("out", f"{folder} exists and is not a folder; give a new folder (diffsweep writes "
                          "probes.md, probes.json and PNGs there)")
    entries = sorted(folder.iterdir())
    if not entries:
        return ()
    ours = _written_by_us(folder)
    foreign = [p.name for p in entries if p.name not in ours or p.is_symlink() or not p.is_file()]
    if foreign:
        shown = ", ".join(foreign[:3]) + (f", ... ({len(foreign) - 3} more)" if len(foreign) > 3 else "")
        raise ConfigError("out", f"{folder} holds files diffsweep did not write ({shown}); give a new or empty "
                          "folder, or the folder of an earlier `compare --probes`")
    return tuple(entries)


@dataclass(frozen=True)
class _Report:
    """What tells an earlier comparison's ``probes.json`` (the rest of it is the report's)."""

    sweep: Any
    experiment: Any
    tables: Any
    arms: Any
    files: list[str]  # every file the comparison wrote in its folder


def _written_by_us(folder: Path) -> set[str]:
    """The names of the files an earlier comparison wrote in ``folder`` (its probes.json lists
    them); empty when ``folder`` holds no such report."""
    try:
        report = read_json_fields(_Report, folder / REPORT, "comparison report")
    except (OSError, ConfigError):
        return set()
    names = {Path(f).name for f in report.files}
    return names | {REPORT} if REPORT in names else set()


def write_outputs(result: ProbeComparison, folder: Path, old: tuple[Path, ...], uri: str | None) -> None:
    """``probes.md``, ``probes.json`` and the plots into ``folder`` (``old``: the earlier
    comparison's files there, from ``check_out``, which are replaced), and the comparison run when
    ``uri`` is given. Everything is written into a new temporary folder beside ``folder`` first,
    then renamed into place."""
    from diffsweep.compare.probe_report import markdown, plot, sections

    try:
        with parents_made_for(folder):
            tmp = Path(tempfile.mkdtemp(prefix=f".{folder.name}.tmp-", dir=folder.parent))
            try:
                tmp.chmod(0o777 & ~_umask())  # mkdtemp's 0o700 would become the output folder's mode
                names = []
                for tables in sections(result.tables):
                    t = tables[0]
                    name = f"{t.probe}-{t.spec.table}.png" if t.probe != t.spec.table else f"{t.probe}.png"
                    plot(tables, result, tmp / name)
                    names.append(name)
                result.folder = folder
                result.files = [folder / "probes.md", folder / REPORT, *(folder / n for n in names)]
                (tmp / "probes.md").write_text(markdown(result, names))
                if uri is not None:
                    result.mlflow_run_id = _log(uri, result, tmp)
                (tmp / REPORT).write_text(json.dumps(result.to_dict(), indent=1) + "\n")
                for path in old:  # only the earlier comparison's own files; the rename refuses a non-empty folder
                    path.unlink(missing_ok=True)
                put_folder(tmp, folder)
            finally:
                shutil.rmtree(tmp, ignore_errors=True)  # a folder made here (gone after the rename)
    except OSError as exc:
        raise ConfigError("out", f"cannot write {folder} ({exc.strerror or exc})") from None


def _umask() -> int:
    mask = os.umask(0)
    os.umask(mask)
    return mask


def _log(uri: str, result: ProbeComparison, tmp: Path) -> str:
    """The comparison as its own MLflow run in the sweep's experiment (``diffsweep.kind`` =
    ``comparison``: never an input to a fit), with the outputs as artifacts."""
    client = mlflow_client(uri)
    exp_id = ensure_experiment(uri, result.experiment)
    sources = sorted({r for t in result.tables for c in t.cells for a in c.arms for r in a.runs})
    tags = source_tags() | {
        tag.KIND: tag.COMPARISON_KIND,
        tag.COMPARISON_SWEEP: result.sweep,
        tag.COMPARISON_OF: "probes",
        tag.COMPARISON_PROBES: ",".join(dict.fromkeys(t.probe for t in result.tables)),
        tag.COMPARISON_BASELINE: ",".join(g.baseline for g in result.arm_groups)[:5000],
        tag.COMPARISON_STEP: "newest" if result.step is None else str(result.step),
        tag.COMPARISON_RUNS: ",".join(sources)[:5000],
    }
    stamp = time.strftime("%Y-%m-%d %H:%M:%S")
    with result_run(client, exp_id, f"compare probes {result.sweep} {stamp}", tags) as run:
        (tmp / REPORT).write_text(json.dumps(result.to_dict() | {"mlflow_run_id": run.run_id}, indent=1) + "\n")
        run.attach(tmp)
    run_id = run.run_id
    return run_id
