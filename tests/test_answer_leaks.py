"""No check-your-understanding answer or exercise's expected value is in sight before its question.

The lint is `tools/upkeep/answer_leaks.py`. Its negative controls build a small course in a temporary folder
(a lecture, its exercise as a solution and as handed out, a README): one that leaks must be flagged, the same one
without the leak must pass. Then the committed course must pass, and every exception the lint lists
(`KNOWN`) must still be needed.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tools" / "upkeep"))
import answer_leaks  # noqa: E402

REPO = Path(__file__).resolve().parents[1]


def _md(source: str, **specref) -> dict:
    return {"cell_type": "markdown", "metadata": {"specref": specref} if specref else {}, "source": source}


def _code(source: str, printed: str = "") -> dict:
    outputs = [{"output_type": "stream", "name": "stdout", "text": printed}] if printed else []
    return {"cell_type": "code", "metadata": {}, "source": source, "outputs": outputs, "execution_count": None}


def _write(path: Path, cells: list[dict]) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps({"cells": cells, "metadata": {}, "nbformat": 4, "nbformat_minor": 5}))
    return path


QUESTIONS = _md("## Check your understanding\n\n1. With alpha = 0.6 and `k = 3`, how many tokens per step?\n"
                "2. A greedy step drafts `[3, 4, 1, 5]` against the argmax `[3, 4, 0, 5, 5]`. What does it emit?")
ANSWERS = _md("### Check your answer\n\n<details><summary>Answers</summary>\n\n"
              "1. $1 + 0.6 + 0.36 + 0.216 = 2.18$ tokens.\n2. `[3, 4, 0]`: the third draft is rejected.\n\n</details>")
SUMMARY = _md("## Summary\n\n- For alpha = 0.6 and k = 3 a step emits 2.18 tokens; greedy emits [3, 4, 0] here.")


def _course(tmp_path: Path, before: list[dict], readme: str = "# course\n", exercise_md: str = "",
            rubric: str = "**Rubric.** 1 point: the numbers (sampled 0.5, then 1, 2).") -> Path:
    """A lecture 03 with `before` ahead of its questions, and exercise 03 whose Task 1 has `rubric`."""
    _write(tmp_path / "notebooks" / "03_speed.ipynb",
           [_md("# Notebook 3"), *before, QUESTIONS, _code("# your working"), ANSWERS, SUMMARY])
    solution = [_md("# Exercise 3"), _md(exercise_md or "Some set-up."), _code("import torch"),
                _md("## Task 1 · Explain (2 points)\n\nUse alpha = 0.8 and `k = 4`. Explain."),
                _md("### BEGIN SOLUTION\nIt is so.\n### END SOLUTION"), _md(rubric, rubric="ex03_explain")]
    _write(tmp_path / "solutions" / "ex03_speed.ipynb", solution)
    _write(tmp_path / "exercises" / "ex03_speed.ipynb", [c for c in solution if "rubric" not in str(c["metadata"])])
    (tmp_path / "README.md").write_text(readme)
    return tmp_path


def _leaks(repo: Path) -> set[tuple[str, str]]:
    return {(leak.literal, leak.where.split(" cell ")[0]) for leak in answer_leaks.lint_all(repo, known={})}


def test_a_clean_course_passes(tmp_path):
    """Trivial numbers, a question's own givens and the summary after the answers are no leak."""
    before = [_md("Tokens per step for alpha = 0.5: E = 1, 2 or 0.5 of a pass."),
              _code("print(drafts)", "drafts [3, 4, 1, 5], argmax [3, 4, 0, 5, 5]\nc = 0.05, k = 8\n")]
    assert _leaks(_course(tmp_path, before)) == set()


@pytest.mark.parametrize("cell", [
    _code("print(E(0.6, 3))", "alpha = 0.6, k = 3: 2.18 tokens per step\n"),  # 03[12], as it once was
    _md("Things to try: $\\alpha = 0.6$, `k = 3` (2.18 tokens per step)."),  # 03[23], as it once was
], ids=["printed", "written"])
def test_a_number_answered_earlier_is_flagged(tmp_path, cell):
    assert _leaks(_course(tmp_path, [cell])) == {("2.18", "notebooks/03_speed.ipynb")}


def test_a_timing_cell_prints_this_machines_figures_and_is_not_read(tmp_path):
    """A cell marked NBVAL_IGNORE_OUTPUT prints this run's timings: the same literal in its source is still read."""
    timed = _code("# NBVAL_IGNORE_OUTPUT\nprint(speedup)", "measured 2.18x plain decoding\n")
    assert _leaks(_course(tmp_path / "timed", [timed])) == set()
    stated = _code("# NBVAL_IGNORE_OUTPUT\nE = 2.18  # the answer, in the source", "")
    assert _leaks(_course(tmp_path / "stated", [stated])) == {("2.18", "notebooks/03_speed.ipynb")}


def test_a_token_list_answered_earlier_is_flagged(tmp_path):
    """02[18] as it once was: the greedy case of question 2, printed before the question."""
    printed = "context 0: drafts [3, 4, 1, 5]  target argmax [3, 4, 0, 5, 5]  emits [3, 4, 0]\n"
    assert _leaks(_course(tmp_path, [_code("show()", printed)])) == {("[3, 4, 0]", "notebooks/03_speed.ipynb")}


def test_the_readme_and_the_companion_exercise_are_read(tmp_path):
    repo = _course(tmp_path, [], readme="| ex03 | tokens per step, 2.18 at alpha 0.6 |",
                   exercise_md="Notebook 03 greedy: emits [3, 4, 0].")
    assert _leaks(repo) == {("2.18", "README.md"), ("[3, 4, 0]", "exercises/ex03_speed.ipynb")}


def test_an_exercise_answer_in_its_companion_lecture_is_flagged(tmp_path):
    """ex06 Task 4 in spirit: the expected numbers already printed by the lecture."""
    rubric = "**Rubric.** 1 point: node A sampled 0.550, 0.735, 0.815."
    clean = _course(tmp_path / "clean", [_code("print(p)", "p = (0.7, 0.3)\n")], rubric=rubric)
    assert _leaks(clean) == set()
    leaky = _course(tmp_path / "leaky", [_code("print(node)", "two sampled children: 0.735\n")], rubric=rubric)
    assert _leaks(leaky) == {("0.735", "notebooks/03_speed.ipynb")}
    earlier = _course(tmp_path / "earlier", [], rubric=rubric, exercise_md="Two children accept 0.735 of the time.")
    assert _leaks(earlier) == {("0.735", "exercises/ex03_speed.ipynb")}


def test_literals():
    text = "E = 2.18, 0.48 and 0.5; 1000 runs, 6694 samples (2023); [3, 4, 0] and [1]; 12.184 v2.185"
    assert answer_leaks.distinctive_literals(text) == {"2.18", "6694", "12.184", "[3, 4, 0]"}
    assert answer_leaks.appears("2.18", "is 2.18.") and not answer_leaks.appears("2.18", "12.18 or 2.185")


def test_the_committed_course_has_no_answer_in_sight_before_its_question():
    leaks = answer_leaks.lint_all(REPO)
    assert not leaks, "\n".join(map(str, leaks))


def test_every_known_exception_is_still_needed():
    found = {(leak.answer, leak.literal) for leak in answer_leaks.lint_all(REPO, known={})}
    stale = sorted(set(answer_leaks.KNOWN) - found)
    assert not stale, f"remove from answer_leaks.KNOWN, they no longer occur: {stale}"
