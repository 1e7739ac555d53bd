"""A submission that ends its kernel or breaks the channel to the checks fails its test (exit 1) with the cause;
"died" (could not be graded, exit 2, which --retry treats as transient) is left to faults of the grader."""

from __future__ import annotations

import json

import pytest

from specref_grading import grade as grader
from specref_grading import processes
from specref_grading.report import EXIT_FAILED
from specref_grading.trust import wall
from specref_grading.trust.wall import RunOutcome


def _cell(cid, source, gid=None, points=0, answer=False):
    meta = {} if gid is None else {"nbgrader": {"grade": not answer, "grade_id": gid, "points": points,
                                                "solution": answer, "schema_version": 3}}
    return {"cell_type": "code", "id": cid, "metadata": meta, "outputs": [], "execution_count": None, "source": source}


def toy(one: str = "    return 1", two: str = "    return 2") -> dict:
    return {"cells": [_cell("s", "import math"),
                      _cell("a1", "def one():\n    ### BEGIN SOLUTION\n" + one + "\n    ### END SOLUTION", "one", 0, True),
                      _cell("t1", "assert one() == 1", "one_check", 1),
                      _cell("a2", "def two():\n    ### BEGIN SOLUTION\n" + two + "\n    ### END SOLUTION", "two", 0, True),
                      _cell("t2", "assert two() == 2", "two_check", 1)],
            "metadata": {}, "nbformat": 4, "nbformat_minor": 5}


def _grade(tmp_path, submission: dict) -> grader.Report:
    sol = tmp_path / "ex_toy.ipynb"
    sol.write_text(json.dumps(toy()))
    sub = tmp_path / "sub.ipynb"
    sub.write_text(json.dumps(submission))
    unjailed = not processes.can_jail()
    if unjailed and processes.root_refusal() is not None:
        pytest.skip("no jail here and no fresh uid to run an unjailed kernel as: nothing can be graded")
    return grader.grade(sub, sol, seed=1, cell_timeout=120, unjailed=unjailed)


@pytest.mark.parametrize("one, cause", [
    ("    import os\n    os._exit(0)", "exit status 0"),  # the kernel exits mid-call
    # an int the kernel can write (its own digit limit lifted) and the trusted side cannot convert: a malformed answer
    ("    import sys\n    sys.set_int_max_str_digits(0)\n    return 10 ** 5000", "refuses"),
])
def test_a_kernel_that_exits_or_breaks_the_channel_fails_its_test(tmp_path, one, cause):
    report = _grade(tmp_path, toy(one=one))
    got = {t.grade_id: t for t in report.tests}
    assert got["one_check"].outcome == "failed", report.text()
    assert "ended its kernel or broke the channel" in got["one_check"].message, got["one_check"].message
    assert cause in got["one_check"].message, got["one_check"].message
    assert got["two_check"].outcome == "passed", report.text()  # the next test runs in a fresh pair
    assert report.exit_code == EXIT_FAILED, report.text()


def test_a_fault_of_the_grader_still_says_died():
    """The trusted process dying on its own (not over its limits) is the grader's: could not be graded."""
    crash = RunOutcome("died", "the kernel died while running test cell 'x' (exit status 1) before reporting a result")
    assert grader.judged(crash, {"role": "test"}).outcome == "died"
    during = RunOutcome("died", "the kernel died while running answer cell 'one' (signal 11) before reporting a result")
    assert grader.judged(during, {"role": "answer"}).outcome == "died"  # the trusted process itself ended
    setup = RunOutcome("died", "the kernel died while running cell 0")
    assert grader.judged(setup, {"role": "setup"}).outcome == "died"  # the exercise's own setup: not the learner's
    ended = RunOutcome("died", "the kernel running the submission's code died during this test (exit status 0)")
    assert grader.judged(ended, {"role": "test"}).outcome == "failed"
    assert wall.RunOutcome is RunOutcome
