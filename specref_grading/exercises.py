"""Generate the learners' exercise notebooks (exercises/) from the solutions (solutions/).

    python -m specref_grading.exercises           # write exercises/ (make exercises)
    python -m specref_grading.exercises --check   # exit 1 and list the files that differ

solutions/ is the single source. Markers are nbgrader's:

* ``### BEGIN SOLUTION`` ... ``### END SOLUTION``: in a code cell the region becomes
  ``# YOUR CODE HERE`` + ``raise NotImplementedError("Task N: write NAME (see the task above)")`` at
  the indentation of the BEGIN line; in a markdown cell it becomes ``YOUR ANSWER HERE``. The stub speaks
  (`stub_message`): N is the number of the last ``## Task N`` heading of a markdown cell above the
  region; NAME is the function or class whose body holds the region (the nearest ``def``/``class``
  line above it at a smaller indentation; a method is named with its class, ``LookupDraft.propose``),
  or, for a region at the top of a cell, the names it
  binds ("set beta and res"), keeping those the task's text names in backticks when it names any.
  Without a task heading above it the message says "(see the exercise above)" and names no task.
* ``### BEGIN HIDDEN TESTS`` ... ``### END HIDDEN TESTS``: removed, markers included
  (the grader puts them back from the solution, see specref_grading/grade.py).
* A cell with the metadata ``"specref": {"solution_only": true}`` (an exercise's closing summary, which states
  what the tasks ask) is left out: it belongs after grading, in the solution.
* A markdown cell with the metadata ``"specref": {"rubric": "<grade_id>"}``, placed after a hand-graded cell
  (nbgrader ``grade`` and ``solution`` both true), is that task's rubric (points per element, a model answer):
  left out of the exercise, printed on the hand-grading sheets (specref_grading/classrun.py). A rubric must name a
  hand-graded cell of the same notebook, once (`check_rubrics`).

Outputs, execution counts, per-cell timing metadata and saved widget state are
cleared; cell ids and all other metadata (nbgrader's ``grade``, ``grade_id``,
``points``) are kept. The notebook is stamped with ``metadata.specref = {"exercise":
<the solution's file stem>, "version": <hash of its tests>}``: specref_grading/grade.py finds the
solution by that id, whatever the learner names the file, and notes an older version. The output is a function of the solution alone: the same
bytes on every run, so CI can regenerate and compare.
"""

from __future__ import annotations

import argparse
import ast
import copy
import hashlib
import json
import re
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
BEGIN_SOLUTION, END_SOLUTION = "### BEGIN SOLUTION", "### END SOLUTION"
BEGIN_HIDDEN, END_HIDDEN = "### BEGIN HIDDEN TESTS", "### END HIDDEN TESTS"
CODE_STUB = ("# YOUR CODE HERE", "raise NotImplementedError({message})")  # message: a JSON (double-quoted) string
MARKDOWN_STUB = ("YOUR ANSWER HERE",)
# Metadata that records a particular run, not the exercise.
RUN_CELL_METADATA = ("execution", "collapsed", "scrolled")
RUN_NOTEBOOK_METADATA = ("widgets",)


class MarkerError(ValueError):
    """A solution notebook whose markers or grading metadata are malformed."""


def _where(name: str, index: int, cell) -> str:
    return f"{name}: cell {index} (id {cell.get('id', '?')})"


_TASK = re.compile(r"^#+\s*Task\s+(\d+)\b", re.M)
_DEF = re.compile(r"^(\s*)(?:async\s+def|def|class)\s+(\w+)")


def _region_names(region: list[str], task_text: str) -> list[str]:
    """The names a top-level region binds, those named in backticks in the task's text first (all, if none is)."""
    try:
        tree = ast.parse("\n".join(region))
    except SyntaxError:
        return []
    bound: list[str] = []
    for node in tree.body:
        targets = node.targets if isinstance(node, ast.Assign) else [node.target] if isinstance(
            node, (ast.AnnAssign, ast.AugAssign)) else []
        names = [node.name] if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)) else [
            n.id for t in targets for n in ast.walk(t) if isinstance(n, ast.Name)]
        bound += [n for n in names if n not in bound]
    asked = [n for n in bound if f"`{n}`" in task_text]
    return asked or bound


def stub_message(lines: list[str], begin: int, end: int, task: tuple[str, str] | None) -> str:
    """What the stub of the region lines[begin + 1 : end] says: which task, and what to write (module docstring)."""
    indent = len(lines[begin]) - len(lines[begin].lstrip())
    name, verb = None, "write"
    for line in reversed(lines[:begin]):
        m = _DEF.match(line)
        if m and len(m.group(1)) < indent:
            if name is None:
                name, indent = m.group(2), len(m.group(1))
            elif line.lstrip().startswith("class "):
                name = f"{m.group(2)}.{name}"  # a method: named with its class
                break
            else:
                break
    if name is None:
        names = _region_names(lines[begin + 1 : end], task[1] if task else "")
        verb, name = "set", " and ".join([", ".join(names[:-1]), names[-1]] if len(names) > 1 else names)
        if not names:
            verb, name = "write", "the answer"
    if task is None:
        return f"{verb} {name} (see the exercise above)"
    return f"Task {task[0]}: {verb} {name} (see the task above)"


def strip_regions(source: str, cell_type: str, where: str, task: tuple[str, str] | None = None) -> str:
    """The cell's source with solution regions replaced by the stub and hidden tests removed.

    `task`: (number, text) of the last task heading above the cell, for the stub's message.
    """
    lines = source.split("\n")
    out: list[str] = []
    state = None  # None, "solution" or "hidden"
    removed_hidden = False
    for n, line in enumerate(lines, 1):
        marker = line.strip()
        if marker in (BEGIN_SOLUTION, BEGIN_HIDDEN):
            if state is not None:
                raise MarkerError(f"{where}, line {n}: {marker!r} inside an open {state} region")
            state = "solution" if marker == BEGIN_SOLUTION else "hidden"
            if state == "solution":
                indent = line[: len(line) - len(line.lstrip())]
                end = next((j for j in range(n, len(lines)) if lines[j].strip() == END_SOLUTION), len(lines))
                stub = ([CODE_STUB[0], CODE_STUB[1].format(message=json.dumps(stub_message(lines, n - 1, end, task)))]
                        if cell_type == "code" else MARKDOWN_STUB)
                out += [indent + s for s in stub]
            else:
                removed_hidden = True
        elif marker in (END_SOLUTION, END_HIDDEN):
            want = "solution" if marker == END_SOLUTION else "hidden"
            if state != want:
                raise MarkerError(f"{where}, line {n}: {marker!r} without a matching BEGIN")
            state = None
        elif state is None:
            out.append(line)
    if state is not None:
        raise MarkerError(f"{where}: {state} region is never closed")
    text = "\n".join(out)
    # A hidden block at the end of a cell would leave blank lines behind.
    return text.rstrip() if removed_hidden else text


def specref_meta(cell) -> dict:
    """The cell's ``metadata.specref`` (an empty dict when it has none or it is not a dict)."""
    meta = cell.get("metadata", {}).get("specref")
    return meta if isinstance(meta, dict) else {}


def is_solution_only(cell) -> bool:
    """A cell kept in the solution only (``"specref": {"solution_only": true}``): a closing summary, say."""
    return specref_meta(cell).get("solution_only") is True


def rubric_for(cell) -> str | None:
    """The grade_id a rubric cell (``"specref": {"rubric": "<grade_id>"}``) is the rubric of; None for other cells."""
    return specref_meta(cell).get("rubric") if "rubric" in specref_meta(cell) else None


def is_hand_graded(cell) -> bool:
    """An answer the grader shows for grading by hand: nbgrader ``grade`` and ``solution`` both true."""
    meta = cell.get("metadata", {}).get("nbgrader") or {}
    return bool(meta.get("grade")) and bool(meta.get("solution"))


def left_out(cell) -> bool:
    """Whether the cell stays in the solution only: a solution_only cell or a rubric."""
    return is_solution_only(cell) or "rubric" in specref_meta(cell)


def check_rubrics(nb, name: str) -> dict[str, str]:
    """{grade_id: rubric text} of the notebook's rubric cells; MarkerError for a malformed one.

    A rubric is a markdown cell naming, as a non-empty string, the grade_id of a hand-graded cell of the same
    notebook, at most one rubric per grade_id; it carries no nbgrader grading of its own. A solution_only cell
    must not be a graded or answer cell (leaving it out would take a task away).
    """
    hand = {gid for c in nb["cells"] if is_hand_graded(c)
            for gid in [(c.get("metadata", {}).get("nbgrader") or {}).get("grade_id")] if isinstance(gid, str)}
    out: dict[str, str] = {}
    for i, cell in enumerate(nb["cells"]):
        nbg = cell.get("metadata", {}).get("nbgrader") or {}
        if is_solution_only(cell) and (nbg.get("grade") or nbg.get("solution")):
            raise MarkerError(f"{_where(name, i, cell)}: a solution_only cell cannot be graded or an answer")
        if "rubric" not in specref_meta(cell):
            continue
        gid = specref_meta(cell)["rubric"]
        if cell.get("cell_type") != "markdown":
            raise MarkerError(f"{_where(name, i, cell)}: a rubric must be a markdown cell")
        if nbg.get("grade") or nbg.get("solution"):
            raise MarkerError(f"{_where(name, i, cell)}: a rubric cannot be graded or an answer itself")
        if not isinstance(gid, str) or gid not in hand:
            raise MarkerError(f"{_where(name, i, cell)}: rubric for {gid!r}, which is not the grade_id of a "
                              f"hand-graded cell (grade and solution true) here; hand-graded: {sorted(hand) or 'none'}")
        if gid in out:
            raise MarkerError(f"{_where(name, i, cell)}: a second rubric for {gid!r}")
        src = cell.get("source", "")
        out[gid] = "".join(src) if isinstance(src, list) else src
    return out


def check_grading_metadata(nb, name: str) -> None:
    """Graded cells need a unique grade_id and non-negative points (the grader keys on them)."""
    seen: dict[str, int] = {}
    for i, cell in enumerate(nb.cells):
        meta = cell.get("metadata", {}).get("nbgrader")
        if not meta or not meta.get("grade"):
            continue
        gid = meta.get("grade_id")
        if not isinstance(gid, str) or not gid:
            raise MarkerError(f"{_where(name, i, cell)}: graded cell without a grade_id")
        if gid in seen:
            raise MarkerError(f"{_where(name, i, cell)}: grade_id {gid!r} also used by cell {seen[gid]}")
        seen[gid] = i
        points = meta.get("points")
        if isinstance(points, bool) or not isinstance(points, (int, float)) or points < 0:
            raise MarkerError(f"{_where(name, i, cell)}: graded cell {gid!r} needs points >= 0, got {points!r}")


def tests_version(solution) -> str:
    """A short hash of what grading depends on: graded cells' ids, points, types and sources (hidden tests too).

    specref_grading/grade.py computes the same from the solution it grades with.
    """
    parts = [[c.get("metadata", {}).get("nbgrader", {}).get("grade_id"),
              c.get("metadata", {}).get("nbgrader", {}).get("points"), c.get("cell_type"),
              "".join(c.get("source", "")) if isinstance(c.get("source"), list) else c.get("source", "")]
             for c in solution["cells"] if c.get("metadata", {}).get("nbgrader", {}).get("grade")]
    return hashlib.sha256(json.dumps(parts, sort_keys=True).encode()).hexdigest()[:12]


def make_exercise(solution, name: str = "notebook"):
    """The exercise notebook for one solution notebook (a new NotebookNode; the input is untouched).

    `name` is the solution's file name (or a path): its stem is the exercise id stamped into the notebook.
    """
    import nbformat  # here, not at the top: specref_grading/grade.py imports this module and must start fast

    nb = copy.deepcopy(solution)
    check_grading_metadata(nb, name)
    check_rubrics(nb, name)
    nb.cells = [c for c in nb.cells if not left_out(c)]  # rubrics and solution_only cells stay in the solution
    nb.metadata["specref"] = {"exercise": Path(name).stem, "version": tests_version(solution)}
    task = None  # (number, text) of the last task heading so far, and the text of its section
    for i, cell in enumerate(nb.cells):
        if cell.cell_type == "markdown":
            headings = list(_TASK.finditer(cell.source))
            if headings:
                task = (headings[-1].group(1), cell.source[headings[-1].start():])
            elif task is not None:
                task = (task[0], task[1] + "\n" + cell.source)
        if cell.cell_type in ("code", "markdown"):
            cell.source = strip_regions(cell.source, cell.cell_type, _where(name, i, cell), task)
        if cell.cell_type == "code":
            cell.outputs = []
            cell.execution_count = None
        for key in RUN_CELL_METADATA:
            cell.metadata.pop(key, None)
    for key in RUN_NOTEBOOK_METADATA:
        nb.metadata.pop(key, None)
    nbformat.validate(nb)
    return nb


def to_bytes(nb) -> bytes:
    """Stable serialization: nbformat's sorted-key JSON plus a final newline."""
    import nbformat  # here, not at the top: specref_grading/grade.py imports this module and must start fast

    text = nbformat.writes(nb)
    return (text if text.endswith("\n") else text + "\n").encode("utf-8")


def notebooks_in(folder: Path) -> list[Path]:
    """The notebooks in a folder, sorted; hidden files (a grader's temporary copies) are not ours."""
    return sorted(p for p in folder.glob("*.ipynb") if not p.name.startswith(".")) if folder.is_dir() else []


def expected_files(solutions: Path) -> dict[str, bytes]:
    """{exercise file name: bytes} for every solution notebook."""
    import nbformat  # here, not at the top: specref_grading/grade.py imports this module and must start fast

    out: dict[str, bytes] = {}
    for path in notebooks_in(solutions):
        nb = nbformat.read(path, as_version=nbformat.NO_CONVERT)
        out[path.name] = to_bytes(make_exercise(nb, str(path.relative_to(solutions.parent))))  # id: the file stem
    return out


def differences(solutions: Path, exercises: Path) -> list[str]:
    """What `--check` reports: missing, differing and stale exercise notebooks."""
    want = expected_files(solutions)
    have = {p.name for p in notebooks_in(exercises)}
    problems = []
    for name, data in want.items():
        path = exercises / name
        if name not in have:
            problems.append(f"missing: {path}")
        elif path.read_bytes() != data:
            problems.append(f"differs: {path}")
    problems += [f"stale (no solution): {exercises / n}" for n in sorted(have - set(want))]
    return problems


def write(solutions: Path, exercises: Path) -> list[str]:
    """Write exercises/ to match solutions/; returns the files changed or removed."""
    want = expected_files(solutions)
    exercises.mkdir(parents=True, exist_ok=True)
    changed = []
    for name, data in want.items():
        path = exercises / name
        if not path.is_file() or path.read_bytes() != data:
            path.write_bytes(data)
            changed.append(f"wrote {path}")
    for path in notebooks_in(exercises):
        if path.name not in want:
            path.unlink()
            changed.append(f"removed {path} (no solution)")
    return changed


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description="Generate exercises/ from solutions/.")
    ap.add_argument("--solutions", type=Path, default=ROOT / "solutions")
    ap.add_argument("--exercises", type=Path, default=ROOT / "exercises")
    ap.add_argument("--check", action="store_true", help="write nothing; exit 1 if exercises/ is out of date")
    args = ap.parse_args(argv)
    try:
        if args.check:
            problems = differences(args.solutions, args.exercises)
            for line in problems:
                print(line)
            if problems:
                print("exercises/ is out of date: run `make exercises` and commit the result", file=sys.stderr)
                return 1
            print(f"exercises/ matches solutions/ ({len(notebooks_in(args.solutions))} notebooks)")
            return 0
        changed = write(args.solutions, args.exercises)
    except MarkerError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    for line in changed:
        print(line)
    print(f"exercises/ up to date ({len(changed)} changed)")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
