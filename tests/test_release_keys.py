"""A release graded for an exercise ships none of its answer key: each key is a module, and the module is absent.

Every exercise's key (the specref modules its check modules forbid: `release.answer_keys`) is a module of the
package, so the released specref, built like the kernel's copy, leaves each one out whole and keeps every other
module as the package's own file. The read-back (`release.keys_present`) finds a key's source or compiled file
wherever it lies; planted into a release, it is found (the negative control).
"""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest

from specref_grading import release
from specref_grading.trust import kernel_tree

KEYS = release.answer_keys()
PACKAGE = release.ROOT / "specref"


def _files(package: Path, key: str) -> list[Path]:
    """Every file of `key` (a dotted module) under the package folder: its source, its package folder, its
    compiled file."""
    rel = Path(*key.split(".")[1:])
    return [p for p in (package / rel.with_suffix(".py"), package / rel) if p.exists()] + list(
        (package / rel).parent.glob(f"__pycache__/{rel.name}.*.pyc"))


def test_every_answer_key_is_a_module_of_the_package():
    reading = kernel_tree.Reading(PACKAGE)
    assert KEYS and all(KEYS.values())
    for exercise, keys in KEYS.items():
        assert all(k in reading.modules for k in keys), (exercise, keys)
        assert release.keys_present(PACKAGE, keys) == list(keys)  # found where they are: the read-back can see


@pytest.mark.parametrize("exercise", sorted(KEYS))
def test_a_release_graded_for_an_exercise_holds_no_file_of_its_key(exercise, tmp_path):
    selection = release.strip_keys((exercise,), KEYS, tmp_path)
    package = tmp_path / "specref"
    assert release.keys_present(package, KEYS[exercise]) == []
    for key in KEYS[exercise]:
        assert _files(package, key) == [], key
        assert not selection.available(key)
    for path in package.rglob("*.py"):  # every module that ships is the package's own file
        assert path.read_bytes() == (PACKAGE / path.relative_to(package)).read_bytes(), path
    others = {m for e, keys in KEYS.items() if e != exercise for m in keys} - set(KEYS[exercise])
    assert others & selection.kept  # the other exercises' keys still ship: practice only


def test_a_release_graded_for_every_exercise_holds_no_key(tmp_path):
    release.strip_keys(tuple(KEYS), KEYS, tmp_path)
    every = tuple(sorted({k for keys in KEYS.values() for k in keys}))
    assert release.keys_present(tmp_path / "specref", every) == []
    assert (tmp_path / "specref" / "sampling.py").is_file()  # the rules every exercise builds on still ship


@pytest.mark.parametrize("planted", ["source", "compiled", "package"])
def test_a_key_planted_into_a_release_is_found(tmp_path, planted):
    """Negative control of the read-back: the key's source, its compiled file, or a module under a key package."""
    release.strip_keys(("ex01_roofline", "ex05_prompt_lookup"), KEYS, tmp_path)
    package = tmp_path / "specref"
    assert release.keys_present(package, ("specref.perf.roofline", "specref.drafts.prompt_lookup")) == []
    if planted == "source":
        shutil.copyfile(PACKAGE / "perf" / "roofline.py", package / "perf" / "roofline.py")
        want = ["specref.perf.roofline"]
    elif planted == "compiled":
        (package / "drafts" / "__pycache__").mkdir(exist_ok=True)
        (package / "drafts" / "__pycache__" / "prompt_lookup.cpython-311.pyc").write_bytes(b"\0" * 16)
        want = ["specref.drafts.prompt_lookup"]
    else:
        (package / "perf" / "roofline").mkdir()
        (package / "perf" / "roofline" / "__init__.py").write_text("")
        want = ["specref.perf.roofline"]
    assert release.keys_present(package, ("specref.perf.roofline", "specref.drafts.prompt_lookup")) == want
