"""The README's set-up works on a fresh clone: `make venv` alone makes a ready environment.

A green suite in a long-lived checkout can hide a missing install step (a package
installed by hand, a module importable only from the repo root). This test clones
the committed HEAD (uncommitted changes are not part of it, as in CI) into a
temporary folder, runs the README's set-up there with a plain `python3` on PATH,
and then checks the result from outside the clone: the readiness report passes,
`specref` is imported from the clone, the installed versions are the pins, and a
second `make venv` has nothing to do. pip's cache and the torch wheel on disk
keep it to a few minutes.

The clone runs no tests of its own, and SPECREF_FRESH_CLONE guards against this
test being started again from inside one.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
GUARD = "SPECREF_FRESH_CLONE"
SETUP_TIMEOUT_S = 900

pytestmark = [pytest.mark.fresh_clone, pytest.mark.slow, pytest.mark.timeout(SETUP_TIMEOUT_S + 300)]


def clean_env() -> dict[str, str]:
    """This process's environment without its virtual environment: `python3` is the machine's."""
    drop = ("VIRTUAL_ENV", "PYTHONPATH", "PYTHONHOME", "MAKEFLAGS", "MFLAGS", "MAKELEVEL")
    env = {k: v for k, v in os.environ.items() if k not in drop}
    venv_bin = str(Path(sys.prefix) / "bin")
    env["PATH"] = os.pathsep.join(p for p in env.get("PATH", "").split(os.pathsep) if p and p != venv_bin)
    env[GUARD] = "1"
    return env


def run(cmd: list[str], cwd: Path, env: dict[str, str], timeout: float = 300) -> subprocess.CompletedProcess:
    proc = subprocess.run(cmd, cwd=cwd, env=env, capture_output=True, text=True, timeout=timeout)
    assert proc.returncode == 0, f"{' '.join(cmd)} failed ({proc.returncode}):\n{proc.stdout[-4000:]}\n{proc.stderr[-4000:]}"
    return proc


@pytest.fixture(scope="module")
def clone(tmp_path_factory):
    if os.environ.get(GUARD):
        pytest.skip("already inside a fresh-clone check")
    if shutil.which("git") is None or shutil.which("make") is None:
        pytest.fail("git and make are needed for the fresh-clone check")
    head = subprocess.run(["git", "rev-parse", "HEAD"], cwd=REPO, capture_output=True, text=True)
    if head.returncode != 0:
        pytest.skip("not a git checkout")
    root = tmp_path_factory.mktemp("fresh")
    dest = root / "specref"
    env = clean_env()
    try:
        run(["git", "clone", "--quiet", str(REPO), str(dest)], root, env)
        run(["make", "venv"], dest, env, timeout=SETUP_TIMEOUT_S)
        yield dest, env
    finally:
        shutil.rmtree(root, ignore_errors=True)  # a venv with torch is ~1 GB


def test_readiness_report_passes_outside_the_clone(clone, tmp_path):
    dest, env = clone
    proc = run([str(dest / ".venv" / "bin" / "python"), "-m", "specref"], tmp_path, env, timeout=120)
    assert proc.stdout.rstrip().splitlines()[-1].startswith("READY"), proc.stdout


def test_specref_is_imported_from_the_clone(clone, tmp_path):
    dest, env = clone
    proc = run([str(dest / ".venv" / "bin" / "python"), "-c", "import specref; print(specref.__file__)"], tmp_path, env)
    assert Path(proc.stdout.strip()).resolve().is_relative_to(dest.resolve())


def test_the_clone_runs_the_pinned_versions(clone):
    dest, env = clone
    run([str(dest / ".venv" / "bin" / "python"), "-m", "pytest", "-q", "-p", "no:cacheprovider",
         "tests/test_environment.py::test_this_environment_runs_the_pinned_versions"], dest, env)


def test_jupyterlab_and_its_widget_extension_are_installed(clone):
    dest, env = clone
    proc = run([str(dest / ".venv" / "bin" / "jupyter"), "labextension", "list"], dest, env)
    assert "@jupyter-widgets/jupyterlab-manager" in proc.stdout + proc.stderr


def test_second_setup_has_nothing_to_do(clone):
    dest, env = clone
    proc = subprocess.run(["make", "-q", "venv"], cwd=dest, env=env, capture_output=True, text=True)
    assert proc.returncode == 0, "make venv would run again: the stamp does not make set-up idempotent"


def test_the_clone_grades_wherever_it_lies(clone, tmp_path):
    # The clone lies under pytest's temporary folder (/tmp on Linux), where learners and CI systems clone too:
    # the jail binds the clone's venv and its specref copy inside the kernel's own empty /tmp.
    dest, env = clone
    assert str(dest.resolve()).startswith(tempfile_root()), dest
    solution = "solutions/ex02_accept_reject.ipynb"
    unjailed = [] if os.geteuid() == 0 else ["UNJAILED=1"]  # without root no jail: graded only when asked
    proc = run(["make", "grade", f"NB={solution}", f"SOLUTION={solution}", "SEED=3", *unjailed], dest, env, timeout=600)
    status = proc.stdout.rstrip().splitlines()[-1]
    assert "hidden seed 3" in proc.stdout, proc.stdout
    assert status == "status: full marks" or status.startswith("status: autograded checks passed, "), proc.stdout
    assert "could not be graded" not in proc.stdout, proc.stdout
    if os.geteuid() == 0:  # as root the kernel is jailed; without root the report says what it cannot promise
        assert "not in a jail" not in proc.stdout, proc.stdout
    folder = tmp_path / "class"
    folder.mkdir()
    shutil.copy(dest / "exercises" / "ex02_accept_reject.ipynb", folder / "stub.ipynb")
    graded = subprocess.run(["make", "grade-all", f"DIR={folder}", *unjailed], cwd=dest, env=env, capture_output=True,
                            text=True, timeout=900)
    # the grader exits 1 (the unsolved stub fails its checks), which make reports as its recipe's Error 1
    why = graded.stdout[-4000:] + graded.stderr[-4000:]
    assert graded.returncode == 2 and "grade-all] Error 1" in graded.stderr, why
    assert "graded 1 of 1 submissions" in graded.stdout, graded.stdout
    book = (tmp_path / "class-grading" / "gradebook.csv").read_text()  # beside the class's folder, not in it
    assert "stub.ipynb" in book and "some checks failed" in book, book
    # The run again: nothing changed, so nothing is regraded and the gradebook stays.
    again = subprocess.run(["make", "grade-all", f"DIR={folder}", *unjailed], cwd=dest, env=env, capture_output=True,
                           text=True, timeout=900)
    assert "graded 0 of 1 submissions" in again.stdout and "1 unchanged, not regraded" in again.stdout, again.stdout
    assert (tmp_path / "class-grading" / "gradebook.csv").read_text() == book
    merged = run(["make", "grade-merge", f"DIR={folder}"], dest, env, timeout=300)
    assert "merged 0 hand marks" in merged.stdout, merged.stdout
    # The release for a class graded on ex02: its answer key is not in the released specref.
    released = tmp_path / "release"
    out = run(["make", "release", f"DIR={released}", "GRADED=ex02"], dest, env, timeout=600)
    assert "graded from this release: ex02" in out.stdout, out.stdout
    assert not (released / "specref" / "chain_verify.py").exists()
    assert (released / "exercises" / "ex02_accept_reject.ipynb").exists()


def tempfile_root() -> str:
    import tempfile

    return os.path.realpath(tempfile.gettempdir())


def test_the_class_is_graded_from_a_non_editable_install(clone, tmp_path):
    """`pip install .` (not editable) in the clone's venv: the grader and specref then live in site-packages, and
    `make grade`, `make grade-all` (with its resume), `make grade-merge` and `make release` still work. Last in this
    file: it replaces the clone's editable install."""
    dest, env = clone
    run([str(dest / ".venv" / "bin" / "python"), "-m", "pip", "install", "--quiet", "--no-deps", "--no-index",
         "--no-build-isolation", "."], dest, env, timeout=600)
    where = run([str(dest / ".venv" / "bin" / "python"), "-I", "-c",
                 "import specref, specref_grading.grade as g; print(specref.__file__); print(g.__file__)"],
                tmp_path, env).stdout.split()
    assert all("site-packages" in w for w in where), where
    unjailed = [] if os.geteuid() == 0 else ["UNJAILED=1"]
    solution = "solutions/ex05_prompt_lookup.ipynb"
    proc = run(["make", "grade", f"NB={solution}", f"SOLUTION={solution}", "SEED=4", *unjailed], dest, env,
               timeout=600)
    status = proc.stdout.rstrip().splitlines()[-1]
    assert status == "status: full marks" or status.startswith("status: autograded checks passed, "), proc.stdout
    folder = tmp_path / "class"
    folder.mkdir()
    shutil.copy(dest / "exercises" / "ex05_prompt_lookup.ipynb", folder / "stub.ipynb")  # stamped: found by its id
    for expect in ("graded 1 of 1 submissions", "graded 0 of 1 submissions"):  # the run, then its resume
        graded = subprocess.run(["make", "grade-all", f"DIR={folder}", *unjailed], cwd=dest, env=env,
                                capture_output=True, text=True, timeout=900)
        assert expect in graded.stdout, graded.stdout + graded.stderr[-4000:]
    book = (tmp_path / "class-grading" / "gradebook.csv").read_text()
    assert "stub.ipynb" in book and "some checks failed" in book, book
    merged = run(["make", "grade-merge", f"DIR={folder}"], dest, env, timeout=300)
    assert "hand marks from" in merged.stdout and "gradebook:" in merged.stdout, merged.stdout
    released = tmp_path / "release"
    out = run(["make", "release", f"DIR={released}", "GRADED=ex05"], dest, env, timeout=600)
    assert "graded from this release: ex05" in out.stdout, out.stdout
    assert (released / "exercises" / "ex05_prompt_lookup.ipynb").exists()
    assert not (released / "specref" / "drafts" / "prompt_lookup.py").exists()
