"""The MLflow UI on the project's store, run as a child ``mlflow server`` (``diffsweep ui``).

The store is the one training logs to (``tracking_uri()``); a missing SQLite file is an error rather
than a new empty database, and an ``http(s)`` URI is already a server, so nothing starts. The server
(``UiServer``) is ``python -m mlflow server --workers 1`` with job execution off, bound to 127.0.0.1
by default, in its own process group, its output kept (last lines) for error messages; it is stopped
by SIGTERM to that group, then SIGKILL. Links open MLflow's "Model training" view (``MODEL_TRAINING``).
The tracking server a cluster's jobs log to (``diffsweep server``) is ``diffsweep.tracking.server``.
Imports neither torch nor mlflow: the server is a separate process and experiments are looked up
over its REST API. See docs/training.md, 'Browse runs: `diffsweep ui`'.
"""

from __future__ import annotations

import collections
import errno
import json
import os
import signal
import socket
import subprocess
import sys
import threading
import time
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

READY_TIMEOUT = 60.0  # seconds for GET /health to answer (~5 s warm, ~20 s for a cold machine)
# The query that opens an experiment page in the "Model training" view: MLflow 3.17's UI reads its
# workflow type from the URL's ``workflowType`` (genai | machine_learning), else from the browser's
# localStorage ``mlflow.workflowType_v1`` (set by the GenAI / Model training toggle), else GenAI.
# The experiment tag ``mlflow.experimentKind`` no longer decides it.
MODEL_TRAINING = "workflowType=machine_learning"
MAX_LINKS = 20  # experiments linked when no --experiment is given
STOP_TIMEOUT = 10.0  # seconds between SIGTERM and SIGKILL
TAIL_LINES = 30  # server output lines shown when it fails


class UiError(Exception):
    """The UI cannot be served; ``code`` is the exit status (2: the user can fix it)."""

    def __init__(self, message: str, code: int = 1) -> None:
        super().__init__(message)
        self.code = code


class _Stop(Exception):
    """Raised in the main thread by SIGINT (Ctrl-C), SIGTERM or SIGHUP: stop the server."""


def sqlite_path(uri: str) -> Path | None:
    """The database file of a ``sqlite:///`` URI (relative to the working directory when the URI
    is ``sqlite:///x.db``, absolute for ``sqlite:////abs/x.db``); ``None`` for other URIs."""
    if not uri.startswith("sqlite:///"):
        return None
    path = uri.removeprefix("sqlite:///").split("?", 1)[0]
    return Path(path).absolute()


def absolute_store(uri: str) -> str:
    """``uri`` with an SQLite database's path made absolute (the server runs in its directory)."""
    db = sqlite_path(uri)
    if db is None:
        return uri
    return f"sqlite:///{db}" + (f"?{query}" if (query := uri.partition("?")[2]) else "")


def check_store(uri: str) -> None:
    """Refuse a store that has no runs to show: a SQLite file that does not exist yet."""
    db = sqlite_path(uri)
    if db is not None and not db.is_file():
        raise UiError(f"no MLflow store at {db}: no runs there yet (train one first, run this from the "
                      "directory that holds mlflow.db, or set MLFLOW_TRACKING_URI)", code=2)


def is_remote(uri: str) -> bool:
    return uri.startswith(("http://", "https://"))


def url_host(host: str) -> str:
    """The host as it goes in a URL the user can open: wildcard binds become 127.0.0.1."""
    if host in ("0.0.0.0", "", "::"):
        return "127.0.0.1"
    return f"[{host}]" if ":" in host else host


def port_in_use(host: str, port: int) -> bool:
    """Whether ``host:port`` cannot be bound (the server would fail on it). SO_REUSEADDR as the
    server's own socket sets it, so a port left in TIME_WAIT by an earlier server counts as free."""
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    with socket.socket(family, socket.SOCK_STREAM) as sock:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            sock.bind((host, port))
        except OSError as exc:
            if exc.errno == errno.EADDRINUSE:
                return True
            if exc.errno == errno.EACCES:
                raise UiError(f"--port: port {port} needs privileges here ({exc.strerror}); pick one above 1023",
                              code=2) from None
            raise UiError(f"--host: cannot bind {host} port {port} ({exc.strerror}); expected a host name or address "
                          "of this machine", code=2) from None
    return False


def check_bind(host: str, port: int) -> None:
    """``--host`` and ``--port`` of ``ui`` and ``server``, checked before anything is created or
    started: a host name or address (not empty: that would bind every interface unasked) and a
    port in 1-65535 (``check_free``: free there). A ``UiError`` (exit 2) naming the option."""
    if not host.strip():
        raise UiError(f"--host: expected a host name or address of this machine (0.0.0.0: every interface), "
                      f"got {host!r}", code=2)
    if not 1 <= port <= 65535:  # (a bool or float never gets here: the CLI parses an int)
        raise UiError(f"--port: expected a port in [1, 65535], got {port}", code=2)


def check_free(host: str, port: int) -> None:
    """The port is free on ``host`` (checked after every flag, so a bad flag is reported whatever
    else runs on this machine, and before anything is created)."""
    if port_in_use(host, port):
        raise port_error(host, port)


def check_artifacts(destination: str) -> None:
    """``server --artifacts-destination``: a URI with a scheme other than ``file:`` (s3://...) is
    the object store's business; a local path must be a folder, or a path one can be made at (its
    nearest existing parent a writable folder), so the server can store what jobs upload."""
    if not destination.strip():
        raise UiError("--artifacts-destination: expected a directory or an s3://... URI, got ''", code=2)
    scheme = destination.split("://", 1)[0].lower() if "://" in destination else ""
    if scheme not in ("", "file"):
        return
    path = Path(urllib.parse.urlparse(destination).path if scheme else destination).absolute()
    existing = next(p for p in (path, *path.parents) if p.exists() or p == Path(p.anchor))
    if not existing.is_dir():
        where = "is a file" if existing == path else f"lies under {existing}, which is a file"
        raise UiError(f"--artifacts-destination: {path} {where}; expected a directory (or s3://...)", code=2)
    if not os.access(existing, os.W_OK | os.X_OK):
        raise UiError(f"--artifacts-destination: cannot write in {existing}; expected a writable directory", code=2)


def missing_parents(path: Path) -> list[Path]:
    """The folders above ``path`` that do not exist yet, deepest first."""
    return [p for p in path.absolute().parents if not p.exists()]


def remove_empty(folders: list[Path]) -> None:
    """Remove the folders (deepest first) that this process made and that are still empty."""
    for folder in folders:
        try:
            folder.rmdir()
        except OSError:
            return


def port_error(host: str, port: int) -> UiError:
    return UiError(f"--port: port {port} on {host} is already in use (another MLflow server?); pick a free one "
                   "with --port", code=2)


def get_json(url: str, timeout: float = 10.0) -> dict:
    with urllib.request.urlopen(url, timeout=timeout) as response:  # noqa: S310 (our own or the user's server)
        return json.loads(response.read() or b"{}")


def runs_page(base_url: str, experiment_id: str) -> str:
    """An experiment's runs page in the Model training view."""
    return f"{base_url}/#/experiments/{experiment_id}/runs?{MODEL_TRAINING}"


def experiment_url(base_url: str, name: str) -> str:
    """The runs page (``runs_page``) of experiment ``name``, looked up on the server."""
    query = urllib.parse.urlencode({"experiment_name": name})
    try:
        experiment = get_json(f"{base_url}/api/2.0/mlflow/experiments/get-by-name?{query}")["experiment"]
    except urllib.error.HTTPError as exc:
        if exc.code != 404:
            raise UiError(f"cannot look up experiment {name!r} on {base_url}: HTTP {exc.code}") from None
        known = _experiment_names(base_url)
        raise UiError(f"no experiment {name!r} in the store (experiments: {', '.join(known) or 'none'})",
                      code=2) from None
    except (urllib.error.URLError, OSError, ValueError, KeyError) as exc:
        raise UiError(f"cannot look up experiment {name!r} on {base_url}: {exc}") from None
    if experiment.get("lifecycle_stage") == "deleted":
        raise UiError(f"experiment {name!r} is deleted (restore it in the MLflow UI)", code=2)
    return runs_page(base_url, experiment["experiment_id"])


def experiment_urls(base_url: str, limit: int = MAX_LINKS) -> dict[str, str]:
    """Name -> runs page of the store's active experiments, newest first (at most ``limit``), except
    MLflow's "Default" (made in every store; diffsweep never logs to it)."""
    found = [e for e in _experiments(base_url, limit + 1) if not (e["experiment_id"] == "0" and e["name"] == "Default")]
    return {e["name"]: runs_page(base_url, e["experiment_id"]) for e in found[:limit]}


def _experiments(base_url: str, limit: int) -> list[dict]:
    try:
        found = get_json(f"{base_url}/api/2.0/mlflow/experiments/search?max_results={limit}")
    except (urllib.error.URLError, OSError, ValueError):
        return []
    return found.get("experiments", [])


def _experiment_names(base_url: str) -> list[str]:
    return sorted(e["name"] for e in _experiments(base_url, 50))


@dataclass
class UiServer:
    """One ``mlflow server`` child process on ``store_uri``; ``start`` returns once it serves."""

    store_uri: str
    host: str = "127.0.0.1"
    port: int = 5000
    proc: subprocess.Popen | None = None
    output: collections.deque = field(default_factory=lambda: collections.deque(maxlen=TAIL_LINES))

    @property
    def url(self) -> str:
        return f"http://{url_host(self.host)}:{self.port}"

    def command(self) -> list[str]:
        """``mlflow server`` with one worker (2 processes, ~0.4 GB, ready in ~5 s; the default 4 uvicorn
        workers add ~40 ms to every kept-alive request). Runs logged straight to SQLite have local
        artifact paths (``mlruns/`` beside the store), which the server reads directly; artifacts
        uploaded through the server go to ``mlruns/`` beside the database too, not to an
        ``mlartifacts/`` in whatever directory the UI started from."""
        db = sqlite_path(self.store_uri)
        cmd = [sys.executable, "-m", "mlflow", "server", "--backend-store-uri", absolute_store(self.store_uri),
               "--host", self.host, "--port", str(self.port), "--workers", "1"]
        if db is not None:  # uploads through the UI's server land beside the store, like direct logging's
            cmd += ["--artifacts-destination", str(db.parent / "mlruns")]
        return cmd

    def start(self, timeout: float = READY_TIMEOUT) -> None:
        """Start the server and wait for ``GET /health``; on failure stop it and raise ``UiError``
        with the end of its output."""
        if port_in_use(self.host, self.port):
            raise port_error(self.host, self.port)
        db = sqlite_path(self.store_uri)
        self.proc = subprocess.Popen(
            self.command(), env=self.environment(), cwd=db.parent if db is not None else None, stdin=subprocess.DEVNULL,
            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, errors="replace",
            start_new_session=True,  # Ctrl-C reaches only us; we stop the whole group
        )
        threading.Thread(target=self._drain, daemon=True).start()
        try:
            self._wait_ready(timeout)
        except BaseException:
            self.stop()
            raise

    def environment(self) -> dict[str, str]:
        """The server's environment: ours, with job execution (a second worker pool) and telemetry off."""
        env = os.environ | {"MLFLOW_SERVER_ENABLE_JOB_EXECUTION": "false", "PYTHONUNBUFFERED": "1"}
        env.setdefault("MLFLOW_DISABLE_TELEMETRY", "true")
        return env

    def _drain(self) -> None:
        assert self.proc is not None and self.proc.stdout is not None
        for line in self.proc.stdout:
            self.output.append(line.rstrip("\n"))

    def _wait_ready(self, timeout: float) -> None:
        assert self.proc is not None
        deadline = time.monotonic() + timeout
        while True:
            if self.proc.poll() is not None:
                time.sleep(0.2)  # let the drain thread read the last lines
                if any("address already in use" in line.lower() for line in self.output):
                    raise port_error(self.host, self.port)
                raise UiError(self._failure(f"the MLflow server exited with status {self.proc.returncode} "
                                            "before it was ready"))
            try:
                with urllib.request.urlopen(f"{self.url}/health", timeout=2) as response:  # noqa: S310
                    if response.status == 200:
                        return
            except (urllib.error.URLError, OSError):
                pass
            if time.monotonic() > deadline:
                raise UiError(self._failure(f"the MLflow server did not answer {self.url}/health "
                                            f"within {timeout:g} s"))
            time.sleep(0.25)

    def _failure(self, message: str) -> str:
        tail = "\n".join(f"  | {line}" for line in self.output)
        return f"{message}; its last output:\n{tail}" if tail else message

    def wait(self) -> int:
        """Block until the server exits (it should not): its exit status."""
        assert self.proc is not None
        return self.proc.wait()

    def stop(self, timeout: float = STOP_TIMEOUT) -> None:
        """SIGTERM to the server's process group, SIGKILL after ``timeout`` seconds; idempotent."""
        proc = self.proc
        if proc is None or proc.returncode is not None and not _group_alive(proc.pid):
            return
        _signal_group(proc.pid, signal.SIGTERM)
        try:
            proc.wait(timeout)
        except subprocess.TimeoutExpired:
            _signal_group(proc.pid, signal.SIGKILL)
            proc.wait()
        deadline = time.monotonic() + timeout  # uvicorn's worker may outlive the `mlflow server` parent
        while _group_alive(proc.pid) and time.monotonic() < deadline:
            time.sleep(0.1)
        if _group_alive(proc.pid):
            _signal_group(proc.pid, signal.SIGKILL)


def _signal_group(pgid: int, sig: int) -> None:
    try:
        os.killpg(pgid, sig)
    except ProcessLookupError:
        pass


def _group_alive(pgid: int) -> bool:
    try:
        os.killpg(pgid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def serve_until_stopped(server: UiServer, timeout: float, ready: Callable[[], None]) -> None:
    """Start ``server``, call ``ready()``, and serve until Ctrl-C, SIGTERM or SIGHUP; then (or on
    any error) stop it cleanly. The server exiting by itself is a ``UiError``."""
    restore = _stop_on_signals()
    try:
        server.start(timeout)
        ready()
        rc = server.wait()
        raise UiError(server._failure(f"the MLflow server exited unexpectedly with status {rc}"))
    except (KeyboardInterrupt, _Stop):
        pass
    finally:
        _ignore_signals()  # a second Ctrl-C while stopping must not leave the server running
        try:
            server.stop()
        finally:
            restore()


def serve(store_uri: str, host: str = "127.0.0.1", port: int = 5000, experiment: str | None = None,
          echo=print, timeout: float = READY_TIMEOUT) -> None:
    """Serve the MLflow UI on ``store_uri`` until Ctrl-C, SIGTERM or SIGHUP, then stop it cleanly.

    An ``http(s)`` store is already a server: its URL (and the experiments') is printed and nothing
    is started. Raises ``UiError`` when the store, port or server is unusable, and ``ConfigError``
    (naming ``MLFLOW_TRACKING_URI``) when the store is no usable tracking store.
    """
    from diffsweep.tracking.store import check_experiment_name, check_tracking

    if experiment is not None:
        check_experiment_name(experiment)
    if is_remote(store_uri):
        check_tracking(store_uri)  # answers within seconds, or the reason it does not
        base = store_uri.rstrip("/")
        echo(_banner(f"MLflow UI: {base}  (MLFLOW_TRACKING_URI is a server already; nothing to start)",
                     _links(base, experiment)))
        return
    check_bind(host, port)
    check_store(store_uri)
    check_tracking(store_uri)
    check_free(host, port)
    server = UiServer(store_uri, host, port)

    def ready() -> None:
        echo(_banner(f"MLflow UI: {server.url}  (store: {store_uri}; Ctrl-C to stop)", _links(server.url, experiment)))

    serve_until_stopped(server, timeout, ready)
    echo("MLflow UI stopped")


def _links(base_url: str, experiment: str | None) -> dict[str, str]:
    """The runs pages to print: the one experiment asked for, else every experiment's."""
    return {experiment: experiment_url(base_url, experiment)} if experiment is not None else experiment_urls(base_url)


def _banner(first: str, links: dict[str, str]) -> str:
    """The lines printed once the UI serves, as one text: one write, which a Ctrl-C cannot split."""
    return "\n".join([first, *(f"experiment {name}: {url}" for name, url in links.items())])


def _stop_on_signals():
    """Make SIGINT, SIGTERM and SIGHUP raise ``_Stop`` in the main thread; returns a function
    that restores the previous handlers."""
    if threading.current_thread() is not threading.main_thread():
        return lambda: None

    def handler(signum, frame):
        raise _Stop(signal.Signals(signum).name)

    previous = {sig: signal.getsignal(sig) for sig in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)}
    for sig in previous:  # SIGINT too: a shell starts background jobs with it ignored
        signal.signal(sig, handler)

    def restore() -> None:
        for sig, old in previous.items():
            signal.signal(sig, old if old is not None else signal.SIG_DFL)

    return restore


def _ignore_signals() -> None:
    if threading.current_thread() is threading.main_thread():
        for sig in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP):
            signal.signal(sig, signal.SIG_IGN)
