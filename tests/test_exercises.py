"""exercises/ is generated from solutions/, and the graders cannot pass on an unsolved stub.

The first half specifies specref_grading/exercises.py on throwaway notebooks; the second
runs the real pipeline (specref_grading's jailed kernels) on a toy exercise, including a
leaky one that the self-check must flag; the last tests hold the committed
exercises/ to the solutions/ they come from.
"""

from __future__ import annotations

import ast
import re
from pathlib import Path

import nbformat
import pytest
from nbformat.v4 import new_code_cell, new_markdown_cell, new_notebook

REPO = Path(__file__).resolve().parents[1]
from specref_grading import exercises as make_exercises
from specref_grading import grade
from specref_grading import plan as grade_plan
from specref_grading import selfcheck as grading_selfcheck
from specref_grading.exercises import MarkerError, make_exercise, notebooks_in, to_bytes

SOLUTIONS = notebooks_in(REPO / "solutions")


def nbgrader(grade_id: str, points: float, solution: bool, graded: bool = True) -> dict:
    return {"nbgrader": {"grade": graded, "grade_id": grade_id, "points": points, "solution": solution,
                         "locked": not solution, "schema_version": 3}}


def toy_solution(hidden_only: bool = False) -> nbformat.NotebookNode:
    """A small exercise in nbgrader's style; pure Python so a kernel runs it in a moment.

    hidden_only=True makes the graded test cell consist of hidden tests only: the
    learner's copy would then pass without any work (the leak the self-check must flag).
    """
    visible = "" if hidden_only else "assert double(2) == 4\n"
    nb = new_notebook()
    nb.metadata["kernelspec"] = {"name": "python3", "display_name": "Python 3", "language": "python"}
    nb.cells = [
        new_markdown_cell("# Toy exercise"),
        new_code_cell("import math"),
        new_code_cell("def double(x):\n    \"\"\"Twice x.\"\"\"\n    ### BEGIN SOLUTION\n    return 2 * x\n    ### END SOLUTION",
                      metadata=nbgrader("double", 0, True, graded=False)),
        new_code_cell(visible + "### BEGIN HIDDEN TESTS\nassert double(-3) == -6\n### END HIDDEN TESTS",
                      metadata=nbgrader("test_double", 2, False)),
        new_markdown_cell("Why?\n\n### BEGIN SOLUTION\nBecause.\n### END SOLUTION", metadata=nbgrader("why", 1, True)),
        new_code_cell("answer = None\n### BEGIN SOLUTION\nanswer = math.floor(2.5)\n### END SOLUTION\nassert answer == 2",
                      metadata=nbgrader("answer", 1, True)),
    ]
    nb.cells[1].outputs = [nbformat.v4.new_output("stream", name="stdout", text="hi\n")]
    nb.cells[1].execution_count = 3
    nb.cells[1].metadata["execution"] = {"iopub.execute_input": "2026-01-01T00:00:00Z"}
    nb.metadata["widgets"] = {"application/vnd.jupyter.widget-state+json": {"state": {}}}
    return nb


def cell(nb: nbformat.NotebookNode, grade_id: str) -> nbformat.NotebookNode:
    return next(c for c in nb.cells if c.metadata.get("nbgrader", {}).get("grade_id") == grade_id)


# -- make_exercises: the transformation --------------------------------------------------------
def test_solution_region_becomes_a_stub_at_the_region_indentation():
    src = cell(make_exercise(toy_solution()), "double").source
    assert src == ('def double(x):\n    """Twice x."""\n    # YOUR CODE HERE\n'
                   '    raise NotImplementedError("write double (see the exercise above)")')


def test_top_level_solution_region_keeps_the_code_around_it():
    src = cell(make_exercise(toy_solution()), "answer").source
    assert src == ('answer = None\n# YOUR CODE HERE\nraise NotImplementedError("set answer (see the exercise above)")\n'
                   'assert answer == 2')


def test_the_stub_names_its_task_and_what_to_write():
    """The task number comes from the last "## Task N" heading above; the name from the def around the region, or
    from what a top-level region binds (those the task's text names in backticks)."""
    nb = toy_solution()
    nb.cells.insert(2, new_markdown_cell("## Task 3 · Double it (2 points)\n\nWrite `double(x)`."))
    nb.cells.insert(6, new_markdown_cell("## Task 4 · Floor\n\nSet `answer` to the floor of 2.5."))
    cell(nb, "answer").source = "answer = None\n### BEGIN SOLUTION\nscratch = 2.5\nanswer = math.floor(scratch)\n" \
                                "### END SOLUTION"
    ex = make_exercise(nb)
    assert 'raise NotImplementedError("Task 3: write double (see the task above)")' in cell(ex, "double").source
    assert 'raise NotImplementedError("Task 4: set answer (see the task above)")' in cell(ex, "answer").source


@pytest.mark.parametrize("solution", SOLUTIONS, ids=[p.stem for p in SOLUTIONS])
def test_every_stub_of_the_exercises_names_its_task(solution):
    ex = make_exercise(nbformat.read(solution, as_version=4), solution.name)
    stubs = [line.strip() for c in ex.cells if c.cell_type == "code" for line in c.source.split("\n")
             if line.strip().startswith("raise NotImplementedError")]
    assert stubs and all(re.fullmatch(r'raise NotImplementedError\("Task \d+: (write|set) [\w.]+( and \w+)* '
                                      r'\(see the task above\)"\)', s) for s in stubs), stubs


def test_markdown_solution_region_becomes_your_answer_here():
    assert cell(make_exercise(toy_solution()), "why").source == "Why?\n\nYOUR ANSWER HERE"


def test_hidden_tests_are_removed_with_their_markers():
    assert cell(make_exercise(toy_solution()), "test_double").source == "assert double(2) == 4"


def test_outputs_counts_timings_and_widget_state_are_cleared():
    ex = make_exercise(toy_solution())
    code = [c for c in ex.cells if c.cell_type == "code"]
    assert all(c.outputs == [] and c.execution_count is None for c in code)
    assert all("execution" not in c.metadata for c in ex.cells)
    assert "widgets" not in ex.metadata


def test_cell_ids_and_grading_metadata_are_kept():
    sol = toy_solution()
    ex = make_exercise(sol)
    assert [c.id for c in ex.cells] == [c.id for c in sol.cells]
    assert [c.metadata.get("nbgrader") for c in ex.cells] == [c.metadata.get("nbgrader") for c in sol.cells]


def test_the_solution_notebook_is_not_modified():
    sol = toy_solution()
    before = nbformat.writes(sol)
    make_exercise(sol)
    assert nbformat.writes(sol) == before


def test_output_is_the_same_bytes_on_every_run(tmp_path):
    (tmp_path / "solutions").mkdir()
    nbformat.write(toy_solution(), tmp_path / "solutions" / "ex_toy.ipynb")
    args = ["--solutions", str(tmp_path / "solutions"), "--exercises", str(tmp_path / "exercises")]
    assert make_exercises.main(args) == 0
    first = (tmp_path / "exercises" / "ex_toy.ipynb").read_bytes()
    assert make_exercises.main(args) == 0
    assert (tmp_path / "exercises" / "ex_toy.ipynb").read_bytes() == first
    reread = nbformat.read(tmp_path / "solutions" / "ex_toy.ipynb", as_version=4)
    assert to_bytes(make_exercise(reread, "solutions/ex_toy.ipynb")) == first
    assert first.endswith(b"}\n")


@pytest.mark.parametrize("source, problem", [
    ("### BEGIN SOLUTION\nx = 1", "never closed"),
    ("x = 1\n### END SOLUTION", "without a matching BEGIN"),
    ("### BEGIN SOLUTION\n### BEGIN HIDDEN TESTS\n### END HIDDEN TESTS\n### END SOLUTION", "inside an open"),
    ("### BEGIN HIDDEN TESTS\nassert 1\n### END SOLUTION", "without a matching BEGIN"),
])
def test_malformed_markers_are_errors_that_name_the_cell(source, problem):
    nb = new_notebook(cells=[new_code_cell(source)])
    with pytest.raises(MarkerError, match=problem) as err:
        make_exercise(nb, "solutions/bad.ipynb")
    assert "solutions/bad.ipynb: cell 0" in str(err.value)


def test_graded_cells_need_unique_grade_ids_and_points():
    nb = toy_solution()
    cell(nb, "answer").metadata["nbgrader"]["grade_id"] = "test_double"
    with pytest.raises(MarkerError, match="also used"):
        make_exercise(nb)
    nb = toy_solution()
    cell(nb, "answer").metadata["nbgrader"]["points"] = "one"
    with pytest.raises(MarkerError, match="points"):
        make_exercise(nb)


RUBRIC = "Why (1 point): doubling is x + x; model answer: because 2x is x added to itself."
SUMMARY = "## Summary\n\n- `double` returns twice its input: the answer to the task, stated after grading."


def with_rubric_and_summary() -> nbformat.NotebookNode:
    """The toy solution with a rubric right after its hand-graded answer `why` and a solution_only summary."""
    nb = toy_solution()
    at = next(i for i, c in enumerate(nb.cells) if c.metadata.get("nbgrader", {}).get("grade_id") == "why")
    nb.cells.insert(at + 1, new_markdown_cell(RUBRIC, metadata={"specref": {"rubric": "why"}}))
    nb.cells.append(new_markdown_cell(SUMMARY, metadata={"specref": {"solution_only": True}}))
    return nb


def test_rubrics_and_solution_only_cells_stay_in_the_solution():
    sol = with_rubric_and_summary()
    ex = make_exercise(sol, "solutions/ex_toy.ipynb")
    text = to_bytes(ex).decode()
    assert "model answer" not in text and "stated after grading" not in text and '"rubric"' not in text
    assert "solution_only" not in text
    assert [c.id for c in ex.cells] == [c.id for c in sol.cells if "specref" not in c.metadata]  # only those two gone
    assert make_exercises.check_rubrics(sol, "sol") == {"why": RUBRIC}
    # The tests' version does not move with a rubric: it is not graded.
    assert ex.metadata["specref"]["version"] == make_exercise(toy_solution())["metadata"]["specref"]["version"]


@pytest.mark.parametrize("change, problem", [
    (lambda c: c.metadata.__setitem__("specref", {"rubric": "double"}), "not the grade_id of a hand-graded"),
    (lambda c: c.metadata.__setitem__("specref", {"rubric": "nowhere"}), "not the grade_id of a hand-graded"),
    (lambda c: c.metadata.__setitem__("specref", {"rubric": 3}), "not the grade_id of a hand-graded"),
    (lambda c: c.__setitem__("cell_type", "code") or c.update(outputs=[], execution_count=None),
     "must be a markdown cell"),
])
def test_a_rubric_must_name_a_hand_graded_task(change, problem):
    sol = with_rubric_and_summary()
    change(next(c for c in sol.cells if "rubric" in c.metadata.get("specref", {})))
    with pytest.raises(MarkerError, match=problem):
        make_exercise(sol, "solutions/ex_toy.ipynb")


def test_one_rubric_per_task_and_no_task_is_solution_only():
    sol = with_rubric_and_summary()
    sol.cells.append(new_markdown_cell("again", metadata={"specref": {"rubric": "why"}}))
    with pytest.raises(MarkerError, match="a second rubric"):
        make_exercise(sol)
    sol = toy_solution()
    cell(sol, "why").metadata["specref"] = {"solution_only": True}
    with pytest.raises(MarkerError, match="solution_only cell cannot be graded"):
        make_exercise(sol)


def test_a_solution_only_cell_need_not_be_a_summary():
    sol = toy_solution()
    sol.cells.insert(2, new_code_cell("print('the worked answer, after grading')",
                                      metadata={"specref": {"solution_only": True}}))
    assert "after grading" not in to_bytes(make_exercise(sol)).decode()


def test_check_mode_lists_missing_differing_and_stale_files(tmp_path, capsys):
    sol, ex = tmp_path / "solutions", tmp_path / "exercises"
    sol.mkdir()
    nbformat.write(toy_solution(), sol / "ex_toy.ipynb")
    args = ["--solutions", str(sol), "--exercises", str(ex)]
    assert make_exercises.main(args + ["--check"]) == 1
    assert "missing" in capsys.readouterr().out
    assert make_exercises.main(args) == 0
    assert make_exercises.main(args + ["--check"]) == 0
    (ex / "ex_toy.ipynb").write_bytes((ex / "ex_toy.ipynb").read_bytes().replace(b"YOUR CODE HERE", b"solved"))
    (ex / "ex_old.ipynb").write_bytes((ex / "ex_toy.ipynb").read_bytes())
    capsys.readouterr()
    assert make_exercises.main(args + ["--check"]) == 1
    out = capsys.readouterr().out
    assert f"differs: {ex / 'ex_toy.ipynb'}" in out and f"stale (no solution): {ex / 'ex_old.ipynb'}" in out


def test_a_graders_temporary_copies_are_neither_sources_nor_stale(tmp_path):
    """Hidden `.grading-*.ipynb` files (what an earlier grade.py left beside the notebooks) are not ours."""
    sol, ex = tmp_path / "solutions", tmp_path / "exercises"
    sol.mkdir()
    nbformat.write(toy_solution(), sol / "ex_toy.ipynb")
    args = ["--solutions", str(sol), "--exercises", str(ex)]
    assert make_exercises.main(args) == 0
    nbformat.write(toy_solution(), sol / ".grading-abc.ipynb")
    nbformat.write(toy_solution(), ex / ".grading-def.ipynb")
    assert make_exercises.main(args + ["--check"]) == 0
    assert [p.name for p in notebooks_in(sol)] == ["ex_toy.ipynb"]


def test_exercises_are_stamped_with_the_exercise_id_and_the_tests_version():
    sol = toy_solution()
    stamp = make_exercise(sol, "solutions/ex_toy.ipynb").metadata["specref"]
    assert stamp == {"exercise": "ex_toy", "version": make_exercises.tests_version(sol)}
    assert "specref" not in sol.metadata  # the solution itself is untouched
    changed = toy_solution()
    cell(changed, "test_double").source += "\nassert double(0) == 0"
    assert make_exercises.tests_version(changed) != stamp["version"]  # a new test is a new version
    changed = toy_solution()
    cell(changed, "double").source = cell(changed, "double").source.replace("2 * x", "x + x")
    assert make_exercises.tests_version(changed) == stamp["version"]  # answers do not change the version


# -- grading: what runs comes from the solution (tests/grading/test_plan.py has the attacks) -----
def test_grading_runs_the_solutions_test_cells_and_only_the_learners_answers():
    sol = toy_solution()
    submission = make_exercise(sol, "ex_toy.ipynb")
    cell(submission, "test_double").source = "pass  # the learner emptied the test"
    cell(submission, "double").source = "def double(x):\n    return x + x"
    plan = grade_plan.build_plan(grading_selfcheck._plain(sol), grading_selfcheck._plain(submission))
    by_id = {c["grade_id"]: c for c in plan.cells if c["grade_id"]}
    assert by_id["test_double"]["source"] == cell(sol, "test_double").source  # hidden tests included
    assert by_id["double"]["source"] == "def double(x):\n    return x + x"  # answers stay the learner's
    assert [t.grade_id for t in plan.tests] == ["test_double"]
    assert [m[0] for m in plan.manual] == ["why", "answer"]  # graded answer cells are graded by hand
    assert any("differs from the exercise" in n for n in plan.notes)


def test_grading_follows_the_solutions_order_whatever_the_learner_did_to_the_cells():
    sol = toy_solution()
    submission = make_exercise(sol, "ex_toy.ipynb")
    submission.cells = [c for c in submission.cells if c.metadata.get("nbgrader", {}).get("grade_id") != "test_double"]
    submission.cells.reverse()
    plan = grade_plan.build_plan(grading_selfcheck._plain(sol), grading_selfcheck._plain(submission))
    code_ids = [i for i, c in enumerate(sol.cells) if c.cell_type == "code"]
    assert [c["n"] for c in plan.cells] == code_ids


@pytest.mark.slow
def test_grader_scores_each_graded_cell_by_its_own_result():
    nb = new_notebook()
    nb.cells = [
        new_markdown_cell("# Mapping"),
        new_code_cell("x = 1"),
        new_markdown_cell("between"),
        new_code_cell("y = x + 1", metadata=nbgrader("answer", 0, True, graded=False)),
        new_code_cell("raise RuntimeError('an ungraded cell that fails does not matter')"),
        new_code_cell("assert y == 2", metadata=nbgrader("passes", 1, False)),
        new_code_cell("assert y == 3, 'y is not 3'", metadata=nbgrader("fails", 2, False)),
    ]
    plain = grading_selfcheck._plain(nb)
    results = {r.grade_id: r for r in grade.grade_plan(grade_plan.build_plan(plain, plain))}
    assert {k: r.outcome for k, r in results.items()} == {"passes": "passed", "fails": "failed"}
    assert results["fails"].message.startswith("y is not 3\n")  # then what failed before it, in plain words
    assert "cell 4 raised RuntimeError" in results["fails"].message


@pytest.mark.slow
def test_self_check_accepts_a_sound_exercise(tmp_path):
    (tmp_path / "solutions").mkdir()
    path = tmp_path / "solutions" / "ex_toy.ipynb"
    nbformat.write(toy_solution(), path)
    assert grading_selfcheck.self_check(path) == []


@pytest.mark.slow
def test_self_check_flags_a_graded_cell_that_passes_on_the_stub(tmp_path):
    """Negative control: a test cell made of hidden tests only is empty in the learner's copy."""
    (tmp_path / "solutions").mkdir()
    path = tmp_path / "solutions" / "ex_leaky.ipynb"
    nbformat.write(toy_solution(hidden_only=True), path)
    problems = grading_selfcheck.self_check(path)
    assert len(problems) == 1 and "'test_double'" in problems[0] and "passes on the unsolved stub" in problems[0]


@pytest.mark.slow
def test_self_check_flags_a_graded_cell_that_fails_on_the_solution(tmp_path):
    nb = toy_solution()
    cell(nb, "test_double").source += "\nassert double(1) == 3"
    (tmp_path / "solutions").mkdir()
    path = tmp_path / "solutions" / "ex_wrong.ipynb"
    nbformat.write(nb, path)
    problems = grading_selfcheck.self_check(path)
    assert len(problems) == 1 and "'test_double'" in problems[0] and "does not pass on the solution" in problems[0]


# -- the committed notebooks -------------------------------------------------------------------
def test_committed_exercises_are_generated_from_the_solutions():
    problems = make_exercises.differences(REPO / "solutions", REPO / "exercises")
    assert problems == [], "exercises/ is out of date; run `make exercises`:\n" + "\n".join(problems)


@pytest.mark.slow
@pytest.mark.parametrize("solution", SOLUTIONS, ids=[p.stem for p in SOLUTIONS])
def test_every_graded_cell_passes_on_the_solution_and_fails_on_the_stub(solution):
    problems = grading_selfcheck.self_check(solution)
    assert problems == [], "\n".join(problems)


# -- a learner who runs the exercise top to bottom ------------------------------------------
_SCOPES = (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda, ast.ClassDef, ast.ListComp, ast.SetComp,
           ast.DictComp, ast.GeneratorExp)


def _top_level(node: ast.AST):
    """The nodes of one cell's own scope: nested functions, classes and comprehensions are not entered."""
    for child in ast.iter_child_nodes(node):
        yield child
        if not isinstance(child, _SCOPES):
            yield from _top_level(child)


def _bound(tree: ast.Module) -> set[str]:
    """The names a cell binds in the notebook's namespace."""
    names = set()
    for n in _top_level(tree):
        if isinstance(n, ast.Name) and isinstance(n.ctx, (ast.Store, ast.Del)):
            names.add(n.id)
        elif isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            names.add(n.name)
        elif isinstance(n, (ast.Import, ast.ImportFrom)):
            names.update((a.asname or a.name).split(".")[0] for a in n.names)
        elif isinstance(n, ast.ExceptHandler) and n.name:
            names.add(n.name)
    return names


def unbound_reads(exercise, solution) -> list[str]:
    """Names an exercise's code cell reads at top level that no cell up to it binds: NameErrors to be.

    An answer cell counts as binding what its solution binds, where the exercise's text up to that cell names it
    (the learner is asked for `beta`); a helper only a solution region defines, and the text never asks for,
    is unbound in the learner's copy.
    """
    import builtins

    known, problems, text = set(dir(builtins)), [], ""
    kept = [c for c in solution.cells if not make_exercises.left_out(c)]  # the exercise's cells, in the solution
    assert len(kept) == len(exercise.cells)
    for i, (cell, sol) in enumerate(zip(exercise.cells, kept)):
        # The stubs' messages name what to write; the question is whether the task's own text asks for it.
        text += "\n" + "\n".join(line for line in cell.source.split("\n")
                                  if not line.strip().startswith("raise NotImplementedError("))
        if cell.cell_type != "code":
            continue
        tree = ast.parse(cell.source)
        known |= _bound(tree)
        if cell.metadata.get("nbgrader", {}).get("solution"):
            known |= {n for n in _bound(ast.parse(sol.source)) if re.search(rf"\b{re.escape(n)}\b", text)}
        reads = {n.id for n in _top_level(tree) if isinstance(n, ast.Name) and isinstance(n.ctx, ast.Load)}
        problems += [f"cell {i} reads {name!r}, which no cell up to it defines" for name in sorted(reads - known)]
    return problems


def test_unbound_reads_finds_a_name_only_a_solution_region_defined():
    sol = toy_solution()
    sol.cells.insert(3, new_code_cell("def helper(x):\n    return x\n### BEGIN SOLUTION\ndef extra():\n    return 1\n"
                                      "### END SOLUTION", metadata=nbgrader("helper", 0, True, graded=False)))
    sol.cells.append(new_code_cell("print(helper(answer), extra())"))
    assert unbound_reads(sol, sol) == []  # the solution defines both
    assert unbound_reads(make_exercise(sol), sol) == [f"cell {len(sol.cells) - 1} reads 'extra', which no cell up "
                                                      "to it defines"]
    sol.cells[3].source = "# extra: a helper you write\n" + sol.cells[3].source  # now the exercise asks for it
    assert unbound_reads(make_exercise(sol), sol) == []


@pytest.mark.parametrize("solution", SOLUTIONS, ids=[p.stem for p in SOLUTIONS])
def test_every_name_an_exercise_reads_is_defined_by_then_without_the_solutions(solution):
    """A learner who fills in the answers and runs the exercise from the top meets no NameError: no cell outside
    the answers uses a helper that only a solution region defined (nor a name a later cell defines)."""
    sol = nbformat.read(solution, as_version=4)
    assert unbound_reads(make_exercise(sol, solution.name), sol) == []


# Grades in kernels whose environment specref_grading sets itself: tools/upkeep/portable.py leaves these out.
pytestmark = pytest.mark.grader
