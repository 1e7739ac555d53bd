"""Prove the graders grade: every graded cell passes on the solution and fails on the stub.

    python -m specref_grading.selfcheck                       # every notebook in solutions/
    python -m specref_grading.selfcheck solutions/ex02_accept_reject.ipynb

For each solution notebook, specref_grading/grade.py grades the solution itself (its answers,
hidden tests included) and the exercise generated from it (as a learner receives it), each
across the wall (answers in a jailed kernel, tests in a trusted process), and reads the learner's copy
of every test cell: one made of hidden tests only would pass there, unsolved. A graded code cell that
fails on the solution is a broken test; one that passes on the stub would give points for doing nothing;
a test that the trusted side flags for review on the solution (e.g. a function that changed its inputs)
would flag honest learners too (the scanner's notes, specref_grading/scan.py, never withhold points).
All are reported, and so is a solution notebook with no autograded cell at all.
"""

from __future__ import annotations

import argparse
import ast
import json
import sys
from pathlib import Path

import nbformat

from specref_grading.exercises import make_exercise, notebooks_in
from specref_grading.grade import GradeError, build_plan, grade_plan

ROOT = Path(__file__).resolve().parents[1]


def _plain(nb) -> dict:
    return json.loads(nbformat.writes(nb))


def _has_code(source: str) -> bool:
    try:
        return bool(ast.parse(source).body)
    except SyntaxError:
        return True


def self_check(solution_path: Path) -> list[str]:
    """Problems with one solution notebook's grading; an empty list means it grades correctly."""
    solution_path = Path(solution_path).resolve()
    name = solution_path.name
    solution = nbformat.read(solution_path, as_version=4)
    stub = make_exercise(solution, name)
    try:
        on_solution = grade_plan(build_plan(_plain(solution), _plain(solution), name))
        on_stub = grade_plan(build_plan(_plain(solution), _plain(stub), name))
    except GradeError as e:
        return [f"{name}: {e}"]
    problems = []
    if not on_solution:
        problems.append(f"{name}: no autograded cell (metadata.nbgrader.grade on a code cell)")
    for r in on_solution:
        if r.outcome != "passed":
            problems.append(f"{name}: graded cell {r.grade_id!r} does not pass on the solution: "
                            f"{r.outcome} {r.message}".rstrip())
        for flag in r.flags:
            problems.append(f"{name}: graded cell {r.grade_id!r} is flagged for review on the solution: {flag}")
    for r in on_stub:
        if r.outcome == "passed":
            problems.append(f"{name}: graded cell {r.grade_id!r} passes on the unsolved stub: it would give "
                            "points for doing nothing")
    for cell in stub.cells:  # the learner's own copy must fail until solved: a visible check in every test cell
        meta = cell.metadata.get("nbgrader", {})
        if meta.get("grade") and not meta.get("solution") and cell.cell_type == "code" and not _has_code(cell.source):
            problems.append(f"{name}: graded cell {meta.get('grade_id')!r} passes on the unsolved stub in the "
                            "learner's copy (it holds hidden tests only): keep a visible check in every test cell")
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
