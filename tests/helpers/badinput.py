"""Bad input as a user meets it: run ``diffsweep`` in a fresh process, expect one ``error:`` line and
exit 2 with no traceback, and prove that nothing was created, changed or deleted.

    with untouched(tmp_path):
        r = diffsweep("data", "prepare", "docs", "--out", "docs", "--force", cwd=tmp_path)
    refused(r, "--out", "docs")
"""

from __future__ import annotations

import hashlib
import os
import subprocess
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path


def diffsweep(*args: str, cwd: Path, env: dict[str, str] | None = None, timeout: float = 300,
              stdin: str | None = None) -> subprocess.CompletedProcess:
    """Run ``diffsweep ARGS`` in a fresh process in ``cwd``, as a user would."""
    return subprocess.run([sys.executable, "-m", "diffsweep", *args], cwd=cwd, capture_output=True, text=True,
                          env={**os.environ, **(env or {})}, timeout=timeout, input=stdin)


def refused(r: subprocess.CompletedProcess, *needles: str, code: int = 2) -> str:
    """Assert exit ``code``, exactly one ``error:`` line on stderr naming every needle, no traceback
    and no usage box; return the line."""
    assert r.returncode == code, f"exit {r.returncode}\n{r.stdout}\n{r.stderr}"
    assert "Traceback" not in r.stderr and "Traceback" not in r.stdout, r.stderr
    assert "Usage:" not in r.stderr and "╭" not in r.stderr, r.stderr  # Typer's usage box
    errors = [line for line in r.stderr.splitlines() if line.startswith("error:")]
    assert len(errors) == 1, r.stderr
    for needle in needles:
        assert needle in errors[0], errors[0]
    return errors[0]


def tree_state(root: Path) -> dict[str, str]:
    """Every path under ``root`` with what it is: a folder, a link's target, a file's size, mode and
    content hash. Two equal states mean nothing under ``root`` was created, changed or deleted."""
    state: dict[str, str] = {}
    for path in sorted(root.rglob("*")):
        rel = str(path.relative_to(root))
        if path.is_symlink():
            state[rel] = f"link -> {os.readlink(path)}"
        elif path.is_dir():
            state[rel] = "dir"
        else:
            st = path.stat()
            state[rel] = f"file {st.st_size} {oct(st.st_mode)} {hashlib.sha256(path.read_bytes()).hexdigest()}"
    return state


@contextmanager
def untouched(root: Path) -> Iterator[None]:
    """Assert that the block leaves the tree under ``root`` exactly as it found it."""
    before = tree_state(root)
    yield
    after = tree_state(root)
    created = sorted(set(after) - set(before))
    deleted = sorted(set(before) - set(after))
    changed = sorted(p for p in set(before) & set(after) if before[p] != after[p])
    assert not (created or deleted or changed), f"created {created}, deleted {deleted}, changed {changed}"
