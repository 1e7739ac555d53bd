"""Grader for exercise 5's second part: acceptance by draft position, counted from recorded steps.

The learner writes acceptance_by_position(steps, k) -> [(accepted, reached)] for positions
1..k over `specref.decoding.record.RecordedStep` lists (the rule of
`specref.decoding.positions.acceptance_by_position`), then uses it in an ablation that finds what
Medusa's heads lack on copy-heavy text (Task 6, graded by hand). It is graded on random step
lists, with steps whose k shrank and steps without drafts among them; the learner gets a fresh
copy of each list.
"""

from __future__ import annotations

import copy
import random
from collections.abc import Callable

from specref.decoding.positions import acceptance_by_position
from specref.decoding.record import RecordedStep

from .report import as_ints, as_items, call_learner, failure, passed
from .rules import graded

# Task 5 must not call the count it asks for, nor reach into the graders.
FORBIDDEN = ("specref.decoding.positions", "specref_grading")
ALLOWED = ("specref_grading.checks.draft_positions.check_acceptance_counts",)

Counter = Callable[[list[RecordedStep], int], object]


def _as_counts(out: object, k: int) -> list[tuple[int, int]] | None:
    """The learner's answer as k (accepted, reached) pairs of plain ints, or None when it is not that."""
    rows = as_items(out, k)
    if rows is None:
        return None
    pairs = [as_ints(row, 2) for row in rows]
    return None if any(p is None for p in pairs) else [(p[0], p[1]) for p in pairs]  # type: ignore[index]


def _random_steps(rng: random.Random, k: int) -> list[RecordedStep]:
    """A generation's worth of steps: mostly k drafts, some fewer (the budget's end), some none."""
    steps, start = [], 16
    for _ in range(rng.randint(0, 14)):
        m = k if rng.random() < 0.8 else rng.randint(0, k)
        drafts = [rng.randrange(50) for _ in range(m)]
        n = min(m, int(rng.expovariate(0.6))) if m else 0
        emitted = drafts[:n] + [rng.randrange(50)]
        steps.append(RecordedStep(start, drafts, n, emitted))
        start += len(emitted)
    return steps


def _cases(n_cases: int, seed: int) -> list[tuple[list[RecordedStep], int]]:
    """(steps, k): a worked example, then random generations."""
    worked = [RecordedStep(10, [1, 2, 3], 0, [7]), RecordedStep(11, [4, 5, 6], 3, [4, 5, 6, 8]),
              RecordedStep(15, [1, 2, 3], 1, [1, 9]), RecordedStep(17, [3], 1, [3, 2])]
    cases = [(worked, 3), ([], 2)]
    rng = random.Random(seed)
    while len(cases) < n_cases:
        k = rng.randint(1, 6)
        cases.append((_random_steps(rng, k), k))
    return cases[:n_cases]


def _hint(steps: list[RecordedStep], k: int, got: list[tuple[int, int]]) -> str:
    every = [(sum(s.n_accepted >= i for s in steps), sum(1 for s in steps if s.drafts)) for i in range(1, k + 1)]
    if got == every:
        return ("position i is reached only by steps that kept drafts 1..i-1: count those as `reached`, "
                "not every step (the acceptance is conditional).")
    return ("a step reaches position i when it drafted at least i tokens and accepted drafts 1..i-1 "
            "(n_accepted >= i - 1); of those, it accepts i when n_accepted >= i.")


def _show(steps: list[RecordedStep]) -> str:
    return "[" + ", ".join(f"(drafts={s.drafts}, n_accepted={s.n_accepted})" for s in steps[:6]) + \
        (", ...]" if len(steps) > 6 else "]")


@graded(5, "check_acceptance_counts", FORBIDDEN, ALLOWED)
def check_acceptance_counts(fn: Counter, n_cases: int = 100, seed: int = 0) -> None:
    """Grade acceptance_by_position(steps, k) against the reference on recorded-step lists."""
    g = "check_acceptance_counts"
    for n, (steps, k) in enumerate(_cases(n_cases, seed), 1):
        where = f"wrong answer on case {n} of {n_cases}."
        inputs = [f"steps = {_show(steps)} ({len(steps)} steps)", f"k = {k}"]
        want = acceptance_by_position(steps, k)
        arg = copy.deepcopy(steps)
        out = call_learner(g, where, inputs, fn, arg, k)
        if arg != steps:
            raise failure(g, where, inputs, "your function changed `steps`; read them, do not edit them.")
        got = _as_counts(out, k)
        if got is None:
            raise failure(g, where, inputs + [f"got {out!r}"],
                          f"return a list of {k} (accepted, reached) pairs of ints.")
        if got != want:
            raise failure(g, where, inputs + [f"expected {want}", f"got      {got}"], _hint(steps, k, got))
    passed(g, f"{n_cases} step lists, counts equal the reference")
