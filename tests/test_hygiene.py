"""What every committed notebook must look like before a learner opens it (tools/upkeep/lint_notebooks.py).

The linter runs over every notebook in notebooks/, solutions/ and exercises/; the synthetic notebooks
below prove that each of its checks flags what it is meant to flag and passes a well-formed notebook.
"""

from __future__ import annotations

import sys
from pathlib import Path

import nbformat
import pytest

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "tools" / "upkeep"))

import lint_notebooks  # noqa: E402
from lint_notebooks import (  # noqa: E402
    check_your_understanding,
    error_outputs,
    learning_goals,
    machine_paths,
    python3_kernel,
    references_exist,
    seeded_first_cell,
    summary,
    title,
)

# --- the committed notebooks -------------------------------------------------------------


@pytest.mark.parametrize("path", lint_notebooks.committed_notebooks(), ids=lambda p: str(p.relative_to(REPO)))
def test_notebook_passes_every_check_of_the_linter(path: Path) -> None:
    problems = lint_notebooks.lint(path)
    assert not problems, f"{path.relative_to(REPO)}: " + "; ".join(problems)


def test_the_linter_finds_the_committed_notebooks() -> None:
    found = {p.parent.name for p in lint_notebooks.committed_notebooks()}
    assert found == {"notebooks", "solutions", "exercises"}


def test_only_lectures_must_end_with_check_your_understanding() -> None:
    assert check_your_understanding in lint_notebooks.checks_for(REPO / "notebooks" / "01_x.ipynb")
    assert check_your_understanding not in lint_notebooks.checks_for(REPO / "solutions" / "ex01_x.ipynb")
    assert check_your_understanding not in lint_notebooks.checks_for(REPO / "exercises" / "ex01_x.ipynb")


# --- the checks themselves, on synthetic notebooks ---------------------------------------

def _notebook(*cells: nbformat.NotebookNode, kernel: str = "python3") -> nbformat.NotebookNode:
    nb = nbformat.v4.new_notebook(cells=list(cells))
    nb.metadata["kernelspec"] = {"name": kernel, "display_name": "Python 3", "language": "python"}
    return nb


def _md(text: str) -> nbformat.NotebookNode:
    return nbformat.v4.new_markdown_cell(text)


def _code(source: str, *outputs: nbformat.NotebookNode) -> nbformat.NotebookNode:
    return nbformat.v4.new_code_cell(source, outputs=list(outputs))


SEED = "import numpy as np\nimport torch\ntorch.manual_seed(0)\nnp.random.seed(0)"


def _good() -> nbformat.NotebookNode:
    return _notebook(
        _md("# Chapter"),
        _md("## Learning goals\n- one"),
        _code(SEED),
        _code("print(np.arange(3))", nbformat.v4.new_output("stream", name="stdout", text="[0 1 2]\n")),
        _md("## Summary\nDone."),
    )


@pytest.mark.parametrize("check", lint_notebooks.CHECKS, ids=lambda c: c.__name__)
def test_check_passes_a_well_formed_notebook(check: lint_notebooks.Check) -> None:
    assert check(_good()) == []


def test_error_outputs_flags_an_error_output_and_a_stderr_traceback() -> None:
    nb = _good()
    nb.cells[3].outputs = [nbformat.v4.new_output("error", ename="ValueError", evalue="bad", traceback=[])]
    assert error_outputs(nb) == ["cell 3: error output ValueError: bad"]
    nb.cells[3].outputs = [nbformat.v4.new_output("stream", name="stderr", text="Traceback (most recent call last):")]
    assert error_outputs(nb) == ["cell 3: traceback on stderr"]


def test_error_outputs_allows_a_warning_on_stderr() -> None:
    nb = _good()
    nb.cells[3].outputs = [nbformat.v4.new_output("stream", name="stderr", text="UserWarning: slow\n")]
    assert error_outputs(nb) == []


@pytest.mark.parametrize(
    "text",
    ["/work/main/notebooks/x.ipynb", "/root/.cache/huggingface", "/home/ana/data", "/tmp/tmpab12/file",
     sys.prefix + "/lib/python3.11/site-packages/torch/nn.py", str(REPO) + "/specref/rejection.py"],
)
def test_machine_paths_flags_a_path_in_an_output(text: str) -> None:
    nb = _good()
    nb.cells[3].outputs = [nbformat.v4.new_output("stream", name="stderr", text=f"File {text}, line 3\n")]
    assert len(machine_paths(nb)) == 1


def test_machine_paths_flags_a_path_in_a_source() -> None:
    nb = _good()
    nb.cells[3].source = "open('/home/ana/weights.pt')"
    assert machine_paths(nb) == ["cell 3: machine path \"/home/ana/weights.pt')\""]


def test_machine_paths_allows_urls_and_relative_paths() -> None:
    nb = _good()
    nb.cells[1].source = "See https://example.org/home/tmp/page and ../specref/assets/x.json"
    assert machine_paths(nb) == []


def test_title_flags_a_first_cell_that_is_not_a_title() -> None:
    assert title(_notebook(_md("## Chapter"), _code(SEED))) != []
    assert title(_notebook(_code(SEED), _md("# Chapter"))) != []


def test_learning_goals_and_summary_flag_notebooks_without_those_headings() -> None:
    nb = _good()
    nb.cells[1].source = "Learning goals are below."  # mentions it, but not as a heading
    nb.cells[4].source = "## Recap"
    assert learning_goals(nb) == ["no markdown heading 'Learning goals'"]
    assert summary(nb) == ["no markdown heading 'Summary'"]


def test_seeded_first_cell_flags_an_unseeded_first_cell() -> None:
    nb = _good()
    nb.cells[2].source = "import numpy as np\nimport torch"
    assert seeded_first_cell(nb) == [
        "the first code cell does not call numpy.random.seed",
        "the first code cell does not call torch.manual_seed",
    ]


def test_seeded_first_cell_requires_the_seed_of_a_generator_imported_later() -> None:
    nb = _good()
    nb.cells[3].source = "import random\nrandom.choice([1, 2])"
    assert seeded_first_cell(nb) == ["the first code cell does not call random.seed"]


def test_seeded_first_cell_ignores_seeds_inside_a_function_or_in_a_later_cell() -> None:
    nb = _good()
    nb.cells[2].source = "import numpy as np\nimport torch\ndef setup():\n    torch.manual_seed(0)\n    np.random.seed(0)"
    nb.cells[3].source = "torch.manual_seed(0)\nnp.random.seed(0)"
    assert len(seeded_first_cell(nb)) == 2


def test_seeded_first_cell_looks_past_an_exercises_cell_of_the_checks_imports() -> None:
    nb = _good()
    checks = _code("from specref_grading.checks.roofline import MODELS")
    checks.metadata["specref"] = {"side": "checks"}
    nb.cells.insert(2, checks)
    assert seeded_first_cell(nb) == []
    nb.cells[3].source = "import torch"  # the control: the cell after it must still seed
    assert seeded_first_cell(nb) == ["the first code cell does not call torch.manual_seed"]
    nb.cells[3].source = SEED
    checks.source += "\nimport torch\ntorch.rand(1)"  # a checks cell that does more than import is the first cell
    assert seeded_first_cell(nb) == ["the first code cell does not call numpy.random.seed",
                                     "the first code cell does not call torch.manual_seed"]


def test_seeded_first_cell_resolves_aliases_and_accepts_seed_everything() -> None:
    aliased = "from numpy import random as npr\nfrom torch import manual_seed\n%matplotlib inline\nmanual_seed(0)\nnpr.seed(1)"
    assert seeded_first_cell(_notebook(_code(aliased))) == []
    helper = "import numpy as np\nimport random\nimport specref\nspecref.seed_everything(0)"
    assert seeded_first_cell(_notebook(_code(helper))) == []
    wrong = "import numpy as np\nimport torch\nnp.random.seed(0)\ntorch.seed()"  # torch.seed() is not reproducible
    assert seeded_first_cell(_notebook(_code(wrong))) == ["the first code cell does not call torch.manual_seed"]


def test_check_your_understanding_needs_the_heading_and_a_collapsible_answer() -> None:
    nb = _good()
    assert check_your_understanding(nb) == ["no markdown heading 'Check your understanding'"]
    nb.cells.insert(4, _md("## Check your understanding\n1. Why?"))
    assert "no collapsible answer" in check_your_understanding(nb)[0]
    nb.cells.insert(5, _md("<details><summary>Answers</summary>\n\n1. Because.\n\n</details>"))
    assert check_your_understanding(nb) == []


def test_references_exist_flags_a_missing_notebook_and_exercise() -> None:
    nb = _good()
    nb.cells[1].source = "Notebook 02 shows it; notebook 99 will, and so will `99_future.ipynb` and ex99_none.ipynb."
    assert references_exist(nb) == [
        "cell 1: refers to 'notebook 99', which does not exist",
        "cell 1: refers to '99_future.ipynb', which does not exist",
        "cell 1: refers to 'ex99_none.ipynb', which does not exist",
    ]


def test_python3_kernel_flags_another_kernel() -> None:
    nb = _good()
    nb.metadata["kernelspec"]["name"] = "conda-env-x"
    assert python3_kernel(nb) == ["kernelspec is 'conda-env-x', not 'python3'"]


def test_main_exits_non_zero_and_names_the_check_on_a_bad_notebook(tmp_path: Path, capsys) -> None:
    good, bad = tmp_path / "good.ipynb", tmp_path / "bad.ipynb"
    nbformat.write(_good(), good)
    broken = _good()
    broken.metadata["kernelspec"]["name"] = "conda-env-x"
    nbformat.write(broken, bad)
    assert lint_notebooks.main([str(good)]) == 0
    assert lint_notebooks.main([str(good), str(bad)]) == 1
    out = capsys.readouterr().out
    assert out == f"{bad}: python3_kernel: kernelspec is 'conda-env-x', not 'python3'\n"


# --- rubrics and solution_only cells (solutions/ and exercises/) ---------------------------

def _hand_graded(gid: str) -> nbformat.NotebookNode:
    cell = _md("Explain.\n\n### BEGIN SOLUTION\nBecause.\n### END SOLUTION")
    cell.metadata["nbgrader"] = {"grade": True, "solution": True, "grade_id": gid, "points": 1, "locked": False,
                                 "schema_version": 3}
    return cell


def _rubric(gid: object) -> nbformat.NotebookNode:
    cell = _md("1 point for naming the residual. Model answer: ...")
    cell.metadata["specref"] = {"rubric": gid}
    return cell


def test_rubrics_flags_a_hand_graded_task_without_one_and_passes_one_with_it() -> None:
    nb = _good()
    nb.cells.insert(4, _hand_graded("why"))
    assert lint_notebooks.rubrics(nb) == [
        "cell 4: hand-graded task 'why' has no rubric (a markdown cell after it with the metadata "
        '"specref": {"rubric": "why"})']
    nb.cells.insert(5, _rubric("why"))
    assert lint_notebooks.rubrics(nb) == []


def test_rubrics_flags_a_misplaced_rubric_and_one_naming_no_hand_graded_task() -> None:
    nb = _good()
    nb.cells[4:4] = [_hand_graded("why"), _md("an aside"), _rubric("why")]
    assert lint_notebooks.rubrics(nb) == ["cell 4: the rubric of 'why' is not the cell right after it"]
    nb = _good()
    nb.cells[4:4] = [_hand_graded("why"), _rubric("wyh")]
    assert len(lint_notebooks.rubrics(nb)) == 1 and "rubric for 'wyh'" in lint_notebooks.rubrics(nb)[0]


def test_a_solution_only_cell_of_any_kind_is_allowed_in_a_solution() -> None:
    nb = _good()
    nb.cells[3].metadata["specref"] = {"solution_only": True}  # a code cell, not a summary
    assert all(check(nb) == [] for check in lint_notebooks.SOLUTION_CHECKS)


def test_an_exercise_needs_no_summary_but_holds_no_rubric_or_solution_only_cell() -> None:
    checks = lint_notebooks.checks_for(REPO / "exercises" / "ex01_x.ipynb")
    assert summary not in checks and lint_notebooks.nothing_solution_only in checks
    assert lint_notebooks.rubrics in lint_notebooks.checks_for(REPO / "solutions" / "ex01_x.ipynb")
    assert summary in lint_notebooks.checks_for(REPO / "solutions" / "ex01_x.ipynb")
    nb = _good()
    assert lint_notebooks.nothing_solution_only(nb) == []
    nb.cells[1:1] = [_rubric("why")]
    nb.cells[4].metadata["specref"] = {"solution_only": True}
    assert len(lint_notebooks.nothing_solution_only(nb)) == 2
