"""The MLflow UI on the project's store, run as a child ``mlflow server`` (``diffsweep ui``), and
the tracking server a cluster's jobs log to (``diffsweep server``, ``run_server``).

- Store: the one training logs to (``tracking_uri()``: ``MLFLOW_TRACKING_URI``, else ``mlflow.db`` in
  the working directory). A missing SQLite file is an error rather than a new empty database; an
  ``http(s)`` URI is already a server, so there is nothing to start.
- Server: ``python -m mlflow server --workers 1`` with job execution off (2 processes, ~0.4 GB,
  ready in ~5 s; the default 4 uvicorn workers add ~40 ms to every kept-alive request), bound to
  127.0.0.1 by default, in its own process group, its output kept (last lines) for error messages.
- Artifacts: runs logged straight to SQLite have local artifact paths (``mlruns/`` beside the
  store), which the server reads directly; artifacts uploaded through the server go to ``mlruns/``
  beside the database too, not to an ``mlartifacts/`` in whatever directory the UI started from.
- Stop: SIGTERM to the server's process group, then SIGKILL if it does not exit within seconds.
- Links: each experiment's runs page in MLflow's "Model training" view (``MODEL_TRAINING``); the
  UI of MLflow 3 opens its GenAI view otherwise, and offers no server setting for either that or
  the "MLflow Assistant" panel it opens on a browser's first visit to a localhost UI.

- ``diffsweep server``: the same child server for a cluster, on a store of the user's choice (default
  SQLite in ``$XDG_DATA_HOME/diffsweep``, on the login node's disk: SQLite on a network file system
  is unsafe for many writers), bound to the host name, artifacts uploaded through it
  (``--serve-artifacts``), accepting that name in the Host header (MLflow 3 refuses names it does not
  know with HTTP 403; ``/health`` is exempt, so the REST API is checked through the name too).

Imports neither torch nor mlflow: the server is a separate process and experiments are looked up
over its REST API.
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


def _missing_parents(path: Path) -> list[Path]:
    """The folders above ``path`` that do not exist yet, deepest first."""
    return [p for p in path.absolute().parents if not p.exists()]


def _remove_empty(folders: list[Path]) -> None:
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


@dataclass
class TrackingServer(UiServer):
    """``diffsweep server``: one ``mlflow server`` that a cluster's jobs log to over HTTP (the UI
    too), its artifacts uploaded through it to ``artifacts``; ``name`` is the host name in its URL."""

    artifacts: str = ""
    workers: int = 1
    name: str = ""

    @property
    def url(self) -> str:
        return f"http://{self.name or url_host(self.host)}:{self.port}"

    def command(self) -> list[str]:
        return [sys.executable, "-m", "mlflow", "server", "--backend-store-uri", absolute_store(self.store_uri),
                "--serve-artifacts", "--artifacts-destination", self.artifacts, "--host", self.host,
                "--port", str(self.port), "--workers", str(self.workers)]

    def environment(self) -> dict[str, str]:
        """Also the Host headers the server accepts (unless MLFLOW_SERVER_ALLOWED_HOSTS says): MLflow
        refuses every other one with HTTP 403, and jobs name this machine by its host name."""
        env = super().environment()
        env.setdefault("MLFLOW_SERVER_ALLOWED_HOSTS", ",".join(allowed_hosts(self.name or self.host)))
        return env


# MLflow 3.17's default Host headers (mlflow.server.security_utils.get_default_allowed_hosts): local
# and private addresses on any port. Setting MLFLOW_SERVER_ALLOWED_HOSTS replaces them, so they are
# repeated with this machine's names added.
_LOCAL_HOSTS = ("localhost", "127.0.0.1", "[::1]", "0.0.0.0")
_PRIVATE_HOSTS = ("192.168.*", "10.*", *(f"172.{i}.*" for i in range(16, 32)), "fc00:*", "fd00:*")


def allowed_hosts(name: str) -> list[str]:
    """The Host headers a tracking server named ``name`` accepts: ``name`` and this machine's
    host names (short and qualified) on any port, and MLflow's defaults."""
    local = [n for n in dict.fromkeys((name, socket.gethostname(), socket.getfqdn(), *_LOCAL_HOSTS)) if n]
    return [*local, *(f"{n.replace('[', '[[]', 1)}:*" for n in local), *_PRIVATE_HOSTS]


def absolute_store(uri: str) -> str:
    """``uri`` with an SQLite database's path made absolute (the server runs in its directory)."""
    db = sqlite_path(uri)
    if db is None:
        return uri
    return f"sqlite:///{db}" + (f"?{query}" if (query := uri.partition("?")[2]) else "")


def data_dir() -> Path:
    """Where ``diffsweep server`` keeps its store by default: ``$XDG_DATA_HOME/diffsweep``, else
    ``~/.local/share/diffsweep`` (the login node's own disk, unless home is a network mount)."""
    base = os.environ.get("XDG_DATA_HOME") or str(Path.home() / ".local" / "share")
    return Path(base) / "diffsweep"


def run_server(store_uri: str | None = None, *, artifacts: str | None = None, host: str | None = None,
               port: int = 5000, workers: int = 1, echo=print, warn=print, timeout: float = READY_TIMEOUT) -> None:
    """Serve the tracking store ``store_uri`` (default: SQLite in ``data_dir()``) to a cluster's jobs
    until Ctrl-C, SIGTERM or SIGHUP: an ``mlflow server`` bound to ``host`` (default: this
    machine's host name), artifacts uploaded through it to ``artifacts`` (default: ``mlartifacts``
    beside an SQLite store, else in ``data_dir()``). Once it answers through the URL jobs will use,
    prints the ``export MLFLOW_TRACKING_URI=...`` line.

    ``warn`` gets a note when the store is on a network file system or the host name is a loopback
    address. Raises ``UiError`` (port in use, server failed) and ``ConfigError`` on
    ``MLFLOW_TRACKING_URI`` (the store given is not usable: the CLI names its flag)."""
    from diffsweep.config import ConfigError
    from diffsweep.tracking.filesystems import network_filesystem_here
    from diffsweep.tracking.store import KEY, check_tracking

    # Everything the user gave is checked before anything is created (the data folder, the store),
    # and before the port: a bad flag is reported whatever else runs on this machine.
    host = socket.gethostname() if host is None else host
    check_bind(host, port)
    if artifacts is not None:
        check_artifacts(artifacts)
    if store_uri is not None:
        if is_remote(store_uri):
            raise ConfigError(KEY, f"{store_uri} is a tracking server already; give the database it should serve")
        check_tracking(store_uri)  # creates nothing
    check_free(host, port)
    if store_uri is None:
        created = _missing_parents(data_dir() / "mlflow.db")
        data_dir().mkdir(parents=True, exist_ok=True)
        store_uri = f"sqlite:///{data_dir() / 'mlflow.db'}"
        try:
            check_tracking(store_uri)
        except BaseException:
            _remove_empty(created)
            raise
    db = sqlite_path(store_uri)
    if artifacts is None:
        artifacts = str((db.parent if db is not None else data_dir()) / "mlartifacts")
    if db is not None and (kind := network_filesystem_here(db)) is not None:
        warn(f"note: {db} is on a network file system ({kind}); this server is its only writer, which SQLite "
             "handles, but a local disk is faster (--backend-store-uri sqlite:////LOCAL/DISK/mlflow.db)")
    name = socket.gethostname() if host in ("0.0.0.0", "", "::") else url_host(host)
    if _loopback(name):
        warn(f"note: {name} is a loopback address here, so only jobs on this machine reach the server; "
             "for other nodes give --host an address of this machine they reach (or 0.0.0.0: every interface)")
    server = TrackingServer(absolute_store(store_uri), host, port, artifacts=artifacts, workers=workers, name=name)

    def ready() -> None:
        _check_api(server.url)
        echo(f"MLflow tracking server: {server.url}  (store: {server.store_uri}; artifacts: {artifacts}; "
             f"Ctrl-C stops it)\nexport MLFLOW_TRACKING_URI={server.url}")

    _serve_until_stopped(server, timeout, ready)
    echo("MLflow tracking server stopped")


def _loopback(name: str) -> bool:
    """Whether the host ``name`` resolves to a loopback address here (127.0.1.1 is Debian's
    /etc/hosts entry for the machine's own name)."""
    import ipaddress

    try:
        infos = socket.getaddrinfo(name.strip("[]"), None)
    except OSError:
        return False
    return any(ipaddress.ip_address(str(info[4][0]).split("%", 1)[0]).is_loopback for info in infos)


def _check_api(url: str) -> None:
    """The server answers its REST API through ``url`` (``/health`` skips the Host check)."""
    try:
        get_json(f"{url}/api/2.0/mlflow/experiments/search?max_results=1")
    except urllib.error.HTTPError as exc:
        why = " (it refuses that Host header: see MLFLOW_SERVER_ALLOWED_HOSTS)" if exc.code == 403 else ""
        raise UiError(f"the MLflow server answers {url} with HTTP {exc.code}{why}") from None
    except (urllib.error.URLError, OSError, ValueError) as exc:
        raise UiError(f"the MLflow server does not answer {url}: {exc}") from None


def _serve_until_stopped(server: UiServer, timeout: float, ready: Callable[[], None]) -> None:
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

    _serve_until_stopped(server, timeout, ready)
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
