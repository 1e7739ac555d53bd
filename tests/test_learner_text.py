"""No development history in what a learner reads (tools/upkeep/learner_text.py holds the linter).

Every notebook, exercise and solution, and the README's learner sections, must be free of dates of runs,
issue numbers, goal lines, "host", "written on", "earlier run" and the like. The negative controls below
prove the linter flags each kind, in each place a learner reads (markdown, printed output, code comments),
including on the notebooks 05 and 07 as they were before they were rebuilt.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "tools" / "upkeep"))
import learner_text  # noqa: E402

# The last commit before notebooks 05 and 07 were rebuilt: both built their story on stored runs of one day.
OLD_REV = "95ea385"


@pytest.mark.parametrize("path", learner_text.learner_files(), ids=lambda p: f"{p.parent.name}/{p.name}")
def test_notebook_has_no_development_history(path: Path) -> None:
    problems = learner_text.lint_notebook(path)
    assert not problems, "\n".join(map(str, problems))


def test_readme_learner_sections_have_no_development_history() -> None:
    problems = learner_text.lint_readme(REPO / "README.md")
    assert not problems, "\n".join(map(str, problems))


def test_every_learner_folder_has_notebooks() -> None:
    folders = {p.parent.name for p in learner_text.learner_files()}
    assert folders == {"notebooks", "exercises", "solutions"}


BAD = [
    ("measured 2026-12-01 05:59 UTC", "a date"),
    ("The benchmark ran again on December 2 on another machine.", "a date"),
    ("run on 3 Dec, plain steps under 2 ms", "a date"),
    ("the benchmark's goals (issue 13), as judged on this run:", "an issue number"),
    ("as issue #29 asked", "an issue number"),
    ("NOT met: EAGLE-3 beats the small model", "a goal line"),
    ("met: prompt lookup about 1x", "a goal line"),
    ("within 0.85-1.15 at every (B, k): (met)", "a goal line"),
    ("goals met (in the order of section 2): no, no, yes", "a goal line"),
    ("On the machine the course was written on, EAGLE-3 was fastest", "'written on'"),
    ("On a faster host of the same kind", "'host'"),
    ("the same kind of 2-core VM", "a VM"),
    ("an earlier run put it at 2", "an earlier run"),
    ("The benchmark ran again a day later", "another day"),
    ("on the second day plain decoding ran faster", "another day"),
    ("as measured in this session", "a session"),
    ("stop 12 of the review", "a stop"),
]

GOOD = [
    "batch 256 by day, batch 8 at night",
    "def __init__(self, host='', user='', passwd=''):",
    "self.host = host_name",
    "you may 3 times draft the same token",
    "the first run of the cell compiles the kernel",
    "the assumption is exact only when p == q",
    "tokens per target pass: 2.61; acceptance by position 0.57 / 0.41",
    "Leviathan et al. (2022), Section 3",
]


@pytest.mark.parametrize("text,kind", BAD, ids=[b[1] + ": " + b[0][:30] for b in BAD])
def test_linter_flags_known_bad_text(text: str, kind: str) -> None:
    kinds = [p.kind for p in learner_text.problems_in_text(text)]
    assert kind in kinds, f"{text!r} gave {kinds}"


@pytest.mark.parametrize("text", GOOD)
def test_linter_passes_ordinary_text(text: str) -> None:
    assert learner_text.problems_in_text(text) == []


def _notebook(cells: list[dict]) -> dict:
    return {"cells": cells, "metadata": {}, "nbformat": 4, "nbformat_minor": 5}


@pytest.mark.parametrize("place", ["markdown", "output", "comment"])
def test_linter_reads_every_place_a_learner_reads(place: str, tmp_path: Path) -> None:
    bad = "NOT met: the goal of issue 13"
    clean_code = {"cell_type": "code", "source": "x = 1\n", "outputs": [], "metadata": {}, "execution_count": 1}
    cell = {
        "markdown": {"cell_type": "markdown", "source": bad, "metadata": {}},
        "output": {**clean_code, "outputs": [{"output_type": "stream", "name": "stdout", "text": [bad + "\n"]}]},
        "comment": {**clean_code, "source": f"x = 1  # {bad}\n"},
    }[place]
    path = tmp_path / "nb.ipynb"
    path.write_text(json.dumps(_notebook([cell])))
    problems = learner_text.lint_notebook(path)
    assert {p.kind for p in problems} == {"a goal line", "an issue number"}, problems
    assert all(place in p.where for p in problems)
    path.write_text(json.dumps(_notebook([clean_code])))  # the same notebook without the line passes
    assert learner_text.lint_notebook(path) == []


def test_cell_metadata_is_not_learner_text(tmp_path: Path) -> None:
    cell = {"cell_type": "code", "source": "x = 1\n", "outputs": [], "execution_count": 1,
            "metadata": {"execution": {"iopub.execute_input": "2026-11-29T14:47:03.251520Z"}}}
    path = tmp_path / "nb.ipynb"
    path.write_text(json.dumps(_notebook([cell])))
    assert learner_text.lint_notebook(path) == []


def test_readme_sections_are_found_and_a_missing_one_is_an_error() -> None:
    readme = (REPO / "README.md").read_text(encoding="utf-8")
    names = [name for name, _ in learner_text.readme_learner_text(readme)]
    assert names == ["introduction", *learner_text.README_LEARNER_SECTIONS]
    with pytest.raises(ValueError, match="For learners"):
        learner_text.readme_learner_text(readme.replace("## For learners", "## Learners"))
    # Development history in a contributors' section is allowed; in a learner section it is flagged.
    history = "\nOn a faster host (2026-12-02) the run took longer.\n"
    assert learner_text.readme_learner_text(readme + "\n## For contributors\n" + history)  # still parses
    flagged = readme.replace("## For learners\n", "## For learners\n" + history)
    assert any(p.kind == "a date" for _, t in learner_text.readme_learner_text(flagged)
               for p in learner_text.problems_in_text(t))


def _old(path: str) -> str | None:
    try:
        out = subprocess.run(["git", "-C", str(REPO), "show", f"{OLD_REV}:{path}"], capture_output=True, text=True,
                             timeout=30)
    except (OSError, subprocess.TimeoutExpired):
        return None
    return out.stdout if out.returncode == 0 else None


@pytest.mark.parametrize("path", ["notebooks/05_choosing_a_draft.ipynb", "notebooks/07_when_speculation_hurts.ipynb",
                                  "README.md"])
def test_linter_flags_the_old_files(path: str, tmp_path: Path) -> None:
    """Negative control on real files: the versions of 05, 07 and the README before the rebuild."""
    text = _old(path)
    if text is None:
        pytest.skip(f"git history with {OLD_REV} is not available (a shallow or exported copy)")
    old = tmp_path / Path(path).name
    old.write_text(text)
    problems = learner_text.lint_readme(old) if path.endswith(".md") else learner_text.lint_notebook(old)
    kinds = {p.kind for p in problems}
    expected = {"a date", "'host'"} | ({"'written on'"} if path.endswith(".md") else {"a goal line"})
    assert expected <= kinds, kinds


# -- code: comments and docstrings of every .py file carry no history -----------------------------------------


def test_code_has_no_development_history() -> None:
    files = learner_text.code_files()
    problems = [p for f in files for p in learner_text.lint_python(f)]
    assert not problems, "\n".join(map(str, problems))


def test_code_files_are_every_code_folder_but_historys_home() -> None:
    rel = {p.relative_to(REPO).as_posix() for p in learner_text.code_files()}
    for expected in ("specref/drafts/base.py", "specref_grading/grade.py", "tests/test_draft_contract.py",
                     "tools/upkeep/house.py", "benchmarks/bench_drafts.py"):
        assert expected in rel, expected
    assert not any(r.startswith("benchmarks/history/") for r in rel)
    assert not set(learner_text.CODE_EXEMPT) & rel


DATED = '''"""Speedup as measured 2026-12-01 on the grown target."""


def f(x):
    """Twice x, as issue 46 asked."""
    return 2 * x  # the fix of Dec 3, see PR #12
'''

CLEAN = '''"""One read back to the host per step; the first run of the loop compiles the kernel."""


def f(x):
    """Twice x; printed as "met" or "NOT met" live by a benchmark."""
    when = "2026-12-01"  # a string in code, not a comment or a docstring
    return 2 * x
'''


def test_a_dated_docstring_or_comment_is_flagged_and_code_is_not(tmp_path: Path) -> None:
    """Negative control: a date and an issue number in a module docstring, a function docstring and a comment."""
    path = tmp_path / "dated.py"
    path.write_text(DATED)
    found = {(p.where.rsplit(":", 1)[1], p.kind) for p in learner_text.lint_python(path, repo=tmp_path)}
    assert found == {("1", "a date"), ("5", "an issue number"), ("6", "a date"), ("6", "an issue number")}, found
    path.write_text(CLEAN)  # "host", a loop's first run, a goal verdict, a date in a string: not history in code
    assert learner_text.lint_python(path, repo=tmp_path) == []


def test_history_lives_only_in_benchmarks_history(tmp_path: Path) -> None:
    """A dated .py under benchmarks/history/ is left alone; the same file beside it is flagged."""
    for folder in ("benchmarks/history", "benchmarks", "specref", "tests"):
        (tmp_path / folder).mkdir(parents=True, exist_ok=True)
        (tmp_path / folder / "dated.py").write_text(DATED)
    files = learner_text.code_files(tmp_path)
    assert {p.relative_to(tmp_path).as_posix() for p in files} == {"benchmarks/dated.py", "specref/dated.py",
                                                                    "tests/dated.py"}
    flagged = {p.where.split(":")[0] for f in files for p in learner_text.lint_python(f, repo=tmp_path)}
    assert flagged == {"benchmarks/dated.py", "specref/dated.py", "tests/dated.py"}
    assert learner_text.main([str(tmp_path / "benchmarks" / "dated.py")]) == 1
