"""Medusa's typical acceptance: the rule as stated, its greedy limit, and the course's checks showing it is LOSSY."""

from __future__ import annotations

import math
import random

import numpy as np
import pytest
import torch
from model_factory import TINY_VOCAB, exact_first_two, small_gpt2, tiny_pair

from specref.chain_verify import verify_chain
from specref.checks.exact import generation_distribution
from specref.checks.montecarlo import distribution_test, simulate
from specref.checks.toy import toy_pair
from specref.decoding.chain import generate, speculative_generate
from specref.rejection import verify_chain_greedy
from specref.sampling import SamplingParams
from specref.typical import TypicalAcceptance, verify_chain_typical


def reference(drafts: list[int], p: list[list[float]], epsilon: float, delta: float) -> tuple[list[int], int]:
    """The rule, one position at a time in plain Python: (accepted drafts + the argmax at the stop, n accepted)."""
    out = []
    for i, x in enumerate(drafts):
        entropy = -sum(v * math.log(v) for v in p[i] if v > 0)
        if not p[i][x] > min(epsilon, delta * math.exp(-entropy)):
            break
        out.append(x)
    stop = p[len(out)]
    return out + [max(range(len(stop)), key=lambda y: (stop[y], -y))], len(out)


def _run(drafts, p, **kw):
    out, n = verify_chain_typical(torch.tensor([drafts]), torch.tensor([p], dtype=torch.float64), **kw)
    return out[0].tolist(), int(n[0])


# -- the rule ------------------------------------------------------------------------------------

UNIFORM = [0.25, 0.25, 0.25, 0.25]  # H = ln 4: threshold min(0.09, 0.3 / 4) = 0.075, every token passes
PEAKED = [0.9, 0.05, 0.03, 0.02]  # H = 0.43: threshold min(0.09, 0.3 * 0.65) = 0.09, only token 0 passes
EDGE = [0.91, 0.09, 0.0, 0.0]  # threshold = epsilon = 0.09 exactly: token 1 sits on it, and fails (strict >)


@pytest.mark.parametrize(
    "drafts,p,expected",
    [
        ([2, 1, 3], [UNIFORM, PEAKED, UNIFORM, UNIFORM], ([2, 0, -1, -1], 1)),  # stop at 1: the argmax of PEAKED follows
        ([3, 0], [UNIFORM, PEAKED, [0.1, 0.2, 0.6, 0.1]], ([3, 0, 2], 2)),  # all pass: the bonus is argmax p_3
        ([1], [PEAKED, UNIFORM], ([0, -1], 0)),  # the first draft fails: one token, the argmax
        ([1, 0], [EDGE, UNIFORM, UNIFORM], ([0, -1, -1], 0)),  # p(x) equal to the threshold is not enough
        ([0, 1], [EDGE, UNIFORM, [0, 0, 0.5, 0.5]], ([0, 1, 2], 2)),  # argmax ties: the first index
    ],
)
def test_worked_examples(drafts, p, expected):
    assert reference(drafts, p, 0.09, 0.3) == (expected[0][: expected[1] + 1], expected[1])
    assert _run(drafts, p) == expected


def test_threshold_is_min_of_epsilon_and_the_entropy_term():
    rule = TypicalAcceptance(epsilon=0.2, delta=0.5)
    p = torch.tensor([UNIFORM, PEAKED, [1.0, 0, 0, 0]], dtype=torch.float64)
    entropy = torch.tensor([math.log(4), -sum(v * math.log(v) for v in PEAKED), 0.0], dtype=torch.float64)
    expected = torch.minimum(torch.full((3,), 0.2, dtype=torch.float64), 0.5 * torch.exp(-entropy))
    assert torch.allclose(rule.threshold(p), expected, rtol=0, atol=1e-15)
    assert rule.threshold(p)[0] < 0.2 and rule.threshold(p)[2] == 0.2  # a flat p asks less than a confident one


@pytest.mark.parametrize("epsilon,delta", [(0.09, 0.3), (0.3, 0.09), (1.0, 2.0), (0.01, 0.5)])
def test_random_cases_equal_the_reference(epsilon, delta):
    rng = random.Random(f"{epsilon}-{delta}")
    for _ in range(60):
        V, k, B = rng.randint(2, 6), rng.randint(0, 5), rng.randint(1, 4)
        sharp = rng.choice([0.5, 2.0, 6.0])
        p = torch.softmax(sharp * torch.randn((B, k + 1, V), generator=torch.Generator().manual_seed(rng.randrange(9**9)),
                                              dtype=torch.float64), -1)
        drafts = torch.tensor([[rng.randrange(V) for _ in range(k)] for _ in range(B)], dtype=torch.long).reshape(B, k)
        before = p.clone(), drafts.clone()
        out, n = verify_chain_typical(drafts, p, epsilon, delta)
        for b in range(B):
            ref, n_ref = reference(drafts[b].tolist(), p[b].tolist(), epsilon, delta)
            assert (out[b].tolist(), int(n[b])) == (ref + [-1] * (k - n_ref), n_ref)
        assert torch.equal(p, before[0]) and torch.equal(drafts, before[1]), "inputs were modified"


def test_sampled_next_token_follows_p_at_the_stop():
    # Every draft fails (token 3 has p = 0.02 under PEAKED), so the one token is drawn from p_1 = PEAKED.
    N = 20_000
    p = torch.tensor([[PEAKED, UNIFORM]], dtype=torch.float64).expand(N, 2, 4)
    out, n = verify_chain_typical(torch.full((N, 1), 3), p, next_token="sample", generator=torch.Generator().manual_seed(0))
    assert (n == 0).all() and (out[:, 1] == -1).all()
    assert distribution_test(torch.tensor(PEAKED), samples=out[:, 0]).passed
    again, _ = verify_chain_typical(torch.full((N, 1), 3), p, next_token="sample",
                                    generator=torch.Generator().manual_seed(0))
    assert torch.equal(out, again), "the same seed must give the same tokens"
    # Negative control: the same samples against the distribution at the wrong position.
    assert not distribution_test(torch.tensor(UNIFORM), samples=out[:, 0]).passed


# -- the greedy limit --------------------------------------------------------------------------------


def test_on_one_hot_p_it_is_the_greedy_rule():
    # Temperature 0 makes p one-hot: H = 0, the threshold is min(epsilon, delta) < 1, so only the argmax passes.
    g = torch.Generator().manual_seed(1)
    for _ in range(50):
        B, k, V = 3, int(torch.randint(1, 6, (1,), generator=g)), 4
        best = torch.randint(0, V, (B, k + 1), generator=g)
        p = torch.nn.functional.one_hot(best, V).double()
        drafts = torch.where(torch.rand((B, k), generator=g) < 0.7, best[:, :k], torch.randint(0, V, (B, k), generator=g))
        got = verify_chain_typical(drafts, p, 0.5, 0.9)
        expected = verify_chain_greedy(drafts, p)
        assert torch.equal(got[0], expected[0]) and torch.equal(got[1], expected[1])


@pytest.fixture(scope="module")
def target():
    return small_gpt2(vocab=64, n_embd=32, n_layer=2, seed=0, scale=20.0)


@pytest.mark.parametrize("k", [1, 3, 6])
def test_greedy_speculative_with_typical_acceptance_equals_greedy_target(target, k):
    draft = small_gpt2(vocab=64, n_embd=32, n_layer=1, seed=5, scale=20.0)
    ids = torch.randint(0, 64, (4, 5), generator=torch.Generator().manual_seed(k))
    expected = generate(target, ids, 24, temperature=0)
    got, stats = speculative_generate(target, draft, ids, k=k, max_new_tokens=24, temperature=0,
                                      acceptance=TypicalAcceptance())
    assert torch.equal(got, expected)
    self_draft, _ = speculative_generate(target, target, ids, k=k, max_new_tokens=24, temperature=0,
                                         acceptance=TypicalAcceptance())
    assert torch.equal(self_draft, expected)


# -- the course's checks flag it: it is approximate --------------------------------------------------

N_RUNS = 2_000  # the sample size: the exact rule must pass, typical acceptance must fail, both at this N
PROMPT, K = [1, 2, 3], 2


def _first_two_counts(acceptance, draft, seed: int) -> np.ndarray:  # [V, V]
    target, _ = tiny_pair()
    # K + 1 new tokens, so the first step really drafts K (k shrinks to what can still be emitted).
    out, _ = speculative_generate(target, draft, torch.tensor([PROMPT] * N_RUNS), k=K, max_new_tokens=K + 1,
                                  generator=torch.Generator().manual_seed(seed), acceptance=acceptance)
    pairs = out[:, len(PROMPT):len(PROMPT) + 2].numpy()
    return np.bincount(pairs[:, 0] * TINY_VOCAB + pairs[:, 1], minlength=TINY_VOCAB**2).reshape(TINY_VOCAB, TINY_VOCAB)


@pytest.mark.parametrize("which", ["unrelated draft", "the target as its own draft"])
def test_distribution_test_flags_typical_acceptance_and_passes_the_exact_rule(which):
    target, unrelated = tiny_pair()
    draft = unrelated if which == "unrelated draft" else target
    exact = exact_first_two(target, PROMPT, SamplingParams(1.0))
    passed = distribution_test(exact, counts=_first_two_counts("exact", draft, seed=11))
    assert passed.passed, f"exact rule, N = {N_RUNS}: {passed}"
    for rule in (TypicalAcceptance(), TypicalAcceptance(next_token="sample")):
        flagged = distribution_test(exact, counts=_first_two_counts(rule, draft, seed=11))
        assert not flagged.passed and flagged.p_value < 1e-6, f"{rule}, N = {N_RUNS}: {flagged}"


def _typical_rule(acceptance: TypicalAcceptance):
    """Typical acceptance in the shape the toy checkers call (q and u unused: the argmax variant draws nothing)."""
    def rule(draft_tokens, q, p, generator=None, u=None):
        return acceptance.verify(draft_tokens, p, generator)
    return rule


def test_exact_enumeration_measures_the_shift():
    toy_target, toy_draft = toy_pair(torch.Generator().manual_seed(0))
    truth = toy_target.joint(0, 2)  # [V, V]
    exact = generation_distribution(toy_target, toy_draft, 0, k=3, n=2)
    typical = generation_distribution(toy_target, toy_draft, 0, k=3, n=2, rule=_typical_rule(TypicalAcceptance()))
    tv_exact = 0.5 * float((exact - truth).abs().sum())
    tv_first = 0.5 * float((typical.sum(1) - truth.sum(1)).abs().sum())  # the first token alone
    tv_two = 0.5 * float((typical - truth).abs().sum())
    assert tv_exact < 1e-12, f"exact rule: TV = {tv_exact:.3g}"
    assert tv_first > 0.05 and tv_two > tv_first, f"typical acceptance: TV first token {tv_first:.4f}, first two {tv_two:.4f}"
    # The sampler follows the distribution enumerated for it, and the test tells it from the target's.
    sim = simulate(toy_target, toy_draft, 0, k=3, n=2, runs=N_RUNS, generator=torch.Generator().manual_seed(2),
                   rule=_typical_rule(TypicalAcceptance()))
    assert distribution_test(typical, samples=sim.tokens).passed
    assert not distribution_test(truth, samples=sim.tokens).passed
    sim_exact = simulate(toy_target, toy_draft, 0, k=3, n=2, runs=N_RUNS, generator=torch.Generator().manual_seed(2),
                         rule=verify_chain)
    assert distribution_test(truth, samples=sim_exact.tokens).passed


# -- bad input ------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "kwargs,error,match",
    [
        (dict(epsilon=0.0), ValueError, "epsilon"),
        (dict(epsilon=1.5), ValueError, "epsilon"),
        (dict(epsilon=float("nan")), ValueError, "epsilon"),
        (dict(epsilon=True), TypeError, "epsilon"),
        (dict(epsilon="0.1"), TypeError, "epsilon"),
        (dict(delta=0), ValueError, "delta"),
        (dict(delta=-1.0), ValueError, "delta"),
        (dict(delta=float("inf")), ValueError, "delta"),
        (dict(next_token="residual"), ValueError, "next_token"),
    ],
)
def test_bad_settings_are_rejected(kwargs, error, match):
    with pytest.raises(error, match=match):
        TypicalAcceptance(**kwargs)
    with pytest.raises(error, match=match):
        verify_chain_typical(torch.tensor([[0]]), torch.full((1, 2, 2), 0.5, dtype=torch.float64), **kwargs)


P_OK = torch.full((1, 3, 4), 0.25, dtype=torch.float64)


@pytest.mark.parametrize(
    "drafts,p,kw,error,match",
    [
        (torch.tensor([0, 1]), P_OK, {}, ValueError, r"draft_tokens must have shape \[B, k\]"),
        (torch.tensor([[0, 1, 2]]), P_OK, {}, ValueError, r"p must have shape \[B, k\+1, V\]"),
        (torch.tensor([[0, 4]]), P_OK, {}, ValueError, "outside the vocabulary"),
        (torch.tensor([[0.0, 1.0]]), P_OK, {}, TypeError, "draft_tokens must be an integer"),
        (torch.tensor([[0, 1]]), P_OK * 2, {}, ValueError, "sum to 1"),
        (torch.tensor([[0, 1]]), torch.full((1, 3, 4), float("nan")), {}, ValueError, "NaN"),
        (torch.tensor([[0, 1]]), [[0.5, 0.5]], {}, TypeError, "p must be a torch.Tensor"),
        (torch.tensor([[0, 1]]), P_OK, dict(generator=0), TypeError, "generator"),
    ],
)
def test_bad_input_is_rejected(drafts, p, kw, error, match):
    with pytest.raises(error, match=match):
        verify_chain_typical(drafts, p, **kw)


def test_an_unknown_acceptance_is_rejected(target):
    for bad in ("typical", None, 0.09):
        with pytest.raises(ValueError, match='acceptance must be "exact" or a TypicalAcceptance'):
            speculative_generate(target, target, torch.tensor([[1, 2]]), k=2, max_new_tokens=3, acceptance=bad)
