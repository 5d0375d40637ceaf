"""``diffsweep server``, the tracking server a cluster's jobs log to, and ``launch``'s warning about an
SQLite store on a network file system (issue #20).

- Pure: which file system holds a path (from a given /proc/mounts text), and the warning's text.
- ``launch`` warns (dry run included) when jobs on other machines would write such a store, not
  when they run on this machine.
- Through the CLI: ``diffsweep server`` on its defaults (SQLite under $XDG_DATA_HOME, artifacts
  served) prints the ``export MLFLOW_TRACKING_URI=`` line once it answers; 16 processes log
  through it at once with the trainer's own logger, and no metric is lost; a port in use and a
  server given as the store are one-line errors; Ctrl-C stops it and frees the port.
- On the localhost Slurm cluster (marked ``slurm``): a 2-run sweep launched with
  MLFLOW_TRACKING_URI naming the server logs every step of every run through it (the cluster runs
  2 jobs at once, so the 16 concurrent writers are the processes of the test above; a 16-run sweep
  was measured once at 68 s and is left out of CI to keep it short). It uses the module's server:
  the tests on that server run in the one pytest-xdist worker of the Slurm tests (group ``slurm``),
  so that the server starts once.
"""

from __future__ import annotations

import multiprocessing
import os
import queue
import re
import signal
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import ClassVar

import pytest

from diffsweep.launch import scheduler as schedulers
from diffsweep.launch.api import SweepTarget, launch_sweep
from diffsweep.launch.profiles import Profile
from diffsweep.launch.scheduler import Scheduler, register
from diffsweep.sweep import load_sweep
from diffsweep.tracking import filesystems
from diffsweep.tracking.filesystems import (
    filesystem_of,
    network_filesystem,
    network_store_warning,
    shared_store_warning,
)
from diffsweep.tracking.server import TrackingServer, allowed_hosts, data_dir
from tests.browser import free_port, port_free
from tests.helpers.badinput import refused
from tests.helpers.cli import run as cli
from tests.launch.conftest import ledger, metric_steps, write_sweep

MOUNTS = r"""proc /proc proc rw,nosuid 0 0
/dev/sda1 / ext4 rw,relatime 0 0
server:/export/home /home nfs4 rw,vers=4.2 0 0
/dev/sdb1 /home/local ext4 rw 0 0
10.0.0.1@o2ib:/scratch /scratch lustre rw,flock 0 0
//nas/team\040share /mnt/team\040share cifs rw 0 0
tmpfs /tmp tmpfs rw 0 0
sshfs#me@host: /tmpfoo fuse.sshfs rw 0 0
"""


@pytest.mark.parametrize(("path", "kind", "network"), [
    ("/home/me/proj/mlflow.db", "nfs4", "nfs4"),
    ("/home", "nfs4", "nfs4"),
    ("/home/local/me/mlflow.db", "ext4", None),  # a local disk mounted inside the network one
    ("/homework/mlflow.db", "ext4", None),  # a prefix of the name is not the mount
    ("/scratch/sweeps/mlflow.db", "lustre", "lustre"),
    ("/mnt/team share/mlflow.db", "cifs", "cifs"),  # /proc/mounts writes the space as \040
    ("/tmp/mlflow.db", "tmpfs", None),
    ("/tmpfoo/mlflow.db", "fuse.sshfs", "fuse.sshfs"),
    ("/var/lib/x.db", "ext4", None),
])
def test_the_file_system_of_a_path_is_its_longest_mount(path, kind, network):
    assert filesystem_of(path, MOUNTS) == kind
    assert network_filesystem(path, MOUNTS) == network


def test_a_later_mount_on_the_same_point_hides_the_earlier():
    mounts = "/dev/sda1 / ext4 rw 0 0\nserver:/x /data nfs rw 0 0\n/dev/sdc1 /data xfs rw 0 0\n"
    assert filesystem_of("/data/mlflow.db", mounts) == "xfs"
    assert filesystem_of("/anything", "") == ""


def test_the_warning_names_the_file_its_file_system_and_the_fix():
    text = network_store_warning("sqlite:////scratch/me/mlflow.db", MOUNTS)
    assert text == (
        "warning: the MLflow store /scratch/me/mlflow.db is on a network file system (lustre), where SQLite's "
        "locking is unreliable and the sweep's jobs on many nodes write at once (lost metrics, a corrupt store); "
        "serve it instead: run `diffsweep server` on the login node and `export MLFLOW_TRACKING_URI=http://HOST:PORT` "
        "as it prints before launching")
    assert "\n" not in text
    assert network_store_warning("sqlite:////home/me/mlflow.db?timeout=30", MOUNTS).startswith(
        "warning: the MLflow store /home/me/mlflow.db is on a network file system (nfs4)")
    for fine in ("sqlite:////home/local/mlflow.db", "sqlite:////tmp/mlflow.db", "http://login1:5000",
                 "postgresql://db/mlflow", "sqlite:///relative.db"):
        assert network_store_warning(fine, MOUNTS) is None, fine


def network_mounts(tmp_path: Path, monkeypatch, kind: str = "nfs4") -> Path:
    """Make this test's machine see ``tmp_path/shared`` as a network mount of type ``kind``."""
    shared = tmp_path / "shared"
    shared.mkdir()
    mounts = tmp_path / "mounts"
    mounts.write_text(f"/dev/sda1 / ext4 rw 0 0\nserver:/x {shared.resolve()} {kind} rw 0 0\n")
    monkeypatch.setattr(filesystems, "MOUNTS", mounts)
    return shared


def test_the_warning_sees_through_symlinks(tmp_path, monkeypatch):
    shared = network_mounts(tmp_path, monkeypatch)
    (tmp_path / "link").symlink_to(shared)
    assert f"store {shared.resolve()}/mlflow.db is on a network file system (nfs4)" in shared_store_warning(
        f"sqlite:///{tmp_path / 'link' / 'mlflow.db'}")
    assert shared_store_warning(f"sqlite:///{tmp_path / 'mlflow.db'}") is None  # beside it: the local disk
    assert shared_store_warning("http://login1:5000") is None
    monkeypatch.setattr(filesystems, "MOUNTS", tmp_path / "no-such-file")  # not Linux: no warning, no error
    assert shared_store_warning(f"sqlite:///{shared / 'mlflow.db'}") is None


class ClusterScheduler(Scheduler):
    """A cluster whose jobs run on other machines (the default); never submits here."""

    name = "cluster"
    label = "the test cluster"
    runs_jobs = "on the test cluster"
    seen: ClassVar[list[str]] = []

    def default_profile(self) -> Profile:
        return Profile(name="cluster", executor=self.name, gpus_per_node=4)

    def submit(self, submission):
        raise AssertionError("dry runs only")

    def states(self, attempts):
        return {}

    def cancel(self, attempts):
        return {}, ""


@pytest.fixture
def cluster():
    register("cluster", ClusterScheduler)
    yield
    schedulers.SCHEDULERS.unregister("cluster")


def test_launch_warns_when_cluster_jobs_would_write_sqlite_on_a_network_fs(tmp_path, monkeypatch, text_dataset,
                                                                           cluster):
    shared = network_mounts(tmp_path, monkeypatch, "lustre")
    spec = load_sweep(write_sweep(tmp_path / "t.yaml", text_dataset))

    def warnings_of(executor: str, uri: str) -> list[str]:
        seen: list[str] = []
        launch_sweep(SweepTarget(spec=spec, executor=executor, out=tmp_path / "out"), dry_run=True, tracking_uri=uri,
                     warn=seen.append, echo=lambda line: None)
        return seen

    on_shared = f"sqlite:///{shared / 'mlflow.db'}"
    (warning,) = warnings_of("cluster", on_shared)
    assert warning.startswith(f"warning: the MLflow store {shared.resolve() / 'mlflow.db'} is on a network file "
                              "system (lustre)") and "diffsweep server" in warning
    assert warnings_of("local", on_shared) == []  # jobs on this machine only
    assert warnings_of("cluster", f"sqlite:///{tmp_path / 'mlflow.db'}") == []  # a local disk
    assert warnings_of("cluster", "http://login1:5000") == []  # a server: what the warning asks for
    monkeypatch.chdir(shared)
    monkeypatch.delenv("MLFLOW_TRACKING_URI", raising=False)
    assert len(warnings_of("cluster", None)) == 1  # the default store, ./mlflow.db, here on the network mount


def test_the_server_command_serves_artifacts_and_accepts_its_host_name(tmp_path, monkeypatch):
    monkeypatch.delenv("MLFLOW_SERVER_ALLOWED_HOSTS", raising=False)
    monkeypatch.setenv("XDG_DATA_HOME", str(tmp_path / "data"))
    assert data_dir() == tmp_path / "data" / "diffsweep"
    monkeypatch.delenv("XDG_DATA_HOME")
    assert data_dir() == Path.home() / ".local" / "share" / "diffsweep"
    server = TrackingServer("sqlite:///x.db", "0.0.0.0", 5001, artifacts="/data/art", workers=1, name="login1")
    cmd = server.command()
    assert cmd[:4] == [sys.executable, "-m", "mlflow", "server"]
    assert cmd[4:] == ["--backend-store-uri", f"sqlite:///{Path('x.db').absolute()}", "--serve-artifacts",
                       "--artifacts-destination", "/data/art", "--host", "0.0.0.0", "--port", "5001", "--workers", "1"]
    assert server.url == "http://login1:5001"
    hosts = server.environment()["MLFLOW_SERVER_ALLOWED_HOSTS"].split(",")
    for host in ("login1", "login1:*", socket.gethostname(), f"{socket.gethostname()}:*", "localhost:*", "10.*"):
        assert host in hosts
    assert "[[]::1]:*" in allowed_hosts("login1")  # fnmatch: "[" escaped, as MLflow's own defaults do
    monkeypatch.setenv("MLFLOW_SERVER_ALLOWED_HOSTS", "mlflow.example.org")  # the user's choice wins
    assert server.environment()["MLFLOW_SERVER_ALLOWED_HOSTS"] == "mlflow.example.org"


# --- through the CLI: a real `diffsweep server` -------------------------------------------------

START_TIMEOUT = 120.0  # a new SQLite store's schema takes ~5-10 s; a loaded 2-core machine, more
EXPORT = re.compile(r"export MLFLOW_TRACKING_URI=(http://\S+)$")


def server_env(data: Path) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if k not in ("MLFLOW_TRACKING_URI", "MLFLOW_SERVER_ALLOWED_HOSTS")}
    return env | {"XDG_DATA_HOME": str(data), "PYTHONUNBUFFERED": "1", "MLFLOW_DISABLE_TELEMETRY": "true"}


def in_process_server_env(data: Path) -> dict:
    """``server_env`` as the changes the in-process CLI makes to this process's environment (None: unset)."""
    return {"MLFLOW_TRACKING_URI": None, "MLFLOW_SERVER_ALLOWED_HOSTS": None, "XDG_DATA_HOME": str(data),
            "MLFLOW_DISABLE_TELEMETRY": "true"}


@dataclass
class ServerProcess:
    """A running ``diffsweep server``: its process, the URI it printed, its output so far."""

    proc: subprocess.Popen
    port: int
    data: Path  # its XDG_DATA_HOME
    uri: str = ""
    lines: list[str] = field(default_factory=list)
    reader: threading.Thread | None = None
    stopped: bool = False  # by ``stop``: on purpose


    def stop(self, timeout: float = 30.0) -> int:
        """Ctrl-C, then its exit status once it and the rest of its output are done."""
        self.stopped = True
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGINT)
        rc = self.proc.wait(timeout)
        if self.reader is not None:
            self.reader.join(5)
        return rc


def start_server(data: Path, *args: str) -> ServerProcess:
    """``diffsweep server --port PORT ARGS`` with ``data`` as XDG_DATA_HOME, once it printed its URI."""
    port = free_port()
    proc = subprocess.Popen([sys.executable, "-m", "diffsweep", "server", "--port", str(port), *args],
                            cwd=data, env=server_env(data), stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            start_new_session=True)
    server = ServerProcess(proc, port, data)
    lines: queue.Queue[str | None] = queue.Queue()

    def read() -> None:
        assert proc.stdout is not None
        for line in proc.stdout:
            server.lines.append(line.rstrip("\n"))
            lines.put(line.rstrip("\n"))
        lines.put(None)

    server.reader = threading.Thread(target=read, daemon=True)
    server.reader.start()
    deadline = time.monotonic() + START_TIMEOUT
    while not server.uri:
        try:
            line = lines.get(timeout=max(0.0, deadline - time.monotonic()))
        except queue.Empty:
            kill(server)
            raise AssertionError(f"`diffsweep server` printed no URI within {START_TIMEOUT:g} s: {server.lines}") from None
        if line is None:
            proc.wait(10)
            raise AssertionError(f"`diffsweep server` exited {proc.returncode} before serving: {server.lines}\n"
                                 f"{proc.stderr.read() if proc.stderr else ''}")
        if match := EXPORT.match(line):
            server.uri = match[1]
    return server


def kill(server: ServerProcess) -> None:
    if server.proc.poll() is None:
        server.proc.send_signal(signal.SIGINT)
        try:
            server.proc.wait(30)
        except subprocess.TimeoutExpired:
            os.killpg(server.proc.pid, signal.SIGKILL)  # its own group; the mlflow server has its own too
            server.proc.wait()


@pytest.fixture(scope="module")
def _servers(tmp_path_factory) -> Iterator[list[ServerProcess]]:
    """The module's ``diffsweep server`` processes (``tracking_server``); those still running are
    stopped at the end."""
    servers: list[ServerProcess] = []
    try:
        yield servers
    finally:
        for server in servers:
            kill(server)


@pytest.fixture
def tracking_server(_servers, tmp_path_factory) -> ServerProcess:
    """One ``diffsweep server`` on its defaults for this module's tests, started by the first that
    needs it. The last, test_ctrl_c_stops_the_server_and_frees_its_port, stops it with Ctrl-C; a
    test run after that one (another order, another selection) gets a new one. A server that
    ended otherwise is not replaced: the tests that use it fail."""
    if not _servers or _servers[-1].stopped:
        _servers.append(start_server(tmp_path_factory.mktemp("server")))
    return _servers[-1]


@pytest.mark.xdist_group("slurm")  # one worker starts the module's server, the Slurm tests' (see above)
def test_the_server_prints_the_uri_to_export_and_keeps_its_store_on_local_disk(tracking_server):
    host = socket.gethostname()
    assert tracking_server.uri == f"http://{host}:{tracking_server.port}"
    assert tracking_server.lines[0].startswith(f"MLflow tracking server: {tracking_server.uri}  (store: sqlite:///"
                                               f"{tracking_server.data / 'diffsweep' / 'mlflow.db'}; artifacts: "
                                               f"{tracking_server.data / 'diffsweep' / 'mlartifacts'}")
    assert tracking_server.lines[1] == f"export MLFLOW_TRACKING_URI={tracking_server.uri}"
    assert (tracking_server.data / "diffsweep" / "mlflow.db").is_file()


NUM_WRITERS = 16
NUM_STEPS = 25
METRICS = ("train/loss", "train/lr", "train/grad_norm", "val/loss")


def _value(writer: int, step: int, metric: int) -> float:
    return writer * 1000 + step + metric / 8


def _writer(uri: str, experiment_id: str, index: int, start, results) -> None:
    """One training process's logging, as the trainer does it (``MlflowTracker``), flushed every
    step so that all writers' requests overlap: ``start`` releases all of them at once."""
    from diffsweep.tracking.logger import MlflowTracker

    tracker = MlflowTracker(uri, experiment_id)
    start.wait(120)
    began = time.time()
    run_id = tracker.start(f"writer-{index}", {"index": str(index)}, {"diffsweep.test": "server"}, "x: 1\n",
                           {"host": socket.gethostname()})
    for step in range(1, NUM_STEPS + 1):
        tracker.log(step, {key: _value(index, step, m) for m, key in enumerate(METRICS)})
        tracker.flush()
    tracker.finish("FINISHED")
    results.put((index, run_id, began, time.time()))


@pytest.mark.xdist_group("slurm")  # one worker starts the module's server, the Slurm tests' (see above)
def test_16_processes_log_through_the_server_at_once_and_no_metric_is_lost(tracking_server):
    from mlflow.tracking import MlflowClient

    from diffsweep.tracking.store import ensure_experiment

    uri = tracking_server.uri
    experiment_id = ensure_experiment(uri, "writers")
    # Fresh processes, as jobs are, forked from a server that has only imported MLflow and this
    # module (once: 16 processes importing MLflow took ~25 CPU-s of the 2-core CI machine).
    context = multiprocessing.get_context("forkserver")
    context.set_forkserver_preload(["mlflow.tracking", "mlflow.store.tracking.rest_store", "diffsweep.tracking.logger",
                                    __name__])
    start, results = context.Barrier(NUM_WRITERS), context.Queue()
    writers = [context.Process(target=_writer, args=(uri, experiment_id, i, start, results))
               for i in range(NUM_WRITERS)]
    for w in writers:
        w.start()
    for w in writers:
        w.join(240)
    assert [w.exitcode for w in writers] == [0] * NUM_WRITERS, tracking_server.lines
    done = [results.get(timeout=10) for _ in range(NUM_WRITERS)]
    run_ids = {index: run_id for index, run_id, _, _ in done}
    spans = [(began, ended) for _, _, began, ended in done]
    # all logged at once: each writer began before any had ended
    assert max(b for b, _ in spans) < min(e for _, e in spans), spans
    print(f"{NUM_WRITERS} writers x {NUM_STEPS} steps x {len(METRICS)} metrics, logging at once: "
          f"{max(e for _, e in spans) - min(b for b, _ in spans):.1f} s")

    client = MlflowClient(uri)
    runs = client.search_runs([experiment_id], max_results=100)
    assert sorted(r.info.run_id for r in runs) == sorted(run_ids.values())
    for index, run_id in run_ids.items():
        run = client.get_run(run_id)
        assert run.info.status == "FINISHED" and run.data.params == {"index": str(index)}
        for m, key in enumerate(METRICS):
            history = sorted((p.step, p.value) for p in client.get_metric_history(run_id, key))
            assert history == [(s, _value(index, s, m)) for s in range(1, NUM_STEPS + 1)], (index, key)
        # artifacts go through the server to its destination on the login node's disk
        assert {a.path for a in client.list_artifacts(run_id)} >= {"config.yaml", "attempts.json"}
    stored = tracking_server.data / "diffsweep" / "mlartifacts" / experiment_id
    assert len(list(stored.rglob("config.yaml"))) == NUM_WRITERS


def test_a_port_in_use_is_a_one_line_error(tmp_path):
    with socket.socket() as taken:
        taken.bind(("", 0))  # every interface: whatever the host name resolves to
        taken.listen()
        port = taken.getsockname()[1]
        result = cli("server", "--port", str(port), cwd=tmp_path, env=in_process_server_env(tmp_path))
    refused(result, f"port {port}", "already in use", "--port")


def test_a_server_as_the_store_is_a_one_line_error_naming_the_flag(tmp_path):
    result = cli("server", "--backend-store-uri", "http://login1:5000", cwd=tmp_path,
                 env=in_process_server_env(tmp_path))
    refused(result, "--backend-store-uri", "is a tracking server already")


# --- on the localhost Slurm cluster ---------------------------------------------------------------




@pytest.mark.slurm
def test_a_slurm_sweep_logs_every_step_of_its_runs_through_the_server(tmp_path, text_dataset, tracking_server,
                                                                    slurm_cluster):
    from mlflow.tracking import MlflowClient

    steps = 4
    sweep = write_sweep(tmp_path / "t.yaml", text_dataset, steps=steps, name="served")
    env = {"MLFLOW_TRACKING_URI": tracking_server.uri}
    began = time.monotonic()
    r = cli("launch", str(sweep), "--profile", "localhost", "--wait", cwd=tmp_path, env=env)
    assert r.returncode == 0, r.stdout + r.stderr
    print(f"2 runs on Slurm through the server: {time.monotonic() - began:.1f} s")
    assert "launched 2 runs on Slurm" in r.stdout
    assert "network file system" not in r.stderr  # a server, not an SQLite file
    assert ledger(tmp_path / "runs" / "served")["tracking_uri"] == tracking_server.uri
    assert not (tmp_path / "mlflow.db").exists()  # nothing fell back to a local store

    client = MlflowClient(tracking_server.uri)
    runs = client.search_runs([client.get_experiment_by_name("served").experiment_id], max_results=100)
    assert len(runs) == 2 and len({r.data.tags["diffsweep.sweep_run"] for r in runs}) == 2
    for run in runs:
        assert run.info.status == "FINISHED"
        assert run.data.tags.get("diffsweep.slurm_array_job_id"), run.data.tags
        assert metric_steps(tracking_server.uri, run.info.run_id) == list(range(1, steps + 1))
        assert metric_steps(tracking_server.uri, run.info.run_id, "val/loss") == [steps]


# --- last: Ctrl-C stops the module's server ------------------------------------------------------


@pytest.mark.xdist_group("slurm")  # the worker of the module's server (see above)
def test_ctrl_c_stops_the_server_and_frees_its_port(tracking_server):
    """The module's server, after the tests above used it (alone, a server of its own)."""
    server = tracking_server
    assert server.stop() == 0, server.proc.stderr.read() if server.proc.stderr else ""
    assert server.lines[-1] == "MLflow tracking server stopped"
    assert port_free(server.port)
