"""Bad input to ``diffsweep server`` and ``diffsweep ui``: one ``error:`` line naming the option,
exit 2, and nothing created (not even the server's data folder) and no server started."""

from __future__ import annotations

import socket
from pathlib import Path

import pytest

from tests.browser import free_port
from tests.helpers.badinput import diffsweep, refused, untouched


@pytest.fixture
def env(tmp_path: Path) -> dict[str, str]:
    """The server's default data folder under tmp_path (not there yet: making it would show)."""
    (tmp_path / "afile").write_text("x\n")
    return {"XDG_DATA_HOME": str(tmp_path / "xdg"), "MLFLOW_TRACKING_URI": ""}


def test_a_busy_port_is_refused_before_the_data_folder_is_made(tmp_path, env):
    with socket.socket() as busy:
        busy.bind(("127.0.0.1", 0))
        busy.listen()
        port = busy.getsockname()[1]
        with untouched(tmp_path):
            r = diffsweep("server", "--host", "127.0.0.1", "--port", str(port), cwd=tmp_path, env=env)
    refused(r, "--port", str(port), "already in use")


@pytest.mark.parametrize(("destination", "needles"), [
    ("afile", ["--artifacts-destination", "afile", "is a file", "expected a directory"]),
    ("afile/art", ["--artifacts-destination", "which is a file"]),
    ("file://{tmp}/afile", ["--artifacts-destination", "is a file"]),
    ("", ["--artifacts-destination", "expected a directory"]),
])
def test_an_artifacts_destination_that_cannot_hold_artifacts_is_refused(tmp_path, env, destination, needles):
    with untouched(tmp_path):
        r = diffsweep("server", "--host", "127.0.0.1", "--port", str(free_port()), "--artifacts-destination",
                      destination.format(tmp=tmp_path), cwd=tmp_path, env=env)
    refused(r, *needles)


@pytest.mark.parametrize(("args", "needles"), [
    (["--host", ""], ["--host", "expected a host name"]),
    (["--host", "  "], ["--host"]),
    (["--host", "no-such-host.invalid"], ["--host", "no-such-host.invalid"]),
    (["--host", "127.0.0.1", "--port", "0"], ["--port"]),
    (["--host", "127.0.0.1", "--port", "-1"], ["--port"]),
    (["--host", "127.0.0.1", "--port", "70000"], ["--port"]),
    (["--host", "127.0.0.1", "--port", "abc"], ["--port"]),
    (["--host", "127.0.0.1", "--workers", "0"], ["--workers"]),
])
def test_server_refuses_bad_host_port_and_workers_before_anything_is_made(tmp_path, env, args, needles):
    with untouched(tmp_path):
        r = diffsweep("server", *args, cwd=tmp_path, env=env)
    refused(r, *needles)


@pytest.mark.parametrize(("args", "needles"), [
    (["--host", ""], ["--host"]),
    (["--port", "70000"], ["--port"]),
    (["--experiment", ""], ["--experiment", "expected a non-empty experiment name"]),
    (["--experiment", "a\nb"], ["--experiment", "control characters"]),
])
def test_ui_refuses_bad_options(tmp_path, env, args, needles):
    with untouched(tmp_path):
        r = diffsweep("ui", *args, cwd=tmp_path, env=env)
    refused(r, *needles)


def test_check_bind_refuses_ports_out_of_range_itself():
    from diffsweep.tracking.ui import UiError, check_bind

    for port in (0, -1, 65536):
        with pytest.raises(UiError, match="--port") as exc:
            check_bind("127.0.0.1", port)
        assert exc.value.code == 2


@pytest.mark.parametrize(("store", "needle"), [
    ("sqlite:///afile", "not an SQLite database"),
    ("sqlite:///folder", "is a directory"),
    ("sqlite:///afile/mlflow.db", "cannot write"),
    ("", "file store"),
])
def test_an_unusable_store_is_refused_and_nothing_is_made(tmp_path, env, store, needle):
    (tmp_path / "folder").mkdir()
    with untouched(tmp_path):
        r = diffsweep("server", "--host", "127.0.0.1", "--port", str(free_port()), "--backend-store-uri", store,
                      cwd=tmp_path, env=env)
    refused(r, "--backend-store-uri", needle)
