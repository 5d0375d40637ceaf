"""The ``diffsweep`` command line in a test: in this process (``run``: milliseconds) or in a fresh
one (``run_process``: 1-3 s of imports on the 2-core CI machine).

``run`` is for tests about what a command does: its output, its exit code, the files it writes,
what it refuses. It calls the same entry point as the console script, with ``prog_name`` "diffsweep",
in ``cwd`` with ``env`` added to the environment, and returns what a process would: the exit code,
stdout and stderr apart, and an uncaught exception as a traceback at the end of stderr (so
``refused`` in tests/helpers/badinput.py still catches one).

``run_process`` is for tests where the process boundary is the point: signals and Ctrl-C, the
exit code the interpreter returns, what is imported at start-up, concurrent invocations, a job
that outlives the command. Such a test says so in its name or docstring.
"""

from __future__ import annotations

import os
import subprocess
import sys
import traceback
from collections.abc import Mapping
from pathlib import Path

from typer.testing import CliRunner

_runner = CliRunner()


def run(*args: str, cwd: Path | str | None = None, env: Mapping[str, str] | None = None,
        stdin: str | None = None) -> subprocess.CompletedProcess:
    """``diffsweep ARGS`` run in this process, as ``python -m diffsweep ARGS`` would run in ``cwd``
    with ``env`` added to the environment."""
    from diffsweep.cli import app

    here = os.getcwd()
    if cwd is not None:
        os.chdir(cwd)
    try:
        result = _runner.invoke(app, list(args), input=stdin, env=dict(env or {}), prog_name="diffsweep")
    finally:
        os.chdir(here)
    stderr = result.stderr
    if result.exception is not None and not isinstance(result.exception, SystemExit):
        stderr += "".join(traceback.format_exception(*result.exc_info))
    return subprocess.CompletedProcess(["diffsweep", *args], result.exit_code, result.stdout, stderr)


def run_process(*args: str, cwd: Path | str | None = None, env: Mapping[str, str] | None = None,
                stdin: str | None = None, timeout: float = 600) -> subprocess.CompletedProcess:
    """``python -m diffsweep ARGS`` in a fresh process in ``cwd``, with ``env`` added to the
    environment."""
    return subprocess.run([sys.executable, "-m", "diffsweep", *args], cwd=cwd, capture_output=True, text=True,
                          env={**os.environ, **(env or {})}, timeout=timeout, input=stdin)
