"""What every committed notebook must look like before a learner opens it.

No error outputs, no paths of the machine that ran it, a markdown title, learning goals and a
summary, a first code cell that seeds every random number generator the notebook uses, the python3
kernel, and references only to notebooks and exercises that exist. A lecture (notebooks/) also ends
with its questions under 'Check your understanding' and their answers in a collapsible block. A solution
(solutions/) gives every hand-graded task a rubric right after it (a markdown cell with the metadata
"specref": {"rubric": "<grade_id>"}); an exercise (exercises/) holds no rubric and no solution_only cell
(both stay in the solution), and so needs no summary: an exercise's summary is the solution's, after grading.

Each check is a function `check(nb) -> list[str]`: the problems it found, empty when the notebook is
fine. `lint(path)` runs the checks that apply to one file and prefixes each problem with the check's
name.

Usage: python tools/upkeep/lint_notebooks.py [NOTEBOOK ...]  (no files: notebooks/, solutions/ and
exercises/). Prints one line per problem and exits 1 if there is any.
"""

from __future__ import annotations

import ast
import json
import re
import sys
from collections.abc import Callable
from pathlib import Path

import nbformat

REPO = Path(__file__).resolve().parents[2]

Check = Callable[[nbformat.NotebookNode], list[str]]

# The three random number generators a notebook can draw from, and the calls that seed them.
SEEDERS = {"torch": "torch.manual_seed", "numpy": "numpy.random.seed", "random": "random.seed"}
SEED_EVERYTHING = re.compile(r"^specref(\.\w+)*\.seed_everything$")
_ABSOLUTE_PATH = re.compile(r"(?<![\w.~-])/(?:work|root|home|tmp|Users|private|var/folders|opt|mnt)/")
_HEADING = r"^\s*#{{1,6}}\s*{}\b"
_NOTEBOOK_REF = re.compile(r"\bnotebooks? (\d\d)\b|\b(\d\d)_\w+\.ipynb\b", re.IGNORECASE)
_EXERCISE_REF = re.compile(r"\b(ex\d\d_\w+)\.ipynb\b")


def _machine_paths_pattern() -> re.Pattern[str]:
    """The usual home/scratch prefixes, plus this machine's checkout and venv wherever they live."""
    here = sorted({str(REPO), sys.prefix} - {"/"})
    return re.compile("|".join([_ABSOLUTE_PATH.pattern, *(r"(?<![\w.~-])" + re.escape(p) for p in here)]))


MACHINE_PATH = _machine_paths_pattern()


def _heading(title: str) -> re.Pattern[str]:
    return re.compile(_HEADING.format(re.escape(title)), re.IGNORECASE | re.MULTILINE)


def _markdown_has_heading(nb: nbformat.NotebookNode, title: str) -> bool:
    heading = _heading(title)
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
    """No error output and no traceback on stderr (a warning on stderr is fine)."""
    problems = []
    for i, cell in enumerate(nb.cells):
        for out in cell.get("outputs", []):
            if out.get("output_type") == "error":
                problems.append(f"cell {i}: error output {out.get('ename')}: {out.get('evalue')}")
            elif out.get("output_type") == "stream" and out.get("name") == "stderr" \
                    and "Traceback" in out.get("text", ""):
                problems.append(f"cell {i}: traceback on stderr")
    return problems


def machine_paths(nb: nbformat.NotebookNode) -> list[str]:
    """No absolute path of a machine in a source or an output (URLs and relative paths are fine)."""
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
    """The first cell is a markdown title starting with '# '."""
    first = nb.cells[0] if nb.cells else None
    if first is None or first.cell_type != "markdown" or not first.source.startswith("# "):
        return ["the first cell is not a markdown title starting with '# '"]
    return []


def learning_goals(nb: nbformat.NotebookNode) -> list[str]:
    """A markdown heading 'Learning goals' (a mention in running text is not enough)."""
    return [] if _markdown_has_heading(nb, "Learning goals") else ["no markdown heading 'Learning goals'"]


def summary(nb: nbformat.NotebookNode) -> list[str]:
    """A markdown heading 'Summary'."""
    return [] if _markdown_has_heading(nb, "Summary") else ["no markdown heading 'Summary'"]


def check_your_understanding(nb: nbformat.NotebookNode) -> list[str]:
    """A lecture ends with its questions under 'Check your understanding' and answers in a collapsible block."""
    cells = [c for c in nb.cells if c.cell_type == "markdown"]
    heading = _heading("Check your understanding")
    at = next((i for i, c in enumerate(cells) if heading.search(c.source)), None)
    if at is None:
        return ["no markdown heading 'Check your understanding'"]
    if not any("<details>" in c.source and "</details>" in c.source for c in cells[at:]):
        return ["'Check your understanding' has no collapsible answer (<details>...</details>) after it"]
    return []


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
    """The first code cell seeds torch, and numpy and random too if the notebook imports them.

    Only calls the cell makes when it runs count (not those inside a def), with import aliases
    resolved; `specref.seed_everything` seeds all three. An exercise's cell of the checks' imports before it
    (`_checks_imports`) is not that first cell: it only imports.
    """
    code = [c for c in nb.cells if c.cell_type == "code" and not _checks_imports(c)]
    if not code:
        return ["no code cell"]
    names = _imports(nb)
    calls = _top_level_calls(_python(code[0].source), names)
    if any(SEED_EVERYTHING.match(c) for c in calls):
        return []
    imported = {dotted.split(".")[0] for dotted in names.values()}
    needed = {"torch"} | (imported & {"numpy", "random"})
    return [f"the first code cell does not call {SEEDERS[m]}" for m in sorted(needed) if SEEDERS[m] not in calls]


def _checks_imports(cell: nbformat.NotebookNode) -> bool:
    """A cell of the checks' imports (``metadata.specref.side == "checks"``, run by the grader on its own side:
    specref_grading/plan.py) holding imports only, so it draws no random number."""
    meta = cell.get("metadata", {}).get("specref")
    if not (isinstance(meta, dict) and meta.get("side") == "checks"):
        return False
    try:
        body = _python(cell.source).body
    except SyntaxError:
        return False
    return all(isinstance(s, (ast.Import, ast.ImportFrom)) for s in body)


def _gid(cell: nbformat.NotebookNode) -> str | None:
    return (cell.get("metadata", {}).get("nbgrader") or {}).get("grade_id")


def rubrics(nb: nbformat.NotebookNode) -> list[str]:
    """Every hand-graded task (nbgrader grade and solution true) has a rubric right after it, a markdown cell with
    the metadata "specref": {"rubric": "<its grade_id>"}; every rubric names a hand-graded task
    (specref_grading.exercises.check_rubrics). A solution_only cell may be anything: it is only left out."""
    from specref_grading.exercises import MarkerError, check_rubrics, is_hand_graded, rubric_for

    try:
        check_rubrics(nb, "notebook")
    except MarkerError as e:
        return [str(e).removeprefix("notebook: ")]
    problems = []
    for i, cell in enumerate(nb.cells):
        if not is_hand_graded(cell):
            continue
        later = nb.cells[i + 1:]
        after = next((c for c in later if rubric_for(c) == _gid(cell)), None)
        if after is None:
            problems.append(f"cell {i}: hand-graded task {_gid(cell)!r} has no rubric (a markdown cell after it "
                            f"with the metadata \"specref\": {{\"rubric\": \"{_gid(cell)}\"}})")
        elif later[0] is not after:
            problems.append(f"cell {i}: the rubric of {_gid(cell)!r} is not the cell right after it")
    return problems


def nothing_solution_only(nb: nbformat.NotebookNode) -> list[str]:
    """What learners receive holds no rubric and no solution_only cell."""
    from specref_grading.exercises import left_out

    return [f"cell {i}: a rubric or solution_only cell (it belongs in the solution only)"
            for i, cell in enumerate(nb.cells) if left_out(cell)]


def python3_kernel(nb: nbformat.NotebookNode) -> list[str]:
    """The notebook runs on the kernel named 'python3'."""
    name = nb.metadata.get("kernelspec", {}).get("name")
    return [] if name == "python3" else [f"kernelspec is {name!r}, not 'python3'"]


# --- which checks apply where, and the command line ---------------------------------------

# Every committed notebook: lectures, solutions, and the exercises generated from the solutions
# (what learners open, so the same rules hold).
CHECKS: list[Check] = [error_outputs, machine_paths, title, python3_kernel, learning_goals, summary,
                       seeded_first_cell, references_exist]
LECTURE_CHECKS: list[Check] = [*CHECKS, check_your_understanding]
SOLUTION_CHECKS: list[Check] = [*CHECKS, rubrics]
EXERCISE_CHECKS: list[Check] = [*(c for c in CHECKS if c is not summary), nothing_solution_only]
FOLDERS = ("notebooks", "solutions", "exercises")


def checks_for(path: Path | str) -> list[Check]:
    """The checks for a notebook by its folder: a lecture (notebooks/) gets the lecture's extra check, a solution
    (solutions/) the rubrics, an exercise (exercises/) no summary but no rubric or solution_only cell either."""
    folder = Path(path).resolve().parent
    return {(REPO / "notebooks").resolve(): LECTURE_CHECKS, (REPO / "solutions").resolve(): SOLUTION_CHECKS,
            (REPO / "exercises").resolve(): EXERCISE_CHECKS}.get(folder, CHECKS)


def lint(path: Path | str, checks: list[Check] | None = None) -> list[str]:
    """Run `checks` (default: `checks_for(path)`) on one notebook: 'check_name: problem' per problem."""
    nb = nbformat.read(Path(path), as_version=4)
    return [f"{check.__name__}: {problem}" for check in (checks_for(path) if checks is None else checks)
            for problem in check(nb)]


def committed_notebooks(*folders: str) -> list[Path]:
    """The .ipynb files directly in `folders` (default: notebooks/, solutions/, exercises/), sorted."""
    return sorted(p for f in (folders or FOLDERS) for p in (REPO / f).glob("*.ipynb"))


def main(argv: list[str] | None = None) -> int:
    paths = [Path(a) for a in (sys.argv[1:] if argv is None else argv)] or committed_notebooks()
    found = 0
    for path in paths:
        for problem in lint(path):
            print(f"{path}: {problem}")
            found += 1
    print(f"{len(paths)} notebooks, {found} problems", file=sys.stderr)
    return 1 if found else 0


if __name__ == "__main__":
    sys.exit(main())
