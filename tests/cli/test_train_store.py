"""``diffsweep train`` and its MLflow store as a user meets them: many training processes opening
a store that does not exist yet, stores it cannot use (one line naming MLFLOW_TRACKING_URI, exit
2, nothing created), a store left half-migrated, and a damaged ``run.json``.

The command runs in this process (``tests.helpers.cli.run``), except in the test of concurrent
training processes, where the processes are the point."""

from __future__ import annotations

import builtins
import json
import os
import signal
import socket
import sqlite3
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

from tests.helpers.badinput import refused
from tests.helpers.cli import run
from tests.helpers.tracking import mlflow_client

from .test_train_cli import one_line, train_args

# Imports the slow modules once, then forks one child per argument list (argv[2], JSON); each
# child sends its stderr to gate/err<i> and waits for gate/go, then runs the CLI as
# ``python -m diffsweep ARGS`` would: all processes reach the store within milliseconds. Forked, not
# started: eight separate processes still meet in the store, without eight imports of torch and
# MLflow (~4 CPU-s each). Prints the children's exit codes (JSON) once all have ended.
RELEASE = """
import json, os, runpy, sys, time, traceback
import torch, mlflow.tracking, mlflow.store.tracking.sqlalchemy_store, diffsweep.train.trainer
gate, commands = sys.argv[1], json.loads(sys.argv[2])
children = {}
for i, args in enumerate(commands):
    pid = os.fork()
    if pid == 0:
        os.dup2(os.open(os.path.join(gate, f"err{i}"), os.O_WRONLY | os.O_CREAT | os.O_TRUNC), 2)
        os.dup2(os.open(os.devnull, os.O_WRONLY), 1)
        while not os.path.exists(os.path.join(gate, "go")):
            time.sleep(0.002)
        sys.argv = ["diffsweep", *args]
        code = 1
        try:
            runpy.run_module("diffsweep", run_name="__main__", alter_sys=True)
            code = 0
        except SystemExit as exc:
            code = exc.code if isinstance(exc.code, int) else int(exc.code is not None)
        except BaseException:
            traceback.print_exc()
        finally:
            sys.stdout.flush()
            sys.stderr.flush()
            os._exit(code)
    children[pid] = i
open(os.path.join(gate, "ready"), "w").close()
codes = [None] * len(commands)
for _ in commands:
    pid, status = os.wait()
    codes[children[pid]] = os.waitstatus_to_exitcode(status)
print(json.dumps(codes))
"""
# Creating the store's schema takes a process 3-4 s, so processes released within milliseconds all
# meet in it: 8 on the 2-core CI machine (4 per core) is as much contention as 16 was, at half the cost.
# Three steps: a step logged twice by a retried write would show as well as in four.
PROCESSES = 8
STEPS = 3  # above the tiny run's 2 warm-up steps


@pytest.mark.slow
def test_trainings_started_at_once_on_a_new_store_all_finish(text_dataset, tmp_path):
    """8 ``diffsweep train`` processes (real processes: their concurrency is the point; forked from
    one that imported torch and MLflow, see RELEASE) released at the same instant on a store that
    does not exist yet (MLflow alone: every one crashed in its schema creation): 8 FINISHED runs,
    each with every step exactly once."""
    store = tmp_path / "store" / "mlflow.db"
    store.parent.mkdir()
    uri = f"sqlite:///{store}"
    gate = tmp_path / "gate"
    gate.mkdir()
    commands = [train_args(text_dataset, f"train.seed={seed}", f"train.max_steps={STEPS}", f"train.eval_every={STEPS}",
                           f"train.checkpoint_every={STEPS}") for seed in range(PROCESSES)]
    env = {**os.environ, "PYTHONUNBUFFERED": "1", "MLFLOW_TRACKING_URI": uri}
    parent = subprocess.Popen([sys.executable, "-c", RELEASE, str(gate), json.dumps(commands)], cwd=tmp_path, env=env,
                              stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    # Waits for the state (every child forked and waiting, or the parent dead); the bound only ends a hang.
    deadline = time.monotonic() + 900
    while not (gate / "ready").exists():
        assert time.monotonic() < deadline and parent.poll() is None, parent.stderr.read() if parent.poll() else "hung"
        time.sleep(0.1)
    assert not store.exists()
    (gate / "go").touch()
    out, err = parent.communicate(timeout=900)
    assert parent.returncode == 0, err[-3000:]
    codes = json.loads(out.strip().splitlines()[-1])
    failed = {i: (gate / f"err{i}").read_text()[-2000:] for i, code in enumerate(codes) if code != 0}
    assert codes == [0] * PROCESSES, failed
    client = mlflow_client(uri)
    runs = client.search_runs([client.get_experiment_by_name("diffsweep").experiment_id])
    assert sorted(r.data.params["train.seed"] for r in runs) == sorted(str(s) for s in range(PROCESSES))
    for r in runs:
        assert r.info.status == "FINISHED"
        for key in ("train/loss", "train/tokens", "val/loss"):
            steps = sorted(m.step for m in client.get_metric_history(r.info.run_id, key))
            assert steps == (list(range(1, STEPS + 1)) if key.startswith("train/") else [STEPS]), (key, steps)
    assert len(client.search_experiments()) == 2  # MLflow's Default and diffsweep: created once


def _silent_server() -> tuple[socket.socket, int]:
    """A TCP port that accepts connections and never answers (a hung or firewalled server)."""
    listener = socket.socket()
    listener.bind(("127.0.0.1", 0))
    listener.listen(8)
    return listener, listener.getsockname()[1]


def test_unusable_tracking_stores_are_one_line_exit_2_and_create_nothing(text_dataset, tmp_path):
    listener, port = _silent_server()
    not_sqlite = tmp_path / "notes.db"
    not_sqlite.write_text("these are my notes, not a database\n")
    cases = {
        "silent server": (f"http://127.0.0.1:{port}", "unreachable (timed out, within 5 s)"),
        "unknown scheme": ("ftp://example.org/store", "unsupported scheme 'ftp'"),
        "file store": (str(tmp_path / "mlruns"), "file store"),
        "not sqlite": (f"sqlite:///{not_sqlite}", "is not an SQLite database"),
        "a directory": (f"sqlite:///{tmp_path}", "is a directory"),
    }
    try:
        for name, (uri, needle) in cases.items():
            started = time.monotonic()
            result = run(*train_args(text_dataset), cwd=tmp_path, env={"MLFLOW_TRACKING_URI": uri})
            refused(result, "MLFLOW_TRACKING_URI", needle)
            one_line(result)
            # The silent server is given up on after 5 s (the line says so); MLflow's own default would retry
            # for minutes (a hang is what this bounds, loosely: a loaded CI box is slow).
            assert time.monotonic() - started < 120, name
            assert not (tmp_path / "runs").exists() and not (tmp_path / "mlruns").exists(), name
    finally:
        listener.close()
    assert not_sqlite.read_text() == "these are my notes, not a database\n"
    assert not (tmp_path / "mlflow.db").exists()


@pytest.mark.parametrize(("uri", "words"), [
    ("file:///tmp/mlruns", "file store"),
    ("sqlite:///:memory:", "in-memory"),
    ("sqlite://", "in-memory"),
    ("postgresql://me:secret@127.0.0.1/mlflow", ("postgresql://me:***@127.0.0.1/mlflow: cannot use this database from "
                                                "here (ModuleNotFoundError")),
    ("sqlite:///{tmp}/nowhere/mlflow.db", "cannot write the SQLite store"),
    ("sqlite:///{tmp}/foreign.db", "is an SQLite database but not an MLflow store"),
    ("sqlite:///{tmp}/short.db", "is not an SQLite database"),
], ids=["file-uri", "memory", "memory-short", "sql-no-driver", "no-directory", "foreign-sqlite", "short-file"])
def test_check_tracking_refuses(tmp_path, uri, words):
    from diffsweep.config import ConfigError
    from diffsweep.tracking.store import check_tracking

    with sqlite3.connect(tmp_path / "foreign.db") as connection:
        connection.execute("CREATE TABLE mine (x)")
    (tmp_path / "short.db").write_bytes(b"SQLite")
    with pytest.raises(ConfigError) as err:
        check_tracking(uri.format(tmp=tmp_path))
    assert err.value.key == "MLFLOW_TRACKING_URI" and words in err.value.message and "secret" not in str(err.value)
    assert not (tmp_path / "nowhere").exists()


def test_check_tracking_accepts_a_new_an_empty_and_a_working_store(tmp_path, mlflow_store):
    from diffsweep.tracking.store import check_tracking

    (tmp_path / "empty.db").touch()  # SQLite's empty database, which MLflow fills
    for uri in (f"sqlite:///{tmp_path / 'new.db'}", f"sqlite:///{tmp_path / 'empty.db'}", mlflow_store):
        check_tracking(uri)
    assert not (tmp_path / "new.db").exists() and (tmp_path / "empty.db").stat().st_size == 0


def _half_migrate(database: Path, *, runs: bool) -> None:
    """What a schema migration raced by another process leaves: a store with alembic's temporary
    copy of a table it was rebuilding."""
    from diffsweep.tracking.store import ensure_experiment

    uri = f"sqlite:///{database}"
    experiment = ensure_experiment(uri, "half")
    if runs:
        client = mlflow_client(uri)
        client.set_terminated(client.create_run(experiment).info.run_id)
    with sqlite3.connect(database) as connection:
        connection.execute("CREATE TABLE _alembic_tmp_latest_metrics (key VARCHAR(250))")


@pytest.mark.parametrize("runs", [False, True], ids=["empty", "with-runs"])
def test_a_half_migrated_store_says_what_to_do(text_dataset, tmp_path, store, runs):
    database = tmp_path / "mlflow.db"  # the ``store`` fixture's empty store, half-migrated below
    _half_migrate(database, runs=runs)
    before = database.read_bytes()
    result = run(*train_args(text_dataset), cwd=tmp_path, env={"MLFLOW_TRACKING_URI": f"sqlite:///{database}"})
    one_line(result)
    refused(result, "MLFLOW_TRACKING_URI", "half-migrated", "_alembic_tmp_latest_metrics",
                          "mlflow db upgrade" if runs else f"delete {database}")
    assert database.read_bytes() == before and not (tmp_path / "runs").exists()


def test_a_store_of_another_schema_version_says_what_to_do(text_dataset, tmp_path, store):
    database = tmp_path / "mlflow.db"  # the ``store`` fixture's: an empty store of this MLflow's schema
    with sqlite3.connect(database) as connection:
        connection.execute("UPDATE alembic_version SET version_num = '0584bdc529eb'")  # an older MLflow's
    result = run(*train_args(text_dataset), cwd=tmp_path, env=store)
    one_line(result)
    refused(result, "MLFLOW_TRACKING_URI", "schema version 0584bdc529eb",
                          f"mlflow db upgrade sqlite:///{database}")
    assert not (tmp_path / "runs").exists()


def test_a_damaged_run_json_is_one_line_naming_it(text_dataset, tmp_path, store):
    args = train_args(text_dataset, "train.max_steps=3", "train.eval_every=3", "train.checkpoint_every=3")
    first = run(*args, cwd=tmp_path, env=store)
    assert first.returncode == 0, first.stderr
    run_dir = next((tmp_path / "runs").iterdir())
    run_file = run_dir / "run.json"
    whole = run_file.read_text()
    run_id = json.loads(whole)["run_id"]
    before = {p.name for p in run_dir.rglob("*")}
    for damaged in (whole[: len(whole) // 2].encode(), b"", b"[1, 2]\n", b"\xff\xfe garbage"):
        run_file.write_bytes(damaged)
        result = run(*args, cwd=tmp_path, env=store)
        refused(result, f"{run_file.relative_to(tmp_path)}: unreadable", "restore it, or delete it")
        one_line(result)
        assert {p.name for p in run_dir.rglob("*")} == before
    assert mlflow_client(store["MLFLOW_TRACKING_URI"]).get_run(run_id).info.status == "FINISHED"


@pytest.mark.slow
def test_a_run_is_created_even_when_the_store_stays_locked_past_sqlites_timeout(tmp_path):
    """Another process holds the database's write lock for longer than the 20 s MLflow lets
    SQLite wait: creating the run is retried until the lock is free, instead of failing."""
    from diffsweep.tracking.logger import MlflowTracker
    from diffsweep.tracking.store import ensure_experiment

    uri = f"sqlite:///{tmp_path / 'mlflow.db'}"
    tracker = MlflowTracker(uri, experiment_id=ensure_experiment(uri, "busy"))
    holder = sqlite3.connect(tmp_path / "mlflow.db", isolation_level=None, check_same_thread=False)
    holder.execute("BEGIN EXCLUSIVE")  # a long write by another process
    release = threading.Timer(22, lambda: holder.execute("COMMIT"))
    release.start()
    started = time.monotonic()
    try:
        tracker.start("busy", {"a": "1"}, {}, "a: 1\n", {"first_step": "1"})
    finally:
        release.join()
        holder.close()
    assert time.monotonic() - started > 20
    tracker.finish("FINISHED")
    assert mlflow_client(uri).get_run(tracker.run_id).info.status == "FINISHED"


# A process that takes the store's lock file, says so, and stops itself (as Ctrl-Z would stop a
# diffsweep process while it opens the store); it releases the lock when continued.
STOPPED_HOLDER = """
import fcntl, os, signal, sys
fd = os.open(sys.argv[1], os.O_RDWR | os.O_CREAT)
fcntl.flock(fd, fcntl.LOCK_EX)
open(sys.argv[2], "w").close()
os.kill(os.getpid(), signal.SIGSTOP)
"""


def stopped_holder(database: Path, ready: Path) -> subprocess.Popen:
    """A stopped process holding ``<database>.lock`` (see ``STOPPED_HOLDER``)."""
    holder = subprocess.Popen([sys.executable, "-c", STOPPED_HOLDER, f"{database}.lock", str(ready)])
    deadline = time.monotonic() + 60
    while not (ready.exists() and Path(f"/proc/{holder.pid}/stat").read_text().split(")")[1].split()[0] == "T"):
        assert time.monotonic() < deadline and holder.poll() is None, "the holder did not stop"
        time.sleep(0.01)
    return holder


def test_a_store_whose_lock_a_stopped_process_holds_is_one_line_exit_2_not_a_hang(text_dataset, tmp_path, store,
                                                                                  monkeypatch):
    """A process stopped while it holds the store's lock file (Ctrl-Z at the wrong moment; in CI, a
    test's SIGSTOP hung a launch for 13 minutes): ``train`` says on stderr that it waits, then gives
    up once that process has held it for ``LOCK_SECONDS``, with one line naming the lock file and the
    holder's pid, exit 2, and nothing created.
    Continued within that time, the holder lets the same command train."""
    from diffsweep.tracking import store as store_module

    monkeypatch.setattr(store_module, "LOCK_NOTICE", -1.0)  # at the first try that finds it locked
    monkeypatch.setattr(store_module, "LOCK_SECONDS", 1.0)
    database = tmp_path / "mlflow.db"
    holder = stopped_holder(database, tmp_path / "ready")
    try:
        before = database.read_bytes()
        result = run(*train_args(text_dataset), cwd=tmp_path, env=store)
        notice, error = [line for line in result.stderr.splitlines() if line.strip()]
        assert notice.startswith(f"diffsweep: waiting for {database}.lock (locked by another process"), notice
        refused(result, "MLFLOW_TRACKING_URI", f"{database}.lock has been locked by pid {holder.pid} for 1 s",
                f"fuser -v {database}.lock")
        assert database.read_bytes() == before and not (tmp_path / "runs").exists()

        def notice_then_continue(*args, **kwargs) -> None:  # continued once it says it waits: it exits, unlocking
            builtins.print(*args, **kwargs)
            os.kill(holder.pid, signal.SIGCONT)

        monkeypatch.setattr(store_module, "LOCK_SECONDS", 120.0)
        monkeypatch.setattr(store_module, "print", notice_then_continue, raising=False)
        result = run(*train_args(text_dataset, "train.max_steps=3", "train.eval_every=3"), cwd=tmp_path, env=store)
        assert result.returncode == 0, result.stderr
        assert result.stderr.startswith(f"diffsweep: waiting for {database}.lock"), result.stderr
    finally:
        holder.kill()
        holder.wait()
    client = mlflow_client(store["MLFLOW_TRACKING_URI"])
    runs = client.search_runs([client.get_experiment_by_name("diffsweep").experiment_id])
    assert [r.info.status for r in runs] == ["FINISHED"]


def test_processes_queueing_for_the_store_lock_do_not_time_out_a_waiter(tmp_path, monkeypatch):
    """The give-up clock is per holder: a waiter behind a line of healthy holders (each for less than
    ``LOCK_SECONDS``, their sum for more) gets the lock. The holders are a real stopped process and,
    for who /proc/locks names, a stand-in that changes hands at 1.2 s (the unit's logic only)."""
    from diffsweep.tracking import store as store_module

    database = tmp_path / "mlflow.db"
    holder = stopped_holder(database, tmp_path / "ready")
    started = time.monotonic()

    def holders(inode: int) -> set[str]:
        elapsed = time.monotonic() - started
        if elapsed > 2.4 and holder.poll() is None:
            os.kill(holder.pid, signal.SIGCONT)  # it exits, unlocking
            holder.wait()  # gone before the next try, however slow the machine: the give-up is 0.8 s later
        return {"first"} if elapsed < 1.2 else {"second"}

    monkeypatch.setattr(store_module, "LOCK_SECONDS", 2.0)
    monkeypatch.setattr(store_module, "LOCK_NOTICE", 60.0)
    monkeypatch.setattr(store_module, "lock_holders", holders)
    monkeypatch.setattr(store_module.random, "random", lambda: 0.0)  # polls at most 0.5 s apart
    try:
        with store_module._store_lock(database, exclusive=True):
            waited = time.monotonic() - started
    finally:
        holder.kill()
        holder.wait()
    assert waited > 2.4  # longer than LOCK_SECONDS in all, and no error
