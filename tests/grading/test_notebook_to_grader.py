"""Notebook to grader: a submission cannot exhaust or crash the grading process that reads it.

Only regular files are read, capped in size, and every failure to read one is "could not be graded" with its
reason, never a traceback or a hang; an answer is size-capped before anything parses it, and the learner's JSON and
Python are parsed only in a limited process (specref_grading/trust/reading.py). One notebook the parser cannot read
stops no other submission of a batch.
"""

from __future__ import annotations

import csv
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
from specref_grading.trust import reading

from .conftest import CLASSRUN_CMD, REPO, attacked, grade, solved


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
    """The parser needs ~200 bytes per byte of source: an answer longer than MAX_ANSWER_CHARS is never parsed."""
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


def _with_answer(text: str) -> tuple[dict, dict]:
    sol = _answer_solution()
    sub = json.loads(json.dumps(sol))
    sub["cells"][1]["source"] = text
    return sol, sub


def test_the_grading_process_never_parses_the_learners_text(monkeypatch):
    """build_plan and the submission's reading parse nothing the learner wrote here: the answers' Python and the
    notebook's JSON are read in the limited process, whose findings still reach the plan."""
    marker = "learner_marker_name"
    sol, sub = _with_answer(f"def f():\n    {marker} = getattr(object, 'mro')\n    return 1")
    parsed: list[str] = []
    real_parse, real_loads = scan.ast.parse, json.loads
    monkeypatch.setattr(scan.ast, "parse", lambda source, *a, **k: parsed.append(source) or real_parse(source, *a, **k))
    monkeypatch.setattr(json, "loads", lambda s, *a, **k: parsed.append(s) or real_loads(s, *a, **k))
    got = plan.build_plan(sol, sub, "ex_toy.ipynb")
    assert any("uses getattr" in n for n in got.notes), got.notes  # the reading process's finding
    data = json.dumps(sub).encode()
    assert reading.parse_submission(data, "sub.ipynb")["cells"][1]["source"] == sub["cells"][1]["source"]
    texts = [x if isinstance(x, str) else bytes(x).decode("utf-8", "replace") for x in parsed]
    # what comes back is the reading process's own flat reply: plain data, never the learner's JSON or Python
    leaked = [x[:80] for x in texts if marker in x and not x.startswith('{"ok": ')]
    assert leaked == [], leaked
    assert any(marker in x for x in texts)  # the reply was seen: the spy works


@pytest.mark.parametrize("text", ["x = " + "-" * 100_000 + "1", "x = " + "-" * 3000 + "1", "x" + ".a" * 60_000,
                                  "x = " + "+".join(["a"] * 60_000), "def f(:\n", "x = 1\0"])
def test_an_answer_nested_too_deeply_or_unreadable_is_a_note_on_its_tests(text):
    """What the parser or the scanner's walk cannot take (MemoryError, RecursionError, null bytes, bad syntax) is
    that answer's failure, named on its tests; the notebook is still graded."""
    sol, sub = _with_answer(text)
    got = plan.build_plan(sol, sub, "ex_toy.ipynb")
    assert list(got.syntax) == [1], got.syntax
    assert "answer cell 'a'" in got.syntax[1] and ("syntax error" in got.syntax[1] or "cannot be read" in got.syntax[1])


def test_the_reading_process_limits_itself_and_a_reader_past_its_time_is_a_reason(monkeypatch):
    code = ("import resource\nfrom specref_grading.trust import reading\nreading._limit_self()\n"
            "print(resource.getrlimit(resource.RLIMIT_AS)[0] >> 20, resource.getrlimit(resource.RLIMIT_CPU)[0])")
    out = subprocess.run([sys.executable, "-I", "-c", code], capture_output=True, text=True, timeout=60).stdout
    assert out.split() == [str(reading.READ_MEMORY_MB), str(reading.READ_CPU_S)], out
    monkeypatch.setattr(reading, "READ_TIMEOUT_S", 0.001)
    with pytest.raises(GradeError, match="could not be read: reading it took more than"):
        reading.read_answers({"1": "x = 1"}, set(), {})


def test_the_submission_comes_back_slim_and_checked(tmp_path):
    """Only what grading reads comes back: no outputs' data, no nested metadata; a 5000-digit integer or nesting
    too deep in the JSON is a reason, from the reading process."""
    meta = {"nbgrader": {"grade_id": "a", "solution": True, "deep": {"x": [1] * 10}}, "other": {"y": 1}}
    nb = _nb([{"cell_type": "code", "metadata": meta, "source": ["a\n", "b"], "execution_count": 3,
               "outputs": [{"output_type": "error", "traceback": ["x" * 1000]}, "junk"]}], specref={"exercise": "e"})
    got = reading.parse_submission(json.dumps(nb).encode(), "sub.ipynb")
    assert got == {"cells": [{"cell_type": "code", "source": "a\nb", "execution_count": 3,
                              "metadata": {"nbgrader": {"grade_id": "a", "solution": True}},
                              "outputs": [{"output_type": "error"}, {}]}], "metadata": {"specref": {"exercise": "e"}}}
    big = json.dumps(nb).replace('"e"}', '"e", "n": ' + "9" * 5000 + "}").encode()
    for data, why in ((big, "cannot be read as a notebook"), (b"[" * 100_000, "nested too deeply"),
                      (b"\xff{", "not UTF-8")):
        with pytest.raises(GradeError, match=why):
            reading.parse_submission(data, "sub.ipynb")
    path = tmp_path / "huge.ipynb"
    path.write_bytes(big)
    with pytest.raises(GradeError, match="cannot be read as a notebook"):
        reading.read_submission(path)


@pytest.mark.grader
@pytest.mark.parametrize("text, reason", [
    ("{not json", "not valid JSON"),
    (json.dumps({"cells": "nope"}), "not a notebook"),
    (json.dumps({"cells": [{"cell_type": "code", "source": "x", "metadata": []}], "metadata": {}}), "broken metadata"),
    (json.dumps({"cells": [{"cell_type": "code", "source": 3, "metadata": {}}], "metadata": {}}), "broken source"),
])
def test_a_broken_notebook_means_exit_2_with_a_reason(toy, text, reason):
    code, report, out = grade(text, toy)
    assert code == 2 and reason in report["error"], out


# -- what must not take the grader or the host down -------------------------------------------------
@pytest.mark.grader
@pytest.mark.parametrize("bomb", [
    pytest.param(lambda nb: json.dumps(nb)[:-1] + ', "x": ' + "[" * 100_000 + "]" * 100_000 + "}", id="deep-json"),
    pytest.param(lambda nb: json.dumps(attacked(nb, "x = " + "-" * 100_000 + "1")), id="parser-memory-error"),
    pytest.param(lambda nb: json.dumps(attacked(nb, "x = a" + ".b" * 100_000)), id="parser-recursion-error"),
])
def test_a_notebook_the_parser_cannot_read_is_ungradable_and_the_batch_goes_on(toy, tmp_path, bomb):
    """RecursionError and MemoryError from json.loads or ast.parse crashed grade.py, and with it grade-all."""
    sol_dir, sub_dir, exercise_nb = toy
    (sub_dir / "honest.ipynb").write_text(json.dumps(solved(toy)), encoding="utf-8")
    (sub_dir / "bomb.ipynb").write_text(bomb(exercise_nb), encoding="utf-8")
    book = tmp_path / "book.csv"
    proc = subprocess.run([*CLASSRUN_CMD, str(sub_dir), "--csv", str(book), "--solutions-dir",
                           str(sol_dir)], capture_output=True, text=True, timeout=300)
    assert "Traceback" not in proc.stderr, proc.stderr[-2000:]
    rows = {r["file"]: r for r in csv.DictReader(book.open(encoding="utf-8"))}
    assert rows["honest.ipynb"]["total"] == "3" and rows["bomb.ipynb"]["total"] == "0", rows
