"""Grade an exercise notebook: run it under nbval and score its graded cells.

    python tools/grade.py exercises/ex02_accept_reject.ipynb        # make grade NB=...
    python tools/grade.py submissions/alice/ex02_accept_reject.ipynb --solution solutions/ex02_accept_reject.ipynb

Graded cells carry nbgrader metadata: ``metadata.nbgrader.grade = true``, a unique
``grade_id`` and ``points``. Before running, every graded cell that is not a
solution cell (a test cell) gets its source back from the solution notebook,
hidden tests included, so a learner can neither see nor edit the tests that
count. Then ``pytest --nbval-lax`` runs the notebook, one test per code cell
("Cell N" counts code cells from 0), and a graded cell scores its points iff
its test passed. The solution is found by file name in solutions/ unless
``--solution`` is given; ``--as-is`` skips the restoring.

Exit status: 0 full marks, 1 some graded cell failed, 2 the notebook could not be graded.
"""

from __future__ import annotations

import argparse
import copy
import os
import re
import subprocess
import sys
import tempfile
import xml.etree.ElementTree as ET
from dataclasses import dataclass
from pathlib import Path

import nbformat

ROOT = Path(__file__).resolve().parents[1]
CELL_TIMEOUT_S = 180
RUN_TIMEOUT_S = 1800  # the whole pytest run, whatever its cells do
# Colour codes in nbval's reports; the junit writer turns ESC into the text "#x1B".
_ANSI = re.compile(r"(\x1b|#x1B)\[[0-9;]*m")
_EXCEPTION_LINE = re.compile(r"^[A-Za-z_][\w.]*(Error|Exception|Exit|Interrupt|Warning)\b.*$", re.MULTILINE)


@dataclass(frozen=True)
class CellResult:
    grade_id: str
    points: float
    cell_index: int  # position in the notebook, all cell types counted
    code_index: int | None  # nbval's "Cell N" (code cells only); None for markdown
    outcome: str  # "passed", "failed", "error", "skipped", "not run", "manual"
    message: str = ""

    @property
    def passed(self) -> bool:
        return self.outcome == "passed"


def graded_cells(nb) -> list[tuple[int, object]]:
    """(index, cell) of every cell with nbgrader ``grade: true``."""
    return [(i, c) for i, c in enumerate(nb.cells) if c.get("metadata", {}).get("nbgrader", {}).get("grade")]


def is_test_cell(cell) -> bool:
    """A graded cell that the learner does not write: its source comes from the solution."""
    meta = cell.get("metadata", {}).get("nbgrader", {})
    return bool(meta.get("grade")) and not meta.get("solution") and cell.cell_type == "code"


def restore_tests(submission, solution):
    """A copy of `submission` whose test cells carry the solution's source (hidden tests included).

    Cells are matched by grade_id. A test cell the learner deleted is inserted
    again after the cell that precedes it in the solution (or at the end).
    """
    nb = copy.deepcopy(submission)
    by_id = {c.metadata["nbgrader"]["grade_id"]: c for _, c in graded_cells(nb)}
    for i, ref in enumerate(solution.cells):
        if not is_test_cell(ref):
            continue
        gid = ref.metadata["nbgrader"]["grade_id"]
        if gid in by_id:
            by_id[gid].source = ref.source
            by_id[gid].metadata = copy.deepcopy(ref.metadata)
            continue
        new = copy.deepcopy(ref)
        new.outputs, new.execution_count = [], None
        prev_id = solution.cells[i - 1].get("id") if i > 0 else None
        pos = next((j + 1 for j, c in enumerate(nb.cells) if prev_id and c.get("id") == prev_id), len(nb.cells))
        nb.cells.insert(pos, new)
        by_id[gid] = new
    return nb


def _reason(report: str) -> str:
    """The line of a failure report that says what went wrong (the exception), without colour codes."""
    text = _ANSI.sub("", report)
    found = [m.group(0) for m in _EXCEPTION_LINE.finditer(text)]
    if found:
        return found[-1].strip()
    lines = [ln.strip() for ln in text.splitlines() if ln.strip()]
    return lines[0] if lines else ""


def _junit_outcomes(xml_path: Path) -> tuple[dict[str, dict[int, tuple[str, str]]], str]:
    """{notebook file name: {nbval cell number: (outcome, message)}} and any other error, from junit XML."""
    outcomes: dict[str, dict[int, tuple[str, str]]] = {}
    other_error = ""
    if not xml_path.is_file():
        return outcomes, "pytest wrote no report"
    for case in ET.parse(xml_path).getroot().iter("testcase"):
        name = case.get("name", "")
        outcome, message = "passed", ""
        for tag in ("failure", "error", "skipped"):
            node = case.find(tag)
            if node is not None:
                outcome = {"failure": "failed"}.get(tag, tag)
                message = _reason(node.text or node.get("message") or "")
                break
        if name.startswith("Cell ") and name[5:].isdigit():
            outcomes.setdefault(Path(case.get("file", "")).name, {})[int(name[5:])] = (outcome, message)
        elif outcome != "passed":
            other_error = f"{name}: {message}"
    return outcomes, other_error


def run_nbval(paths: list[Path], cell_timeout: int = CELL_TIMEOUT_S) -> tuple[dict[str, dict[int, tuple[str, str]]], str]:
    """Run ``pytest --nbval-lax`` once over notebooks with distinct file names.

    Returns ({file name: {cell number: (outcome, message)}}, an error that is not a cell's:
    a collection failure, or pytest's output tail when it reported nothing).
    """
    with tempfile.TemporaryDirectory() as tmp:
        xml = Path(tmp) / "junit.xml"
        # xunit1 records each test's file, which tells the notebooks apart.
        cmd = [sys.executable, "-m", "pytest", "--nbval-lax", "--nbval-current-env",
               f"--nbval-cell-timeout={cell_timeout}", "-p", "no:cacheprovider", "-q",
               f"--junitxml={xml}", "-o", "junit_family=xunit1", *map(str, paths)]
        env = {**os.environ, "PYTHONDONTWRITEBYTECODE": "1"}
        try:
            proc = subprocess.run(cmd, capture_output=True, text=True, cwd=paths[0].parent, env=env,
                                  timeout=RUN_TIMEOUT_S)
        except subprocess.TimeoutExpired:
            return {}, f"pytest did not finish in {RUN_TIMEOUT_S} s"
        outcomes, error = _junit_outcomes(xml)
    if not outcomes and not error:
        error = (proc.stdout + proc.stderr)[-2000:]
    return outcomes, error


def _score(nb, cells: dict[int, tuple[str, str]], error: str) -> list[CellResult]:
    code_numbers: dict[int, int] = {}
    for i, c in enumerate(nb.cells):
        if c.cell_type == "code":
            code_numbers[i] = len(code_numbers)
    results = []
    for i, c in graded_cells(nb):
        meta = c.metadata["nbgrader"]
        gid, points = meta.get("grade_id", f"cell-{i}"), float(meta.get("points", 0))
        if c.cell_type != "code":
            results.append(CellResult(gid, points, i, None, "manual", "graded by hand"))
            continue
        n = code_numbers[i]
        outcome, message = cells.get(n, ("not run", error))
        results.append(CellResult(gid, points, i, n, outcome, message))
    return results


def grade_notebooks(jobs: list[tuple[object, Path]], cell_timeout: int = CELL_TIMEOUT_S) -> list[list[CellResult]]:
    """Score each (notebook, folder) pair, all in one pytest run.

    Each notebook runs as if it lived in its folder (its relative paths resolve
    there): it is written there under a temporary hidden name and removed afterwards.
    """
    paths: list[Path] = []
    try:
        for nb, where in jobs:
            Path(where).mkdir(parents=True, exist_ok=True)
            fd, name = tempfile.mkstemp(prefix=".grading-", suffix=".ipynb", dir=where)
            paths.append(Path(name))
            with os.fdopen(fd, "w", encoding="utf-8") as f:
                nbformat.write(nb, f)
        outcomes, error = run_nbval(paths, cell_timeout)
    finally:
        for path in paths:
            path.unlink(missing_ok=True)
    return [_score(nb, outcomes.get(path.name, {}), error) for (nb, _), path in zip(jobs, paths)]


def grade_notebook(nb, where: Path, cell_timeout: int = CELL_TIMEOUT_S) -> list[CellResult]:
    """Score one notebook as if it lived in folder `where`."""
    return grade_notebooks([(nb, where)], cell_timeout)[0]


def find_solution(notebook: Path) -> Path | None:
    candidate = ROOT / "solutions" / notebook.name
    return candidate if candidate.is_file() and candidate.resolve() != notebook.resolve() else None


def grade(notebook: Path, solution: Path | None = None, as_is: bool = False,
          cell_timeout: int = CELL_TIMEOUT_S) -> list[CellResult]:
    """Grade one notebook file (restoring its tests from the solution unless `as_is`)."""
    nb = nbformat.read(notebook, as_version=4)
    if not as_is:
        solution = solution or find_solution(notebook)
        if solution is not None:
            nb = restore_tests(nb, nbformat.read(solution, as_version=4))
    return grade_notebook(nb, notebook.resolve().parent, cell_timeout)


def summary(results: list[CellResult]) -> str:
    width = max([len(r.grade_id) for r in results] + [8])
    lines = [f"{'grade_id':<{width}}  {'points':>7}  result"]
    for r in results:
        got = r.points if r.passed else 0.0
        note = "" if r.passed or not r.message else "  " + r.message.splitlines()[0][:100]
        lines.append(f"{r.grade_id:<{width}}  {f'{got:g}/{r.points:g}':>7}  {r.outcome}{note}")
    auto = [r for r in results if r.outcome != "manual"]
    total = sum(r.points for r in auto if r.passed)
    lines.append(f"score: {total:g} / {sum(r.points for r in auto):g} (autograded)")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description="Grade an exercise notebook with pytest --nbval-lax.")
    ap.add_argument("notebook", type=Path)
    ap.add_argument("--solution", type=Path, help="solution notebook to restore tests from (default: solutions/<name>)")
    ap.add_argument("--as-is", action="store_true", help="grade the notebook's own test cells")
    ap.add_argument("--cell-timeout", type=int, default=CELL_TIMEOUT_S)
    args = ap.parse_args(argv)
    if not args.notebook.is_file():
        print(f"error: no such notebook: {args.notebook}", file=sys.stderr)
        return 2
    results = grade(args.notebook, args.solution, args.as_is, args.cell_timeout)
    if not results:
        print(f"error: {args.notebook} has no graded cells (metadata.nbgrader.grade)", file=sys.stderr)
        return 2
    print(summary(results))
    return 0 if all(r.passed or r.outcome == "manual" for r in results) else 1


if __name__ == "__main__":
    raise SystemExit(main())
