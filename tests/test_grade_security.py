"""The grader (specref_grading) against a learner who wants marks without solving.

Every test grades a small toy exercise built here (pure Python, no torch: each kernel
starts in a fraction of a second). Each class of attack is tried on the UNSOLVED stub:
the grade must be 0 for the attacked task. The answers run in a jailed kernel, the tests in a
trusted process (the wall), so an attack gains nothing there; what the scanner notices in an
answer is a note in the report, never a gate on points. The honest solution must still get full marks.

The grader runs as a CLI (``python -m specref_grading.grade ... --json``), as an instructor runs it.
GRADE_PY=path/to/another/grade.py runs the same tests against another grader (one without the wall
fails them).
"""

from __future__ import annotations

import copy
import csv
import hashlib
import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
# The grader's command line; GRADE_PY=path/to/grade.py runs the same tests against another grader.
# -I: isolated, so a folder or file in the working directory (the submissions') is never imported as the grader.
GRADE_CMD = [sys.executable, os.environ["GRADE_PY"]] if os.environ.get("GRADE_PY") else [
    sys.executable, "-I", "-m", "specref_grading.grade"]
CLASSRUN_CMD = [sys.executable, "-I", "-m", "specref_grading.classrun", "grade"]

from specref_grading.exercises import make_exercise as _make_exercise  # noqa: E402

AS_ROOT = os.geteuid() == 0
SETUP = '''import math

def check_double(fn, xs=(1, 2.5, -3)):
    """The exercise's grader for double()."""
    for x in xs:
        got = fn(x)
        assert isinstance(got, (int, float)) and math.isclose(got, 2 * x), (
            f"double({x}) returned {got!r}, expected {2 * x}\\nHint: multiply by two, do not add.")
    print("check_double: passed")'''


def _meta(grade_id, points, solution, graded=True):
    return {"nbgrader": {"grade": graded, "grade_id": grade_id, "points": points, "solution": solution,
                         "locked": not solution, "schema_version": 3}}


def _code(source, meta=None, cid=None):
    return {"cell_type": "code", "execution_count": None, "id": cid, "metadata": meta or {}, "outputs": [],
            "source": source}


def toy_solution() -> dict:
    """Two tasks: double() (2 points, hidden tests) and pair() (1 point), one hand-graded answer."""
    cells = [
        {"cell_type": "markdown", "id": "intro", "metadata": {}, "source": "# Toy"},
        # the checks' cell, as in the course's exercises: it runs in the trusted process only, never in the kernel
        _code(SETUP, {"specref": {"side": "checks"}}, cid="setup"),
        _code("def double(x):\n    ### BEGIN SOLUTION\n    return 2 * x\n    ### END SOLUTION",
              _meta("double_answer", 0, True, graded=False), "a1"),
        _code("check_double(double)\n### BEGIN HIDDEN TESTS\ncheck_double(double, xs=(10, -7.5))\n"
              "### END HIDDEN TESTS", _meta("double_check", 2, False), "t1"),
        _code("def pair(xs):\n    ### BEGIN SOLUTION\n    return sorted(xs)\n    ### END SOLUTION",
              _meta("pair_answer", 0, True, graded=False), "a2"),
        _code("assert pair([3, 1]) == [1, 3], 'pair([3, 1]) should be [1, 3]'\n"
              "xs = [5, 4]\nassert pair(xs) == sorted(xs), 'pair([5, 4]) should be [4, 5]'", _meta("pair_check", 1, False), "t2"),
        {"cell_type": "markdown", "id": "m1", "metadata": _meta("why", 1, True),
         "source": "Why?\n\n### BEGIN SOLUTION\nBecause.\n### END SOLUTION"},
    ]
    return {"cells": cells, "metadata": {"kernelspec": {"name": "python3", "display_name": "Python 3",
                                                        "language": "python"}}, "nbformat": 4, "nbformat_minor": 5}


def make_exercise(solution: dict, name: str = "ex_toy.ipynb") -> dict:
    import nbformat
    nb = json.loads(nbformat.writes(_make_exercise(nbformat.from_dict(copy.deepcopy(solution)), name)))
    for c in nb["cells"]:
        c["source"] = "".join(c["source"]) if isinstance(c["source"], list) else c["source"]
    return nb


def solved(toy) -> dict:
    """The solution as a learner would hand it in: solved, and stamped with the exercise id."""
    nb = toy_solution()
    nb["metadata"]["specref"] = copy.deepcopy(toy[2]["metadata"]["specref"])
    return nb


def answer(nb: dict, grade_id: str) -> dict:
    return next(c for c in nb["cells"] if c["metadata"].get("nbgrader", {}).get("grade_id") == grade_id)


@pytest.fixture
def toy(tmp_path):
    """(solutions folder, submissions folder, the exercise as handed out)."""
    sol_dir, sub_dir = tmp_path / "solutions", tmp_path / "submissions"
    sol_dir.mkdir()
    sub_dir.mkdir()
    sol = toy_solution()
    (sol_dir / "ex_toy.ipynb").write_text(json.dumps(sol), encoding="utf-8")
    return sol_dir, sub_dir, make_exercise(sol)


def grade(nb: dict | str, toy, name: str = "alice.ipynb", *args: str, timeout: float = 120) -> tuple[int, dict, str]:
    """Write the submission and grade it with the CLI; (exit status, JSON report or {}, output)."""
    sol_dir, sub_dir, _ = toy
    path = sub_dir / name
    path.write_text(nb if isinstance(nb, str) else json.dumps(nb), encoding="utf-8")
    proc = subprocess.run([*GRADE_CMD, str(path), "--solutions-dir", str(sol_dir), "--json", *args],
                          capture_output=True, text=True, timeout=timeout, cwd=sub_dir)
    try:
        report = json.loads(proc.stdout)
    except ValueError:
        report = {}
    return proc.returncode, report, proc.stdout + proc.stderr


def scores(report: dict) -> dict[str, float]:
    return {t["grade_id"]: t["score"] for t in report.get("tests", [])}


def attacked(exercise: dict, code: str, grade_id: str = "double_answer") -> dict:
    """The unsolved exercise with `code` added to an answer cell, after its stub."""
    nb = copy.deepcopy(exercise)
    cell = answer(nb, grade_id)
    cell["source"] = cell["source"] + "\n" + code
    return nb


def assert_no_marks_silently(code: int, report: dict, task: str = "double_check") -> None:
    """The attacked task scores 0; the submission failed (exit 1), or is flagged by the trusted side (exit 3) or
    ungradable (exit 2)."""
    assert report, "the grader gave no JSON report"
    assert scores(report)[task] == 0, report
    assert code in (1, 2, 3), report


# -- the honest baseline -------------------------------------------------------------------------
def test_the_honest_solution_gets_full_marks(toy):
    code, report, out = grade(solved(toy), toy)
    assert code == 0, out
    assert scores(report) == {"double_check": 2, "pair_check": 1}
    # the toy's hand-graded answer is never marked by the grader: never "full marks" while it waits
    assert report["flags"] == [] and report["status"] == "autograded checks passed, 1 point awaits hand grading"


def test_the_unsolved_stub_gets_zero_and_says_why(toy):
    code, report, out = grade(toy[2], toy)
    assert code == 1, out
    assert scores(report) == {"double_check": 0, "pair_check": 0}
    assert all("NotImplementedError" in t["message"] for t in report["tests"])


def test_a_solved_exercise_copy_gets_full_marks_whatever_its_file_name(toy):
    nb = copy.deepcopy(toy[2])
    answer(nb, "double_answer")["source"] = "def double(x):\n    return x + x"
    answer(nb, "pair_answer")["source"] = "def pair(xs):\n    return [min(xs), max(xs)]"
    code, report, out = grade(nb, toy, "renamed by the student.ipynb")
    assert code == 0, out
    assert report["exercise"] == "ex_toy"


# -- 1. scored from the solution only ------------------------------------------------------------
def test_test_cells_turned_into_markdown_still_run(toy):
    nb = copy.deepcopy(toy[2])
    for c in nb["cells"]:
        if c["metadata"].get("nbgrader", {}).get("grade_id", "").endswith("_check"):
            c["cell_type"] = "markdown"
            c.pop("outputs", None)
            c.pop("execution_count", None)
    code, report, out = grade(nb, toy)
    assert code == 1 and report["possible"] == 3 and report["total"] == 0, out


def test_an_extra_graded_cell_and_edited_points_are_ignored_and_listed(toy):
    nb = copy.deepcopy(toy[2])
    nb["cells"].append(_code("pass", _meta("bonus", 100, False), "bonus"))
    answer(nb, "double_check")["metadata"]["nbgrader"]["points"] = 50
    answer(nb, "double_check")["source"] = "pass"
    dup = copy.deepcopy(answer(nb, "pair_check"))
    dup["id"], dup["source"] = "dup", "pass"
    nb["cells"].insert(0, dup)
    code, report, out = grade(nb, toy)
    assert code == 1 and report["possible"] == 3 and report["total"] == 0, out
    notes = " ".join(report["notes"])
    assert "'bonus' is not part of the exercise" in notes and "edited grading metadata" in notes
    assert "2 cells claim test grade_id 'pair_check'" in notes
    nb = solved(toy)
    nb["cells"].append(_code("pass", _meta("bonus", 100, False), "bonus"))
    answer(nb, "pair_check")["metadata"]["nbgrader"]["points"] = 50
    code, report, out = grade(nb, toy)
    assert code == 0 and (report["total"], report["possible"]) == (3, 3), out


def test_deleted_and_moved_test_cells_still_grade(toy):
    nb = solved(toy)
    nb["cells"] = [c for c in nb["cells"] if c.get("id") != "t1"]
    nb["cells"].reverse()
    code, report, out = grade(nb, toy)
    assert code == 0 and report["total"] == 3, out


def test_a_renamed_file_is_graded_by_its_exercise_id_with_the_hidden_tests(toy):
    nb = copy.deepcopy(toy[2])
    answer(nb, "double_check")["source"] = "pass"
    answer(nb, "double_answer")["source"] = "def double(x):\n    return 2 * x if x != 10 else 0"
    code, report, out = grade(nb, toy, "something_else.ipynb")
    assert code == 1 and scores(report)["double_check"] == 0, out
    assert "double(10) returned 0, expected 20" in out  # the hidden test ran


def test_no_exercise_id_means_exit_2_unless_the_solution_is_named(toy):
    nb = solved(toy)
    nb["metadata"].pop("specref", None)
    code, report, out = grade(nb, toy, "x.ipynb")
    assert code == 2 and "exercise id" in report["error"], out
    code, report, out = grade(nb, toy, "x.ipynb", "--solution", str(toy[0] / "ex_toy.ipynb"))
    assert code == 0, out


def test_an_older_exercise_version_is_graded_with_todays_tests(toy):
    nb = solved(toy)
    nb["metadata"]["specref"] = {"exercise": "ex_toy", "version": "0123456789ab"}
    code, report, out = grade(nb, toy)
    assert code == 0, out
    assert any("older version" in n and "0123456789ab" in n for n in report["notes"])


# -- 2. isolation ---------------------------------------------------------------------------------
def test_files_beside_the_notebook_are_not_imported(toy):
    sub_dir = toy[1]
    (sub_dir / "conftest.py").write_text("import pytest\n@pytest.hookimpl(tryfirst=True)\n"
                                         "def pytest_runtest_makereport(item, call):\n    call.excinfo = None\n")
    (sub_dir / "pytest.py").write_text("raise SystemExit(0)\n")
    (sub_dir / "math.py").write_text("def isclose(*a, **k):\n    return True\n")
    (sub_dir / "sitecustomize.py").write_text("import builtins\nbuiltins.AssertionError = Warning\n")
    (sub_dir / "specref").mkdir()
    (sub_dir / "specref" / "__init__.py").write_text("residual = lambda p, q: p\n")
    nb = attacked(toy[2], "import math")
    nb = attacked(nb, "double = lambda x: 0")
    code, report, out = grade(nb, toy)
    assert_no_marks_silently(code, report)


def _tree_hash(*folders: Path) -> str:
    h = hashlib.sha256()
    for folder in folders:
        for p in sorted(folder.rglob("*")):
            if p.is_file() and "__pycache__" not in p.parts:
                h.update(str(p).encode() + b"\0" + p.read_bytes())
    return h.hexdigest()


@pytest.mark.skipif(not AS_ROOT, reason="the kernel is confined to an unprivileged uid only when grading as root")
def test_the_kernel_cannot_write_the_repository_the_solutions_or_other_submissions(toy):
    sol_dir, sub_dir, exercise = toy
    other = sub_dir / "bob.ipynb"
    other.write_text(json.dumps(toy_solution()))
    # New files only in the repository (a grader that lets them through must not damage it); appends to
    # the toy solution and to another learner's submission.
    targets = [REPO / "solutions" / "zz_attack.ipynb", REPO / "specref" / "zz_attack.py",
               sol_dir / "ex_toy.ipynb", other, REPO / ".venv" / "zz_attack"]
    before = (_tree_hash(REPO / "solutions", REPO / "specref"), sol_dir.joinpath("ex_toy.ipynb").read_bytes(),
              other.read_bytes())
    code_ = (f"import os\nfor t in {[str(t) for t in targets]!r}:\n    try:\n        open(t, 'a').write('x')\n"
             "    except OSError:\n        pass\n")
    nb = attacked(exercise, code_)
    try:
        code, report, out = grade(nb, toy)
        after = (_tree_hash(REPO / "solutions", REPO / "specref"), sol_dir.joinpath("ex_toy.ipynb").read_bytes(),
                 other.read_bytes())
        assert after == before, "the kernel changed files it must not touch"
        assert not any(t.exists() for t in targets[:2] + [targets[-1]])
        assert_no_marks_silently(code, report)
        assert any("double_answer" in n and "open" in n for n in report["notes"]), report  # noted, not a gate
    finally:
        for t in targets[:2] + [targets[-1]]:
            t.unlink(missing_ok=True)


def _tagged_processes(tag: str) -> list[int]:
    pids = []
    for d in Path("/proc").iterdir():
        if d.name.isdigit() and int(d.name) != os.getpid():
            try:
                if tag.encode() in (d / "cmdline").read_bytes():
                    pids.append(int(d.name))
            except OSError:
                pass
    return pids


@pytest.mark.slow
def test_a_timeout_kills_every_process_of_the_submission(toy):
    tag = f"specref-survivor-{os.getpid()}-{time.time_ns()}"
    code_ = (f"import os, subprocess, sys, time\n"
             f"subprocess.Popen([sys.executable, '-c', 'import time; time.sleep(120)', '{tag}'], start_new_session=True)\n"
             f"if os.fork() == 0:\n    os.setsid()\n    os.execv(sys.executable, [sys.executable, '-c', "
             f"'import time; time.sleep(120)', '{tag}'])\n"
             f"time.sleep(0.5)\nwhile True:\n    pass")
    nb = attacked(toy[2], code_)
    t0 = time.monotonic()
    code, report, out = grade(nb, toy, "alice.ipynb", "--cell-timeout", "4")
    try:
        assert time.monotonic() - t0 < 60
        assert_no_marks_silently(code, report)
        assert "timed out" in out and "answer cell 'double_answer'" in out
        time.sleep(0.3)
        assert _tagged_processes(tag) == [], "a process of the submission survived the grading run"
    finally:
        for pid in _tagged_processes(tag):
            os.kill(pid, 9)


def test_a_dead_kernel_is_reported_at_once(toy):
    """A kernel the submission's own code kills is that submission's failure (exit 1, its cause in each test's
    message), not "could not be graded" (exit 2, which --retry takes for a fault of the grader)."""
    nb = attacked(toy[2], "import os, signal\nos.kill(os.getpid(), signal.SIGKILL)")
    t0 = time.monotonic()
    code, report, out = grade(nb, toy, "alice.ipynb", "--cell-timeout", "60")
    assert time.monotonic() - t0 < 30
    assert code == 1 and report["total"] == 0 and not report["error"], out
    assert all(t["outcome"] == "failed" for t in report["tests"]), out
    assert "the kernel died while running answer cell 'double_answer' (signal 9)" in out


def test_killing_the_runner_after_forging_a_report_gets_nothing(toy):
    forge = ("import os\nline = b'0' * 64 + b' {\"ev\": \"result\", \"outcome\": \"passed\", \"flags\": []}\\n'\n"
             "for fd in range(3, 64):\n    try:\n        os.write(fd, line + b'0' * 64 + b' {\"ev\": \"done\"}\\n')\n"
             "    except OSError:\n        pass\nos._exit(0)")
    nb = attacked(toy[2], "def double(x):\n" + "\n".join("    " + ln for ln in forge.splitlines()))
    code, report, out = grade(nb, toy)
    assert_no_marks_silently(code, report)
    assert report["total"] == 0 and not any(t["outcome"] == "passed" for t in report["tests"]), out
    # the forged lines reach only the kernel's own channel to the checks: a broken message, or a dead kernel
    double = next(t["message"] for t in report["tests"] if t["grade_id"] == "double_check")
    assert "died" in double or "refuses" in double, out


def test_the_whole_run_has_a_time_limit(toy):
    nb = attacked(toy[2], "import time\ntime.sleep(30)")
    t0 = time.monotonic()
    code, report, out = grade(nb, toy, "alice.ipynb", "--timeout", "3")
    assert time.monotonic() - t0 < 20
    assert report["total"] == 0 and code in (1, 3), out
    assert "timed out" in out


# -- 3. checks that code in the same kernel cannot fool ----------------------------------------
@pytest.mark.parametrize("attack", [
    pytest.param("check_double = lambda *a, **k: None\ndouble = lambda x: 0", id="rebind-the-checker"),
    pytest.param("import math\nmath.isclose = lambda *a, **k: True\nisinstance = lambda *a: True\ndouble = lambda x: 0",
                 id="patch-a-module-the-check-uses"),
    pytest.param("import builtins\nbuiltins.isinstance = lambda *a: True\nm = __import__('math')\n"
                 "setattr(m, 'isclose', lambda *a, **k: True)\ndouble = lambda x: 0", id="patch-builtins"),
    pytest.param("check_double.__code__ = (lambda *a, **k: None).__code__\ndouble = lambda x: 0", id="patch-the-checkers-code"),
    pytest.param("get_ipython().set_custom_exc((BaseException,), lambda *a, **k: None)", id="ipython-custom-exc"),
    pytest.param("get_ipython().events.register('post_run_cell', lambda r: setattr(r, 'error_in_exec', None))",
                 id="ipython-events"),
    pytest.param("import sys\nsys.excepthook = lambda *a: None\nsys.settrace(lambda *a: None)\ndouble = lambda x: 0",
                 id="sys-hooks"),
    pytest.param("import threading, time, math\ndef later():\n    time.sleep(0.2)\n    math.isclose = lambda *a, **k: True\n"
                 "threading.Thread(target=later, daemon=True).start()\ndef double(x):\n    time.sleep(0.5)\n    return 0",
                 id="a-thread-patches-later"),
    pytest.param("class Number(float):\n    def __eq__(self, other):\n        return True\n    __hash__ = float.__hash__\n"
                 "def double(x):\n    import math\n    math.isclose = lambda *a, **k: True\n    return Number(0)",
                 id="patch-from-inside-the-called-function"),
    pytest.param("def double(x):\n    raise SystemExit(0)", id="system-exit-during-the-check"),
    pytest.param("def double(x):\n    raise KeyboardInterrupt", id="keyboard-interrupt-during-the-check"),
])
def test_in_kernel_tampering_never_passes_silently(toy, attack):
    code, report, out = grade(attacked(toy[2], attack), toy)
    assert_no_marks_silently(code, report)


@pytest.mark.parametrize("attack", [
    pytest.param("class Yes(list):\n    def __eq__(self, other):\n        return True\n    __hash__ = None\n"
                 "def pair(xs):\n    return Yes()", id="list-that-equals-anything"),
    pytest.param("class Yes:\n    def __eq__(self, other):\n        return True\n"
                 "def pair(xs):\n    return Yes()", id="object-that-equals-anything"),
    pytest.param("def pair(xs):\n    return type('Yes', (list,), {'__eq__': lambda s, o: True})()", id="dynamic-class"),
    pytest.param("def pair(xs):\n    return [1, 3]", id="answers-a-single-case"),
])
def test_objects_that_lie_in_comparisons_do_not_pass(toy, attack):
    code, report, out = grade(attacked(toy[2], attack, "pair_answer"), toy)
    assert_no_marks_silently(code, report, "pair_check")


CHANGES_ITS_INPUT = {
    "function": "def total(x):\n    x.zero_()\n    return 0.0",
    "callable-instance": "class Total:\n    def __call__(self, x):\n        x.zero_()\n        return 0.0\n"
                         "total = Total()",
    "partial": "import functools\ndef _total(scale, x):\n    x.zero_()\n    return 0.0\n"
               "total = functools.partial(_total, 1.0)",
}


@pytest.mark.parametrize("attack", CHANGES_ITS_INPUT.values(), ids=CHANGES_ITS_INPUT.keys())
def test_a_function_that_changes_its_inputs_is_flagged(tensor_toy, attack):
    """The check compares with x.sum() AFTER the call: zeroing the tensor in place would make 0.0 right. The
    change is copied back into the check's tensor (what the learner did is seen), and the wire flags the call
    whatever the callee is: the points are withheld for review (exit 3)."""
    code, report, out = grade(attacked(tensor_toy[2], attack, "total_answer"), tensor_toy)
    assert_no_marks_silently(code, report, "total_check")
    assert code == 3, out
    flags = next(t["flags"] for t in report["tests"] if t["grade_id"] == "total_check")
    assert flags == ["total() changed an input the check passed in: a function must not modify its input values"], (
        report)


# -- 4. the reference implementation as the answer ------------------------------------------------
# What an exercise forbids is absent from the kernel's specref (specref_grading/trust/kernel_tree.py, tested in
# tests/test_grade_kernel_tree.py); here the scanner's side: a use of specref is a note on its cell, never a gate.
def test_using_specref_in_an_answer_is_noted_for_that_cell_only(toy):
    nb = solved(toy)
    answer(nb, "double_answer")["source"] = ("def double(x):\n    if x is None:\n        from specref import residual\n"
                                             "    return 2 * x")
    code, report, out = grade(nb, toy)
    assert code == 0, out
    assert scores(report) == {"double_check": 2, "pair_check": 1}
    assert report["flags"] == [] and all(t["flags"] == [] for t in report["tests"]), report
    noted = [n for n in report["notes"] if "specref" in n]
    assert noted and all("'double_answer'" in n for n in noted), report["notes"]



# The answer binds double() where a reading of top-level statements does not see it, and a grader that reads only
# those charges the answer to no test. The plan must still see which answers each test depends on (it names
# an earlier answer's syntax error with the test); a guarded import of specref (never run) is only a note.
HIDDEN_BINDINGS = {
    "def-in-if": ("if True:\n    def double(x):\n        if x is None:\n            import specref\n"
                  "        return 2 * x"),
    "match-capture": ("def twice(x):\n    if x is None:\n        import specref\n    return 2 * x\n\n"
                      "match (twice,):\n    case (double,):\n        pass"),
}


@pytest.mark.parametrize("source", HIDDEN_BINDINGS.values(), ids=HIDDEN_BINDINGS.keys())
def test_an_answer_is_charged_to_its_test_however_it_binds_its_name(toy, source):
    from specref_grading import plan as grade_plan
    nb = solved(toy)
    answer(nb, "double_answer")["source"] = source
    plan = grade_plan.build_plan(toy_solution(), nb, "ex_toy.ipynb")
    assert 2 in next(t for t in plan.tests if t.grade_id == "double_check").depends, plan
    code, report, out = grade(nb, toy)
    assert code == 0, out
    assert scores(report) == {"double_check": 2, "pair_check": 1}, report
    assert any("'double_answer'" in n and "specref" in n for n in report["notes"]), report["notes"]


@pytest.mark.parametrize("source, names", [
    ("if True:\n    def f(x): return x\nelse:\n    class C: pass", {"f", "C"}),
    ("try:\n    import math as m\nexcept Exception as err:\n    from math import tau", {"m", "err", "tau"}),
    ("with open('x') as fh:\n    for i, (j, k) in []:\n        while 1:\n            import cmath",
     {"fh", "i", "j", "k", "cmath"}),
    ("match [1]:\n    case [a, *rest]: pass\n    case {'k': v, **others}: pass\n    case int() as n: pass",
     {"a", "rest", "v", "others", "n"}),
    ("def g(a=(q := 1)):\n    global h\n    h = local = 2\ny = [(z := t) for t in range(2)]",
     {"g", "q", "h", "y", "z"}),
    ("x += 1\nw: int = 2\ndel v", {"x", "w", "v"}),
])
def test_names_bound_sees_every_binding_of_the_cells_scope(source, names):
    from specref_grading.scan import names_bound
    assert names_bound(source) == names


@pytest.mark.parametrize("source", ['exec("def double(x): return 2 * x")', 'globals()["double"] = abs',
                                    'import sys\nsys.modules["__main__"].double = abs', 'vars().update(double=abs)'])
def test_a_cell_that_binds_names_unseen_is_charged_to_every_later_test(toy, source):
    """What no reading settles may bind double(): every later test depends on the cell; its uses are notes."""
    from specref_grading import plan as grade_plan
    from specref_grading.scan import binds_unknown
    nb = solved(toy)
    answer(nb, "double_answer")["source"] = "if None:\n    import specref\n" + source
    plan = grade_plan.build_plan(toy_solution(), nb, "ex_toy.ipynb")
    assert binds_unknown(source) and not binds_unknown("double = lambda x: 2 * x\nmodel.eval()")
    assert all(2 in t.depends for t in plan.tests), plan
    assert any("'double_answer'" in n and "specref" in n for n in plan.notes), plan.notes


# An exercise whose own cells call specref (ex07's setup runs server_rows(); a later given cell compares the
# learner's result with the reference's): building the plan reads every cell and runs none.
def _given_cells_solution() -> dict:
    nb = toy_solution()
    nb["cells"].insert(2, _code("from specref.theory import expected_tokens_per_step, optimal_k, speedup\n"
                                "TOKENS = expected_tokens_per_step(0.8, 4)", cid="given-setup"))
    nb["cells"].insert(4, _code("print(double(2), optimal_k(0.8, 0.05))", cid="given"))
    return nb


@pytest.mark.parametrize("name, extra, noted", [
    ("expected_tokens_per_step", "print(double(int(expected_tokens_per_step(0.8, 2))))", False),  # the setup calls it
    ("optimal_k", "print(optimal_k(0.8, 0.05))", True),  # only a given cell after the answer calls it: the reference
    ("speedup", "print(speedup(0.8, 4, 0.05))", True),  # imported by the setup, never called by the exercise's cells
])
def test_an_answer_may_use_what_the_exercises_cells_before_it_use(name, extra, noted):
    """What the scanner notes as the reference implementation: never what the exercise's cells before it use."""
    from specref_grading import plan as grade_plan
    sol = _given_cells_solution()
    nb = copy.deepcopy(sol)
    answer(nb, "double_answer")["source"] = "def double(x):\n    return 2 * x\n\n" + extra
    plan = grade_plan.build_plan(sol, nb, "ex_toy.ipynb")
    assert any("'double_answer'" in n and name in n for n in plan.notes) == noted, plan.notes


@pytest.mark.slow
@pytest.mark.skipif(not AS_ROOT, reason="the jail needs root")
def test_the_honest_ex07_answer_with_the_setups_own_call_gets_full_marks(tmp_path):
    """The solution plus print(fit_pass_time(server_rows())), a call ex07's setup makes: once 3/9, needs review."""
    from specref_grading import grade as grader
    from specref_grading import report as grade_report
    sol = REPO / "solutions" / "ex07_load_aware_k.ipynb"
    nb = json.loads(sol.read_text())
    cell = answer(nb, "ex07_fit_answer")
    src = "".join(cell["source"]) if isinstance(cell["source"], list) else cell["source"]
    cell["source"] = src + "\n\nprint(fit_pass_time(server_rows()))\n"
    path = tmp_path / "honest.ipynb"
    path.write_text(json.dumps(nb))
    report = grader.grade(path, sol)
    assert report.exit_code == grade_report.EXIT_FULL and report.total == report.possible, report.text()


# -- 5. honest failures explain themselves --------------------------------------------------------
def test_a_failed_check_shows_its_whole_message_with_the_hint(toy):
    nb = copy.deepcopy(toy[2])
    answer(nb, "double_answer")["source"] = "def double(x):\n    return x + 2"
    code, report, out = grade(nb, toy)
    assert code == 1
    msg = next(t["message"] for t in report["tests"] if t["grade_id"] == "double_check")
    assert "double(1) returned 3, expected 2" in msg and "Hint: multiply by two, do not add." in msg


def test_a_syntax_error_is_named_with_its_cell(toy):
    nb = copy.deepcopy(toy[2])
    answer(nb, "double_answer")["source"] = "def double(x)\n    return 2 * x"
    code, report, out = grade(nb, toy)
    assert code == 1 and "syntax error in answer cell 'double_answer', line 1" in out, out


def test_stale_saved_outputs_are_named(toy):
    nb = copy.deepcopy(toy[2])
    answer(nb, "double_check")["outputs"] = [{"output_type": "stream", "name": "stdout", "text": "check_double: passed\n"}]
    answer(nb, "double_check")["execution_count"] = 7
    code, report, out = grade(nb, toy)
    assert code == 1 and any("stale" in n for n in report["notes"]), out


@pytest.mark.parametrize("text, reason", [
    ("{not json", "not valid JSON"),
    (json.dumps({"cells": "nope"}), "not a notebook"),
    (json.dumps({"cells": [{"cell_type": "code", "source": "x", "metadata": []}], "metadata": {}}), "broken metadata"),
    (json.dumps({"cells": [{"cell_type": "code", "source": 3, "metadata": {}}], "metadata": {}}), "broken source"),
])
def test_a_broken_notebook_means_exit_2_with_a_reason(toy, text, reason):
    code, report, out = grade(text, toy)
    assert code == 2 and reason in report["error"], out


# -- 6. make grade and batch grading --------------------------------------------------------------
def test_make_grade_passes_the_file_name_to_no_shell(toy, tmp_path):
    weird = tmp_path / "a dir; $(touch pwned1) 'q\" `touch pwned2`"
    weird.mkdir()
    nb_path = weird / "$(shell touch pwned3) ';\" $$HOME.ipynb"
    nb_path.write_text(json.dumps(toy_solution()))
    proc = subprocess.run(["make", "-s", "--no-print-directory", "-C", str(REPO), "grade", f"NB={nb_path}",
                           f"SOLUTION={toy[0] / 'ex_toy.ipynb'}"], capture_output=True, text=True, timeout=120,
                          cwd=tmp_path)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert str(nb_path) in proc.stdout
    assert not any((d / f"pwned{i}").exists() for d in (tmp_path, REPO, weird) for i in (1, 2, 3))


def test_make_grade_passes_the_seed_to_no_shell_and_the_report_names_it(toy, tmp_path):
    nb_path = tmp_path / "learner.ipynb"
    nb_path.write_text(json.dumps(toy_solution()))
    make = ["make", "-s", "--no-print-directory", "-C", str(REPO), "grade", f"NB={nb_path}",
            f"SOLUTION={toy[0] / 'ex_toy.ipynb'}"]
    bad = subprocess.run([*make, "SEED=7; touch pwned4 $(touch pwned5)"], capture_output=True, text=True, timeout=120,
                         cwd=tmp_path)
    assert bad.returncode != 0 and "--seed must be" in bad.stderr, bad.stdout + bad.stderr
    assert not any((d / f"pwned{i}").exists() for d in (tmp_path, REPO) for i in (4, 5))
    good = subprocess.run([*make, "SEED=3"], capture_output=True, text=True, timeout=120, cwd=tmp_path)
    assert good.returncode == 0 and "hidden seed 3)" in good.stdout, good.stdout + good.stderr


@pytest.mark.slow
def test_grade_all_writes_a_gradebook_of_isolated_runs(toy, tmp_path):
    sol_dir, sub_dir, exercise = toy
    second = toy_solution()
    answer(second, "pair_check")["metadata"]["nbgrader"]["points"] = 5
    (sol_dir / "ex_other.ipynb").write_text(json.dumps(second))
    honest = solved(toy)
    (sub_dir / "honest.ipynb").write_text(json.dumps(honest))
    (sub_dir / "stub.ipynb").write_text(json.dumps(exercise))
    (sub_dir / "other.ipynb").write_text(json.dumps(make_exercise(second, "ex_other.ipynb")))
    (sub_dir / "patcher.ipynb").write_text(json.dumps(attacked(exercise, "import math\nmath.isclose = lambda *a, **k: True\n"
                                                                         "double = lambda x: 0")))
    (sub_dir / "broken.ipynb").write_text("{")
    out_csv = tmp_path / "book.csv"
    proc = subprocess.run([*CLASSRUN_CMD, str(sub_dir), "--csv", str(out_csv),
                           "--solutions-dir", str(sol_dir)], capture_output=True, text=True, timeout=300)
    assert proc.returncode == 2, proc.stdout + proc.stderr  # one notebook could not be graded
    rows = {r["file"]: r for r in csv.DictReader(out_csv.open())}
    assert set(rows) == {"honest.ipynb", "stub.ipynb", "other.ipynb", "patcher.ipynb", "broken.ipynb"}
    assert (rows["honest.ipynb"]["total"], rows["honest.ipynb"]["double_check"], rows["honest.ipynb"]["status"]) == (
        "3", "2", "autograded checks passed, 1 point awaits hand grading")
    seeds = [int(rows[f]["hidden_seed"]) for f in ("honest.ipynb", "stub.ipynb")]  # a fresh seed per submission
    assert all(s >= 1 for s in seeds) and seeds[0] != seeds[1] and rows["broken.ipynb"]["hidden_seed"] == ""
    assert rows["stub.ipynb"]["total"] == "0" and "NotImplementedError" in rows["stub.ipynb"]["reasons"]
    assert rows["other.ipynb"]["exercise"] == "ex_other" and rows["other.ipynb"]["possible"] == "7"
    assert rows["patcher.ipynb"]["status"].startswith("some checks failed") and rows["patcher.ipynb"]["flags"] == ""
    assert rows["patcher.ipynb"]["total"] == "0"  # math.isclose patched in the learner's kernel, not in the checks
    assert rows["broken.ipynb"]["status"] == "could not be graded" and "JSON" in rows["broken.ipynb"]["reasons"]


def test_forging_a_report_by_reading_the_kernels_memory_gets_nothing(toy):
    """The old kernel held a signing key that code walking its frames could find, to sign a forged result. Across
    the wall the kernel holds no key and no channel to the grade: the walk finds nothing, the task scores 0, and
    what the answer reached for is noted."""
    forge = '''import hashlib, hmac, json, os, sys
def double(x):
    f = sys._getframe()
    while "_SECRET" not in f.f_globals:
        f = f.f_back
    g = f.f_globals
    for t, gid in ((3, "double_check"), (5, "pair_check")):
        for ev in ({"ev": "result", "n": t, "grade_id": gid, "outcome": "passed", "message": "", "flags": []},):
            data = json.dumps(ev)
            os.write(g["_FD"], (hmac.new(g["_SECRET"], data.encode(), hashlib.sha256).hexdigest() + " " + data + "\\n").encode())
    data = json.dumps({"ev": "done"})
    os.write(g["_FD"], (hmac.new(g["_SECRET"], data.encode(), hashlib.sha256).hexdigest() + " " + data + "\\n").encode())
    os._exit(0)'''
    code, report, out = grade(attacked(toy[2], forge), toy)
    assert code == 1 and report["total"] == 0 and report["flags"] == [], out
    notes = " ".join(report["notes"])
    assert "f_back" in notes and "imports os" in notes, report["notes"]


# Grades in kernels whose environment specref_grading sets itself: tools/upkeep/portable.py leaves these out.
pytestmark = pytest.mark.grader


# -- the wire's holes (review of the wire, specref_grading/trust/): operators of the submission's objects, changed inputs --------------
def _toy_with(check_cells: dict[str, str], answers: dict[str, str], checks: str = SETUP, setup: str = "") -> dict:
    """A toy solution of the same shape as toy_solution(), with other answers and test cells: {grade_id: source}.
    `setup`: a setup cell both sides run (a kernel that receives tensors must have imported torch)."""
    cells = [{"cell_type": "markdown", "id": "intro", "metadata": {}, "source": "# Toy"},
             _code(checks, {"specref": {"side": "checks"}}, cid="setup")] + (
        [_code(setup, cid="given")] if setup else [])
    for i, (name, body) in enumerate(answers.items()):
        cells.append(_code(body, _meta(f"{name}_answer", 0, True, graded=False), f"a{i}"))
        cells.append(_code(check_cells[name], _meta(f"{name}_check", 2, False), f"t{i}"))
    return {"cells": cells, "metadata": {"kernelspec": {"name": "python3", "display_name": "Python 3",
                                                        "language": "python"}}, "nbformat": 4, "nbformat_minor": 5}


def _toy_fixture(tmp_path, solution: dict, name: str):
    sol_dir, sub_dir = tmp_path / name / "solutions", tmp_path / name / "submissions"
    sol_dir.mkdir(parents=True)
    sub_dir.mkdir()
    (sol_dir / "ex_toy.ipynb").write_text(json.dumps(solution), encoding="utf-8")
    return sol_dir, sub_dir, make_exercise(solution)


def _solved_with(fixture, solution: dict) -> dict:
    nb = copy.deepcopy(solution)
    nb["metadata"]["specref"] = copy.deepcopy(fixture[2]["metadata"]["specref"])
    return nb


TENSOR_SOLUTION = _toy_with(
    {"total": "import torch\nx = torch.tensor([3.0, 1.0, 2.5])\ngot = total(x)\n"
              "assert isinstance(got, float) and got == float(x.sum()), f'total(x) returned {got!r}'"},
    {"total": "def total(x):\n    ### BEGIN SOLUTION\n    return float(x.sum())\n    ### END SOLUTION"},
    checks="import torch", setup="import torch")
LOOSE_CHECKS_SOLUTION = _toy_with(
    {"near": "for x in (1, 2.5, -3):\n    assert abs(double(x) - 2 * x) < 1e-9, f'double({x}) is not {2 * x}'",
     "truthy": "for x in (1, 2.5, -3):\n    assert double(x), f'double({x}) returned nothing'"},
    {"near": "def double(x):\n    ### BEGIN SOLUTION\n    return 2 * x\n    ### END SOLUTION",
     "truthy": "pass"})


@pytest.fixture
def tensor_toy(tmp_path):
    """A toy whose check passes a tensor to total(x) and reads it again after the call."""
    return _toy_fixture(tmp_path, TENSOR_SOLUTION, "tensor")


@pytest.fixture
def loose_toy(tmp_path):
    """A toy whose checks are written `abs(double(x) - 2 * x) < 1e-9` and `assert double(x)`."""
    return _toy_fixture(tmp_path, LOOSE_CHECKS_SOLUTION, "loose")


def test_the_honest_answers_of_the_tensor_and_loose_toys_get_full_marks(tensor_toy, loose_toy):
    code, report, out = grade(_solved_with(tensor_toy, TENSOR_SOLUTION), tensor_toy)
    assert code == 0 and scores(report) == {"total_check": 2} and report["flags"] == [], out
    code, report, out = grade(_solved_with(loose_toy, LOOSE_CHECKS_SOLUTION), loose_toy)
    assert code == 0 and scores(report) == {"near_check": 2, "truthy_check": 2}, out


LIAR = ("class Liar:\n    def __sub__(self, other):\n        return 0\n    __rsub__ = __add__ = __radd__ = __sub__\n"
        "    def __abs__(self):\n        return 0\n    def __bool__(self):\n        return True\n"
        "    def __lt__(self, other):\n        return True\n"
        "def double(x):\n    return Liar()")


@pytest.mark.parametrize("task", ["near_check", "truthy_check"])
def test_an_object_whose_operators_lie_does_not_pass_a_loose_check(loose_toy, task):
    """`abs(double(x) - 2 * x) < 1e-9` once got 0 from the kernel's __sub__, `assert double(x)` True from its
    __bool__: the checks' side now refuses to let an object of the submission answer either."""
    code, report, out = grade(attacked(loose_toy[2], LIAR, "near_answer"), loose_toy)
    assert_no_marks_silently(code, report, task)
    message = next(t["message"] for t in report["tests"] if t["grade_id"] == task)
    assert "return plain data" in message, report


def test_a_list_passed_in_is_a_copy_and_never_changes(toy):
    """The check compares with sorted(xs) AFTER the call: emptying xs in place would make [] right; across the wall
    the function gets a copy, so the check's list stays [5, 4], and [] is wrong."""
    attack = "def pair(xs):\n    if xs == [3, 1]:\n        return [1, 3]\n    xs.clear()\n    return []"
    code, report, out = grade(attacked(toy[2], attack, "pair_answer"), toy)
    assert_no_marks_silently(code, report, "pair_check")
    assert "pair([5, 4]) should be [4, 5]" in out, out
