"""Hints invite only what the grading wall carries, and a check that cannot read a derivation only gates it.

ex08 Task 1: in a graded run the samplers live in the grader's process and the learner's rng in the kernel, so every
run of a sampler and every draw it makes is a call across the wall. Exact enumeration of the reference cases makes a
few thousand such calls for the six samplers; a sampled test at the sample size Task 2 derives makes hundreds of
thousands. The task's text and its check's hint invite the first only.

ex08 Task 2: no number tells a derived threshold from a scaled copy of the union bound, so the task's points are
the hand-graded derivation's; `check_resolution` is a gate worth no points, and its failures name neither the union
bound's value nor its formula (a learner could take a fraction of either).
"""

from __future__ import annotations

import io
import json
import math
import re
from contextlib import redirect_stdout
from pathlib import Path

import pytest

from specref_grading.checks import pitfalls as G

ROOT = Path(__file__).resolve().parents[1]
EX08 = ROOT / "solutions" / "ex08_lossless_or_not.ipynb"


def _cells() -> list[dict]:
    return json.loads(EX08.read_text(encoding="utf-8"))["cells"]


def _text(cell: dict) -> str:
    return "".join(cell["source"]) if isinstance(cell["source"], list) else cell["source"]


def _solution() -> dict:
    """The solution's setup and answer cells, run in one namespace (test cells left out)."""
    ns: dict = {"__name__": "__main__"}
    with redirect_stdout(io.StringIO()):
        for c in _cells():
            meta = c["metadata"].get("nbgrader", {})
            if c["cell_type"] == "code" and not (meta.get("grade") and not meta.get("solution")) and \
                    c["metadata"].get("specref", {}).get("side") != "checks":
                exec(compile(_text(c), "ex08 cell", "exec"), ns)  # noqa: S102 - the course's own solution
    return ns


class _Counting:
    """Counts the calls that would cross the wall: each run of a sampler and each draw it asks of the rng."""

    def __init__(self) -> None:
        self.calls = 0

    def sampler(self, sampler):
        def run(target, draft, start, n, rng):
            self.calls += 1
            return sampler(target, draft, start, n, self.rng(rng))
        return run

    def rng(self, rng):
        counter = self

        class Rng:
            def uniform(self, *a, **k):
                counter.calls += 1
                return rng.uniform(*a, **k)

            def categorical(self, *a, **k):
                counter.calls += 1
                return rng.categorical(*a, **k)
        return Rng()


def test_ex08_task1_invites_exact_enumeration_only_and_it_fits_the_wall():
    task1 = next(_text(c) for c in _cells() if _text(c).startswith("## Task 1"))
    assert "or a sampled test" not in task1 and "a sampled check must resolve" not in task1
    assert "exact_distribution" in task1 and "not the tool here" in task1
    assert "distribution test" not in G._CHECK_HINT and "exact_distribution" in G._CHECK_HINT

    ns = _solution()
    exact = _Counting()
    for sampler in G.SAMPLERS.values():
        ns["is_lossless"](exact.sampler(sampler))
    # A sampled test at Task 2's size: per case, samples_needed(0.08, 9 cells) generations at a level that leaves
    # the 18 verdicts (6 samplers x 3 cases) a 1e-3 error between them, each a run and its draws (at least one).
    n = ns["samples_needed"](0.08, 9, 1e-3 / 18)
    sampled = len(G.SAMPLERS) * len(G.reference_cases()) * n * 2
    print(f"ex08 Task 1 across the wall: exact enumeration {exact.calls} calls for the six; a sampled test at "
          f"n = {n} per case at least {sampled}")
    assert exact.calls < 50_000 and 10 * exact.calls < sampled


def test_ex08_task2_points_are_the_derivations_and_the_check_is_a_gate():
    graded = {c["metadata"]["nbgrader"]["grade_id"]: c for c in _cells() if c["metadata"].get("nbgrader", {}).get("grade")}
    assert graded["ex08_resolution_check"]["metadata"]["nbgrader"]["points"] == 0
    assert graded["ex08_resolution_derivation"]["metadata"]["nbgrader"]["points"] == 3
    rubric = next(_text(c) for c in _cells() if c["metadata"].get("specref", {}).get("rubric") == "ex08_resolution_derivation")
    assert "3 points" in rubric and "gate" in rubric


def _union(n_cells: int, n: int, level: float) -> float:
    return math.sqrt((n_cells * math.log(2) + math.log(1 / level)) / (2 * n))


def test_ex08_task2_failures_name_neither_the_union_bound_nor_its_formula():
    ns = _solution()
    with pytest.raises(AssertionError) as e:  # 1.1 x the union bound: valid everywhere, not below it at 1000 cells
        G.check_resolution(lambda m, n, lv: 1.1 * _union(m, n, lv), ns["samples_needed"], seed=5)
    message = str(e.value)
    assert "not below the union bound" in message
    assert "sqrt" not in message and "ln 2" not in message and "ln(1" not in message
    assert not any(f"{_union(1000, 20000, lv):.4f}" in message for lv in (0.05, 0.01)), message
    with pytest.raises(AssertionError) as e:
        G.check_resolution(ns["tv_threshold"], lambda tv, m, lv: 50 * ns["samples_needed"](tv, m, lv), seed=5)
    assert "too many samples" in str(e.value) and not re.search(r"at most \d", str(e.value))
