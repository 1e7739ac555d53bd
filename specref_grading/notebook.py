"""A notebook as the grader reads it: JSON, checked enough to walk, its cells' nbgrader roles and its exercise id."""

from __future__ import annotations

import json
from pathlib import Path


class GradeError(Exception):
    """The notebook cannot be graded (exit 2); the message says why."""


# --------------------------------------------------------------------------------------
# Notebooks as JSON: reading, ids and versions
# --------------------------------------------------------------------------------------
def source(cell: dict) -> str:
    src = cell.get("source", "")
    return "".join(src) if isinstance(src, list) else src


def read_notebook(path: Path) -> dict:
    """The notebook as a dict, checked enough to be walked safely; GradeError says what is wrong."""
    try:
        nb = json.loads(Path(path).read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError) as e:
        raise GradeError(f"cannot read {path}: {e}") from e
    except json.JSONDecodeError as e:
        raise GradeError(f"{path} is not valid JSON (line {e.lineno}, column {e.colno}: {e.msg}); "
                         "was it saved by Jupyter?") from e
    except RecursionError as e:
        raise GradeError(f"{path} is nested too deeply to be a notebook") from e
    if not isinstance(nb, dict) or not isinstance(nb.get("cells"), list):
        raise GradeError(f"{path} is not a notebook (no list of cells)")
    if not isinstance(nb.get("metadata", {}), dict):
        raise GradeError(f"{path}: the notebook's metadata is not an object")
    for i, cell in enumerate(nb["cells"]):
        if not isinstance(cell, dict) or not isinstance(cell.get("cell_type"), str):
            raise GradeError(f"{path}: cell {i} is broken (not an object with a cell_type)")
        src = cell.get("source", "")
        if not (isinstance(src, str) or (isinstance(src, list) and all(isinstance(s, str) for s in src))):
            raise GradeError(f"{path}: cell {i} has a broken source (not text)")
        if not isinstance(cell.get("metadata", {}), dict):
            raise GradeError(f"{path}: cell {i} has broken metadata (not an object)")
    return nb


def nbgrader(cell: dict) -> dict:
    meta = cell.get("metadata", {}).get("nbgrader")
    return meta if isinstance(meta, dict) else {}


def is_answer(cell: dict) -> bool:
    return bool(nbgrader(cell).get("solution"))


def is_test(cell: dict) -> bool:
    m = nbgrader(cell)
    return bool(m.get("grade")) and not m.get("solution") and cell.get("cell_type") == "code"


def exercise_id(solution_path: Path) -> str:
    return Path(solution_path).stem


def stamp(submission: dict) -> tuple[str | None, str | None]:
    meta = submission.get("metadata", {}).get("specref")
    if not isinstance(meta, dict):
        return None, None
    eid, ver = meta.get("exercise"), meta.get("version")
    return (eid if isinstance(eid, str) else None), (ver if isinstance(ver, str) else None)


def find_solution(submission: dict, solutions_dir: Path) -> Path:
    eid, _ = stamp(submission)
    if eid is None:
        raise GradeError("the notebook has no exercise id (metadata.specref.exercise, stamped by "
                         "python -m specref_grading.exercises); name its solution with --solution")
    for path in sorted(Path(solutions_dir).glob("*.ipynb")):
        if exercise_id(path) == eid:
            return path
    raise GradeError(f"no solution in {solutions_dir} for exercise id {eid!r}; name one with --solution")


