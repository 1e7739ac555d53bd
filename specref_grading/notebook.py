"""A notebook as the grader reads it: JSON, checked enough to walk, its cells' nbgrader roles and its exercise id."""

from __future__ import annotations

import json
import os
import stat
from pathlib import Path

# The largest notebook file the grader reads (an exercise handed in with its outputs and plots is a few MB), and
# the largest answer cell it parses (an honest answer is a few KB; the parser needs ~200 bytes per byte of source).
MAX_NOTEBOOK_BYTES = 32 << 20
MAX_ANSWER_CHARS = 200_000


class GradeError(Exception):
    """The notebook cannot be graded (exit 2); the message says why."""


# --------------------------------------------------------------------------------------
# Notebooks as JSON: reading, ids and versions
# --------------------------------------------------------------------------------------
def source(cell: dict) -> str:
    src = cell.get("source", "")
    return "".join(src) if isinstance(src, list) else src


def read_capped(path: Path, cap: int = MAX_NOTEBOOK_BYTES, follow: bool = True) -> bytes:
    """The bytes of `path`, a regular file of at most `cap` bytes; GradeError otherwise (a FIFO, a device, a folder,
    a file too large, an unreadable one), never a hang: the file is opened without blocking and checked before any
    byte is read. `follow=False` refuses a symbolic link too."""
    flags = os.O_RDONLY | os.O_NONBLOCK | getattr(os, "O_CLOEXEC", 0) | (0 if follow else os.O_NOFOLLOW)
    try:
        fd = os.open(path, flags)
    except OSError as e:
        raise GradeError(f"cannot read {path}: {e.strerror or e}") from e
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode):
            raise GradeError(f"cannot read {path}: not a regular file (only notebook files are graded)")
        if st.st_size > cap:
            raise GradeError(f"cannot read {path}: {st.st_size} bytes, more than the {cap >> 20} MB a notebook may be")
        chunks, got = [], 0
        while got <= cap:
            chunk = os.read(fd, min(1 << 20, cap + 1 - got))
            if not chunk:
                break
            chunks.append(chunk)
            got += len(chunk)
        if got > cap:
            raise GradeError(f"cannot read {path}: more than the {cap >> 20} MB a notebook may be")
        return b"".join(chunks)
    except OSError as e:
        raise GradeError(f"cannot read {path}: {e.strerror or e}") from e
    finally:
        os.close(fd)


def parse_notebook(data: bytes, path: Path | str) -> dict:
    """The notebook in `data` as a dict, checked enough to be walked safely; GradeError says what is wrong (every
    failure to read it: bad UTF-8, bad JSON, an integer of thousands of digits, nesting too deep)."""
    try:
        nb = json.loads(data.decode("utf-8"))
    except UnicodeDecodeError as e:
        raise GradeError(f"cannot read {path}: it is not UTF-8 text ({e.reason} at byte {e.start})") from e
    except json.JSONDecodeError as e:
        raise GradeError(f"{path} is not valid JSON (line {e.lineno}, column {e.colno}: {e.msg}); "
                         "was it saved by Jupyter?") from e
    except ValueError as e:  # e.g. an integer of more digits than Python converts
        raise GradeError(f"{path} cannot be read as a notebook: {e}") from e
    except (RecursionError, MemoryError) as e:
        raise GradeError(f"{path} is nested too deeply to be a notebook") from e
    return check_notebook(nb, path)


def read_notebook(path: Path) -> dict:
    """The notebook at `path` (a regular file, size-capped: `read_capped`) as a dict; GradeError says what is wrong."""
    return parse_notebook(read_capped(Path(path)), path)


def check_notebook(nb: object, path: Path | str) -> dict:
    """`nb` if it is a notebook that can be walked safely; GradeError says what is wrong."""
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


