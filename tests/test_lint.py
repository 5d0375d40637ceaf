"""The static checks, ``.ci/lint`` (ruff and mypy as pyproject.toml configures them), as one test of
the suite: a finding fails it with the checkers' report. Run inside the suite, mypy (~45 CPU-s on a
cold cache) shares the machine with the other workers' tests instead of holding the test command
on one core before they start."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


@pytest.mark.slow
def test_ruff_and_mypy_find_nothing():
    # the tools of this interpreter's environment, as `. .venv/bin/activate && bash .ci/lint` finds them
    path = os.pathsep.join([str(Path(sys.executable).parent), os.environ.get("PATH", "")])
    done = subprocess.run(["bash", str(ROOT / ".ci/lint")], cwd=ROOT, env=os.environ | {"PATH": path},
                          capture_output=True, text=True, timeout=900)
    assert done.returncode == 0, done.stdout[-6000:] + done.stderr[-3000:]
    assert "+ ruff check" in done.stdout and "+ mypy" in done.stdout and "Success: no issues found" in done.stdout
