"""Exactness by enumeration: the code's output distribution equals the target's, to 1e-12.

`specref.checks.exact` runs `verify_chain` itself on every cell of u-space (see its module
doc), so these tests check the implementation, not a re-derivation. Each exact
check also ships with negative controls: broken rules or drafts that it must reject.
"""

from __future__ import annotations

import pytest
import torch
from hypothesis import example, given, settings
from hypothesis import strategies as st

from specref.chain_verify import verify_chain
from specref.checks.exact import (
    accepted_count_distribution,
    chain_step_distribution,
    generation_distribution,
    one_step_distribution,
    step_distribution,
    step_distribution_formula,
)
from specref.checks.montecarlo import verify_always_accept, verify_skip_residual
from specref.checks.toy import MarkovChain, MisreportedDraft, mixture, random_chain, toy_pair

F64 = torch.float64
TOL = 1e-12

# Probabilities a distribution may hold: zeros, tiny values near float64's limit (1e-300),
# small ones and ordinary ones. Built from integers, which hypothesis draws much faster than floats.
SCALES = {"zero": 0.0, "tiny": 1e-300, "small": 1e-12, "ordinary": 1e-3}
ENTRY = st.builds(lambda scale, m: SCALES[scale] * m, st.sampled_from(list(SCALES)), st.integers(1, 1000))


def _normalize(weights: list[float]) -> torch.Tensor:
    t = torch.tensor(weights, dtype=F64)
    return t / t.sum()


@st.composite
def distribution(draw, V: int) -> torch.Tensor:
    w = draw(st.lists(ENTRY, min_size=V, max_size=V))
    if sum(w) == 0:
        w[draw(st.integers(0, V - 1))] = 1.0
    return _normalize(w)


@st.composite
def p_and_q(draw, V: int | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """Random pairs plus the edge cases: p == q, one-hot q, disjoint supports; V from 1 to 8."""
    V = V if V is not None else draw(st.integers(1, 8))
    kind = draw(st.sampled_from(["random", "random", "equal", "one_hot", "disjoint"]))
    if kind == "disjoint" and V >= 2:
        split = draw(st.integers(1, V - 1))
        p = torch.cat([draw(distribution(split)), torch.zeros(V - split, dtype=F64)])
        q = torch.cat([torch.zeros(split, dtype=F64), draw(distribution(V - split))])
        return p, q
    p = draw(distribution(V))
    if kind == "equal":
        return p, p.clone()
    if kind == "one_hot":
        return p, torch.nn.functional.one_hot(torch.tensor(draw(st.integers(0, V - 1))), V).to(F64)
    return p, draw(distribution(V))


# One position


def test_worked_example_emits_p():
    p = torch.tensor([0.6, 0.3, 0.1], dtype=F64)
    q = torch.tensor([0.3, 0.6, 0.1], dtype=F64)
    assert (one_step_distribution(p, q) - p).abs().max() < TOL


@settings(derandomize=True, max_examples=800, deadline=None)
@given(p_and_q())
# Two roundings of 1/3: a CDF breakpoint one ulp below 1 leaves a cell thinner than float spacing.
@example((torch.tensor([0.3333333333333333] * 3, dtype=F64), torch.tensor([0.33333333333333337] * 3, dtype=F64)))
def test_one_step_output_distribution_is_p(pq):
    p, q = pq
    out = one_step_distribution(p, q)
    assert (out - p).abs().max().item() < TOL, (p.tolist(), q.tolist(), out.tolist())


def test_one_step_check_flags_skipping_the_residual():
    p = torch.tensor([0.6, 0.3, 0.1], dtype=F64)
    q = torch.tensor([0.3, 0.6, 0.1], dtype=F64)
    out = one_step_distribution(p, q, rule=verify_skip_residual)
    # P(a) = min(p, q)(a) + (1 - beta) p(a) = 0.3 + 0.3 * 0.6, not 0.6.
    assert abs(out[0].item() - 0.48) < TOL


def test_one_step_check_flags_always_accepting():
    p = torch.tensor([0.6, 0.3, 0.1], dtype=F64)
    q = torch.tensor([0.3, 0.6, 0.1], dtype=F64)
    assert (one_step_distribution(p, q, rule=verify_always_accept) - q).abs().max() < TOL


def test_enumeration_refuses_a_rule_that_thresholds_elsewhere():
    def coin_flip(draft_tokens, q, p, generator=None, u=None):  # accepts iff u < 0.3141, ignoring p/q
        return verify_chain(draft_tokens, q, p, u=torch.where(u < 0.3141, 0.0, 0.999))

    p = torch.tensor([0.6, 0.3, 0.1], dtype=F64)
    q = torch.tensor([0.3, 0.6, 0.1], dtype=F64)
    with pytest.raises(ValueError, match="rule's outcome changes inside a cell"):
        one_step_distribution(p, q, rule=coin_flip)


# One k-draft step with fixed per-position p_i and q_i


@st.composite
def chain_step(draw) -> tuple[torch.Tensor, torch.Tensor]:
    k = draw(st.integers(0, 3))
    V = draw(st.integers(1, 4))
    pairs = [draw(p_and_q(V)) for _ in range(k)]
    p = torch.stack([pq[0] for pq in pairs] + [draw(distribution(V))])
    q = torch.stack([pq[1] for pq in pairs]) if k else torch.zeros((0, V), dtype=F64)
    return p, q


def _max_gap(a: dict, b: dict) -> float:
    return max((abs(a.get(s, 0.0) - b.get(s, 0.0)) for s in set(a) | set(b)), default=0.0)


@settings(derandomize=True, max_examples=200, deadline=None)
@given(chain_step())
def test_step_distribution_of_the_code_equals_the_closed_form(pq):
    p, q = pq
    assert _max_gap(step_distribution(p, q), step_distribution_formula(p, q)) < TOL


@settings(derandomize=True, max_examples=100, deadline=None)
@given(chain_step())
def test_first_emitted_token_of_a_step_is_distributed_as_p0(pq):
    p, q = pq
    first = torch.zeros(p.shape[1], dtype=F64)
    for seq, w in step_distribution(p, q).items():
        first[seq[0]] += w
    assert (first - p[0]).abs().max() < TOL


def test_step_outcomes_have_one_to_k_plus_one_tokens_and_sum_to_one():
    g = torch.Generator().manual_seed(0)
    p = torch.softmax(torch.randn(4, 3, generator=g, dtype=F64), -1)
    q = torch.softmax(torch.randn(3, 3, generator=g, dtype=F64), -1)
    dist = step_distribution(p, q)
    assert {len(s) for s in dist} == {1, 2, 3, 4}
    assert abs(sum(dist.values()) - 1) < TOL


# Speculative generation on toy chains: the first n tokens


@pytest.fixture(scope="module")
def chains() -> tuple[MarkovChain, MarkovChain]:
    return toy_pair(torch.Generator().manual_seed(0), vocab_size=3, sharpness=2.0, draft_weight=0.6)


@pytest.mark.parametrize("k", range(0, 6))
def test_first_three_tokens_have_the_targets_joint(chains, k):
    target, draft = chains
    got = generation_distribution(target, draft, 0, k, 3)
    assert (got - target.joint(0, 3)).abs().max() < TOL


@pytest.mark.parametrize("settings_", [(0.7, None, None), (1.0, 2, None), (1.3, None, 0.8), (0.0, None, None)])
def test_first_three_tokens_are_exact_with_p_and_q_processed_alike(chains, settings_):
    target, draft = (c.processed(*settings_) for c in chains)
    got = generation_distribution(target, draft, 1, 3, 3)
    assert (got - target.joint(1, 3)).abs().max() < TOL


def test_exactness_needs_no_quality_from_the_draft_only_an_honest_q(chains):
    # Top-k on p only, an unprocessed draft, or a greedy draft with its one-hot q:
    # acceptance suffers, exactness does not, because q is what the draft sampled from.
    target, draft = chains
    p_chain = target.processed(top_k=2)
    for d in (draft, draft.processed(temperature=0), random_chain(3, 4.0, torch.Generator().manual_seed(1))):
        got = generation_distribution(p_chain, d, 0, 2, 3)
        assert (got - p_chain.joint(0, 3)).abs().max() < TOL


def test_larger_vocabulary_is_exact_too():
    target, draft = toy_pair(torch.Generator().manual_seed(3), vocab_size=5, sharpness=1.5, draft_weight=0.5)
    got = generation_distribution(target, draft, 2, 2, 3)
    assert (got - target.joint(2, 3)).abs().max() < TOL


def _tv(a: torch.Tensor, b: torch.Tensor) -> float:
    return 0.5 * (a - b).abs().sum().item()


NEGATIVE_CONTROLS = {
    "skip_residual": lambda t, d: (t, d, verify_skip_residual),
    "always_accept": lambda t, d: (t, d, verify_always_accept),
    "q_at_temperature_1_reported_at_0.7": lambda t, d: (
        t.processed(0.7),
        MisreportedDraft(sampled=d, reported=d.processed(0.7)),
        verify_chain,
    ),
    "q_sampled_with_top_k_reported_without": lambda t, d: (
        t.processed(top_k=2),
        MisreportedDraft(sampled=d.processed(top_k=2), reported=d),
        verify_chain,
    ),
    "greedy_draft_scored_with_softmax_q": lambda t, d: (t, MisreportedDraft(d.processed(0), d), verify_chain),
}


@pytest.mark.parametrize("control", NEGATIVE_CONTROLS)
def test_generation_check_flags_broken_rules_and_drafts(chains, control):
    target, draft, rule = NEGATIVE_CONTROLS[control](*chains)
    got = generation_distribution(target, draft, 0, 3, 3, rule=rule)
    assert abs(got.sum().item() - 1) < TOL, "still a distribution, just the wrong one"
    assert _tv(got, target.joint(0, 3)) > 0.01


def test_accepted_count_distribution_of_a_step_sums_to_one_and_matches_lengths(chains):
    target, draft = chains
    step = chain_step_distribution(target, draft, 0, 4)
    counts = accepted_count_distribution(step, 4)
    assert abs(counts.sum().item() - 1) < TOL and (counts > 0).all()


# The toy chains themselves


def test_joint_sums_to_one_and_its_marginals_are_matrix_powers():
    chain = random_chain(4, 1.0, torch.Generator().manual_seed(4))
    joint = chain.joint(2, 3)
    assert joint.shape == (4, 4, 4) and abs(joint.sum().item() - 1) < TOL
    marg = chain.marginals(2, 3)
    torch.testing.assert_close(marg[0], joint.sum((1, 2)), rtol=0, atol=TOL)
    torch.testing.assert_close(marg[1], joint.sum((0, 2)), rtol=0, atol=TOL)
    torch.testing.assert_close(marg[2], joint.sum((0, 1)), rtol=0, atol=TOL)
    power = torch.linalg.matrix_power(chain.transition, 3)[2]
    torch.testing.assert_close(marg[2], power, rtol=0, atol=TOL)


def test_joint_is_the_chain_rule_product():
    chain = random_chain(3, 1.0, torch.Generator().manual_seed(5))
    T = chain.transition
    assert abs(chain.joint(1, 3)[2, 0, 1].item() - (T[1, 2] * T[2, 0] * T[0, 1]).item()) < 1e-16


def test_score_rows_are_the_distributions_after_each_prefix():
    chain = random_chain(5, 1.0, torch.Generator().manual_seed(6))
    context = torch.tensor([[0, 3], [4, 1]])
    drafts = torch.tensor([[2, 2, 0], [1, 4, 3]])
    p = chain.score(context, drafts)
    assert p.shape == (2, 4, 5)
    assert torch.equal(p[0, 0], chain.transition[3]) and torch.equal(p[1, 3], chain.transition[3])


def test_propose_reports_the_q_it_sampled_from():
    chain = random_chain(5, 1.0, torch.Generator().manual_seed(7))
    context = torch.tensor([[1], [2], [3]])
    tokens, q = chain.propose(context, 4, torch.Generator().manual_seed(0))
    assert tokens.shape == (3, 4) and q.shape == (3, 4, 5)
    assert torch.equal(q, chain.score(context, tokens)[:, :4])


def test_mixture_is_row_wise_and_processed_applies_process_logits():
    g = torch.Generator().manual_seed(8)
    a, b = random_chain(4, 1.0, g), random_chain(4, 1.0, g)
    torch.testing.assert_close(mixture(a, b, 0.3).transition, 0.3 * a.transition + 0.7 * b.transition)
    assert torch.equal(a.processed(temperature=0).transition.sum(-1), torch.ones(4, dtype=F64))


def _uniform_chain(V: int) -> MarkovChain:
    return MarkovChain(torch.full((V, V), 1 / V, dtype=F64))


@pytest.mark.parametrize(
    "make, match",
    [
        (lambda: MarkovChain(torch.ones(2, 3, dtype=F64) / 3), "square"),
        (lambda: MarkovChain(torch.tensor([[0.5, 0.6], [0.5, 0.5]], dtype=F64)), "transition rows must sum to 1"),
        (lambda: random_chain(0, 1.0, torch.Generator()), "vocab_size"),
        (lambda: mixture(_uniform_chain(2), _uniform_chain(3), 0.5), "vocabulary"),
        (lambda: mixture(_uniform_chain(2), _uniform_chain(2), 1.5), "weight"),
        (lambda: _uniform_chain(3).joint(3, 2), "start_token"),
        (lambda: _uniform_chain(3).probs(torch.tensor([[5]])), "context"),
        (lambda: _uniform_chain(3).propose(torch.tensor([[0]]), -1), "k"),
        (lambda: _uniform_chain(3).score(torch.tensor([[0]]), torch.tensor([[0], [1]])), "draft_tokens"),
    ],
)
def test_bad_toy_input_raises_value_error_naming_the_argument(make, match):
    with pytest.raises(ValueError, match=match):
        make()


def test_a_chain_copies_its_matrix_so_the_callers_tensor_is_never_aliased():
    t = torch.full((2, 2), 0.5, dtype=F64)
    chain = MarkovChain(t)
    t[0] = torch.tensor([1.0, 0.0], dtype=F64)
    assert chain.transition[0, 0] == 0.5
