"""Exactness by sampling: many speculative runs on the chapter's toy match the target.

Every statistical test here has a fixed seed, a chi-square statistic from
scipy.stats (through `distribution_test`) at ALPHA = 1e-3, and negative controls
(broken rules and drafts) that the very same test must reject.
"""

from __future__ import annotations

import math
from functools import cache

import numpy as np
import pytest
import scipy.stats
import torch

from specref.chain_verify import verify_chain
from specref.checks.exact import accepted_count_distribution, chain_step_distribution
from specref.checks.montecarlo import (
    BROKEN_RULES,
    DistributionTest,
    Simulation,
    counts_of,
    distribution_test,
    simulate,
    stratified_test,
    tv_bound,
)
from specref.checks.toy import MarkovChain, MisreportedDraft, toy_pair
from specref.rejection import acceptance_probability, residual

F64 = torch.float64
K, N_TOKENS, START = 4, 3, 0
RUNS = 50_000


@cache
def _chapter_toy() -> tuple[MarkovChain, MarkovChain]:
    """Vocabulary 6, a random target, a draft mixing 70% target with 30% noise."""
    return toy_pair(torch.Generator().manual_seed(0), vocab_size=6, sharpness=2.0, draft_weight=0.7)


def _setting(name: str) -> tuple[MarkovChain, MarkovChain]:
    """The correctly processed (target, draft) pair of each sampling setting."""
    t, d = _chapter_toy()
    return {
        "plain": (t, d),
        "temperature_0.7": (t.processed(0.7), d.processed(0.7)),
        "top_k_3": (t.processed(top_k=3), d.processed(top_k=3)),
    }[name]


# name -> (setting, draft used, rule used, is it correct?)
CASES = {
    "correct": ("plain", None, verify_chain, True),
    "correct_temperature_0.7": ("temperature_0.7", None, verify_chain, True),
    "correct_top_k_3": ("top_k_3", None, verify_chain, True),
    "skip_residual": ("plain", None, BROKEN_RULES["skip_residual"], False),
    "always_accept": ("plain", None, BROKEN_RULES["always_accept"], False),
    "bonus_off_by_one": ("plain", None, BROKEN_RULES["bonus_off_by_one"], False),
    # q not processed like p: drafts drawn at temperature 1, verifier told temperature 0.7.
    "q_temperature_mismatch": (
        "temperature_0.7",
        lambda d: MisreportedDraft(sampled=_chapter_toy()[1], reported=d),
        verify_chain,
        False,
    ),
    # drafts drawn with top-k, verifier handed the q without it.
    "q_top_k_mismatch": (
        "top_k_3",
        lambda d: MisreportedDraft(sampled=d, reported=_chapter_toy()[1]),
        verify_chain,
        False,
    ),
    # a greedy (argmax) draft scored with its softmax q instead of its one-hot q.
    "greedy_draft_softmax_q": ("plain", lambda d: MisreportedDraft(d.processed(0), d), verify_chain, False),
}
CORRECT = [c for c, spec in CASES.items() if spec[3]]
BROKEN = [c for c, spec in CASES.items() if not spec[3]]


@cache
def _run(case: str) -> tuple[MarkovChain, MarkovChain, Simulation]:
    """(target, correct draft, simulation of the case), seeded; cached across tests."""
    setting, wrap, rule, _ = CASES[case]
    target, draft = _setting(setting)
    used = wrap(draft) if wrap else draft
    sim = simulate(target, used, START, K, N_TOKENS, RUNS, torch.Generator().manual_seed(1), rule=rule)
    return target, draft, sim


# The first three tokens: joint distribution


def _joint_check(case: str) -> DistributionTest:
    target, _, sim = _run(case)
    return distribution_test(target.joint(START, N_TOKENS), samples=sim.tokens)


@pytest.mark.parametrize("case", CORRECT)
def test_first_three_tokens_follow_the_targets_joint(case):
    result = _joint_check(case)
    assert result.passed, str(result)


@pytest.mark.parametrize("case", [c for c in BROKEN if c != "bonus_off_by_one"])
def test_joint_check_flags_broken_rules_and_drafts(case):
    result = _joint_check(case)
    assert not result.passed and result.statistic > 3 * result.critical, str(result)


def test_joint_of_three_tokens_sees_the_bonus_only_when_a_step_can_reach_it():
    # With k = 4 a bonus is the 5th token of its step, never among the first 3: a wrong
    # bonus is invisible there (the bonus check below catches it). With k = 2 it is the 3rd.
    assert _joint_check("bonus_off_by_one").passed
    target, draft = _setting("plain")
    rule = BROKEN_RULES["bonus_off_by_one"]
    sim = simulate(target, draft, START, 2, N_TOKENS, RUNS, torch.Generator().manual_seed(1), rule)
    result = distribution_test(target.joint(START, N_TOKENS), samples=sim.tokens)
    assert not result.passed and result.statistic > 3 * result.critical, str(result)


# Inside a step: conditional distributions


def _steps(sim: Simulation) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """All recorded steps flattened: context [M], tokens [M, k+1], n_accepted [M]."""
    return sim.context.reshape(-1), sim.step_tokens.reshape(-1, K + 1), sim.n_accepted.reshape(-1)


def _previous(context: torch.Tensor, tokens: torch.Tensor, i: int) -> torch.Tensor:  # the token before position i
    return context if i == 0 else tokens[:, i - 1]


def _stratified(
    expected_rows: torch.Tensor,  # [G, V]
    strata: torch.Tensor,  # [M] stratum of each sample
    cells: torch.Tensor,  # [M] token of each sample
    n_strata: int,
) -> DistributionTest:
    """Count `cells` within `strata` and test each stratum against its expected row."""
    V = expected_rows.shape[-1]
    counts = torch.bincount(strata * V + cells, minlength=n_strata * V).reshape(n_strata, V)
    return stratified_test(expected_rows, counts)


def _accepted_token_check(case: str) -> DistributionTest:
    """A draft kept at position i after token y is distributed as min(p_y, q_y) / beta_y."""
    target, draft, sim = _run(case)
    context, tokens, n_acc = _steps(sim)
    P, Q = target.transition, draft.transition
    beta = acceptance_probability(P, Q)[:, None]
    # After a token whose beta is 0 nothing is ever kept: that stratum is empty, any row will do.
    kept = torch.where(beta > 0, torch.minimum(P, Q) / beta.clamp(min=1e-300), P)  # [V, V]
    V = P.shape[0]
    strata, cells = [], []
    for i in range(K):
        rows = n_acc > i
        strata.append(i * V + _previous(context, tokens, i)[rows])
        cells.append(tokens[rows, i])
    return _stratified(kept.repeat(K, 1), torch.cat(strata), torch.cat(cells), K * V)


def _correction_check(case: str) -> DistributionTest:
    """After rejecting at position a, following token y, the token is residual(p_y, q_y)."""
    target, draft, sim = _run(case)
    context, tokens, n_acc = _steps(sim)
    res = residual(target.transition, draft.transition)  # [V, V]
    V = res.shape[0]
    strata, cells = [], []
    for a in range(K):
        rows = n_acc == a
        strata.append(a * V + _previous(context, tokens, a)[rows])
        cells.append(tokens[rows, a])
    return _stratified(res.repeat(K, 1), torch.cat(strata), torch.cat(cells), K * V)


def _bonus_check(case: str) -> DistributionTest:
    """When all k drafts pass, the bonus after the last draft y is distributed as p_y."""
    target, _, sim = _run(case)
    _, tokens, n_acc = _steps(sim)
    rows = n_acc == K
    return _stratified(target.transition, tokens[rows, K - 1], tokens[rows, K], target.vocab_size)


@cache
def _exact_accept_counts(setting: str) -> torch.Tensor:  # [k+1]
    target, draft = _setting(setting)
    return accepted_count_distribution(chain_step_distribution(target, draft, START, K), K)


def _accept_count_check(case: str) -> DistributionTest:
    """The first step's accepted count follows the exact distribution (enumerated with verify_chain)."""
    _, _, sim = _run(case)
    return distribution_test(_exact_accept_counts(CASES[case][0]), samples=sim.n_accepted[0])


CONDITIONAL_CHECKS = {
    "accepted_token": (_accepted_token_check, ["always_accept", "q_temperature_mismatch", "greedy_draft_softmax_q"]),
    "correction": (_correction_check, ["skip_residual"]),
    "bonus": (_bonus_check, ["bonus_off_by_one"]),
    "accept_count": (_accept_count_check, ["always_accept", "q_temperature_mismatch", "greedy_draft_softmax_q"]),
}


@pytest.mark.parametrize("case", CORRECT)
@pytest.mark.parametrize("check", CONDITIONAL_CHECKS)
def test_conditional_distributions_inside_a_step_are_right(check, case):
    result = CONDITIONAL_CHECKS[check][0](case)
    assert result.passed, str(result)


@pytest.mark.parametrize(
    "check, case", [(check, case) for check, (_, flagged) in CONDITIONAL_CHECKS.items() for case in flagged]
)
def test_conditional_checks_flag_the_bugs_they_target(check, case):
    result = CONDITIONAL_CHECKS[check][0](case)
    assert not result.passed and result.statistic > 3 * result.critical, str(result)


# The sampler


def test_simulation_shapes_and_bookkeeping():
    target, draft = _chapter_toy()
    sim = simulate(target, draft, START, K, 5, 2000, torch.Generator().manual_seed(2))
    S = sim.n_accepted.shape[0]
    assert sim.tokens.shape == (2000, 5) and (sim.tokens >= 0).all() and (sim.tokens < 6).all()
    assert sim.step_tokens.shape == (S, 2000, K + 1) and 1 <= S <= 5
    assert torch.equal(sim.context[0], torch.full((2000,), START))
    emitted = (sim.n_accepted + 1).cumsum(0)
    assert torch.equal(sim.active[1:], emitted[:-1] < 5) and sim.active[0].all()
    assert sim.accepted_histogram().sum() == sim.active.sum()
    assert 1 <= sim.tokens_per_step() <= K + 1


def test_simulation_tokens_are_the_concatenated_step_outputs():
    target, draft = _chapter_toy()
    sim = simulate(target, draft, START, 2, 4, 50, torch.Generator().manual_seed(3))
    for r in range(50):
        emitted = [t for s in range(sim.n_accepted.shape[0]) for t in sim.step_tokens[s, r].tolist() if t >= 0]
        assert sim.tokens[r].tolist() == emitted[:4]


def test_seeded_simulations_reproduce():
    target, draft = _chapter_toy()
    a = simulate(target, draft, START, K, 3, 1000, torch.Generator().manual_seed(4))
    b = simulate(target, draft, START, K, 3, 1000, torch.Generator().manual_seed(4))
    assert torch.equal(a.tokens, b.tokens) and torch.equal(a.n_accepted, b.n_accepted)


def test_k_zero_simulation_is_plain_sampling():
    target, draft = _chapter_toy()
    sim = simulate(target, draft, START, 0, 3, 20_000, torch.Generator().manual_seed(5))
    assert (sim.n_accepted == 0).all()
    result = distribution_test(target.joint(START, 3), samples=sim.tokens)
    assert result.passed, str(result)


@pytest.mark.parametrize(
    "kwargs, error, match",
    [
        ({"k": -1}, ValueError, "k must be"),
        ({"n": 0}, ValueError, "n must be"),
        ({"runs": 0}, ValueError, "runs must be"),
        ({"start_token": 6}, ValueError, "start_token"),
        ({"generator": None}, TypeError, "generator"),
        ({"draft": "not a draft"}, TypeError, "draft"),
    ],
)
def test_bad_simulation_arguments_raise_naming_them(kwargs, error, match):
    target, draft = _chapter_toy()
    args = {"target": target, "draft": draft, "start_token": 0, "k": 2, "n": 3, "runs": 10}
    args["generator"] = torch.Generator().manual_seed(0)
    args.update(kwargs)
    with pytest.raises(error, match=match):
        simulate(**args)


def test_simulation_refuses_a_draft_with_another_vocabulary():
    target, _ = _chapter_toy()
    other = MarkovChain(torch.full((3, 3), 1 / 3, dtype=F64))
    with pytest.raises(ValueError, match="vocabulary"):
        simulate(target, other, 0, 2, 3, 10, torch.Generator().manual_seed(0))


# The test itself


def test_chi_square_statistic_and_p_value_are_scipys_when_no_cell_is_pooled():
    expected = np.array([0.2, 0.3, 0.5])
    counts = np.array([230, 290, 480])
    result = distribution_test(expected, counts=counts)
    ref = scipy.stats.chisquare(counts, 1000 * expected)
    assert result.statistic == pytest.approx(ref.statistic) and result.p_value == pytest.approx(ref.pvalue)
    assert result.dof == 2 and result.samples == 1000


def test_cells_expected_below_five_are_pooled():
    expected = np.array([0.001, 0.002, 0.004, 0.493, 0.5])  # 1, 2, 4 expected in 1000 draws
    counts = np.array([3, 0, 4, 493, 500])
    result = distribution_test(expected, counts=counts)
    ref = scipy.stats.chisquare([7, 493, 500], [7, 493, 500])
    assert result.dof == 2 and result.statistic == pytest.approx(ref.statistic)


def test_a_pool_still_below_five_takes_in_the_next_smallest_cell():
    expected = np.array([0.001, 0.002, 0.3, 0.697])  # pool of 3 expected, grown with the 300 cell
    counts = np.array([1, 2, 297, 700])
    result = distribution_test(expected, counts=counts)
    ref = scipy.stats.chisquare([300, 700], [303, 697])
    assert result.dof == 1 and result.statistic == pytest.approx(ref.statistic)


def test_a_sample_on_a_zero_probability_cell_fails_outright():
    result = distribution_test(np.array([0.5, 0.5, 0.0]), counts=np.array([500, 499, 1]))
    assert not result.passed and result.impossible == 1 and result.p_value == 0


def test_tv_bound_is_bretagnolle_huber_carol():
    expected = np.full(8, 1 / 8)
    result = distribution_test(expected, counts=np.full(8, 125), alpha=0.01)
    assert result.tv == 0
    assert result.tv_bound == pytest.approx(math.sqrt((8 * math.log(2) + math.log(100)) / 2000))


def test_the_tests_bound_is_tv_bound_of_each_stratum_at_alpha_over_strata():
    e = np.array([[0.5, 0.5, 0.0], [0.2, 0.3, 0.5]])
    c = np.array([[60, 40, 0], [30, 70, 100]])
    result = stratified_test(e, c, alpha=0.01)
    assert result.tv_bound == pytest.approx((100 * tv_bound(2, 100, 0.005) + 200 * tv_bound(3, 200, 0.005)) / 300)


def test_tv_bound_is_exceeded_by_a_correct_sampler_at_most_at_rate_alpha_and_resolves_a_shift():
    """Seeded multinomial counts on 30 cells: a correct sampler's TV crosses tv_bound(30, 2000, 0.05) in no more of
    2000 draws than a rate of 0.05 explains (binomial test), and a sampler more than twice the bound away crosses it in all of them
    (negative control: the same bound, the same sample size)."""
    rng = np.random.default_rng(3)
    expected = rng.dirichlet(np.ones(30))
    bound = tv_bound(30, 2000, 0.05)
    counts = rng.multinomial(2000, expected, size=2000)  # [2000, 30]
    over = int((0.5 * np.abs(counts / 2000 - expected).sum(1) > bound).sum())
    assert scipy.stats.binomtest(over, 2000, 0.05, alternative="greater").pvalue > 1e-3
    shifted = 0.8 * expected + 0.2 * np.eye(30)[np.argmin(expected)]  # 0.2 of the mass moved onto one cell
    assert 0.5 * np.abs(shifted - expected).sum() > 2 * bound
    broken = rng.multinomial(2000, shifted, size=2000)
    assert (0.5 * np.abs(broken / 2000 - expected).sum(1) > bound).all()


@pytest.mark.parametrize("args, error, match", [
    ((0, 10, 0.1), ValueError, "cells"), ((3, 0, 0.1), ValueError, "samples"), ((3.0, 10, 0.1), TypeError, "cells"),
    ((3, 10, 1.0), ValueError, "alpha"), ((3, 10, True), ValueError, "alpha"),
])
def test_tv_bound_refuses_bad_input(args, error, match):
    with pytest.raises(error, match=match):
        tv_bound(*args)


def test_tv_bound_holds_for_a_correct_sampler_far_more_often_than_one_minus_alpha():
    # 200 seeded multinomial samples: the bound at alpha = 0.05 is conservative, so none should exceed it.
    rng = np.random.default_rng(0)
    expected = rng.dirichlet(np.ones(20))
    tvs = [distribution_test(expected, counts=rng.multinomial(500, expected)) for _ in range(200)]
    assert all(t.tv <= t.tv_bound for t in tvs)


def test_correct_sampler_fails_at_about_the_rate_alpha():
    # The chi-square part is calibrated: over 1000 seeded multinomial samples, about 5% fail at alpha = 0.05.
    rng = np.random.default_rng(1)
    expected = rng.dirichlet(np.ones(10))
    tests = [distribution_test(expected, counts=rng.multinomial(2000, expected), alpha=0.05) for _ in range(1000)]
    fails = sum(t.p_value < 0.05 for t in tests)
    assert scipy.stats.binomtest(fails, 1000, 0.05).pvalue > 1e-3


def test_samples_and_counts_give_the_same_result():
    expected = torch.full((3, 3), 1 / 9, dtype=F64)
    samples = torch.randint(0, 3, (900, 2), generator=torch.Generator().manual_seed(6))
    a = distribution_test(expected, samples=samples)
    b = distribution_test(expected, counts=counts_of(samples, (3, 3)))
    assert a == b


def test_stratified_statistics_add_up():
    e = np.array([[0.5, 0.5], [0.2, 0.8]])
    c = np.array([[60, 40], [30, 170]])
    result = stratified_test(e, c)
    s = scipy.stats.chisquare(c[0], 100 * e[0]).statistic + scipy.stats.chisquare(c[1], 200 * e[1]).statistic
    assert result.statistic == pytest.approx(s) and result.dof == 2
    assert result.p_value == pytest.approx(scipy.stats.chi2.sf(s, 2))


@pytest.mark.parametrize(
    "kwargs, match",
    [
        ({"counts": np.array([1, 2])}, "shape"),
        ({"counts": np.array([1, -2, 3])}, "non-negative integers"),
        ({"counts": np.array([1.5, 2, 3])}, "non-negative integers"),
        ({"counts": np.array([0, 0, 0])}, "no samples"),
        ({"counts": np.array([1, 2, 3]), "alpha": 0}, "alpha"),
        ({"counts": np.array([1, 2, 3]), "samples": torch.tensor([0])}, "exactly one"),
        ({"samples": torch.tensor([0, 3])}, "outside"),
    ],
)
def test_bad_test_input_raises_value_error(kwargs, match):
    with pytest.raises(ValueError, match=match):
        distribution_test(np.array([0.2, 0.3, 0.5]), **kwargs)


def test_expected_must_be_a_distribution():
    with pytest.raises(ValueError, match="expected"):
        distribution_test(np.array([0.2, 0.3, 0.6]), counts=np.array([1, 2, 3]))
