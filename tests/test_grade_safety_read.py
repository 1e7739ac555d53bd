"""Reading a submission: only regular files, capped in size, and every failure to read one is "could not be
graded" with its reason, never a traceback or a hang; an answer is size-capped before the grader parses it."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import threading
from pathlib import Path

import pytest

from specref_grading import grade as grader
from specref_grading import notebook, plan, scan
from specref_grading.notebook import GradeError

REPO = Path(__file__).resolve().parents[1]


def _nb(cells=(), **meta) -> dict:
    return {"cells": list(cells), "metadata": meta, "nbformat": 4, "nbformat_minor": 5}


def _unblock_later(path: Path, done: threading.Event) -> threading.Thread:
    """A safety valve, not a verdict: if a reader blocks on the FIFO, a writer opens and closes it once the test
    gives up waiting, so a regression fails the test instead of hanging it."""
    def valve():
        if not done.wait(120):
            with open(path, "wb"):
                pass
    t = threading.Thread(target=valve, daemon=True)
    t.start()
    return t


def test_a_fifo_named_ipynb_is_refused_without_blocking(tmp_path):
    fifo = tmp_path / "alice.ipynb"
    os.mkfifo(fifo)
    done = threading.Event()
    _unblock_later(fifo, done)
    try:
        with pytest.raises(GradeError, match="not a regular file"):
            notebook.read_notebook(fifo)
    finally:
        done.set()


def test_a_notebook_over_the_cap_is_refused_before_it_is_read(tmp_path):
    big = tmp_path / "big.ipynb"
    with big.open("wb") as f:
        f.truncate(notebook.MAX_NOTEBOOK_BYTES + 1)
    with pytest.raises(GradeError, match="more than the 32 MB"):
        notebook.read_notebook(big)
    with pytest.raises(GradeError, match="more than the 1 MB"):
        notebook.read_capped(big, cap=1 << 20)


def test_a_link_is_refused_where_links_are_not_followed(tmp_path):
    (tmp_path / "real.ipynb").write_text(json.dumps(_nb()))
    (tmp_path / "link.ipynb").symlink_to(tmp_path / "real.ipynb")
    assert notebook.read_capped(tmp_path / "link.ipynb")  # make grade NB=link.ipynb: the instructor's own choice
    with pytest.raises(GradeError, match="cannot read"):
        notebook.read_capped(tmp_path / "link.ipynb", follow=False)


def test_an_integer_of_5000_digits_is_could_not_be_graded_not_a_traceback(tmp_path):
    """Python refuses to convert an int of more than 4300 digits (ValueError, not a JSONDecodeError): a reason."""
    path = tmp_path / "huge.ipynb"
    path.write_text('{"cells": [], "metadata": {"x": ' + "9" * 5000 + '}, "nbformat": 4, "nbformat_minor": 5}')
    with pytest.raises(GradeError, match="cannot be read as a notebook"):
        notebook.read_notebook(path)
    report = grader.grade(path, path, seed=1)
    assert report.error and report.exit_code == grader.EXIT_UNGRADABLE, report.text()
    proc = subprocess.run([sys.executable, "-I", "-m", "specref_grading.grade", str(path), "--solution", str(path),
                           "--seed", "1"], capture_output=True, text=True, timeout=300, cwd=REPO)
    assert proc.returncode == grader.EXIT_UNGRADABLE and "Traceback" not in proc.stderr, proc.stderr
    assert "could not be graded" in proc.stdout, proc.stdout


def test_every_failure_to_read_is_a_reason(tmp_path):
    cases = {"bad_utf8.ipynb": b"\xff\xfe{", "not_json.ipynb": b"{", "deep.ipynb": b"[" * 100_000,
             "no_cells.ipynb": b"{}"}
    for name, data in cases.items():
        (tmp_path / name).write_bytes(data)
        with pytest.raises(GradeError):
            notebook.read_notebook(tmp_path / name)


def _answer_solution() -> dict:
    meta = {"nbgrader": {"grade": False, "grade_id": "a", "points": 0, "solution": True, "schema_version": 3}}
    test = {"nbgrader": {"grade": True, "grade_id": "t", "points": 1, "solution": False, "schema_version": 3}}
    return _nb([
        {"cell_type": "code", "id": "s", "metadata": {}, "outputs": [], "execution_count": None, "source": "x = 1"},
        {"cell_type": "code", "id": "a", "metadata": meta, "outputs": [], "execution_count": None,
         "source": "def f():\n    ### BEGIN SOLUTION\n    return 1\n    ### END SOLUTION"},
        {"cell_type": "code", "id": "t", "metadata": test, "outputs": [], "execution_count": None,
         "source": "assert f() == 1"}])


def test_an_answer_over_the_cap_is_refused_before_any_parse(monkeypatch):
    """A 2.3 MB answer took the grader's parser to 421 MB: an answer longer than MAX_ANSWER_CHARS is never parsed."""
    sol = _answer_solution()
    sub = json.loads(json.dumps(sol))
    sub["cells"][1]["source"] = "x = [" + "1," * (notebook.MAX_ANSWER_CHARS // 2 + 10) + "]"
    parsed: list[int] = []
    real = scan.ast.parse

    def counting(source, *a, **k):
        parsed.append(len(source))
        return real(source, *a, **k)
    monkeypatch.setattr(scan.ast, "parse", counting)
    with pytest.raises(GradeError, match="more than the .* an answer may be"):
        plan.build_plan(sol, sub, "ex_toy.ipynb")
    assert all(n <= notebook.MAX_ANSWER_CHARS for n in parsed), max(parsed)
    ok = json.loads(json.dumps(sol))
    plan.build_plan(sol, ok, "ex_toy.ipynb")  # an honest answer is parsed as before
