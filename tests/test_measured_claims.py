"""No hand-written sentence states how a timing came out: notebooks generate such verdicts from their run.

The lint is `tools/upkeep/measured_claims.py`; its controls below are sentences a notebook or the README once
held (each contradicted by the run printed beside it) and sentences that model, predict or point.
"""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tools" / "upkeep"))
import measured_claims  # noqa: E402

FILES = measured_claims.default_files()

FLAGGED = [
    "On a CPU, greedy speculative decoding with it beats plain decoding at the best `k`, but by less than 2-3x.",
    "Notebook 01 measured that one target forward pass over a few new tokens costs about as much as a pass over one.",
    "Verifying five tokens costs about as much as one step (as notebook 01 measured, roughly).",
    "On this machine speculative decoding is faster at every k.",
    "The timed run above shows the pass is flat up to 8 tokens.",
    "Here the draft loses to plain decoding in wall-clock time.",
]

PASSED = [
    "The formula predicts a speedup of 2.8x at k = 4.",
    "On a GPU the pass over five tokens costs about as much as one, because reading the weights dominates.",
    "If verifying k + 1 tokens costs more than one step, the speedup is smaller than the chapter's.",
    "Prompt lookup gains the most tokens per pass on the copy workload (counted, with intervals).",
    "The last line says how many drafts beat plain decoding on this run.",
    "A pass reads every weight once: below the ridge it should cost what reading the weights costs.",
]


@pytest.mark.parametrize("path", FILES, ids=lambda p: f"{p.parent.name}/{p.name}")
def test_no_notebook_states_a_measured_direction_by_hand(path: Path) -> None:
    found = measured_claims.lint_notebook(path)
    assert not found, "\n".join(map(str, found))


def test_the_readme_states_no_measured_direction_by_hand() -> None:
    found = measured_claims.lint_readme()
    assert not found, "\n".join(map(str, found))


@pytest.mark.parametrize("sentence", FLAGGED)
def test_the_lint_flags_a_hand_written_measured_direction(sentence: str) -> None:
    assert measured_claims.claims_in_text(sentence), sentence


@pytest.mark.parametrize("sentence", PASSED)
def test_the_lint_passes_models_predictions_counts_and_pointers(sentence: str) -> None:
    assert not measured_claims.claims_in_text(sentence), sentence


def test_code_blocks_are_not_read() -> None:
    assert not measured_claims.claims_in_text("```\n# here it is faster, measured\n```")


def test_the_lint_reads_every_notebook_folder() -> None:
    assert {p.parent.name for p in FILES} == {"notebooks", "solutions", "exercises"}
