"""Code snapshots: a launched job imports a copy of the code made at launch time, so editing the
repository mid-sweep never changes a running (or requeued) job.

The copy holds the ``diffsweep`` and ``diffsweep_kernels`` packages (Python sources and package
data, no caches) under ``<sweep output>/code/<content hash>/``; identical code reuses one copy.
Jobs put that directory first on ``PYTHONPATH``.
"""

from __future__ import annotations

import hashlib
import os
import shutil
import subprocess
from pathlib import Path

from diffsweep.fsutil import publish_once
from diffsweep.rundir import SNAPSHOT_FILE, write_snapshot_record

IGNORE = shutil.ignore_patterns("__pycache__", "*.pyc", "*.so", ".*")


def package_dirs() -> dict[str, Path]:
    """The importable packages a job needs, by import name."""
    import diffsweep
    import diffsweep_kernels

    return {"diffsweep": Path(diffsweep.__file__).parent, "diffsweep_kernels": Path(diffsweep_kernels.__file__).parent}


def _files(root: Path) -> list[Path]:
    return sorted(p for p in root.rglob("*") if p.is_file() and "__pycache__" not in p.parts
                  and not p.name.startswith(".") and p.suffix not in (".pyc", ".so"))


def content_hash(packages: dict[str, Path]) -> str:
    h = hashlib.sha256()
    for name, root in sorted(packages.items()):
        for path in _files(root):
            h.update(f"{name}/{path.relative_to(root)}\0".encode())
            h.update(path.read_bytes())
    return h.hexdigest()[:12]


def snapshot_code(out: Path) -> Path:
    """Copy the running code into ``out/code/<hash>`` (once) and return that directory."""
    packages = package_dirs()
    target = out / "code" / content_hash(packages)
    if (target / SNAPSHOT_FILE).is_file():
        return target.resolve()
    staging = target.with_name(f".{target.name}.{os.getpid()}.tmp")
    shutil.rmtree(staging, ignore_errors=True)
    staging.mkdir(parents=True)
    for name, root in packages.items():
        shutil.copytree(root, staging / name, ignore=IGNORE)
    commit, dirty = _git_state(packages["diffsweep"].parent)
    write_snapshot_record(staging, commit, dirty)
    publish_once(staging, target)  # or another launch made the same snapshot first
    return target.resolve()


def _git_state(root: Path) -> tuple[str, str]:
    try:
        run = lambda *a: subprocess.run(["git", "-C", str(root), *a], capture_output=True, text=True,  # noqa: E731
                                        timeout=10, check=True).stdout.strip()
        return run("rev-parse", "HEAD"), str(bool(run("status", "--porcelain", "--untracked-files=no"))).lower()
    except (OSError, subprocess.SubprocessError):
        return "unknown", "unknown"
