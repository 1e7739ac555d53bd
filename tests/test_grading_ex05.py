"""Exercise 5's graders: the reference rule passes, and each broken proposal rule is flagged by the check meant for it."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from specref.course.grading import prompt_lookup as G
from specref.drafts.prompt_lookup import lookup


def _start(context, max_ngram, min_ngram):
    """Where the copy starts: just after the latest earlier match of the longest suffix, else the last token."""
    L = len(context)
    for n in range(min(max_ngram, L - 1), min_ngram - 1, -1):
        starts = [i for i in range(L - n - 1, -1, -1) if context[i : i + n] == context[L - n :]]
        if starts:
            return starts[0] + n
    return L - 1


def reference(context, k, max_ngram, min_ngram):
    """The solution's answer, written independently of `lookup`."""
    s = _start(context, max_ngram, min_ngram)
    return [context[s + j % (len(context) - s)] for j in range(k)]


def earliest(context, k, max_ngram, min_ngram):
    return G._variant(context, k, max_ngram, min_ngram, latest=False)


def shortest_first(context, k, max_ngram, min_ngram):
    return G._variant(context, k, max_ngram, min_ngram, longest_first=False)


def no_wrap(context, k, max_ngram, min_ngram):  # stops copying where the context ends, then repeats the last token
    s = _start(context, max_ngram, min_ngram)
    out = context[s : s + k]
    return out + [context[-1]] * (k - len(out))


def matches_itself(context, k, max_ngram, min_ngram):  # the suffix may match itself (i = L - n): s = L, nothing follows
    L = len(context)
    for n in range(min(max_ngram, L), min_ngram - 1, -1):
        starts = [i for i in range(L - n, -1, -1) if context[i : i + n] == context[L - n :]]
        if starts:
            s = starts[0] + n
            return [context[s + j % (L - s)] for j in range(k)]
    return [context[-1]] * k


def in_place(context, k, max_ngram, min_ngram):
    out = reference(context, k, max_ngram, min_ngram)
    context.append(0)
    return out


def repeat_last(context, k, max_ngram, min_ngram):
    return [context[-1]] * k


def test_the_reference_rule_passes_every_check(capsys):
    G.check_proposals(reference)
    G.check_proposals(reference, n_cases=400, seed=1)
    G.check_lossless(reference)
    G.check_tokens_per_pass(reference)
    assert capsys.readouterr().out.count("passed") == 4


def test_the_reference_equals_the_package_rule_on_the_hidden_cases():
    for context, k, max_ngram, min_ngram in G._cases(400, seed=1):
        assert reference(context, k, max_ngram, min_ngram) == lookup(context, k, max_ngram, min_ngram)


@pytest.mark.parametrize(
    "rule, message",
    [
        (earliest, "EARLIEST occurrence"),
        (shortest_first, "shortest n-gram first"),
        (no_wrap, "wrapping to s again"),
        (matches_itself, "ZeroDivisionError"),
        (in_place, "changed `context` in place"),
        (lambda c, k, a, b: [float(x) for x in reference(c, k, a, b)], "return a list of"),
        (lambda c, k, a, b: reference(c, k, a, b)[:-1] if k else [0], "return a list of"),
        (lambda c, k, a, b: c[len(c) + 1], "your function raised IndexError"),
    ],
)
def test_the_proposal_check_flags_each_broken_rule(rule, message):
    with pytest.raises(AssertionError, match=message):
        G.check_proposals(rule)


def test_answers_are_read_as_plain_ints():
    assert G._as_proposal(torch.tensor([3, 4]), 2) == [3, 4]
    assert G._as_proposal([np.int64(3), torch.tensor(4)], 2) == [3, 4]
    assert all(type(x) is int for x in G._as_proposal([np.int64(3), 5], 2))
    for bad in ([1.0, 2.0], torch.tensor([1.0, 2.0]), [True, 1], [1], "12", torch.tensor([[1, 2]]), None):
        assert G._as_proposal(bad, 2) is None, bad


@pytest.mark.parametrize(
    "rule, message",
    [
        (lambda c, k, a, b: [50_000] * k, "each in the vocabulary"),
        (lambda c, k, a, b: [c[-1]] * (k + 1), "return exactly k token ids"),
    ],
)
def test_the_lossless_check_flags_invalid_proposals(rule, message):
    with pytest.raises(AssertionError, match=message):
        G.check_lossless(rule)


def test_the_tokens_per_pass_check_flags_a_draft_that_does_not_copy():
    with pytest.raises(AssertionError, match="too few tokens per target pass"):
        G.check_tokens_per_pass(repeat_last)


def test_an_unsolved_stub_reaches_the_learner_as_not_implemented():
    def stub(*args):
        raise NotImplementedError()

    for check in (G.check_proposals, G.check_lossless, G.check_tokens_per_pass):
        with pytest.raises(NotImplementedError):
            check(stub)


def test_an_answer_that_hard_codes_the_visible_streams_passes_them_and_fails_the_hidden_ones():
    memo = {(tuple(c), k, a, b): lookup(c, k, a, b) for c, k, a, b in G._cases(150, seed=0)}

    def hard_coded(context, k, max_ngram, min_ngram):
        return memo.get((tuple(context), k, max_ngram, min_ngram), repeat_last(context, k, max_ngram, min_ngram))

    G.check_proposals(hard_coded)  # the visible check alone cannot tell
    with pytest.raises(AssertionError, match="check_proposals: wrong answer"):
        G.check_proposals(hard_coded, n_cases=400, seed=1)  # the hidden test can


def _scan(source: str) -> list[str]:
    """What tools/grade.py's scan finds in an answer cell of exercise 5, with the solution's setup names."""
    import json
    import sys
    from pathlib import Path

    root = Path(__file__).resolve().parents[1]
    sys.path.insert(0, str(root / "tools"))
    from grade_scan import imported_specref_names, names_used, scan

    cells = json.loads((root / "solutions" / "ex05_prompt_lookup.ipynb").read_text())["cells"]
    first = next(i for i, c in enumerate(cells) if c["metadata"].get("nbgrader", {}).get("solution"))
    setup = imported_specref_names(["".join(c["source"]) for c in cells[:first] if c["cell_type"] == "code"])
    solution = "".join(cells[first]["source"])
    return [f.kind for f in scan(source or solution, setup, names_used(solution) & setup)]


@pytest.mark.parametrize("source", [
    "from specref.drafts.prompt_lookup import lookup\n\ndef lookup_proposal(c, k, a, b):\n    return lookup(c, k, a, b)\n",
    "import specref.course.grading.prompt_lookup as g\ng.lookup = lambda *a: a[0][:a[1]]\n",
    "def lookup_proposal(c, k, a, b):\n    return [c[-1]] * k\n\ncheck_proposals.__globals__['lookup'] = lookup_proposal\n",
    "def lookup_proposal(c, k, a, b):\n    return list(edit_cases(1)[0].tokens[:k])\n",  # a setup name from specref
])
def test_an_answer_that_uses_or_patches_the_reference_is_flagged_and_the_solution_is_not(source):
    assert _scan(source)  # flagged: grade.py withholds the task's points (exit 3, needs review)
    assert _scan("") == []  # "": the solution's own answer, which is clean
