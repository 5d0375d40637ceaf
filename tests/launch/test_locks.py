"""Lock files (diffsweep.lockfile): one holder at a time across processes and hosts, stale holders
taken over, and the trainer's run-directory lock as a user meets it."""

from __future__ import annotations

import dataclasses
import json
import multiprocessing
import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest

from diffsweep import lockfile, slurm
from diffsweep.lockfile import Holder, LockBusy, hold, proc_start
from tests.helpers.cli import run as cli

from ..conftest import TINY_RUN


def write_lock(path: Path, **fields) -> Holder:
    holder = dataclasses.replace(lockfile.this_process("launch"), **fields)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(dataclasses.asdict(holder)))
    return holder


@pytest.fixture
def sleeper():
    proc = subprocess.Popen(["sleep", "60"])
    yield proc
    proc.kill()
    proc.wait()


def test_hold_writes_the_holder_and_leaves_nothing_behind(tmp_path):
    path = tmp_path / "new" / "dir" / ".x.lock"
    with hold(path, "launch", "--out", "busy") as mine:
        data = json.loads(path.read_text())
        assert data["host"] == socket.gethostname() and data["pid"] == mine.pid
        assert data["start"] == proc_start(mine.pid) and data["what"] == "launch"
        assert [p.name for p in path.parent.iterdir()] == [".x.lock"]  # no temporary files left
    assert not (tmp_path / "new").exists()  # directories it created, removed again when empty


def test_a_live_holder_on_this_host_is_refused_naming_it(tmp_path, sleeper):
    path = tmp_path / ".x.lock"
    write_lock(path, pid=sleeper.pid, start=proc_start(sleeper.pid))
    with pytest.raises(LockBusy, match=rf"out: busy \(launch on host {socket.gethostname()}, pid {sleeper.pid}, "
                                       r"since .*\); wait for it to end"):
        with hold(path, "launch", "--out", "busy"):
            pass
    assert json.loads(path.read_text())["pid"] == sleeper.pid  # untouched


def test_a_dead_or_reused_pid_on_this_host_is_taken_over_with_a_warning(tmp_path):
    dead = subprocess.Popen(["true"])
    dead.wait()
    path = tmp_path / ".x.lock"
    for pid, start in ((dead.pid, 1), (os.getpid(), 1)):  # the second: our pid, another start time
        write_lock(path, pid=pid, start=start)
        warnings = []
        with hold(path, "launch", "--out", "busy", warn=warnings.append) as mine:
            assert json.loads(path.read_text())["pid"] == mine.pid
        assert len(warnings) == 1 and f"pid {pid} is no longer running" in warnings[0], warnings
        assert not path.exists()


def test_a_holder_on_another_host_is_refused_with_how_to_clear_it(tmp_path, monkeypatch):
    monkeypatch.setattr(slurm, "job_ended", lambda job: False)
    path = tmp_path / ".x.lock"
    write_lock(path, host="login2", pid=4242)
    with pytest.raises(LockBusy, match=rf"on host login2, pid 4242.*if that process is gone, delete {path}$"):
        with hold(path, "launch", "--out", "busy"):
            pass
    write_lock(path, host="node7", pid=4242, job="77_3")  # a Slurm job Slurm still runs
    with pytest.raises(LockBusy, match=r"Slurm job 77_3"):
        with hold(path, "train", "run", "busy"):
            pass


def test_slurm_holders_gone_by_slurms_word_or_requeued_are_taken_over(tmp_path, monkeypatch):
    path = tmp_path / ".x.lock"
    monkeypatch.setattr(slurm, "job_ended", lambda job: job == "77_3")
    write_lock(path, host="node7", pid=4242, job="77_3")
    warnings = []
    with hold(path, "train", "run", "busy", warn=warnings.append):
        pass
    assert "Slurm job 77_3 is no longer running" in warnings[0]

    # The same job, requeued onto another node: its earlier run is dead (Slurm runs one at a time).
    monkeypatch.setattr(slurm, "job_ended", lambda job: False)
    monkeypatch.setenv("SLURM_ARRAY_JOB_ID", "80")
    monkeypatch.setenv("SLURM_ARRAY_TASK_ID", "1")
    monkeypatch.setenv("SLURM_RESTART_COUNT", "1")
    write_lock(path, host="node7", pid=4242, job="80_1", restarts=0)
    warnings = []
    with hold(path, "train", "run", "busy", warn=warnings.append) as mine:
        assert (mine.job, mine.restarts) == ("80_1", 1)
    assert "earlier run of this Slurm job 80_1" in warnings[0]
    write_lock(path, host="node7", pid=4242, job="80_1", restarts=1)  # the same run on another node: live
    with pytest.raises(LockBusy):
        with hold(path, "train", "run", "busy"):
            pass


def test_an_unreadable_lock_file_is_refused(tmp_path):
    path = tmp_path / ".x.lock"
    for text in ("", "{not json", "[]", '{"host": "h"}', ('{"host": 1, "pid": "x", "start": null, "created": "",'
                 ' "what": "w"}')):
        path.write_text(text)
        with pytest.raises(LockBusy, match="unreadable"):
            with hold(path, "launch", "--out", "busy"):
                pass


def _contend(path: str, barrier, results, done) -> None:
    gone = lockfile._gone
    # A slow check (squeue takes tens of ms) widens the window between finding a lock stale and
    # taking it over, in which another process may already have taken it.
    lockfile._gone = lambda holder: time.sleep(0.2) or gone(holder)
    barrier.wait()
    try:
        with hold(Path(path), "launch", "--out", "busy", warn=lambda line: None):
            results.put(("won", time.monotonic()))
            done.wait(120)  # held until every contender has reported: a loser cannot come late
    except LockBusy:
        results.put(("refused", time.monotonic()))


def test_processes_taking_over_one_stale_lock_at_once_end_with_one_holder(tmp_path):
    dead = subprocess.Popen(["true"])
    dead.wait()
    path = tmp_path / ".x.lock"
    ctx = multiprocessing.get_context("fork")
    for _ in range(3):
        write_lock(path, pid=dead.pid, start=1)
        barrier, results, done = ctx.Barrier(6), ctx.Queue(), ctx.Event()
        procs = [ctx.Process(target=_contend, args=(str(path), barrier, results, done)) for _ in range(6)]
        for p in procs:
            p.start()
        outcomes = sorted(results.get(timeout=120)[0] for _ in procs)  # the timeouts only end a hang
        done.set()
        for p in procs:
            p.join(120)
        assert outcomes == ["refused"] * 5 + ["won"], outcomes
        assert not path.exists() and not path.with_name(".x.lock.break").exists()


def _train_args(dataset: Path) -> list[str]:
    sets = [*TINY_RUN, f"data.path={dataset}", "train.max_steps=100000", "train.eval_every=1000",
            "train.keep_checkpoints=2"]
    return [sys.executable, "-m", "diffsweep", "train", *(f"--set={s}" for s in sets)]


def _wait_for_line(proc: subprocess.Popen, prefix: str) -> None:
    for line in proc.stdout:
        if line.startswith(prefix):
            return
    raise AssertionError(f"no line starting with {prefix!r}; stderr: {proc.stderr.read()}")


@pytest.mark.slow
def test_a_second_trainer_in_a_run_directory_is_refused_and_a_dead_ones_lock_taken_over(text_dataset, tmp_path,
                                                                                         mlflow_store):
    env = {**os.environ, "MLFLOW_TRACKING_URI": mlflow_store, "PYTHONUNBUFFERED": "1"}
    first = subprocess.Popen(_train_args(text_dataset), cwd=tmp_path, env=env, stdout=subprocess.PIPE,
                             stderr=subprocess.PIPE, text=True)
    try:
        _wait_for_line(first, "step 3/")
        first.send_signal(signal.SIGSTOP)  # stopped (e.g. Slurm suspend) is not gone: no timeout steals it
        # the second trainer: this test's process (the CLI in process), another process than the first's
        second = cli(*_train_args(text_dataset)[3:], cwd=tmp_path, env={"MLFLOW_TRACKING_URI": mlflow_store})
        assert second.returncode == 2, second.stderr
        (run_dir,) = (tmp_path / "runs").iterdir()
        assert second.stderr == (f"error: runs/{run_dir.name}: another trainer is using this run directory (train on "
                                 f"host {socket.gethostname()}, pid {first.pid}, since "
                                 f"{json.loads((run_dir / '.trainer.lock').read_text())['created']}); "
                                 "wait for it to end\n")
    finally:
        first.kill()  # dies holding the lock
        first.communicate()
    third = subprocess.Popen(_train_args(text_dataset), cwd=tmp_path, env=env, stdout=subprocess.PIPE,
                             stderr=subprocess.PIPE, text=True)
    _wait_for_line(third, "resuming")
    third.send_signal(signal.SIGUSR2)
    out, err = third.communicate(timeout=300)
    assert third.returncode == 75, err
    assert err.startswith(f"warning: runs/{run_dir.name}/.trainer.lock: took over the lock of train on host "
                          f"{socket.gethostname()}, pid {first.pid}") and f"pid {first.pid} is no longer running" in err
    assert not (run_dir / ".trainer.lock").exists()  # released when the trainer stopped
