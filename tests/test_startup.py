"""A command's start-up imports are frozen out of the garbage collector (diffsweep/startup.py);
nothing else is: not a library user's process, not this test process."""

from __future__ import annotations

import gc
import os
import subprocess
import sys

from diffsweep import startup
from tests.conftest import TINY_RUN

# A fresh process that trains the tiny run, then prints how many objects are frozen (gc.get_freeze_count).
SCRIPT = """
import gc, sys
from pathlib import Path
from diffsweep.config import load_config
sets = sys.argv[2:]
if sys.argv[1] == "command":
    from diffsweep.cli import main
    sys.argv = ["diffsweep", "train", "--out", "runs", *(f"--set={s}" for s in sets)]
    try:
        main()
    except SystemExit as exc:
        assert exc.code in (0, None), exc.code
else:
    from diffsweep.train.trainer import train
    train(load_config(None, sets), Path("runs/lib"), experiment="diffsweep", echo=lambda line: None)
print("frozen", gc.get_freeze_count(), gc.isenabled())
"""


def _frozen(how: str, dataset, tmp_path, store) -> tuple[int, bool]:
    sets = [*TINY_RUN, f"data.path={dataset}", "train.max_steps=3", "train.eval_every=3"]
    result = subprocess.run([sys.executable, "-c", SCRIPT, how, *sets], cwd=tmp_path, capture_output=True, text=True,
                            env={**os.environ, **store}, timeout=600)
    assert result.returncode == 0, result.stderr[-3000:]
    line = result.stdout.strip().splitlines()[-1].split()
    return int(line[1]), line[2] == "True"


def test_a_train_command_freezes_its_imports_and_a_library_caller_does_not(text_dataset, tmp_path, store):
    """Real processes: what is frozen is a property of the process (its entry point)."""
    frozen, enabled = _frozen("command", text_dataset, tmp_path, store)
    assert frozen > 100_000 and enabled  # torch's and MLflow's objects; the collector is on again
    assert _frozen("library", text_dataset, tmp_path, store) == (0, True)


def test_imports_frozen_does_nothing_outside_a_command_process():
    before = gc.get_freeze_count()
    with startup.imports_frozen():
        assert gc.isenabled()
    assert gc.get_freeze_count() == before and gc.isenabled()


def test_in_a_command_process_the_block_runs_without_the_collector_and_then_freezes(monkeypatch):
    monkeypatch.setattr(startup, "_COMMAND", True)
    try:
        with startup.imports_frozen():
            assert not gc.isenabled()
            made = [[] for _ in range(10)]
        assert gc.isenabled() and gc.get_freeze_count() >= len(made)
    finally:
        gc.unfreeze()  # this test process's objects go back to the collector
