"""process_logits and sample: the distribution decoding draws from, and the draw itself."""

from __future__ import annotations

import itertools
import math

import pytest
import torch
from hypothesis import assume, given, settings
from hypothesis import strategies as st

from specref.checks.montecarlo import distribution_test
from specref.checks.toy import random_chain
from specref.sampling import process_logits, sample

F64 = torch.float64


def _logits(seed: int, shape: tuple[int, ...] = (5, 7)) -> torch.Tensor:
    return torch.randn(shape, generator=torch.Generator().manual_seed(seed), dtype=F64)


# process_logits


def test_temperature_one_is_plain_softmax():
    x = _logits(0)
    torch.testing.assert_close(process_logits(x), torch.softmax(x, -1), rtol=0, atol=1e-15)


def test_temperature_divides_the_logits():
    x = _logits(1)
    torch.testing.assert_close(process_logits(x, temperature=0.7), torch.softmax(x / 0.7, -1), rtol=0, atol=1e-15)


def test_temperature_zero_is_one_hot_on_the_argmax():
    x = _logits(2)
    probs = process_logits(x, temperature=0)
    assert torch.equal(probs, torch.nn.functional.one_hot(x.argmax(-1), x.shape[-1]).to(F64))


def test_temperature_zero_breaks_ties_on_the_first_index():
    probs = process_logits(torch.tensor([1.0, 3.0, 3.0, 0.0]), temperature=0)
    assert probs.tolist() == [0.0, 1.0, 0.0, 0.0]


def test_small_temperature_approaches_the_one_hot():
    x = _logits(3)
    torch.testing.assert_close(process_logits(x, temperature=1e-3), process_logits(x, temperature=0), rtol=0, atol=1e-6)


@pytest.mark.parametrize("top_k", [1, 2, 3, 6, 7, 50])
def test_top_k_keeps_exactly_the_k_largest_logits(top_k):
    x = _logits(4)  # continuous: no ties
    probs = process_logits(x, top_k=top_k)
    kept = probs > 0
    expected = torch.zeros_like(kept).scatter(-1, x.topk(min(top_k, x.shape[-1]), -1).indices, True)
    assert torch.equal(kept, expected)
    # Among the kept tokens the ratios are those of the softmax: renormalized, nothing else.
    full = torch.softmax(x, -1)
    torch.testing.assert_close(probs, torch.where(kept, full, 0) / torch.where(kept, full, 0).sum(-1, keepdim=True))


def test_top_k_keeps_ties_with_the_kth_logit():
    probs = process_logits(torch.tensor([2.0, 1.0, 1.0, 0.0]), top_k=2)
    assert (probs > 0).tolist() == [True, True, True, False]


def _smallest_top_p_set(probs: list[float], top_p: float) -> set[int]:
    """Brute force: the most likely tokens, fewest first, whose mass reaches top_p."""
    order = sorted(range(len(probs)), key=lambda i: -probs[i])
    for size in range(1, len(probs) + 1):
        if sum(probs[i] for i in order[:size]) >= top_p:
            return set(order[:size])
    return set(order)


@settings(derandomize=True, max_examples=150, deadline=None)
@given(
    logits=st.lists(st.floats(-4, 4, allow_nan=False), min_size=1, max_size=7),
    top_p=st.floats(0.01, 1.0),
)
def test_top_p_keeps_the_smallest_set_reaching_top_p(logits, top_p):
    x = torch.tensor(logits, dtype=F64)
    full = torch.softmax(x, -1).tolist()
    # Ties in probability make "the" smallest set ambiguous; only distinct values are specified.
    assume(len(set(full)) == len(full))
    assume(all(abs(sum(sorted(full)[::-1][:i]) - top_p) > 1e-9 for i in range(len(full) + 1)))
    kept = set(torch.nonzero(process_logits(x, top_p=top_p) > 0).flatten().tolist())
    assert kept == _smallest_top_p_set(full, top_p)


def test_top_p_always_keeps_the_most_likely_token():
    x = torch.tensor([0.0, 5.0, 1.0])
    assert process_logits(x, top_p=1e-9).tolist() == [0.0, 1.0, 0.0]


# softmax of these float64 logits is exactly [0.5, 0.25, 0.25]: the masses before the sorted tokens are 0, 0.5, 0.75.
EXACT_HALF_QUARTER_QUARTER = torch.tensor([math.log(2), 0.0, 0.0], dtype=F64)


def test_the_boundary_logits_give_exact_probabilities_so_the_boundary_is_hit_exactly():
    assert torch.softmax(EXACT_HALF_QUARTER_QUARTER, -1).tolist() == [0.5, 0.25, 0.25]


def test_top_p_drops_a_token_whose_mass_before_it_equals_top_p():
    # The set {0} already reaches top_p = 0.5, so the next token is not needed.
    assert process_logits(EXACT_HALF_QUARTER_QUARTER, top_p=0.5).tolist() == [1.0, 0.0, 0.0]


def test_top_p_just_above_the_boundary_keeps_the_next_token():
    kept = process_logits(EXACT_HALF_QUARTER_QUARTER, top_p=math.nextafter(0.5, 1.0)) > 0
    assert bool(kept[0]) and int(kept.sum()) == 2


def test_top_k_is_applied_before_top_p():
    x = torch.log(torch.tensor([0.4, 0.3, 0.2, 0.1], dtype=F64))
    # top_k=3 leaves (0.4, 0.3, 0.2)/0.9; top_p=0.7 then needs 0.444 + 0.333 -> two tokens.
    assert (process_logits(x, top_k=3, top_p=0.7) > 0).tolist() == [True, True, False, False]


def test_masked_minus_inf_logits_get_probability_zero():
    probs = process_logits(torch.tensor([0.0, float("-inf"), 1.0]))
    assert probs[1] == 0 and abs(probs.sum().item() - 1) < 1e-6


def test_same_processing_of_the_same_logits_gives_identical_p_and_q():
    chain = random_chain(6, 2.0, torch.Generator().manual_seed(5))
    for args in [(1.0, None, None), (0.7, 3, None), (1.3, None, 0.8), (0.0, None, None)]:
        p = chain.processed(*args).transition
        q = process_logits(torch.log(chain.transition), *args)
        assert torch.equal(p, q)


def test_process_logits_keeps_float64_and_does_not_modify_its_input():
    x = _logits(6)
    before = x.clone()
    out = process_logits(x, temperature=0.5, top_k=3, top_p=0.9)
    assert out.dtype == F64 and torch.equal(x, before)


@pytest.mark.parametrize(
    "kwargs, name",
    [
        ({"temperature": -0.1}, "temperature"),
        ({"temperature": float("nan")}, "temperature"),
        ({"top_k": 0}, "top_k"),
        ({"top_k": -3}, "top_k"),
        ({"top_p": 0.0}, "top_p"),
        ({"top_p": 1.5}, "top_p"),
        ({"top_p": -0.2}, "top_p"),
    ],
)
def test_bad_sampling_parameters_raise_value_error_naming_them(kwargs, name):
    with pytest.raises(ValueError, match=name):
        process_logits(_logits(7), **kwargs)


@pytest.mark.parametrize(
    "logits, name",
    [
        (torch.tensor([0.0, float("nan")]), "NaN"),
        (torch.tensor([0.0, float("inf")]), r"\+inf"),
        (torch.full((3,), float("-inf")), "-inf"),
        (torch.zeros(0), "V >= 1"),
    ],
)
def test_bad_logits_raise_value_error(logits, name):
    with pytest.raises(ValueError, match=name):
        process_logits(logits)


def test_integer_logits_and_bool_top_k_raise_type_error():
    with pytest.raises(TypeError, match="logits"):
        process_logits(torch.tensor([1, 2]))
    with pytest.raises(TypeError, match="top_k"):
        process_logits(_logits(8), top_k=True)


# sample


def test_sample_returns_the_first_token_whose_cdf_exceeds_u():
    probs = torch.tensor([[0.2, 0.5, 0.3]] * 6, dtype=F64)
    u = torch.tensor([0.0, 0.1999, 0.2, 0.6999, 0.7, 0.9999], dtype=F64)
    # At u = 0.2 exactly the CDF is not yet *above* u, so the draw moves to the next token.
    assert sample(probs, u=u).tolist() == [0, 0, 1, 1, 2, 2]


@settings(derandomize=True, max_examples=100, deadline=None)
@given(
    weights=st.lists(st.sampled_from([0.0, 1e-300, 1e-12, 0.1, 0.5, 1.0]), min_size=1, max_size=8),
    u=st.floats(0.0, 1.0, exclude_max=True),
)
def test_sample_never_returns_a_zero_probability_token(weights, u):
    if sum(weights) == 0:
        weights = weights[:-1] + [1.0]
    probs = torch.tensor(weights, dtype=F64)
    probs = probs / probs.sum()
    assert probs[sample(probs, u=torch.tensor(u, dtype=F64))] > 0


def test_sample_with_the_same_seed_reproduces():
    probs = torch.softmax(_logits(9, (1000, 6)), -1)
    a = sample(probs, torch.Generator().manual_seed(3))
    b = sample(probs, torch.Generator().manual_seed(3))
    assert torch.equal(a, b)


def test_sample_does_not_modify_its_input():
    probs = torch.softmax(_logits(10), -1)
    before = probs.clone()
    sample(probs, torch.Generator().manual_seed(0))
    assert torch.equal(probs, before)


def _sampling_check(draw) -> object:
    """Chi-square test of 200,000 draws from a fixed 6-token distribution."""
    probs = torch.tensor([0.05, 0.3, 0.001, 0.2, 0.149, 0.3], dtype=F64)
    draws = draw(probs.expand(200_000, 6), torch.Generator().manual_seed(11))
    return distribution_test(probs, samples=draws)


def test_sample_draws_from_the_given_distribution():
    result = _sampling_check(sample)
    assert result.passed, str(result)


def test_sample_check_flags_an_off_by_one_index():
    # Negative control: the same test must reject a sampler returning the token after the right one.
    def off_by_one(probs, generator):
        return (sample(probs, generator) + 1) % probs.shape[-1]

    result = _sampling_check(off_by_one)
    assert not result.passed and result.p_value < 1e-100, str(result)


def test_sample_of_every_token_combination_in_a_tiny_vocabulary_is_in_support():
    for support in itertools.product([0, 1], repeat=3):
        if not any(support):
            continue
        probs = torch.tensor(support, dtype=F64) / sum(support)
        draws = sample(probs.expand(64, 3), torch.Generator().manual_seed(0))
        assert all(support[i] for i in draws.tolist())
