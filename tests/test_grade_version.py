"""The grader's version key: any change to a file that can change a grade changes the key, so a resumed class
run regrades; a file no grade depends on leaves it as it was."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from specref_grading import classrun, version

REPO = Path(__file__).resolve().parents[1]


@pytest.fixture(scope="module")
def tree(tmp_path_factory) -> Path:
    """A copy of what the key reads (specref/ with its assets, specref_grading/) and a file beside them."""
    root = tmp_path_factory.mktemp("tree")
    for package in version.PACKAGES:
        shutil.copytree(REPO / package, root / package, ignore=shutil.ignore_patterns("__pycache__"))
    (root / "notebooks").mkdir()
    shutil.copy2(REPO / "README.md", root / "notebooks" / "README.md")
    return root


def _changes_the_key(tree: Path, rel: str) -> bool:
    before = version.grader_version(tree)
    path = tree / rel
    old = path.read_bytes()
    path.write_bytes(old + b"\n")
    try:
        return version.grader_version(tree) != before
    finally:
        path.write_bytes(old)


def _files(tree: Path, package: str) -> list[str]:
    return sorted(str(p.relative_to(tree)) for p in (tree / package).rglob("*") if p.is_file())


def test_every_file_of_the_grading_package_changes_the_key(tree):
    # the wall, the jail, the kernel's specref, the protocol, the trusted process, the plan, the checks and the
    # exercise generator: every one decides some grade
    files = _files(tree, "specref_grading")
    assert {"specref_grading/trust/trusted.py", "specref_grading/trust/wall.py", "specref_grading/jail.py",
            "specref_grading/trust/calls.py", "specref_grading/trust/kernel_tree.py",
            "specref_grading/exercises.py", "specref_grading/checks/accept_reject.py"} <= set(files)
    assert [f for f in files if not _changes_the_key(tree, f)] == []


def test_every_file_of_specref_changes_the_key_its_assets_included(tree):
    # ex04's checks load the bundled pair (models/pair.py, reached through specref's lazy names, and its weights);
    # the copy of specref a learner's kernel sees is made from all of specref
    files = _files(tree, "specref")
    assert {"specref/models/pair.py", "specref/models/gpt2.py", "specref/_lazy.py"} <= set(files)
    assets = [f for f in files if f.startswith("specref/assets/")]
    assert any(f.endswith(".safetensors") for f in assets) and any(f.endswith(".json") for f in assets), assets
    assert [f for f in files if not _changes_the_key(tree, f)] == []


def test_a_file_no_grade_depends_on_leaves_the_key_alone(tree):
    # the negative control: the same edit outside the two packages changes nothing
    assert not _changes_the_key(tree, "notebooks/README.md")
    assert version.grader_version(tree) == version.grader_version(tree)


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
    monkeypatch.setattr(classrun, "grader_version", lambda: next(keys))
    for _ in range(3):
        classrun.run(sub, tmp_path / "book.csv", jobs=1, seed=5, solutions_dir=sol_dir, echo=lambda line: None)
    assert graded == ["a.ipynb", "a.ipynb"]  # the first run, then the run whose key changed


# About the grader, not numerics of ours: tools/upkeep/portable.py leaves these out.
pytestmark = pytest.mark.grader
