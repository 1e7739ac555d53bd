"""Exercise 8's graders: the grader's own verdicts are right, the reference check passes, broken checks are flagged.

A learner's check is graded on samplers it has not seen, so the grader's verdict on every construction
(lossless or not) is pinned here, and so is the power of the reference cases against every broken one.
"""

from __future__ import annotations

import pytest
import torch

from specref.checks.rng import exact_distribution
from specref.checks.toy import MarkovChain
from specref.course.grading import pitfalls as G

LOSSLESS = {"exact", "raw", "no_bonus", "argmax"}  # every other construction carries a bug
N = 2


def make_check(*bugs: str):
    """is_lossless as the solution writes it, with `bugs` in (the mistakes a learner's check can make)."""

    def is_lossless(sampler) -> bool:
        for target, draft, start in G.reference_cases():
            want = MarkovChain(target).processed(G.TEMPERATURE).joint(start, N)

            def run(rng, target=target, draft=draft, start=start):
                t, d = (target, draft) if "no_copies" in bugs else (target.clone(), draft.clone())
                out = tuple(int(x) for x in sampler(t, d, start, N, rng))
                if "no_input_check" not in bugs and not (torch.equal(t, target) and torch.equal(d, draft)):
                    return ("changed its inputs",)
                return out[:1] if "first_token_only" in bugs else out

            try:
                got = exact_distribution(run)
            except Exception:
                if "no_copies" in bugs:
                    raise
                return False
            if "first_token_only" in bugs:
                want = want.sum(-1)
            tol = 0.05 if "loose" in bugs else 1e-9
            cells = set(got) | {tuple(c) for c in torch.nonzero(want > 0).tolist()}
            if any(len(c) != want.dim() or abs(got.get(c, 0.0) - float(want[c])) > tol for c in cells):
                return False
        return True

    return is_lossless


CLASSIFICATION = {name: how in LOSSLESS for name, (_, how) in G._VISIBLE.items()}


def _tv(sampler, case) -> float:
    target, draft, start = case
    want = MarkovChain(target).processed(G.TEMPERATURE).joint(start, N)
    got = exact_distribution(lambda rng: tuple(sampler(target.clone(), draft.clone(), start, N, rng)))
    cells = torch.cartesian_prod(*[torch.arange(target.shape[0])] * N).tolist()
    return 0.5 * sum(abs(got.get(tuple(c), 0.0) - float(want[tuple(c)])) for c in cells)


# --------------------------------------------------------------------------------------
# The grader's verdicts
# --------------------------------------------------------------------------------------


@pytest.mark.parametrize("key", sorted(set(G._VISIBLE.values()) | set(G._HIDDEN)), ids=lambda key: f"{key[1]}-k{key[0]}")
def test_the_grader_decides_each_construction_as_designed(key):
    lossless, why = G._truth(*key, 0)
    assert lossless == (key[1] in LOSSLESS), why
    if not lossless and key[1] != "inplace":  # in place: caught by the inputs, not the distribution
        # Power: a TV of 0.03 or more on some reference case, for both seeds the exercise uses.
        for seed in (0, 1):
            assert max(_tv(G._make(*key), c) for c in G.reference_cases(seed=seed)) > 0.03


def test_both_kinds_are_visible_and_hidden():
    visible = [how in LOSSLESS for _, how in G._VISIBLE.values()]
    hidden = [how in LOSSLESS for _, how in G._HIDDEN]
    assert any(visible) and not all(visible) and any(hidden) and not all(hidden)
    assert set(G.SAMPLERS) == set(G._VISIBLE) == set(CLASSIFICATION)


def test_the_in_place_sampler_really_writes_into_its_input():
    target, draft, start = G.reference_cases()[0]
    t = target.clone()
    G.SAMPLERS["F"](t, draft.clone(), start, N, _FixedRNG())
    assert not torch.equal(t, target)


class _FixedRNG:
    def uniform(self) -> float:
        return 0.5

    def categorical(self, probs) -> int:
        return 0


# --------------------------------------------------------------------------------------
# The reference passes; broken checks and classifications are flagged
# --------------------------------------------------------------------------------------


def test_the_reference_check_and_classification_pass(capsys):
    check = make_check()
    G.check_lossless_check(check)
    G.check_lossless_check(check, hidden=True, seed=1)
    G.check_classification(CLASSIFICATION)
    assert capsys.readouterr().out.count("passed") == 3


@pytest.mark.parametrize(
    "bugs, hidden, message",
    [
        (("no_input_check",), False, "not lossless \\(it changes its inputs in place\\)"),
        (("no_copies",), False, "your function raised"),
        (("first_token_only",), True, "your check passed it"),
        (("loose",), True, "your check passed it"),
    ],
)
def test_a_check_with_a_mistake_is_flagged(bugs, hidden, message):
    with pytest.raises(AssertionError, match=message):
        G.check_lossless_check(make_check(*bugs), hidden=hidden, seed=1)


@pytest.mark.parametrize("verdict", [True, False])
def test_a_constant_check_is_flagged(verdict):
    with pytest.raises(AssertionError, match="wrong verdict"):
        G.check_lossless_check(lambda sampler: verdict)


@pytest.mark.parametrize("hidden", [False, True])
def test_a_check_that_looks_samplers_up_fails_even_on_the_visible_ones(hidden):
    table = {id(s): CLASSIFICATION[name] for name, s in G.SAMPLERS.items()}
    with pytest.raises(AssertionError, match="your function raised KeyError"):
        G.check_lossless_check(lambda s: table[id(s)], hidden=hidden)


def test_a_check_that_replays_verdicts_in_call_order_fails_when_the_order_is_drawn_fresh():
    check, verdicts = make_check(), []
    G.check_lossless_check(lambda s: verdicts.append(check(s)) or verdicts[-1], hidden=True, seed=0)

    def replay():
        answers = iter(list(verdicts))
        return lambda s: next(answers)

    G.check_lossless_check(replay(), hidden=True, seed=0)  # a known order can be replayed...
    failed = 0
    for _ in range(3):  # ...a fresh one cannot: 4 of 10 lossless, a replay matches one order in 210
        try:
            G.check_lossless_check(replay(), hidden=True)
        except AssertionError:
            failed += 1
    assert failed >= 1


def test_a_check_must_return_a_bool():
    with pytest.raises(AssertionError, match="return True"):
        G.check_lossless_check(lambda s: "yes")


@pytest.mark.parametrize(
    "answer, message",
    [
        ({**CLASSIFICATION, "B": not CLASSIFICATION["B"]}, "1 of 6 verdicts are wrong"),
        ({k: v for k, v in CLASSIFICATION.items() if k != "A"}, "missing: \\['A'\\]"),
        ({**CLASSIFICATION, "C": 1}, "not a bool"),
        (None, "not a dict"),
        (type("Lying", (dict,), {})(CLASSIFICATION), "not a dict"),
    ],
)
def test_a_wrong_classification_is_flagged(answer, message):
    with pytest.raises(AssertionError, match=message):
        G.check_classification(answer)


def test_an_unsolved_stub_reaches_the_learner_as_not_implemented():
    def stub(sampler):
        raise NotImplementedError()

    with pytest.raises(NotImplementedError):
        G.check_lossless_check(stub)
