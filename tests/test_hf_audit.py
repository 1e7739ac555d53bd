"""specref's Monte-Carlo test audits transformers' own speculative sampler (the installed one).

Exact at the default; flagged with `assistant_ensemble_weight` (lossy by construction) and
matching that rule's closed form; the negative control (a sampler that skips the residual)
flagged by the same test at the same sample size; and the path where the installed
transformers lacks the sampler: it is reported, not crashed on.
"""

from __future__ import annotations

import pytest
import torch

from specref.checks import broken, hf_audit, pitfalls
from specref.checks.exact import step_distribution, step_distribution_formula

N = 20_000  # the notebook's sample size: the power below is measured at it


@pytest.fixture(scope="module")
def sampler():
    fn, has_weight, found = hf_audit.find_sampler()
    if fn is None:
        pytest.skip(found)
    return fn, has_weight


@pytest.fixture(scope="module")
def case():
    return hf_audit.audit_case()


def test_transformers_sampler_is_exact_at_its_default(sampler, case):
    p, q = case
    test = pitfalls.step_test(hf_audit.hf_rule(sampler[0]), p, q, N, torch.Generator().manual_seed(3))
    assert test.passed, str(test)


def test_the_negative_control_is_flagged_at_the_same_size(case):
    p, q = case
    test = pitfalls.step_test(broken.verify_skip_residual, p, q, N, torch.Generator().manual_seed(3))
    assert not test.passed, str(test)


def test_the_test_has_power_at_this_size(case):
    p, q = case
    exact = hf_audit.exact_table(p, q)
    skip = pitfalls.step_table(step_distribution(p, q, broken.verify_skip_residual), 2, 4)
    assert hf_audit.power(exact, skip, N, trials=50) == 1.0
    small = hf_audit.exact_table(p, q, 0.98)  # an output 0.015 in TV from the target's
    assert 0.01 < pitfalls.tv_distance(small, exact) < 0.02
    assert hf_audit.power(exact, small, N, trials=100) >= 0.9
    assert hf_audit.power(exact, exact, N, trials=100) <= 0.05  # false alarms at alpha = 1e-3


def test_ensemble_weight_is_lossy_and_matches_its_closed_form(sampler, case):
    fn, has_weight = sampler
    if not has_weight:
        pytest.skip("this transformers has no assistant_ensemble_weight")
    p, q = case
    tokens = hf_audit.sample_steps(hf_audit.hf_rule(fn, 0.8), p, q, N, torch.Generator().manual_seed(4))
    against_p = hf_audit.step_test_of(tokens, hf_audit.exact_table(p, q), 4)
    against_own = hf_audit.step_test_of(tokens, hf_audit.exact_table(p, q, 0.8), 4)
    assert not against_p.passed and against_own.passed, (str(against_p), str(against_own))
    assert hf_audit.tv_from_exact(p, q, 0.8) > 0.1


def test_ensemble_closed_form_is_the_exact_rule_at_weight_one(case):
    p, q = case
    ours = hf_audit.ensemble_step_distribution(p, q, 1.0)
    exact = step_distribution_formula(p, q)
    assert pitfalls.tv_distance(ours, exact) < 1e-12
    first = hf_audit.first_token(ours, 4)
    torch.testing.assert_close(first, p[0], atol=1e-12, rtol=0)


def test_hf_rule_leaves_the_global_generator_alone_and_is_reproducible(sampler, case):
    p, q = case
    state = torch.random.get_rng_state()
    a = hf_audit.sample_steps(hf_audit.hf_rule(sampler[0]), p, q, 200, torch.Generator().manual_seed(5))
    b = hf_audit.sample_steps(hf_audit.hf_rule(sampler[0]), p, q, 200, torch.Generator().manual_seed(5))
    assert torch.equal(a, b) and torch.equal(torch.random.get_rng_state(), state)


def test_hf_rule_refuses_enumeration_and_bad_weights(sampler, case):
    p, q = case
    rule = hf_audit.hf_rule(sampler[0])
    drafts = torch.zeros((1, 2), dtype=torch.long)
    with pytest.raises(ValueError, match="cannot be enumerated"):
        rule(drafts, q[None], p[None], u=torch.zeros(1, 3))
    with pytest.raises(TypeError, match="explicit torch.Generator"):
        rule(drafts, q[None], p[None])
    for bad in (0.0, 1.0, True, 1.5):
        with pytest.raises(ValueError, match="ensemble_weight"):
            hf_audit.hf_rule(sampler[0], bad)


def test_a_transformers_without_the_sampler_is_reported(monkeypatch):
    transformers_utils = pytest.importorskip("transformers.generation.utils")
    monkeypatch.delattr(transformers_utils, "_speculative_sampling")
    fn, has_weight, found = hf_audit.find_sampler()
    assert fn is None and not has_weight and "has no transformers.generation.utils._speculative_sampling" in found


def test_a_sampler_without_the_weight_is_reported(monkeypatch):
    transformers_utils = pytest.importorskip("transformers.generation.utils")

    def old_sampler(candidate_input_ids, candidate_logits, candidate_length, new_logits):  # a 4.x signature
        raise AssertionError("not called")

    monkeypatch.setattr(transformers_utils, "_speculative_sampling", old_sampler)
    fn, has_weight, found = hf_audit.find_sampler()
    assert fn is old_sampler and not has_weight and "without assistant_ensemble_weight" in found
