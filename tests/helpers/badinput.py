"""Bad input as a user meets it: run ``diffsweep``, expect one ``error:`` line and exit 2 with no
traceback, and prove that nothing was created, changed or deleted.

    with untouched(tmp_path):
        r = diffsweep("data", "prepare", "docs", "--out", "docs", "--force", cwd=tmp_path)
    refused(r, "--out", "docs")

``diffsweep`` runs the command in this process (``tests.helpers.cli.run``: what the command does,
in milliseconds); ``diffsweep_process`` in a fresh ``python -m diffsweep`` process, for the few
tests where the process boundary is the point (what the interpreter prints and returns at exit).
``refused`` reads either result (any CompletedProcess-like object).
"""

from __future__ import annotations

import hashlib
import os
import subprocess
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from tests.helpers.cli import run, run_process


def diffsweep(*args: str, cwd: Path, env: dict[str, str] | None = None,
              stdin: str | None = None) -> subprocess.CompletedProcess:
    """``diffsweep ARGS`` in this process, in ``cwd`` with ``env`` added to the environment: what a
    user's process would print and return (an uncaught exception is a traceback on stderr)."""
    return run(*args, cwd=cwd, env=env, stdin=stdin)


def diffsweep_process(*args: str, cwd: Path, env: dict[str, str] | None = None, timeout: float = 300,
                      stdin: str | None = None) -> subprocess.CompletedProcess:
    """``python -m diffsweep ARGS`` in a fresh process in ``cwd``: only where the process boundary is
    what a test checks (say so in the test)."""
    return run_process(*args, cwd=cwd, env=env, stdin=stdin, timeout=timeout)


def refused(r: subprocess.CompletedProcess, *needles: str, code: int = 2, alone: bool = False) -> str:
    """Assert exit ``code``, exactly one ``error:`` line on stderr naming every needle, no traceback
    and no usage box; return the line. With ``alone``, stderr holds nothing else but ``note:`` lines
    (no warnings either)."""
    assert r.returncode == code, f"exit {r.returncode}\n{r.stdout}\n{r.stderr}"
    assert "Traceback" not in r.stderr and "Traceback" not in r.stdout, r.stderr
    assert "Usage:" not in r.stderr and "╭" not in r.stderr, r.stderr  # Typer's usage box
    errors = [line for line in r.stderr.splitlines() if line.startswith("error:")]
    assert len(errors) == 1, r.stderr
    if alone:
        others = [line for line in r.stderr.splitlines()
                  if line.strip() and not line.startswith(("error:", "note: "))]
        assert not others, r.stderr
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
