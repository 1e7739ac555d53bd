"""No learner code as root, ever: without a jail nothing is graded unless --unjailed asks, and then as a fresh
uid, never as root; the jail mode is part of a class run's key; the trusted process drops root too."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from specref_grading import classrun, processes
from specref_grading import grade as grader
from specref_grading.report import Report
from specref_grading.trust import wall

REPO = Path(__file__).resolve().parents[1]
AS_ROOT = os.geteuid() == 0


def _cell(cid, source, gid=None, points=0, answer=False):
    meta = {} if gid is None else {"nbgrader": {"grade": not answer, "grade_id": gid, "points": points,
                                                "solution": answer, "schema_version": 3}}
    return {"cell_type": "code", "id": cid, "metadata": meta, "outputs": [], "execution_count": None, "source": source}


def toy(check: str = "assert one() == 1") -> dict:
    """one() (1 point); the test cell runs in the trusted process, so `check` may look at that process too."""
    return {"cells": [_cell("s", "import os"),
                      _cell("a", "def one():\n    ### BEGIN SOLUTION\n    return 1\n    ### END SOLUTION", "one", 0, True),
                      _cell("t", check, "one_check", 1)],
            "metadata": {}, "nbformat": 4, "nbformat_minor": 5}


@pytest.fixture
def no_jail(monkeypatch):
    monkeypatch.setattr(grader, "can_jail", lambda: False)
    monkeypatch.setattr(wall, "can_jail", lambda: False)


def _no_kernel(monkeypatch):
    def refuse(*a, **k):
        raise AssertionError("a kernel was started")
    monkeypatch.setattr(grader, "grade_plan", refuse)


def test_without_a_jail_nothing_is_graded_unless_asked(tmp_path, no_jail, monkeypatch):
    sol = tmp_path / "ex_toy.ipynb"
    sol.write_text(json.dumps(toy()))
    _no_kernel(monkeypatch)
    report = grader.grade(sol, sol, seed=1)
    assert report.error == grader.UNJAILED_REFUSED and report.exit_code == grader.EXIT_UNGRADABLE
    assert "--unjailed" in report.error


def test_asked_for_unjailed_as_root_with_no_uid_to_drop_to_it_is_refused(tmp_path, no_jail, monkeypatch):
    """The red team's host: root, no namespaces, a venv under /root that no fresh uid can run. Before, the kernel
    ran as root and read the solutions; now nothing runs, and the report says how to install instead."""
    monkeypatch.setattr(os, "geteuid", lambda: 0)
    monkeypatch.setitem(processes._DROP, 0, False)
    monkeypatch.setattr(processes, "_as_root", lambda: True)
    monkeypatch.setattr(processes.shutil, "which", lambda name: f"/usr/bin/{name}")
    sol = tmp_path / "ex_toy.ipynb"
    sol.write_text(json.dumps(toy()))
    _no_kernel(monkeypatch)
    report = grader.grade(sol, sol, seed=1, unjailed=True)
    assert report.error.startswith("refused: the learner's code would run as root"), report.error
    assert "/opt/specref-venv" in report.error
    with pytest.raises(processes.RootRefused):  # and the wall's own call refuses too, whoever calls it
        processes.unjailed_uid()


def test_the_command_lines_refuse_without_unjailed(tmp_path):
    """Run where no jail can be made (can_jail patched off in a child interpreter): exit 2 with the reason."""
    sol = tmp_path / "ex_toy.ipynb"
    sol.write_text(json.dumps(toy()))
    code = ("import sys\nfrom specref_grading import grade\nfrom specref_grading.trust import wall\n"
            "grade.can_jail = wall.can_jail = lambda: False\n"
            "sys.exit(grade.main([sys.argv[1], '--solution', sys.argv[1], '--seed', '1']))")
    proc = subprocess.run([sys.executable, "-I", "-c", code, str(sol)], capture_output=True, text=True, timeout=300,
                          cwd=REPO)
    assert proc.returncode == grader.EXIT_UNGRADABLE and "--unjailed" in proc.stdout, proc.stdout + proc.stderr
    (tmp_path / "class").mkdir()
    code = ("import sys\nfrom specref_grading import classrun, grade\nfrom specref_grading.trust import wall\n"
            "grade.can_jail = wall.can_jail = lambda: False\nsys.exit(classrun.main(['grade', sys.argv[1]]))")
    proc = subprocess.run([sys.executable, "-I", "-c", code, str(tmp_path / "class")], capture_output=True,
                          text=True, timeout=300, cwd=REPO)
    assert proc.returncode == grader.EXIT_UNGRADABLE and "--unjailed" in proc.stderr, proc.stdout + proc.stderr


def test_a_jailed_run_regrades_what_an_unjailed_run_graded(tmp_path, monkeypatch):
    """The jail mode is in each submission's key: an unjailed 12/12 is not kept by a later jailed resume."""
    sol, sub = tmp_path / "solutions", tmp_path / "class"
    sol.mkdir()
    sub.mkdir()
    (sub / "a.ipynb").write_text(json.dumps(toy()))
    graded: list[bool] = []

    def fake_grade(path, solutions_dir=None, unjailed=False, **kw):
        graded.append(grader.can_jail())
        return Report(str(path), error="not graded in this test")
    monkeypatch.setattr(classrun, "grade", fake_grade)
    monkeypatch.setattr(classrun, "grader_version", lambda: "k")
    monkeypatch.setattr(grader, "root_refusal", lambda: None)
    run = lambda **kw: classrun.run(sub, tmp_path / "out" / "book.csv", jobs=1, seed=5,  # noqa: E731
                                    solutions_dir=sol, echo=lambda line: None, **kw)
    monkeypatch.setattr(grader, "can_jail", lambda: False)
    with pytest.raises(classrun.GradeError, match="--unjailed"):
        run()
    run(unjailed=True)
    run(unjailed=True)  # unchanged, unjailed again: kept
    monkeypatch.setattr(grader, "can_jail", lambda: True)
    run()
    assert graded == [False, True]


@pytest.mark.skipif(not AS_ROOT or shutil.which("id") is None, reason="dropping to a fresh uid needs root")
def test_the_trusted_setup_drops_to_the_uid_drawn(monkeypatch):
    """trusted_setup (the trusted process's preexec) ends as the fresh uid prepare_trusted_uid drew: no groups,
    no_new_privs."""
    monkeypatch.setitem(processes._DROP, 0, True)
    uid = processes.prepare_trusted_uid()
    assert uid is not None and uid != 0
    me = os.getpid()
    try:
        out = subprocess.run(["sh", "-c", "id -u; id -G; grep NoNewPrivs /proc/self/status"], capture_output=True,
                             text=True, timeout=60, cwd="/",
                             preexec_fn=lambda: processes.trusted_setup(me, None)).stdout.split()
    finally:
        processes._TRUSTED_UID.clear()
    assert out[:2] == [str(uid), str(uid)] and out[-1] == "1", out


@pytest.mark.skipif(not AS_ROOT, reason="dropping to a fresh uid needs root")
def test_a_grading_runs_its_checks_as_a_fresh_uid_where_one_can_run_the_interpreter(tmp_path, monkeypatch):
    """End to end: the test cell (the trusted side) sees a uid that is not root, and still grades full marks."""
    if not processes.can_drop():
        pytest.skip(f"no fresh uid can run {sys.executable} on this host (a private folder above it): the trusted "
                    "process stays root here, and the drop itself is tested by test_the_trusted_setup_drops_...")
    sol = tmp_path / "ex_toy.ipynb"
    sol.write_text(json.dumps(toy("assert one() == 1\nassert os.getuid() != 0, os.getuid()")))
    report = grader.grade(sol, sol, seed=1, cell_timeout=120)
    assert report.total == report.possible == 1, report.text()
