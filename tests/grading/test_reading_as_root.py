"""The learner's notebook is never parsed by root: as root, the reading process drops to a fresh uid after its
imports and before it reads the payload (trust/reading._drop_self), whether or not that uid could run the
interpreter itself."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from specref_grading.trust import reading

REPO = Path(__file__).resolve().parents[2]
AS_ROOT = os.geteuid() == 0

# The real main() with its parser replaced by a probe of who parses and what that account can open.
_PROBE = """
import json, os, sys
sys.path.insert(0, sys.argv.pop(1))  # the checkout under test
import specref_grading.trust.reading as r
def probe(payload):
    try:
        open(sys.argv[1], "rb").close()
        secret = "read"
    except PermissionError:
        secret = "refused"
    status = dict(line.split(":", 1) for line in open("/proc/self/status") if ":" in line)
    return {"uid": list(os.getresuid()), "gid": list(os.getresgid()), "groups": os.getgroups(), "secret": secret,
            "caps": int(status["CapEff"], 16), "nnp": int(status["NoNewPrivs"])}
r._read_answers = probe
if sys.argv[2] == "no-drop":  # the negative control: a drop that does nothing
    r._drop_self = lambda uid: None
r.main("answers", *sys.argv[3:])
"""


def _run(secret: Path, mode: str, *uid: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-I", "-c", _PROBE, str(REPO), str(secret), mode, *uid], input=b"{}",
                          capture_output=True, timeout=60, cwd=REPO, env={"PATH": os.defpath})


def _probe(secret: Path, mode: str, *uid: str) -> dict:
    proc = _run(secret, mode, *uid)
    assert proc.returncode == 0, proc.stderr.decode()
    return json.loads(proc.stdout)["ok"]


@pytest.mark.skipif(not AS_ROOT, reason="dropping root needs root")
def test_the_parse_runs_as_a_fresh_uid_that_cannot_read_the_graders_files(tmp_path):
    secret = tmp_path / "answer_key"
    secret.write_text("the reference")
    secret.chmod(0o600)
    got = _probe(secret, "drop", "1234567")
    assert got == {"uid": [1234567] * 3, "gid": [1234567] * 3, "groups": [], "secret": "refused", "caps": 0,
                   "nnp": 1}, got
    # Negative control: the same probe with a drop that does nothing parses as root and reads the key.
    ctrl = _probe(secret, "no-drop", "1234567")
    assert ctrl["uid"] == [0, 0, 0] and ctrl["secret"] == "read" and ctrl["caps"] != 0, ctrl


@pytest.mark.skipif(not AS_ROOT, reason="dropping root needs root")
def test_as_root_the_reading_process_refuses_to_parse_without_a_uid_or_as_uid_0(tmp_path):
    secret = tmp_path / "answer_key"
    secret.write_text("the reference")
    for uid in ((), ("0",)):
        proc = _run(secret, "drop", *uid)
        assert proc.returncode != 0 and b'"ok"' not in proc.stdout, (uid, proc.stdout, proc.stderr)


def test_as_root_the_grading_process_asks_for_a_fresh_uid(monkeypatch):
    """The command gives the reading process a fresh uid (>= 200,000) as root, none otherwise; no setpriv, so the
    interpreter need not be runnable by that uid."""
    seen: list[list[str]] = []

    def fake_run(cmd, **kwargs):
        seen.append(cmd)
        return subprocess.CompletedProcess(cmd, 0, b'{"ok": {"1": {}}}', b"")
    monkeypatch.setattr(reading.subprocess, "run", fake_run)
    monkeypatch.setattr(reading.os, "geteuid", lambda: 0)
    reading.read_answers({"1": "x = 1"}, set(), {})
    monkeypatch.setattr(reading.os, "geteuid", lambda: 1000)
    reading.read_answers({"1": "x = 1"}, set(), {})
    root_cmd, user_cmd = seen
    assert root_cmd[:5] == [sys.executable, "-I", "-m", "specref_grading.trust.reading", "answers"], root_cmd
    assert len(root_cmd) == 6 and int(root_cmd[5]) >= 200_000, root_cmd
    assert user_cmd == root_cmd[:5], user_cmd


@pytest.mark.skipif(not AS_ROOT, reason="dropping root needs root")
def test_an_honest_notebook_and_its_answers_are_read_after_the_drop():
    """Nothing the parse needs is imported after the drop (a lazy import from a root-only folder would fail)."""
    nb = reading.read_submission(REPO / "solutions" / "ex02_accept_reject.ipynb")
    assert nb["cells"], nb
    got = reading.read_answers({"1": "def f(x):\n    return x + 1\n", "2": "def g(:\n"}, {"sample"}, {})
    assert got["1"]["syntax"] is None and "f" in got["1"]["bound"], got
    assert got["2"]["syntax"] is not None, got
