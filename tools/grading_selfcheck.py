"""Prove the graders grade: every graded cell passes on the solution and fails on the stub.

    python tools/grading_selfcheck.py                       # every notebook in solutions/
    python tools/grading_selfcheck.py solutions/ex02_accept_reject.ipynb

For each solution notebook, run it as it is (hidden tests included) and the exercise
generated from it (as a learner receives it) with ``pytest --nbval-lax`` through
tools/grade.py. A graded code cell that fails on the solution is a broken test; one
that passes on the stub would give points for doing nothing. Both are reported, and
so is a solution notebook with no autograded cell at all.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import nbformat

sys.path.insert(0, str(Path(__file__).resolve().parent))

from grade import grade_notebooks  # noqa: E402
from make_exercises import make_exercise, notebooks_in  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]


def self_check(solution_path: Path, exercises_dir: Path | None = None) -> list[str]:
    """Problems with one solution notebook's grading; an empty list means it grades correctly.

    The solution runs in its own folder and the stub in `exercises_dir` (default: the
    exercises/ folder beside the solution's folder), where learners run it.
    """
    solution_path = Path(solution_path).resolve()
    exercises_dir = exercises_dir or solution_path.parent.parent / "exercises"
    name = solution_path.name
    solution = nbformat.read(solution_path, as_version=4)
    stub = make_exercise(solution, name)
    on_solution, on_stub = grade_notebooks([(solution, solution_path.parent), (stub, Path(exercises_dir))])
    problems = []
    auto = [r for r in on_solution if r.outcome != "manual"]
    if not auto:
        problems.append(f"{name}: no autograded cell (metadata.nbgrader.grade on a code cell)")
    for r in auto:
        if not r.passed:
            problems.append(f"{name}: graded cell {r.grade_id!r} (Cell {r.code_index}) does not pass on the "
                            f"solution: {r.outcome} {r.message}".rstrip())
    for r in on_stub:
        if r.outcome != "manual" and r.passed:
            problems.append(f"{name}: graded cell {r.grade_id!r} (Cell {r.code_index}) passes on the unsolved "
                            "stub: it would give points for doing nothing")
    return problems


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description="Check that every graded cell passes on the solution and fails on the stub.")
    ap.add_argument("solutions", nargs="*", type=Path)
    args = ap.parse_args(argv)
    paths = args.solutions or notebooks_in(ROOT / "solutions")
    problems = []
    for path in paths:
        found = self_check(path)
        print(f"{path.name}: {'ok' if not found else f'{len(found)} problem(s)'}")
        problems += found
    for line in problems:
        print(line, file=sys.stderr)
    return 1 if problems else 0


if __name__ == "__main__":
    raise SystemExit(main())
