"""Notebook to plan: what runs, in which order and for how many points comes from the solution, not the learner.

Each attack edits the toy exercise's cells or metadata (test cells turned into markdown, extra graded cells, edited
points, deleted or moved cells, a renamed file, an older version): the grade follows the solution's plan, by grade id,
and the honest solution still gets full marks. What the scanner notices in an answer (a use of specref, names bound
out of sight) is a note charged to the tests that follow, never a gate on points.
"""

from __future__ import annotations

import copy

import pytest

from .conftest import _code, _meta, answer, grade, scores, solved, toy_solution

pytestmark = pytest.mark.grader


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


# -- scored from the solution only ------------------------------------------------------------
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


# -- the reference implementation as the answer ------------------------------------------------
# What an exercise forbids is absent from the kernel's specref (specref_grading/trust/kernel_tree.py, tested in
# test_answer_key.py); here the scanner's side: a use of specref is a note on its cell, never a gate.
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
