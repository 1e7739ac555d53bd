"""Tokens per step and speedup: the chapter's numbers, limits, and agreement with exact enumeration."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from specref.checks.exact import accepted_count_distribution, step_distribution
from specref.theory import expected_tokens_per_step, optimal_k, speedup

F64 = torch.float64


def test_alpha_08_k_4_gives_3_3616_tokens_per_step():
    assert expected_tokens_per_step(0.8, 4) == pytest.approx(3.3616, abs=1e-12)


def test_alpha_08_k_4_c_005_gives_speedup_2_8013():
    assert speedup(0.8, 4, 0.05) == pytest.approx(3.3616 / 1.2, abs=1e-12)
    assert round(speedup(0.8, 4, 0.05), 4) == 2.8013


def test_alpha_06_k_3_gives_2_176_tokens_per_step():
    assert expected_tokens_per_step(0.6, 3) == pytest.approx(2.176, abs=1e-12)


@pytest.mark.parametrize("k", [0, 1, 4, 10])
def test_alpha_one_gives_exactly_k_plus_one(k):
    assert expected_tokens_per_step(1.0, k) == k + 1


@pytest.mark.parametrize("k", [1, 4, 10])
def test_alpha_near_one_approaches_k_plus_one_without_cancellation(k):
    assert expected_tokens_per_step(1 - 1e-12, k) == pytest.approx(k + 1, abs=1e-9)


@pytest.mark.parametrize("k", [0, 1, 4, 10])
def test_alpha_zero_gives_one_token(k):
    assert expected_tokens_per_step(0.0, k) == 1


def test_tokens_per_step_is_the_geometric_sum():
    for alpha in (0.1, 0.5, 0.9):
        for k in range(8):
            assert expected_tokens_per_step(alpha, k) == pytest.approx(sum(alpha**i for i in range(k + 1)), rel=1e-13)


def test_optimal_k_for_alpha_08_c_005():
    # The curve flattens over k = 6-8 (3.040, 3.082, 3.092), peaks at 8 and then declines.
    assert optimal_k(0.8, 0.05) == 8
    assert round(speedup(0.8, 8, 0.05), 4) == 3.0921
    assert speedup(0.8, 9, 0.05) < speedup(0.8, 8, 0.05)


def test_larger_draft_cost_moves_the_optimum_to_smaller_k():
    ks = [optimal_k(0.8, c) for c in (0.01, 0.05, 0.1, 0.2, 0.5)]
    assert ks == sorted(ks, reverse=True) and ks[0] > ks[-1]
    assert optimal_k(0.8, 0.2) < optimal_k(0.8, 0.05)


def test_hopeless_draft_gives_optimal_k_zero():
    assert optimal_k(0.05, 0.5) == 0


def test_vectorized_shapes_broadcast():
    alpha = np.array([0.5, 0.8, 0.9])[:, None]
    k = np.arange(1, 5)[None, :]
    assert np.shape(expected_tokens_per_step(alpha, k)) == (3, 4)
    assert np.shape(speedup(alpha, k, 0.05)) == (3, 4)
    assert np.shape(optimal_k(np.array([0.5, 0.8]), np.array([[0.05], [0.2]]))) == (2, 2)
    assert isinstance(expected_tokens_per_step(0.5, 2), float) and isinstance(optimal_k(0.5, 0.1), int)


@pytest.mark.parametrize(
    "call, error, match",
    [
        (lambda: expected_tokens_per_step(1.2, 3), ValueError, "alpha"),
        (lambda: expected_tokens_per_step(-0.1, 3), ValueError, "alpha"),
        (lambda: expected_tokens_per_step(float("nan"), 3), ValueError, "alpha"),
        (lambda: expected_tokens_per_step(0.5, -1), ValueError, "k"),
        (lambda: expected_tokens_per_step(0.5, 2.5), TypeError, "k"),
        (lambda: speedup(0.5, 3, -0.1), ValueError, "c"),
        (lambda: speedup(0.5, 3, float("inf")), ValueError, "c"),
        (lambda: optimal_k(0.5, 0.1, k_max=-1), ValueError, "k_max"),
    ],
)
def test_bad_arguments_raise_naming_them(call, error, match):
    with pytest.raises(error, match=match):
        call()


def _constant_beta_step(alpha: float, k: int, seed: int) -> tuple[torch.Tensor, torch.Tensor]:
    """p_i, q_i with sum_x min(p_i, q_i) = alpha at every position: q = alpha p + (1 - alpha) r, r off p's support."""
    g = torch.Generator().manual_seed(seed)
    p_half = torch.softmax(torch.randn(k + 1, 3, generator=g, dtype=F64), -1)
    r_half = torch.softmax(torch.randn(k, 3, generator=g, dtype=F64), -1)
    p = torch.cat([p_half, torch.zeros(k + 1, 3, dtype=F64)], -1)  # [k+1, 6]: tokens 0-2
    r = torch.cat([torch.zeros(k, 3, dtype=F64), r_half], -1)  # [k, 6]: tokens 3-5
    return p, alpha * p[:k] + (1 - alpha) * r


@pytest.mark.parametrize("alpha", [0.0, 0.3, 0.6, 0.8, 1.0])
@pytest.mark.parametrize("k", [1, 2, 4])
def test_formula_is_the_mean_of_the_exact_accepted_count_distribution(alpha, k):
    p, q = _constant_beta_step(alpha, k, seed=k)
    counts = accepted_count_distribution(step_distribution(p, q), k)  # P(A = a), from running verify_chain
    tokens_per_step = (counts * torch.arange(1, k + 2, dtype=F64)).sum().item()
    assert tokens_per_step == pytest.approx(expected_tokens_per_step(alpha, k), abs=1e-12)
    # and the law behind it: P(A >= i) = alpha^i
    tail = counts.flip(0).cumsum(0).flip(0)
    torch.testing.assert_close(tail, torch.tensor([alpha**i for i in range(k + 1)], dtype=F64), rtol=0, atol=1e-12)


def test_formula_check_flags_position_dependent_acceptance():
    # Negative control: acceptance 0.9 then 0.5 is not "alpha = 0.7 at every position".
    p9, q9 = _constant_beta_step(0.9, 2, seed=0)
    p5, q5 = _constant_beta_step(0.5, 2, seed=0)
    p = torch.stack([p9[0], p5[1], p5[2]])
    q = torch.stack([q9[0], q5[1]])
    counts = accepted_count_distribution(step_distribution(p, q), 2)
    mean = (counts * torch.arange(1, 4, dtype=F64)).sum().item()
    assert mean == pytest.approx(1 + 0.9 + 0.9 * 0.5, abs=1e-12)
    assert abs(mean - expected_tokens_per_step(0.7, 2)) > 0.05


def test_estimate_alpha_recovers_alpha_from_truncated_geometric_steps():
    from specref.theory import estimate_alpha

    rng = np.random.default_rng(0)
    alpha, k, n = 0.7, 4, 20_000
    # Accepted count per step: the first failure among k Bernoulli(alpha) draws.
    accepted = (rng.random((n, k)) < alpha).cumprod(1).sum(1)
    assert abs(estimate_alpha(accepted, k) - alpha) < 0.01
    # Negative control: dividing by all k drafts counts drafts never examined, and is biased low.
    assert accepted.sum() / (n * k) < alpha - 0.1


def test_estimate_alpha_rejects_impossible_counts():
    from specref.theory import estimate_alpha

    with pytest.raises(ValueError, match="n_accepted"):
        estimate_alpha([5], 4)
    with pytest.raises(ValueError, match="undefined"):
        estimate_alpha([0, 0], 0)
