"""Acceptance by draft position: (accepted, reached) at positions 1..k, from recorded steps or a histogram (chapter 5).

Position i is reached by a step that drafted at least i tokens and kept drafts 1..i-1; it is accepted
when the step kept draft i too. accepted / reached is P(draft i accepted | drafts 1..i-1 were).
"""

from __future__ import annotations

from collections.abc import Iterable

from .._validate import check_int
from .record import RecordedStep


def acceptance_by_position(steps: list[RecordedStep], k: int) -> list[tuple[int, int]]:
    """(accepted, reached) at draft position i = 1..k: a step reaches i when it drafted >= i and kept 1..i-1.

    accepted / reached is P(draft i accepted | drafts 1..i-1 were), the conditional acceptance
    of chapter 5. A step that drafted fewer than i tokens (k shrinks at the end of a budget)
    does not reach i; a step with no drafts reaches nothing.
    """
    k = check_int("k", k, 1, "draft positions")
    if not isinstance(steps, (list, tuple)) or not all(isinstance(s, RecordedStep) for s in steps):
        raise TypeError("steps must be a list of RecordedStep (from record_generation)")
    counts = [[0, 0] for _ in range(k)]
    for s in steps:
        for i in range(1, min(k, len(s.drafts)) + 1):
            if s.n_accepted < i - 1:
                break
            counts[i - 1][1] += 1
            counts[i - 1][0] += s.n_accepted >= i
    return [(a, r) for a, r in counts]


def counts_from_histogram(hist: Iterable[int]) -> list[tuple[int, int]]:
    """(accepted, reached) at positions 1..k from steps counted by drafts accepted (`SpecStats.accepted_hist`, [k + 1]).

    For steps that all drafted k tokens this equals `acceptance_by_position`: position i is reached by the
    steps that accepted at least i - 1 drafts and accepted by those that accepted at least i.
    """
    h = [int(x) for x in hist]
    if any(x < 0 for x in h):
        raise ValueError(f"hist must hold step counts >= 0, got {h}")
    return [(sum(h[i:]), sum(h[i - 1:])) for i in range(1, len(h))]
