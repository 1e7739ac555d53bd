"""The accept/reject rule: worked example, mechanics of verify_chain, greedy rule, bad input.

Exactness of the output distribution is proven in test_exact.py (enumeration) and
test_montecarlo.py (sampling); this file pins down the mechanics.
"""

from __future__ import annotations

import pytest
import torch

from specref.chain_verify import verify_chain
from specref.rejection import acceptance_probability, residual, verify_chain_greedy
from specref.sampling import sample

F64 = torch.float64


def _dist(seed: int, shape: tuple[int, ...]) -> torch.Tensor:
    return torch.softmax(2 * torch.randn(shape, generator=torch.Generator().manual_seed(seed), dtype=F64), -1)


def _chain_inputs(seed: int, B: int, k: int, V: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Drafts sampled from their q, with a p for each position: a valid batched step."""
    g = torch.Generator().manual_seed(seed)
    q = _dist(seed, (B, k, V))
    p = _dist(seed + 1000, (B, k + 1, V))
    return sample(q, g), q, p


# acceptance probability and residual


def test_worked_example_beta_and_residual():
    p = torch.tensor([0.6, 0.3, 0.1], dtype=F64)
    q = torch.tensor([0.3, 0.6, 0.1], dtype=F64)
    assert abs(acceptance_probability(p, q).item() - 0.7) < 1e-15
    torch.testing.assert_close(residual(p, q), torch.tensor([1.0, 0.0, 0.0], dtype=F64), rtol=0, atol=1e-15)


def test_acceptance_probability_is_one_minus_total_variation():
    p, q = _dist(1, (50, 7)), _dist(2, (50, 7))
    tv = 0.5 * (p - q).abs().sum(-1)
    torch.testing.assert_close(acceptance_probability(p, q), 1 - tv, rtol=0, atol=1e-14)


def test_acceptance_probability_is_symmetric():
    p, q = _dist(3, (20, 5)), _dist(4, (20, 5))
    torch.testing.assert_close(acceptance_probability(p, q), acceptance_probability(q, p), rtol=0, atol=0)


def test_residual_is_a_distribution_supported_where_p_exceeds_q():
    p, q = _dist(5, (100, 6)), _dist(6, (100, 6))
    r = residual(p, q)
    assert (r >= 0).all()
    torch.testing.assert_close(r.sum(-1), torch.ones(100, dtype=F64), rtol=0, atol=1e-14)
    assert (r[q >= p] == 0).all()


def test_residual_of_p_equal_q_is_p_and_never_nan():
    p = _dist(7, (4, 5))
    r = residual(p, p.clone())
    assert not torch.isnan(r).any() and torch.equal(r, p)


def test_residual_with_disjoint_supports_is_p():
    p = torch.tensor([0.5, 0.5, 0.0, 0.0], dtype=F64)
    q = torch.tensor([0.0, 0.0, 0.25, 0.75], dtype=F64)
    assert torch.equal(residual(p, q), p)
    assert acceptance_probability(p, q).item() == 0


# verify_chain: mechanics


def test_draft_is_accepted_iff_u_times_q_is_below_p():
    p = torch.tensor([[0.2, 0.8], [0.5, 0.5]], dtype=F64)
    q = torch.tensor([[0.4, 0.6]], dtype=F64)
    x = torch.tensor([0])  # threshold min(1, 0.2 / 0.4) = 0.5
    assert verify_chain(x, q, p, u=torch.tensor([0.4999, 0.3], dtype=F64))[1] == 1
    assert verify_chain(x, q, p, u=torch.tensor([0.5, 0.3], dtype=F64))[1] == 0
    assert verify_chain(x, q, p, u=torch.tensor([0.5001, 0.3], dtype=F64))[1] == 0


def test_rejection_emits_the_residual_sample_of_the_last_uniform():
    p = torch.tensor([[0.6, 0.3, 0.1], [1 / 3, 1 / 3, 1 / 3]], dtype=F64)
    q = torch.tensor([[0.3, 0.6, 0.1]], dtype=F64)
    # Draft 1 has threshold 0.5; u = 0.9 rejects it; the residual is one-hot on token 0.
    tokens, n = verify_chain(torch.tensor([1]), q, p, u=torch.tensor([0.9, 0.99], dtype=F64))
    assert n == 0 and tokens.tolist() == [0]


def test_all_accepted_emits_the_bonus_from_the_last_p():
    q = _dist(8, (3, 4))
    p = torch.cat([q, torch.tensor([[0.0, 0.0, 1.0, 0.0]], dtype=F64)])  # p_i = q_i: always accepted
    tokens, n = verify_chain(torch.tensor([1, 3, 0]), q, p, u=torch.tensor([0.9, 0.9, 0.9, 0.5], dtype=F64))
    assert n == 3 and tokens.tolist() == [1, 3, 0, 2]


def test_emitted_tokens_are_the_accepted_prefix_then_one_token():
    drafts, q, p = _chain_inputs(9, 500, 4, 5)
    tokens, n = verify_chain(drafts, q, p, torch.Generator().manual_seed(0))
    assert tokens.shape == (500, 5) and n.shape == (500,)
    pos = torch.arange(5)
    accepted = pos[:4] < n[:, None]
    assert torch.equal(torch.where(accepted, tokens[:, :4], -1), torch.where(accepted, drafts, -1))
    assert ((tokens >= 0) == (pos <= n[:, None])).all()
    assert set(n.tolist()) == {0, 1, 2, 3, 4}, "every accept count occurs, so every branch ran"


def test_unbatched_returns_n_accepted_plus_one_tokens():
    drafts, q, p = _chain_inputs(10, 1, 3, 4)
    for seed in range(20):
        tokens, n = verify_chain(drafts[0], q[0], p[0], torch.Generator().manual_seed(seed))
        assert isinstance(n, int) and tokens.shape == (n + 1,) and torch.equal(tokens[:n], drafts[0, :n])


def test_k_zero_is_plain_sampling_from_p0():
    p = _dist(11, (300, 1, 6))
    u = torch.rand(300, 1, generator=torch.Generator().manual_seed(1), dtype=F64)
    tokens, n = verify_chain(torch.zeros((300, 0), dtype=torch.long), torch.zeros((300, 0, 6), dtype=F64), p, u=u)
    assert (n == 0).all() and torch.equal(tokens[:, 0], sample(p[:, 0], u=u[:, 0]))


def test_batched_equals_one_at_a_time_with_the_same_uniforms():
    drafts, q, p = _chain_inputs(12, 64, 4, 6)
    u = torch.rand(64, 5, generator=torch.Generator().manual_seed(2), dtype=F64)
    tokens, n = verify_chain(drafts, q, p, u=u)
    for b in range(64):
        tokens_b, n_b = verify_chain(drafts[b], q[b], p[b], u=u[b])
        assert n_b == n[b] and torch.equal(tokens_b, tokens[b, : n_b + 1])


def test_the_generator_supplies_the_uniforms_in_row_order():
    drafts, q, p = _chain_inputs(13, 32, 3, 5)
    drawn = verify_chain(drafts, q, p, torch.Generator().manual_seed(4))
    given_u = verify_chain(drafts, q, p, u=torch.rand(32, 4, generator=torch.Generator().manual_seed(4), dtype=F64))
    assert torch.equal(drawn[0], given_u[0]) and torch.equal(drawn[1], given_u[1])


def test_seeded_runs_reproduce():
    drafts, q, p = _chain_inputs(14, 256, 4, 6)
    a = verify_chain(drafts, q, p, torch.Generator().manual_seed(5))
    b = verify_chain(drafts, q, p, torch.Generator().manual_seed(5))
    assert torch.equal(a[0], b[0]) and torch.equal(a[1], b[1])


def test_inputs_are_never_modified():
    drafts, q, p = _chain_inputs(15, 16, 3, 5)
    u = torch.rand(16, 4, generator=torch.Generator().manual_seed(6), dtype=F64)
    before = [t.clone() for t in (drafts, q, p, u)]
    verify_chain(drafts, q, p, u=u)
    verify_chain(drafts, q, p, torch.Generator().manual_seed(0))
    verify_chain_greedy(drafts, p)
    acceptance_probability(p[:, 0], p[:, 1])
    residual(p[:, 0], p[:, 1])
    assert all(torch.equal(a, b) for a, b in zip(before, (drafts, q, p, u)))


def test_float32_inputs_work_and_agree_with_float64():
    drafts, q, p = _chain_inputs(16, 128, 3, 5)
    u = torch.rand(128, 4, generator=torch.Generator().manual_seed(7), dtype=F64)
    t64, n64 = verify_chain(drafts, q, p, u=u)
    t32, n32 = verify_chain(drafts, q.float(), p.float(), u=u.float())
    # Only u within float32 rounding of a threshold could differ; none is here.
    assert torch.equal(t64, t32) and torch.equal(n64, n32)


# the greedy rule


def test_greedy_accepts_the_prefix_equal_to_the_argmax_then_emits_the_argmax():
    logits = torch.tensor([[0.0, 5.0, 1.0], [3.0, 0.0, 1.0], [0.0, 1.0, 4.0], [2.0, 0.0, 0.0]])
    # argmax per position: 1, 0, 2, 0. Drafts 1, 0 match; draft 1 != 2 is corrected to 2.
    tokens, n = verify_chain_greedy(torch.tensor([1, 0, 1]), logits)
    assert n == 2 and tokens.tolist() == [1, 0, 2]
    tokens, n = verify_chain_greedy(torch.tensor([1, 0, 2]), logits)
    assert n == 3 and tokens.tolist() == [1, 0, 2, 0], "all accepted: the bonus is the last argmax"
    tokens, n = verify_chain_greedy(torch.tensor([2, 0, 2]), logits)
    assert n == 0 and tokens.tolist() == [1]


def test_greedy_equals_verify_chain_with_one_hot_p_and_q():
    B, k, V = 400, 4, 3
    g = torch.Generator().manual_seed(8)
    logits = torch.randn(B, k + 1, V, generator=g, dtype=F64)
    drafts = torch.randint(0, V, (B, k), generator=g)
    one_hot_p = torch.nn.functional.one_hot(logits.argmax(-1), V).to(F64)
    one_hot_q = torch.nn.functional.one_hot(drafts, V).to(F64)  # a greedy draft's q
    greedy = verify_chain_greedy(drafts, logits)
    for seed in range(3):  # one-hot p and q leave nothing to chance: any u gives the same result
        sampled = verify_chain(drafts, one_hot_q, one_hot_p, torch.Generator().manual_seed(seed))
        assert torch.equal(greedy[0], sampled[0]) and torch.equal(greedy[1], sampled[1])
    assert len(set(greedy[1].tolist())) == k + 1, "every accept count occurs"


def test_greedy_batched_equals_one_at_a_time():
    g = torch.Generator().manual_seed(9)
    logits = torch.randn(50, 4, 3, generator=g)
    drafts = torch.randint(0, 3, (50, 3), generator=g)
    tokens, n = verify_chain_greedy(drafts, logits)
    for b in range(50):
        tokens_b, n_b = verify_chain_greedy(drafts[b], logits[b])
        assert n_b == n[b] and torch.equal(tokens_b, tokens[b, : n_b + 1])


# bad input


def _valid() -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    drafts, q, p = _chain_inputs(17, 1, 2, 4)
    return drafts[0], q[0], p[0]


def _with(t: torch.Tensor, index: tuple, value: float) -> torch.Tensor:
    t = t.clone()
    t[index] = value
    return t


@pytest.mark.parametrize(
    "change, match",
    [
        (lambda d, q, p: (d, q, _with(p, (0, 0), -0.1)), "p has negative"),
        (lambda d, q, p: (d, _with(q, (1, 2), float("nan")), p), "q contains NaN"),
        (lambda d, q, p: (d, q, p * 1.01), "p rows must sum to 1"),
        (lambda d, q, p: (d, q * 0.5, p), "q rows must sum to 1"),
        (lambda d, q, p: (d, q, p[:2]), "p must have shape"),
        (lambda d, q, p: (d, q[:1], p), "q must have shape"),
        (lambda d, q, p: (d, torch.cat([q, torch.zeros(2, 1, dtype=F64)], 1), p), "q must have shape"),
        (lambda d, q, p: (torch.tensor([0, 4]), q, p), "draft_tokens holds ids outside the vocabulary"),
        (lambda d, q, p: (torch.tensor([0, -1]), q, p), "draft_tokens"),
        (lambda d, q, p: (d[None, None], q, p), "draft_tokens must have shape"),
        (lambda d, q, p: (torch.zeros(0, dtype=torch.long), q, p), "p must have shape"),
        (lambda d, q, p: (torch.zeros(0, dtype=torch.long), q[:1], p[:1]), "q must have shape"),
    ],
)
def test_bad_input_raises_value_error_naming_the_argument(change, match):
    d, q, p = change(*_valid())
    with pytest.raises(ValueError, match=match):
        verify_chain(d, q, p, torch.Generator().manual_seed(0))


def test_a_draft_that_q_gives_probability_zero_is_refused():
    d, q, p = _valid()
    q = q.clone()
    q[0] = torch.tensor([0.0, 0.5, 0.5, 0.0], dtype=F64)
    with pytest.raises(ValueError, match=r"q gives probability 0 to a draft"):
        verify_chain(torch.tensor([0, int(d[1])]), q, p, torch.Generator().manual_seed(0))


def test_float_draft_tokens_and_non_tensors_raise_type_error():
    d, q, p = _valid()
    with pytest.raises(TypeError, match="draft_tokens"):
        verify_chain(d.double(), q, p)
    with pytest.raises(TypeError, match="q"):
        verify_chain(d, q.tolist(), p)


@pytest.mark.parametrize(
    "u, match",
    [
        (torch.tensor([0.5, 0.5], dtype=F64), "u must have shape"),
        (torch.tensor([0.5, 1.0, 0.1], dtype=F64), r"\[0, 1\)"),
        (torch.tensor([0.5, -0.1, 0.1], dtype=F64), r"\[0, 1\)"),
        (torch.tensor([0.5, float("nan"), 0.1], dtype=F64), r"\[0, 1\)"),
    ],
)
def test_bad_uniforms_raise_value_error(u, match):
    with pytest.raises(ValueError, match=match):
        verify_chain(*_valid(), u=u)


def test_greedy_rejects_nan_and_shape_mismatch():
    with pytest.raises(ValueError, match="NaN"):
        verify_chain_greedy(torch.tensor([0]), torch.tensor([[0.0, float("nan")], [1.0, 0.0]]))
    with pytest.raises(ValueError, match="p must have shape"):
        verify_chain_greedy(torch.tensor([0, 1]), torch.zeros(2, 2))
    with pytest.raises(ValueError, match="draft_tokens"):
        verify_chain_greedy(torch.tensor([2]), torch.zeros(2, 2))


def test_acceptance_and_residual_reject_mismatched_or_invalid_pairs():
    p = torch.tensor([0.5, 0.5], dtype=F64)
    with pytest.raises(ValueError, match="same shape"):
        residual(p, torch.tensor([0.2, 0.3, 0.5], dtype=F64))
    with pytest.raises(ValueError, match="q has negative"):
        acceptance_probability(p, torch.tensor([1.5, -0.5], dtype=F64))


# -- the shared probability check: a fast path, then the message that names the defect ----------

@pytest.mark.parametrize(
    "row, match",
    [
        ([1.2, -0.2, 0.0], "negative"),  # sums to 1: only the minimum catches it
        ([0.5, float("nan"), 0.5], "NaN"),
        ([0.5, float("inf"), 0.5], "inf"),
        ([1.0, float("-inf"), 1.0], "inf"),
        ([0.5, 0.4, 0.0], "sum to 1"),
    ],
)
@pytest.mark.parametrize("dtype", [torch.float32, F64])
def test_check_probs_names_each_defect(row, match, dtype):
    from specref._validate import check_probs

    x = torch.tensor([[0.2, 0.3, 0.5], row], dtype=dtype)
    with pytest.raises(ValueError, match=match):
        check_probs("q", x)


def test_check_probs_accepts_rows_within_the_float32_tolerance():
    from specref._validate import check_probs

    x = torch.softmax(torch.randn(5, 4096, generator=torch.Generator().manual_seed(0)), -1)  # float32 rounding
    assert check_probs("q", x) is x
    with pytest.raises(ValueError, match="sum to 1"):
        check_probs("q", x * (1 + 1e-3))
