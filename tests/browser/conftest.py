"""Fixtures for the browser tests: a real JupyterLab server and a headless Chromium.

The server runs the venv's JupyterLab over a temporary copy of `notebooks/`, so running
cells in the browser never rewrites the committed notebooks. Chromium is Debian's
(`apt-get install -y chromium`); Playwright drives it without downloading a browser.
"""

from __future__ import annotations

import json
import os
import shutil
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
SCREENSHOTS = REPO / "build" / "screenshots"  # tests/conftest.py names them in the summary
CHROMIUM = Path(os.environ.get("SPECREF_CHROMIUM", "/usr/bin/chromium"))
# The machine has no internet: without these flags Chromium keeps dialling out
# (updates, sync, QUIC probes) and fills the logs with refused connections.
CHROMIUM_ARGS = [
    "--no-sandbox",
    "--disable-gpu",
    "--disable-quic",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
]
SERVER_START_TIMEOUT_S = 60
SERVER_STOP_TIMEOUT_S = 15


@dataclass(frozen=True)
class LabServer:
    url: str  # e.g. http://127.0.0.1:PORT
    root: Path  # the server's root folder: a temporary copy of notebooks/

    def notebook_url(self, name: str) -> str:
        # ?reset: open this notebook alone, not the tabs a previous test left in the workspace.
        return f"{self.url}/lab/tree/{name}?reset"


def _free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _get_json(url: str, method: str = "GET") -> object:
    request = urllib.request.Request(url, method=method)
    with urllib.request.urlopen(request, timeout=5) as response:
        body = response.read()
    return json.loads(body) if body else None


def _lab_config(base: Path) -> dict[str, str]:
    """Isolated Jupyter config, runtime and settings dirs, so no user state leaks in."""
    config = base / "config"
    (config / "labconfig").mkdir(parents=True)
    # The news prompt is a toast that would cover part of every screenshot.
    (config / "labconfig" / "page_config.json").write_text(
        json.dumps({"disabledExtensions": {"@jupyterlab/apputils-extension:announcements": True}})
    )
    settings = base / "settings"
    tracker = settings / "@jupyterlab" / "notebook-extension"
    tracker.mkdir(parents=True)
    # Windowing would detach off-screen cells from the DOM; the checks read every cell.
    (tracker / "tracker.jupyterlab-settings").write_text(json.dumps({"windowingMode": "none"}))
    return {
        "JUPYTER_CONFIG_DIR": str(config),
        "JUPYTER_RUNTIME_DIR": str(base / "runtime"),
        "JUPYTERLAB_SETTINGS_DIR": str(settings),
        "JUPYTERLAB_WORKSPACES_DIR": str(base / "workspaces"),
    }


def _stop(process: subprocess.Popen, url: str) -> None:
    """Shut the kernels down through the API, then stop the server by its PID."""
    if process.poll() is None:
        try:
            for kernel in _get_json(f"{url}/api/kernels"):  # type: ignore[union-attr]
                _get_json(f"{url}/api/kernels/{kernel['id']}", method="DELETE")
        except (OSError, urllib.error.URLError, ValueError):
            pass  # the server is going away regardless; the PID below is what matters
        process.terminate()
        try:
            process.wait(timeout=SERVER_STOP_TIMEOUT_S)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait(timeout=SERVER_STOP_TIMEOUT_S)


@pytest.fixture(scope="session")
def lab(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LabServer]:
    """A JupyterLab server over a temporary copy of notebooks/, stopped even on failure."""
    base = tmp_path_factory.mktemp("lab")
    root = base / "root"
    shutil.copytree(REPO / "notebooks", root, ignore=shutil.ignore_patterns(".ipynb_checkpoints"))
    # Notebooks 05 and 07 read the committed benchmark results at ../benchmarks/results, as in the repository.
    shutil.copytree(REPO / "benchmarks" / "results", base / "benchmarks" / "results")
    port = _free_port()
    url = f"http://127.0.0.1:{port}"
    env = dict(os.environ, **_lab_config(base))
    # Kernels import the working tree's specref even when it is not pip-installed.
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(REPO), env.get("PYTHONPATH")]))
    command = [
        sys.executable, "-m", "jupyterlab",
        "--no-browser",
        "--ip=127.0.0.1",
        f"--port={port}",
        "--ServerApp.port_retries=0",
        "--ServerApp.token=",
        "--ServerApp.password=",
        f"--ServerApp.root_dir={root}",
        "--LabApp.expose_app_in_browser=True",  # window.jupyterapp, to run commands
        "--LabApp.check_for_updates_class=jupyterlab.NeverCheckForUpdate",
    ]
    if hasattr(os, "geteuid") and os.geteuid() == 0:
        command.append("--allow-root")
    log_path = base / "server.log"
    with open(log_path, "wb") as log:
        process = subprocess.Popen(command, env=env, stdout=log, stderr=subprocess.STDOUT, cwd=root)
    try:
        deadline = time.monotonic() + SERVER_START_TIMEOUT_S
        while True:
            if process.poll() is not None:
                pytest.fail(f"jupyter lab exited with {process.returncode}:\n{log_path.read_text()[-3000:]}")
            try:
                _get_json(f"{url}/api/status")
                break
            except (OSError, urllib.error.URLError, ValueError):
                if time.monotonic() > deadline:
                    pytest.fail(f"jupyter lab did not answer within {SERVER_START_TIMEOUT_S} s:\n"
                                f"{log_path.read_text()[-3000:]}")
                time.sleep(0.25)
        yield LabServer(url=url, root=root)
    finally:
        _stop(process, url)


@pytest.fixture(scope="session")
def browser() -> Iterator[object]:
    """Headless Chromium driven by Playwright; skipped where either is missing."""
    sync_api = pytest.importorskip("playwright.sync_api", reason="the playwright package is not installed")
    if not CHROMIUM.is_file():
        pytest.skip(f"no Chromium at {CHROMIUM} (apt-get install -y chromium)")
    playwright = sync_api.sync_playwright().start()
    try:
        chromium = playwright.chromium.launch(
            executable_path=str(CHROMIUM), headless=True, args=CHROMIUM_ARGS, timeout=60_000
        )
        try:
            yield chromium
        finally:
            chromium.close()
    finally:
        playwright.stop()


@pytest.fixture(scope="session")
def screenshots() -> Path:
    """The folder the browser tests save one screenshot per widget cell into."""
    SCREENSHOTS.mkdir(parents=True, exist_ok=True)
    return SCREENSHOTS
