"""What the grader's tests share: the toy exercise, the submission makers, the CLI grading, the skip markers.

The toy exercise (pure Python, no torch: each kernel starts in a fraction of a second) has two tasks: double()
(2 points, with hidden tests) and pair() (1 point), and a hand-graded answer. Its checks' cell runs in the trusted
process only, as in the course's exercises. An attack is the unsolved stub with code added to an answer cell
(`attacked`); a submission is a notebook with one answer cell's source replaced (`with_answer`).

The grader runs as a CLI (``python -m specref_grading.grade ... --json``), as an instructor runs it.
GRADE_PY=path/to/another/grade.py runs the same tests against another grader (one without the wall fails them).
"""

from __future__ import annotations

import contextlib
import copy
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from specref_grading import jail as _jail
from specref_grading import processes as _processes
from specref_grading.exercises import make_exercise as _make_exercise
from specref_grading.processes import can_jail
from specref_grading.trust import program as _program
from specref_grading.trust.calls import Peer as _Peer
from specref_grading.trust.trusted_policy import TrustedPolicy as _TrustedPolicy

REPO = Path(__file__).resolve().parents[2]
# The grader's command line; GRADE_PY=path/to/grade.py runs the same tests against another grader.
# -I: isolated, so a folder or file in the working directory (the submissions') is never imported as the grader.
GRADE_CMD = [sys.executable, os.environ["GRADE_PY"]] if os.environ.get("GRADE_PY") else [
    sys.executable, "-I", "-m", "specref_grading.grade"]
CLASSRUN_CMD = [sys.executable, "-I", "-m", "specref_grading.classrun", "grade"]

AS_ROOT = os.geteuid() == 0
CAN_JAIL = AS_ROOT and shutil.which("unshare") is not None
# The jail needs root and namespaces; a fresh uid, cgroups and chown need root.
jailed = pytest.mark.skipif(not can_jail() or shutil.which("unshare") is None, reason="the jail needs root and unshare")
as_root = pytest.mark.skipif(not AS_ROOT, reason="needs root: the jail, a fresh uid, cgroups and chown are made as root")

SETUP = '''import math

def check_double(fn, xs=(1, 2.5, -3)):
    """The exercise's grader for double()."""
    for x in xs:
        got = fn(x)
        assert isinstance(got, (int, float)) and math.isclose(got, 2 * x), (
            f"double({x}) returned {got!r}, expected {2 * x}\\nHint: multiply by two, do not add.")
    print("check_double: passed")'''


# -- cells and notebooks -------------------------------------------------------------------------------------------
def _meta(grade_id, points, solution, graded=True):
    return {"nbgrader": {"grade": graded, "grade_id": grade_id, "points": points, "solution": solution,
                         "locked": not solution, "schema_version": 3}}


def _code(source, meta=None, cid=None):
    return {"cell_type": "code", "execution_count": None, "id": cid, "metadata": meta or {}, "outputs": [],
            "source": source}


def _cell(cid, source, gid=None, points=0, answer=False):
    """A code cell; with `gid`, a graded test cell (or an answer cell, `answer=True`)."""
    meta = {} if gid is None else {"nbgrader": {"grade": not answer, "grade_id": gid, "points": points,
                                                "solution": answer, "schema_version": 3}}
    return {"cell_type": "code", "id": cid, "metadata": meta, "outputs": [], "execution_count": None, "source": source}


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
    """The exercise as handed out (the stubs, stamped with the exercise id), each cell's source one string."""
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


def exercise(name: str) -> dict:
    """One of the course's exercises as handed out (exercises/), each cell's source one string."""
    nb = json.loads((REPO / "exercises" / f"{name}.ipynb").read_text(encoding="utf-8"))
    for c in nb["cells"]:
        c["source"] = "".join(c["source"]) if isinstance(c["source"], list) else c["source"]
    return nb


def solution_notebook(exercise: str) -> dict:
    """One of the course's solutions (solutions/), each cell's source one string."""
    nb = json.loads((REPO / "solutions" / f"{exercise}.ipynb").read_text(encoding="utf-8"))
    for c in nb["cells"]:
        c["source"] = "".join(c["source"]) if isinstance(c["source"], list) else c["source"]
    return nb


def answer(nb: dict, grade_id: str) -> dict:
    """The cell of `grade_id`."""
    return next(c for c in nb["cells"] if c["metadata"].get("nbgrader", {}).get("grade_id") == grade_id)


def with_answer(nb: dict, grade_id: str, source: str) -> dict:
    """The notebook with one answer cell's source replaced."""
    nb = copy.deepcopy(nb)
    answer(nb, grade_id)["source"] = source
    return nb


def attacked(exercise: dict, code: str, grade_id: str = "double_answer") -> dict:
    """The unsolved exercise with `code` added to an answer cell, after its stub."""
    nb = copy.deepcopy(exercise)
    cell = answer(nb, grade_id)
    cell["source"] = cell["source"] + "\n" + code
    return nb


# -- grading and its report ------------------------------------------------------------------------------------------
@pytest.fixture
def toy(tmp_path):
    """(solutions folder, submissions folder, the exercise as handed out)."""
    sol_dir, sub_dir = tmp_path / "solutions", tmp_path / "submissions"
    sol_dir.mkdir()
    sub_dir.mkdir()
    sol = toy_solution()
    (sol_dir / "ex_toy.ipynb").write_text(json.dumps(sol), encoding="utf-8")
    return sol_dir, sub_dir, make_exercise(sol)


def _cli(path: Path, solutions: Path, args, timeout: float, cwd: Path) -> tuple[int, dict, str]:
    proc = subprocess.run([*GRADE_CMD, str(path), "--solutions-dir", str(solutions), "--json", *args],
                          capture_output=True, text=True, timeout=timeout, cwd=cwd)
    try:
        report = json.loads(proc.stdout)
    except ValueError:
        report = {}
    return proc.returncode, report, proc.stdout + proc.stderr


def grade(nb: dict | str, toy, name: str = "alice.ipynb", *args: str, timeout: float = 120) -> tuple[int, dict, str]:
    """Write the submission and grade it with the CLI; (exit status, JSON report or {}, output)."""
    sol_dir, sub_dir, _ = toy
    path = sub_dir / name
    path.write_text(nb if isinstance(nb, str) else json.dumps(nb), encoding="utf-8")
    return _cli(path, sol_dir, args, timeout, sub_dir)


def grade_exercise(nb: dict, tmp_path: Path, *args: str, timeout: float = 300) -> tuple[int, dict, str]:
    """Grade a submission of one of the course's exercises (its solution found by the exercise id)."""
    path = tmp_path / "learner.ipynb"
    path.write_text(json.dumps(nb), encoding="utf-8")
    return _cli(path, REPO / "solutions", args, timeout, tmp_path)


def scores(report: dict) -> dict[str, float]:
    return {t["grade_id"]: t["score"] for t in report.get("tests", [])}


def assert_no_marks_silently(code: int, report: dict, task: str = "double_check") -> None:
    """The attacked task scores 0; the submission failed (exit 1), or is flagged by the trusted side (exit 3) or
    ungradable (exit 2)."""
    assert report, "the grader gave no JSON report"
    assert scores(report)[task] == 0, report
    assert code in (1, 2, 3), report


LIMITS_CHECK = '''import resource
cpu = resource.getrlimit(resource.RLIMIT_CPU)[0]
data = resource.getrlimit(resource.RLIMIT_DATA)[0]
groups = open("/proc/self/cgroup").read()
assert (cpu, data >> 20) == ({cpu}, {mb}), ("the trusted process's limits", cpu, data >> 20)
if {cgroup}:
    assert "/specref-grade/run-" in groups and "-trusted" in groups, groups
'''


def toy_with_limits(double_answer: str = "def double(x):\n    ### BEGIN SOLUTION\n    return 2 * x\n    ### END SOLUTION",
        seq_answer: str = "def seq(n):\n    ### BEGIN SOLUTION\n    return list(range(n))\n    ### END SOLUTION",
        cgroup: bool = False) -> dict:
    """double() (2 points), seq() (1 point: its check loops over the value returned, item by item) and a check
    of the trusted process's own limits (1 point)."""
    cells = [
        _code("import math", cid="setup"),
        _code(double_answer, _meta("double_answer", 0, True, graded=False), "a1"),
        _code("for x in (1, 2.5, -3):\n    got = double(x)\n    assert math.isclose(got, 2 * x), f'double({x}) = {got!r}'",
              _meta("double_check", 2, False), "t1"),
        _code(seq_answer, _meta("seq_answer", 0, True, graded=False), "a2"),
        _code("xs = seq(3)\ntotal = 0\nfor i in range(len(xs)):\n    total += xs[i]\nassert total == 3, total",
              _meta("seq_check", 1, False), "t2"),
        _code(LIMITS_CHECK.format(cpu=_processes.TRUSTED_CPU_S, mb=_processes.TRUSTED_MEMORY_MB, cgroup=cgroup),
              _meta("limits_check", 1, False), "t3"),
    ]
    return {"cells": cells, "metadata": {"kernelspec": {"name": "python3", "display_name": "Python 3",
                                                        "language": "python"}}, "nbformat": 4, "nbformat_minor": 5}


@contextlib.contextmanager
def kernel_peer(timeout: float = 60):
    """A trusted peer talking to the kernel's program in a fresh ``python -I`` (the jail's command, unjailed)."""
    t2k_r, t2k_w = os.pipe()
    k2t_r, k2t_w = os.pipe()
    proc = subprocess.Popen([sys.executable, "-I", "-c", _program.kernel_program(_jail.KERNEL), str(t2k_r), str(k2t_w)],
                            pass_fds=(t2k_r, k2t_w), cwd="/")
    os.close(t2k_r)
    os.close(k2t_w)
    try:
        yield _Peer(k2t_r, t2k_w, "trusted", timeout=timeout, policy=_TrustedPolicy())
    finally:
        os.close(t2k_w)
        os.close(k2t_r)
        proc.wait(timeout=30)
