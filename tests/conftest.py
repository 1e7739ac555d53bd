"""Shared test settings."""

import os
import time
from pathlib import Path

import pytest
import torch

# Two cores, many small ops: one intra-op thread avoids oversubscription (and is much faster).
# SPECREF_THREADS=N runs them on N threads (tools/upkeep/portable.py's fingerprint reads it too).
torch.set_num_threads(int(os.environ.get("SPECREF_THREADS", "1")))

SCREENSHOTS = Path(__file__).resolve().parents[1] / "build" / "screenshots"  # tests/browser writes them


def pytest_sessionstart(session: pytest.Session) -> None:
    session.config._specref_started = time.time()  # type: ignore[attr-defined]


def pytest_terminal_summary(terminalreporter, exitstatus, config) -> None:  # noqa: ANN001
    """Point at the browser tests' screenshots from this run (by file time: under pytest-xdist the
    tests ran in worker processes whose state the process printing this summary never sees)."""
    started = getattr(config, "_specref_started", None)
    if started is None or not SCREENSHOTS.is_dir():
        return
    shots = [s for s in SCREENSHOTS.glob("*.png") if s.stat().st_mtime >= started - 1]
    if shots:
        terminalreporter.write_line(f"browser screenshots ({len(shots)}): {SCREENSHOTS}")
