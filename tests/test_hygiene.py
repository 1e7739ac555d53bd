"""What every committed notebook must look like before a learner opens it.

No error outputs, no paths of the machine that ran it, a title, learning goals and a
summary, a first code cell that seeds every random number generator the notebook uses,
and the python3 kernel. Each check is a function returning the problems it found; the
synthetic notebooks at the bottom prove every check flags what it is meant to flag.
"""

from __future__ import annotations

import ast
import json
import re
import sys
from collections.abc import Callable
from pathlib import Path

import nbformat
import pytest

REPO = Path(__file__).resolve().parents[1]

# The three random number generators a notebook can draw from, and the calls that seed them.
SEEDERS = {"torch": "torch.manual_seed", "numpy": "numpy.random.seed", "random": "random.seed"}
SEED_EVERYTHING = re.compile(r"^specref(\.\w+)*\.seed_everything$")
_ABSOLUTE_PATH = re.compile(r"(?<![\w.~-])/(?:work|root|home|tmp|Users|private|var/folders|opt|mnt)/")
_HEADING = r"^\s*#{{1,6}}\s*{}\b"


def _machine_paths_pattern() -> re.Pattern[str]:
    """The usual home/scratch prefixes, plus this machine's checkout and venv wherever they live."""
    here = sorted({str(REPO), sys.prefix} - {"/"})
    return re.compile("|".join([_ABSOLUTE_PATH.pattern, *(r"(?<![\w.~-])" + re.escape(p) for p in here)]))


MACHINE_PATH = _machine_paths_pattern()


def _markdown_has_heading(nb: nbformat.NotebookNode, title: str) -> bool:
    heading = re.compile(_HEADING.format(re.escape(title)), re.IGNORECASE | re.MULTILINE)
    return any(c.cell_type == "markdown" and heading.search(c.source) for c in nb.cells)


def _python(source: str) -> ast.Module:
    """Parse a code cell, dropping IPython magics and shell lines that are not Python."""
    if source.lstrip().startswith("%%"):
        return ast.Module(body=[], type_ignores=[])
    lines = ["" if line.lstrip().startswith(("%", "!")) else line for line in source.splitlines()]
    return ast.parse("\n".join(lines))


def _imports(nb: nbformat.NotebookNode) -> dict[str, str]:
    """Every name bound by an import anywhere in the notebook -> the dotted name it stands for."""
    names: dict[str, str] = {}
    for cell in nb.cells:
        if cell.cell_type != "code":
            continue
        for node in ast.walk(_python(cell.source)):
            if isinstance(node, ast.Import):
                for a in node.names:
                    # `import numpy.random` binds `numpy`; `import numpy as np` binds `np`.
                    names[a.asname or a.name.split(".")[0]] = a.name if a.asname else a.name.split(".")[0]
            elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
                for a in node.names:
                    names[a.asname or a.name] = f"{node.module}.{a.name}"
    return names


def _dotted(node: ast.expr, names: dict[str, str]) -> str | None:
    if isinstance(node, ast.Name):
        return names.get(node.id, node.id)
    if isinstance(node, ast.Attribute):
        base = _dotted(node.value, names)
        return f"{base}.{node.attr}" if base else None
    return None


def _top_level_calls(tree: ast.Module, names: dict[str, str]) -> set[str]:
    """Calls the cell makes when it runs: top-level statements, not bodies of defs or classes."""
    calls: set[str] = set()
    stack: list[ast.AST] = list(tree.body)
    while stack:
        node = stack.pop()
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef, ast.Lambda)):
            continue
        if isinstance(node, ast.Call) and (name := _dotted(node.func, names)):
            calls.add(name)
        stack.extend(ast.iter_child_nodes(node))
    return calls


# --- the checks: each returns a list of problems, empty when the notebook is fine ---------

def error_outputs(nb: nbformat.NotebookNode) -> list[str]:
    problems = []
    for i, cell in enumerate(nb.cells):
        for out in cell.get("outputs", []):
            if out.get("output_type") == "error":
                problems.append(f"cell {i}: error output {out.get('ename')}: {out.get('evalue')}")
            elif out.get("output_type") == "stream" and out.get("name") == "stderr" and "Traceback" in out.get("text", ""):
                problems.append(f"cell {i}: traceback on stderr")
    return problems


def machine_paths(nb: nbformat.NotebookNode) -> list[str]:
    problems = []
    for i, cell in enumerate(nb.cells):
        texts = [cell.source]
        for out in cell.get("outputs", []):
            # Images are base64: no path can hide there, and random bytes could look like one.
            data = {k: v for k, v in out.get("data", {}).items() if not k.startswith("image/")}
            texts.append(json.dumps({**out, "data": data}))
        for text in texts:
            if m := MACHINE_PATH.search(text):
                problems.append(f"cell {i}: machine path {text[m.start():m.start() + 60]!r}")
                break
    return problems


def title(nb: nbformat.NotebookNode) -> list[str]:
    first = nb.cells[0] if nb.cells else None
    if first is None or first.cell_type != "markdown" or not first.source.startswith("# "):
        return ["the first cell is not a markdown title starting with '# '"]
    return []


def learning_goals(nb: nbformat.NotebookNode) -> list[str]:
    return [] if _markdown_has_heading(nb, "Learning goals") else ["no markdown heading 'Learning goals'"]


def summary(nb: nbformat.NotebookNode) -> list[str]:
    return [] if _markdown_has_heading(nb, "Summary") else ["no markdown heading 'Summary'"]


def check_your_understanding(nb: nbformat.NotebookNode) -> list[str]:
    """A lecture ends with its questions under 'Check your understanding' and answers in a collapsible block."""
    cells = [c for c in nb.cells if c.cell_type == "markdown"]
    heading = re.compile(_HEADING.format(re.escape("Check your understanding")), re.IGNORECASE | re.MULTILINE)
    at = next((i for i, c in enumerate(cells) if heading.search(c.source)), None)
    if at is None:
        return ["no markdown heading 'Check your understanding'"]
    if not any("<details>" in c.source and "</details>" in c.source for c in cells[at:]):
        return ["'Check your understanding' has no collapsible answer (<details>...</details>) after it"]
    return []


_NOTEBOOK_REF = re.compile(r"\bnotebooks? (\d\d)\b|\b(\d\d)_\w+\.ipynb\b", re.IGNORECASE)
_EXERCISE_REF = re.compile(r"\b(ex\d\d_\w+)\.ipynb\b")


def references_exist(nb: nbformat.NotebookNode) -> list[str]:
    """Every notebook or exercise a notebook mentions exists in the repository."""
    lectures = {p.name[:2] for p in (REPO / "notebooks").glob("[0-9][0-9]_*.ipynb")}
    exercises = {p.stem for p in (REPO / "solutions").glob("ex*.ipynb")}
    problems = []
    for i, cell in enumerate(nb.cells):
        for m in _NOTEBOOK_REF.finditer(cell.source):
            if (m.group(1) or m.group(2)) not in lectures:
                problems.append(f"cell {i}: refers to {m.group(0)!r}, which does not exist")
        for m in _EXERCISE_REF.finditer(cell.source):
            if m.group(1) not in exercises:
                problems.append(f"cell {i}: refers to {m.group(0)!r}, which does not exist")
    return problems


def seeded_first_cell(nb: nbformat.NotebookNode) -> list[str]:
    """The first code cell seeds torch, and numpy and random too if the notebook imports them."""
    code = [c for c in nb.cells if c.cell_type == "code"]
    if not code:
        return ["no code cell"]
    names = _imports(nb)
    calls = _top_level_calls(_python(code[0].source), names)
    if any(SEED_EVERYTHING.match(c) for c in calls):
        return []
    imported = {dotted.split(".")[0] for dotted in names.values()}
    needed = {"torch"} | (imported & {"numpy", "random"})
    return [f"the first code cell does not call {SEEDERS[m]}" for m in sorted(needed) if SEEDERS[m] not in calls]


def python3_kernel(nb: nbformat.NotebookNode) -> list[str]:
    name = nb.metadata.get("kernelspec", {}).get("name")
    return [] if name == "python3" else [f"kernelspec is {name!r}, not 'python3'"]


# --- the committed notebooks -------------------------------------------------------------

def _notebooks(*folders: str) -> list[str]:
    return sorted(str(p.relative_to(REPO)) for f in folders for p in (REPO / f).glob("*.ipynb"))


# exercises/ is generated from solutions/, and it is what learners open: the same rules hold.
ALL = _notebooks("notebooks", "solutions", "exercises")


def _check(check: Callable[[nbformat.NotebookNode], list[str]], path: str) -> None:
    problems = check(nbformat.read(REPO / path, as_version=4))
    assert not problems, f"{path}: " + "; ".join(problems)


@pytest.mark.parametrize("path", ALL)
def test_notebook_has_no_committed_error_output(path: str) -> None:
    _check(error_outputs, path)


@pytest.mark.parametrize("path", ALL)
def test_notebook_shows_no_path_of_this_machine(path: str) -> None:
    _check(machine_paths, path)


@pytest.mark.parametrize("path", ALL)
def test_notebook_opens_with_a_markdown_title(path: str) -> None:
    _check(title, path)


@pytest.mark.parametrize("path", ALL)
def test_notebook_runs_on_the_python3_kernel(path: str) -> None:
    _check(python3_kernel, path)


@pytest.mark.parametrize("path", ALL)
def test_notebook_states_learning_goals(path: str) -> None:
    _check(learning_goals, path)


@pytest.mark.parametrize("path", ALL)
def test_notebook_ends_with_a_summary(path: str) -> None:
    _check(summary, path)


@pytest.mark.parametrize("path", ALL)
def test_notebook_seeds_every_generator_in_its_first_code_cell(path: str) -> None:
    _check(seeded_first_cell, path)


@pytest.mark.parametrize("path", _notebooks("notebooks"))
def test_lecture_ends_with_questions_and_collapsible_answers(path: str) -> None:
    _check(check_your_understanding, path)


@pytest.mark.parametrize("path", ALL)
def test_notebook_refers_only_to_notebooks_that_exist(path: str) -> None:
    _check(references_exist, path)


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


ALL_CHECKS = [error_outputs, machine_paths, title, learning_goals, summary, seeded_first_cell, python3_kernel,
              references_exist]


@pytest.mark.parametrize("check", ALL_CHECKS, ids=lambda c: c.__name__)
def test_check_passes_a_well_formed_notebook(check: Callable[[nbformat.NotebookNode], list[str]]) -> None:
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
