"""The grader's version key: any change to a file that can change a grade changes the key, so a resumed class
run regrades; a file no grade depends on leaves it as it was."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from specref_grading import classrun, version

REPO = Path(__file__).resolve().parents[1]
SOLUTIONS = sorted((REPO / "solutions").glob("ex*.ipynb"))


@pytest.fixture(scope="module")
def tree(tmp_path_factory) -> Path:
    """A copy of the sources the key reads (specref/ and specref_grading/, Python files only), to edit freely."""
    root = tmp_path_factory.mktemp("tree")
    for package in ("specref", "specref_grading"):
        for path in (REPO / package).rglob("*.py"):
            if "__pycache__" not in path.parts:
                dest = root / path.relative_to(REPO)
                dest.parent.mkdir(parents=True, exist_ok=True)
                shutil.copy2(path, dest)
    return root


def _edited(path: Path) -> bytes:
    old = path.read_bytes()
    path.write_bytes(old + b"\n# an edit\n")
    return old


GRADING_FILES = sorted(str(p.relative_to(REPO)) for p in (REPO / "specref_grading").rglob("*.py")
                       if "__pycache__" not in p.parts)


@pytest.mark.parametrize("rel", GRADING_FILES)
def test_every_file_of_the_grading_package_is_in_the_key(tree, rel):
    # the wall, the jail, the protocol, the trusted process, the plan, the checks and the exercise generator
    solution = REPO / "solutions" / "ex02_accept_reject.ipynb"
    before = version.grader_version(solution, tree)
    old = _edited(tree / rel)
    try:
        assert version.grader_version(solution, tree) != before, rel
    finally:
        (tree / rel).write_bytes(old)
    assert version.grader_version(solution, tree) == before


@pytest.mark.parametrize("solution", SOLUTIONS, ids=[p.stem for p in SOLUTIONS])
def test_every_exercise_reaches_specref_through_its_key(tree, solution):
    files = {str(p.relative_to(tree)) for p in version.grader_files(solution, tree)}
    assert "specref/__init__.py" in files and "specref_grading/checks/rules.py" in files, sorted(files)


def test_each_specref_module_an_exercise_reaches_changes_its_key(tree):
    solution = REPO / "solutions" / "ex05_prompt_lookup.ipynb"  # the exercise that reaches the most of specref
    reached = sorted(str(p.relative_to(tree)) for p in version.grader_files(solution, tree)
                     if p.relative_to(tree).parts[0] == "specref")
    assert len(reached) > 20, reached
    for rel in reached:
        before = version.grader_version(solution, tree)
        old = _edited(tree / rel)
        try:
            assert version.grader_version(solution, tree) != before, rel
        finally:
            (tree / rel).write_bytes(old)


def test_what_an_exercise_imports_is_followed_through_the_modules_it_imports(tree):
    # ex02's setup imports specref.checks.rng, which imports specref.sampling; the checks import specref.rejection
    files = {str(p.relative_to(tree)) for p in version.grader_files(REPO / "solutions" / "ex02_accept_reject.ipynb",
                                                                    tree)}
    assert {"specref/checks/rng.py", "specref/sampling.py", "specref/_validate.py"} <= files, sorted(files)


def test_a_file_no_grade_reaches_leaves_the_key_alone(tree):
    # the negative control: a module of specref no exercise's cells reach (notebooks' plotting) is not in ex02's key
    solution = REPO / "solutions" / "ex02_accept_reject.ipynb"
    files = {str(p.relative_to(tree)) for p in version.grader_files(solution, tree)}
    assert "specref/course/plots.py" not in files
    before = version.grader_version(solution, tree)
    old = _edited(tree / "specref" / "course" / "plots.py")
    try:
        assert version.grader_version(solution, tree) == before
    finally:
        (tree / "specref" / "course" / "plots.py").write_bytes(old)


def test_a_resumed_run_regrades_when_the_key_changes(tmp_path, monkeypatch):
    """The key is what the class run compares: a new key regrades every submission, the same key none."""
    sol_dir, sub = tmp_path / "solutions", tmp_path / "class"
    sol_dir.mkdir()
    sub.mkdir()
    graded: list[str] = []

    def fake_grade(path, solutions_dir=None, **kw):
        graded.append(Path(path).name)
        return classrun.Report(str(path), error="not graded in this test")

    nb = {"cells": [], "metadata": {}, "nbformat": 4, "nbformat_minor": 5}
    (sub / "a.ipynb").write_text(json.dumps(nb))
    monkeypatch.setattr(classrun, "grade", fake_grade)
    keys = iter(["one", "one", "two"])
    monkeypatch.setattr(classrun, "grader_version", lambda solution=None: next(keys))
    for _ in range(3):
        classrun.run(sub, tmp_path / "book.csv", jobs=1, seed=5, solutions_dir=sol_dir, echo=lambda line: None)
    assert graded == ["a.ipynb", "a.ipynb"]  # the first run, then the run whose key changed
