"""Helpers for launch tests: tiny sweeps on the session's text dataset, waiting for a state, and a job
process held still (SIGSTOP) while a test signals it."""

from __future__ import annotations

import contextlib
import dataclasses
import json
import os
import shutil
import signal
import subprocess
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest

from diffsweep.rundir import read_job_state
from tests.helpers.held import StepHold

# A tiny-xs model on the 512-token BPE test dataset (see tests/conftest.py), a few steps.
TINY_SET = {
    "model.size": "tiny-xs",
    "model.vocab_size": 512,
    "train.seq_len": 32,
    "train.batch_tokens": 128,
    "train.micro_batch_size": 2,
    "train.warmup_steps": 2,
    "train.eval_every": 4,
    "train.eval_tokens": 256,
    "train.checkpoint_every": 2,
    "train.keep_checkpoints": 100,
    "train.log_every": 1,
}


def write_sweep(path: Path, dataset: Path, *, steps: int = 8, kinds=("transformer", "diff_v1"), extra: str = "",
                name: str = "t") -> Path:
    settings = {**TINY_SET, "data.path": str(dataset), "train.max_steps": steps}
    lines = [f"name: {name}", "set:"] + [f"  {k}: {v}" for k, v in settings.items()]
    lines += ["grid:", f"  model.attention.kind: [{', '.join(kinds)}]"]
    path.write_text("\n".join(lines) + "\n" + extra)
    return path


def ledger(out: Path) -> dict:
    return json.loads((out / "ledger.json").read_text())


def attempts(out: Path) -> dict:
    """Every run's submissions, by key (what must not change when nothing is resubmitted)."""
    return {key: e["attempts"] for key, e in ledger(out)["entries"].items()}


def wait_for(predicate, timeout: float, what: str, poll: float = 0.5):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = predicate()
        if value:
            return value
        time.sleep(poll)
    raise AssertionError(f"timed out after {timeout} s waiting for {what}")


def _proc_status(pid: int) -> dict[str, str]:
    return dict(line.split(":", 1) for line in Path(f"/proc/{pid}/status").read_text().splitlines() if ":" in line)


def stopped(pid: int) -> bool:
    """Whether process ``pid`` is stopped (by SIGSTOP)."""
    return _proc_status(pid)["State"].strip().startswith("T")


def in_mask(pid: int, sig: int, *fields: str) -> bool:
    """Whether ``sig`` is in one of the signal masks ``fields`` of /proc/PID/status (SigPnd and ShdPnd:
    sent but not delivered yet, e.g. to a stopped process; SigIgn: ignored)."""
    status = _proc_status(pid)
    return any(int(status[f].strip(), 16) >> (sig - 1) & 1 for f in fields)


def pending(pid: int, sig: int) -> bool:
    return in_mask(pid, sig, "SigPnd", "ShdPnd")


def store_locks(pid: int) -> list[str]:
    """The files of an SQLite MLflow store on which process ``pid`` holds a lock (``/proc/locks``,
    not one it waits for): ``mlflow.db`` (SQLite's own), ``mlflow.db.lock`` (``diffsweep.tracking.store``'s)."""
    from diffsweep.tracking.store import lock_holders

    found = []
    for fd in Path(f"/proc/{pid}/fd").iterdir():
        with contextlib.suppress(OSError):
            target = os.readlink(fd)
            if Path(target).name.startswith("mlflow.db") and str(pid) in lock_holders(os.stat(fd).st_ino):
                found.append(target)
    return found


def stop_outside_the_store(pid: int) -> bool:
    """Stop ``pid`` (SIGSTOP); True once it is stopped holding no lock on its MLflow store, else it
    is continued (False: try again). A job stopped holding one hangs every command that opens the
    store until it is continued (a launch waited 13 minutes in CI)."""
    os.kill(pid, signal.SIGSTOP)
    deadline = time.monotonic() + 10
    while not stopped(pid):
        if time.monotonic() > deadline:
            raise AssertionError(f"process {pid} did not stop")
        time.sleep(0.001)
    if not store_locks(pid):
        return True
    os.kill(pid, signal.SIGCONT)
    return False


@contextmanager
def held(pid: int) -> Iterator[None]:
    """The job process ``pid`` stopped (SIGSTOP) for the block: whatever the block sends it is
    handled after, at whatever step it had reached, so no run can finish before a signal arrives.
    It is stopped holding no lock on its MLflow store (``stop_outside_the_store``), so commands that
    open the store meanwhile do not wait for it.
    (Slurm's signals come with a SIGCONT of their own: a Slurm job may go on, and end, before.)"""
    try:
        wait_for(lambda: stop_outside_the_store(pid), 30, f"process {pid} to stop outside the store's locks",
                 poll=0.005)
        yield
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGCONT)


@contextmanager
def held_at(hold: StepHold) -> Iterator[int]:
    """The pid of the one job that waits at step ``hold.step`` (``tests.helpers.held``), held (SIGSTOP,
    see ``held``) for the block; after it, the job goes on, handling what the block sent it."""
    (pid,) = hold.wait()
    try:
        with held(pid):
            yield pid
    finally:
        hold.release()


def training(run_dir: Path, starts: int | None = None) -> dict | None:
    """The run's ``job.json`` once its job (its start number ``starts``, if given) is running and
    has reported a step, e.g. to hold its ``pid``; None before."""
    job = read_job_state(run_dir)
    running = job is not None and job.state == "running" and job.step is not None
    return dataclasses.asdict(job) if running and starts in (None, job.starts) else None


def metric_steps(uri: str, run_id: str, key: str = "train/loss") -> list[int]:
    from mlflow.tracking import MlflowClient

    return sorted(m.step for m in MlflowClient(uri).get_metric_history(run_id, key))


def require_slurm() -> None:
    """Skip (with the reason) when no Slurm controller answers; under DIFFSWEEP_REQUIRE_SLURM=1 (CI,
    which starts the localhost cluster) fail instead."""
    ok = shutil.which("sinfo") is not None and subprocess.run(["sinfo", "-h"], capture_output=True,
                                                             timeout=30).returncode == 0
    if not ok:
        reason = ("no reachable Slurm controller (start one: bash slurm/start-cluster.sh && "
                  "source /tmp/diffsweep-slurm/env.sh)")
        if os.environ.get("DIFFSWEEP_REQUIRE_SLURM") == "1":
            pytest.fail(reason)
        pytest.skip(reason)


@pytest.fixture
def slurm_cluster() -> None:
    """A test that needs the localhost Slurm cluster (see ``require_slurm``)."""
    require_slurm()
