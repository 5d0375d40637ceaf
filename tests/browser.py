"""Real-browser checks of the MLflow UI: ``diffsweep ui`` as a subprocess, headless Chromium via Playwright.

Chromium is Debian's (``apt-get install chromium`` -> /usr/bin/chromium), driven by the
``playwright`` Python package; ``playwright install`` (which downloads browsers) is never used.
Without either, tests using these helpers skip with the reason, unless DIFFSWEEP_REQUIRE_BROWSER=1
(CI), where that is a failure.

Use from a test module (the fixtures are re-exported by tests/cli/conftest.py; re-export them the
same way in another directory's conftest.py)::

    from tests.browser import expect_runs_visible, ui_server

    @pytest.mark.browser
    def test_x(page, tmp_path):                      # `page`: a fresh Playwright page (skips without a browser)
        ...                                          # make runs in tmp_path/mlflow.db
        with ui_server(tmp_path, experiment="diffsweep") as ui:
            expect_runs_visible(page, ui.experiment_url, ["run-a", "run-b"], screenshot=tmp_path / "ui.png")
"""

from __future__ import annotations

import contextlib
import importlib.util
import os
import queue
import random
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

import pytest

CHROMIUM = "/usr/bin/chromium"
CHROMIUM_ARGS = ["--no-sandbox", "--disable-gpu"]
REQUIRE_ENV = "DIFFSWEEP_REQUIRE_BROWSER"
UI_START_TIMEOUT = 90.0  # `diffsweep ui` prints its URL once /health answers: ~5 s warm, more when loaded
VISIBLE_TIMEOUT_MS = 60_000  # first paint of the runs table is ~3 s; generous for a shared 2-core box


def missing_browser() -> str | None:
    """Why a browser test cannot run here, or ``None`` when it can."""
    if not os.access(CHROMIUM, os.X_OK):
        return f"{CHROMIUM} not found (apt-get install chromium)"
    if importlib.util.find_spec("playwright") is None:
        return "the playwright package is not installed (pip install playwright; never `playwright install`)"
    return None


def require_browser() -> None:
    """Skip the calling test when no browser is available; fail instead under DIFFSWEEP_REQUIRE_BROWSER=1."""
    reason = missing_browser()
    if reason is not None:
        if os.environ.get(REQUIRE_ENV) == "1":
            pytest.fail(f"{reason}, and {REQUIRE_ENV}=1")
        pytest.skip(reason)


@pytest.fixture(scope="session")
def browser():
    """One headless Chromium for the session (launching costs ~0.3 s, but Playwright's driver more)."""
    require_browser()
    from playwright.sync_api import sync_playwright

    with sync_playwright() as playwright:
        chromium = playwright.chromium.launch(executable_path=CHROMIUM, args=CHROMIUM_ARGS, headless=True)
        try:
            yield chromium
        finally:
            chromium.close()


@pytest.fixture
def page(browser):
    """A fresh page (own cookies and storage) in a 1400x900 window."""
    context = browser.new_context(viewport={"width": 1400, "height": 900})
    try:
        yield context.new_page()
    finally:
        context.close()


def expect_runs_visible(page, url: str, names: list[str], timeout_ms: int = VISIBLE_TIMEOUT_MS,
                        screenshot: Path | None = None) -> None:
    """Open ``url`` (an experiment's runs page) and assert each run name shows as a link.

    Child runs are collapsed under their parent in MLflow 3's runs table: expand the parent
    (``button[data-component-id*='runnamecellrenderer']``) before asking for a child's name.
    On failure, a full-page screenshot goes to ``screenshot`` when given.
    """
    from playwright.sync_api import expect

    page.goto(url)
    try:
        for name in names:
            expect(page.get_by_role("link", name=name)).to_be_visible(timeout=timeout_ms)
    except AssertionError:
        if screenshot is not None:
            page.screenshot(path=str(screenshot), full_page=True)
            raise AssertionError(f"runs not visible at {url}; screenshot: {screenshot}") from None
        raise


def expect_model_training_view(page, timeout_ms: int = VISIBLE_TIMEOUT_MS) -> None:
    """Assert the page shows MLflow's "Model training" view of an experiment (its sidebar links
    Runs and Model registry, and none of the GenAI view's, such as Evaluation runs)."""
    from playwright.sync_api import expect

    expect(page.get_by_role("heading", name="Runs", exact=True)).to_be_visible(timeout=timeout_ms)
    expect(page.get_by_role("link", name="Model registry", exact=True)).to_be_visible(timeout=timeout_ms)
    expect(page.get_by_role("link", name="Evaluation runs", exact=True)).to_have_count(0)


def search_runs(page, filter_string: str) -> None:
    """Type ``filter_string`` into the runs page's search box (MLflow's search syntax) and run it."""
    box = page.get_by_placeholder(re.compile(r"^metrics\."))  # 'metrics.rmse < 1 and params.model = "tree"'
    box.fill(filter_string)
    box.press("Enter")


def run_url(experiment_url: str, run_id: str) -> str:
    """A run's page from its experiment's runs page (``.../#/experiments/<id>/runs[?query]``)."""
    page, _, _ = experiment_url.partition("?")
    return f"{page.rstrip('/')}/{run_id}"


def expect_artifact_visible(page, run_page_url: str, path: str, text: str | None = None,
                            timeout_ms: int = VISIBLE_TIMEOUT_MS, screenshot: Path | None = None) -> None:
    """Open the run's Artifacts tab, assert ``path`` is listed, click it and (when given) assert
    ``text`` shows in its preview."""
    from playwright.sync_api import expect

    page.goto(f"{run_page_url}/artifacts")
    try:
        entry = page.get_by_text(path, exact=True).first
        expect(entry).to_be_visible(timeout=timeout_ms)
        if text is not None:
            entry.click()
            expect(page.get_by_text(text).first).to_be_visible(timeout=timeout_ms)
    except AssertionError:
        if screenshot is not None:
            page.screenshot(path=str(screenshot), full_page=True)
            raise AssertionError(f"artifact {path} not shown at {run_page_url}; screenshot: {screenshot}") from None
        raise


def free_port() -> int:
    """A port a server can bind now, below the kernel's ephemeral range: a port the kernel hands
    out (bind to 0) can be taken again, before the server binds it, as the source port of any
    outgoing connection on the machine (seen once in CI: another test's MLflow client took it)."""
    try:
        low = int(Path("/proc/sys/net/ipv4/ip_local_port_range").read_text().split()[0])
    except (OSError, ValueError, IndexError):
        low = 32768
    rng = random.Random()  # not the tests' seeded global generator: parallel workers must not agree
    for _ in range(200):
        port = rng.randrange(10000, max(low, 10001))
        if port_free(port):
            return port
    with socket.socket() as sock:  # a crowded range: what the kernel gives
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def port_free(port: int, host: str = "127.0.0.1") -> bool:
    """Whether a server could bind ``host:port`` now (SO_REUSEADDR, as servers set it)."""
    with socket.socket() as sock:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            sock.bind((host, port))
        except OSError:
            return False
    return True


@dataclass
class UiProcess:
    """A running ``diffsweep ui``: its process, the printed URLs, and what it has printed so far."""

    proc: subprocess.Popen
    port: int
    url: str = ""
    experiment_url: str | None = None
    lines: list[str] = field(default_factory=list)  # its stdout so far
    reader: threading.Thread | None = None

    def stop(self, sig: int = signal.SIGINT, timeout: float = 30.0) -> int:
        """Send ``sig`` (Ctrl-C by default), wait for the exit status and the rest of its stdout."""
        if self.proc.poll() is None:
            self.proc.send_signal(sig)
        rc = self.proc.wait(timeout)
        if self.reader is not None:
            self.reader.join(5)
        return rc


@contextlib.contextmanager
def ui_server(cwd: Path, env: dict[str, str] | None = None, port: int | None = None, experiment: str | None = None,
              timeout: float = UI_START_TIMEOUT) -> Iterator[UiProcess]:
    """Run ``diffsweep ui --port PORT [--experiment NAME]`` in ``cwd`` until its URL is printed; stop it
    (SIGINT, then SIGKILL of its group) on exit if the test has not. ``env`` is added to a copy of
    the environment without MLFLOW_TRACKING_URI, so by default the UI serves ``cwd/mlflow.db``."""
    port = port or free_port()
    args = [sys.executable, "-m", "diffsweep", "ui", "--port", str(port)]
    if experiment is not None:
        args += ["--experiment", experiment]
    environ = {k: v for k, v in os.environ.items() if k != "MLFLOW_TRACKING_URI"}
    environ |= {"PYTHONUNBUFFERED": "1", "MLFLOW_DISABLE_TELEMETRY": "true"} | (env or {})
    proc = subprocess.Popen(args, cwd=cwd, env=environ, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            start_new_session=True)
    ui = UiProcess(proc, port)
    lines: queue.Queue[str | None] = queue.Queue()

    def read() -> None:
        for line in proc.stdout:
            ui.lines.append(line.rstrip("\n"))
            lines.put(line)
        lines.put(None)

    ui.reader = threading.Thread(target=read, daemon=True)
    ui.reader.start()
    try:
        deadline = time.monotonic() + timeout
        while not ui.url or (experiment is not None and ui.experiment_url is None):
            try:
                line = lines.get(timeout=max(0.0, deadline - time.monotonic()))
            except queue.Empty:
                raise AssertionError(f"`diffsweep ui` printed no URL within {timeout:g} s: {ui.lines}") from None
            if line is None:
                proc.wait(10)
                raise AssertionError(f"`diffsweep ui` exited {proc.returncode} before serving:\n"
                                     f"{''.join(ui.lines)}{proc.stderr.read()}")
            if match := re.match(r"MLflow UI: (\S+)", line):
                ui.url = match[1]
            elif experiment is not None and (match := re.match(rf"experiment {re.escape(experiment)}: (\S+)", line)):
                ui.experiment_url = match[1]
        yield ui
    finally:
        if proc.poll() is None:
            proc.send_signal(signal.SIGINT)
            try:
                proc.wait(30)
            except subprocess.TimeoutExpired:
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(proc.pid, signal.SIGKILL)  # the ui process's own group; the server has its own
                proc.wait()
