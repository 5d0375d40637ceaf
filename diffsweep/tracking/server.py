"""``diffsweep server``: the MLflow tracking server a cluster's jobs log to, the same child
``mlflow server`` as the UI (``diffsweep.tracking.ui``) on a store of the user's choice (default
SQLite in ``$XDG_DATA_HOME/diffsweep``, on the login node's disk: SQLite on a network file system
is unsafe for many writers), bound to the host name, artifacts uploaded through it
(``--serve-artifacts``), accepting that name in the Host header (MLflow 3 refuses names it does not
know with HTTP 403; ``/health`` is exempt, so the REST API is checked through the name too)."""

from __future__ import annotations

import os
import socket
import sys
import urllib.error
from dataclasses import dataclass
from pathlib import Path

from diffsweep.tracking.ui import (
    READY_TIMEOUT,
    UiError,
    UiServer,
    absolute_store,
    check_artifacts,
    check_bind,
    check_free,
    get_json,
    is_remote,
    missing_parents,
    remove_empty,
    serve_until_stopped,
    sqlite_path,
    url_host,
)


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
        created = missing_parents(data_dir() / "mlflow.db")
        data_dir().mkdir(parents=True, exist_ok=True)
        store_uri = f"sqlite:///{data_dir() / 'mlflow.db'}"
        try:
            check_tracking(store_uri)
        except BaseException:
            remove_empty(created)
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

    serve_until_stopped(server, timeout, ready)
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
