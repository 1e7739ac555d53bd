"""The graders: exact enumeration is right, correct answers pass, typical wrong answers fail with a useful hint."""

from __future__ import annotations

import random

import numpy as np
import pytest
import torch
from model_factory import best_k
from scipy import stats

from specref.chain_verify import verify_chain  # ex03's Task 4 loop calls it (the exercise's setup imports it)
from specref.checks.exact import step_distribution_formula
from specref.checks.rng import TorchRNG, exact_distribution
from specref_grading.checks import accept_reject
from specref_grading.checks import speedup as speedup_grading


# The answers a learner writes. A task may not call the specref function it asks for (the reference rule,
# specref_grading.checks.rules), so the passing answers are written here, as the solutions write them.
def residual(p, q):
    diff = (p - q).clamp(min=0)
    mass = diff.sum(-1, keepdim=True)
    return torch.where(mass > 0, diff / torch.where(mass > 0, mass, torch.ones_like(mass)), p)


def simulate_accepted(alphas, n, generator, bug=None):
    """ex03 Task 1 as the solution writes it, with `bug` in (the negative controls)."""
    k = len(alphas)
    a = torch.tensor(alphas, dtype=torch.float64).reshape(k)
    if bug == "one_alpha" and k:
        a = a[:1].expand(k)  # every position at the first position's rate
    if bug == "shifted" and k:
        a = torch.cat([a[1:], a[:1]])  # the rates one position off
    u = torch.rand((n, k), generator=generator, dtype=torch.float64)
    accepted = (u > a if bug == "flipped" else u < a).long()
    if bug == "no_stop":
        return accepted.sum(1)  # every draft judged on its own: no first rejection
    if bug == "global_rng":
        accepted = (torch.rand((n, k), dtype=torch.float64) < a).long()
    return accepted.cumprod(1).sum(1)


def accepted_count_pmf(alphas):
    """ex03 Task 2 as the solution writes it."""
    pmf, reach = [], 1.0
    for a in alphas:
        pmf.append(reach * (1 - a))
        reach *= a
    pmf.append(reach)
    return pmf



# --------------------------------------------------------------------------------------
# Reference answers, written with the learner's interface
# --------------------------------------------------------------------------------------


def step(draft_tokens, q, p, rng):
    """The speculative step as a learner writes it (the solution notebook's version)."""
    k = len(draft_tokens)
    out = []
    for i in range(k):
        x = int(draft_tokens[i])
        if rng.uniform() < min(1.0, float(p[i, x] / q[i, x])):
            out.append(x)
        else:
            out.append(rng.categorical(residual(p[i], q[i])))
            return out
    out.append(rng.categorical(p[k]))
    return out


def step_multiplied(draft_tokens, q, p, rng):
    """Same rule, accept test written as u * q(x) < p(x) and the bonus sampled by a hand-made inverse CDF."""
    out = []
    for i, x in enumerate(draft_tokens.tolist()):
        if rng.uniform() * q[i, x] < p[i, x]:
            out.append(x)
            continue
        out.append(rng.categorical(residual(p[i], q[i])))
        return out
    u, cdf = rng.uniform(), torch.cumsum(p[-1], 0)
    for y in range(len(cdf)):
        if u < cdf[y]:
            return out + [y]
    return out + [len(cdf) - 1]


def emit_parts(p, q, a):
    """P(emit x) in its two parts for the rule that keeps a drafted x with probability a(x), as a learner writes
    them: drafted and kept, rejected and replaced; a rule no replacement can make lossless is refused."""
    accepted = q * a
    if bool((accepted > p + 1e-9).any()):
        raise ValueError(f"a = {a.tolist()} keeps a token more often than p allows")
    return accepted, (p - accepted).clamp(min=0)


def replacement(p, q, a):
    """The distribution a rejection of the rule a draws from (ex02 Task 2), p when the rule never rejects."""
    _, missing = emit_parts(p, q, a)
    return missing / missing.sum() if missing.sum() > 1e-12 else p.clone()


WORKED_BETA, WORKED_RES = 0.65, torch.tensor([6 / 7, 0.0, 1 / 7], dtype=torch.float64)  # ex02's worked rule, by hand


# --------------------------------------------------------------------------------------
# The exact enumerator
# --------------------------------------------------------------------------------------


def test_repeated_comparisons_of_one_uniform_are_conditioned_on_earlier_branches():
    def three_way(rng):
        u = rng.uniform()
        if u < 0.2:
            return "a"
        if u < 0.5:  # given u >= 0.2, this has probability 0.3 / 0.8
            return "b"
        return "c" if u >= 0.9 else "d"

    d = exact_distribution(three_way)
    assert d == pytest.approx({"a": 0.2, "b": 0.3, "c": 0.1, "d": 0.4}, abs=1e-15)


def test_affine_comparisons_branch_on_the_implied_threshold():
    assert exact_distribution(lambda r: r.uniform() * 0.5 < 0.2)[True] == pytest.approx(0.4)
    assert exact_distribution(lambda r: 1 - r.uniform() > 0.7)[True] == pytest.approx(0.3)
    assert exact_distribution(lambda r: -2 * r.uniform() + 1 >= 0)[True] == pytest.approx(0.5)
    assert exact_distribution(lambda r: (r.uniform() + 1) / 4 <= 0.3)[True] == pytest.approx(0.2)
    assert exact_distribution(lambda r: r.uniform() * 0 < 0.5) == {True: 1.0}


def test_reflected_comparisons_with_tensors_and_numpy_scalars():
    t = torch.tensor(0.25, dtype=torch.float64)
    assert exact_distribution(lambda r: bool(t > r.uniform()))[True] == pytest.approx(0.25)
    assert exact_distribution(lambda r: bool(np.float64(0.7) > r.uniform()))[True] == pytest.approx(0.7)
    assert exact_distribution(lambda r: t * r.uniform() < 0.125)[True] == pytest.approx(0.5)


def test_thresholds_outside_the_unit_interval_are_clipped():
    assert exact_distribution(lambda r: r.uniform() < 1.7) == {True: 1.0}
    assert exact_distribution(lambda r: r.uniform() < -0.2) == {False: 1.0}
    assert exact_distribution(lambda r: r.uniform() < float("inf")) == {True: 1.0}


def test_categorical_branches_over_every_index_with_positive_probability():
    d = exact_distribution(lambda r: (r.categorical([0.5, 0.0, 0.5]), r.categorical(torch.tensor([0.25, 0.75]))))
    assert d == pytest.approx({(0, 0): 0.125, (0, 1): 0.375, (2, 0): 0.125, (2, 1): 0.375})


@pytest.mark.parametrize(
    "bad, message",
    [
        (lambda r: float(r.uniform()) < 0.5, "symbolic value"),
        (lambda r: bool(r.uniform()), "symbolic value"),
        (lambda r: r.uniform() == 0.5, "probability 0"),
        (lambda r: r.uniform() * r.uniform() < 0.5, "two values derived"),
        (lambda r: r.uniform() < torch.tensor([0.1, 0.2]), "shape"),
        (lambda r: r.uniform() < "0.5", "str"),
    ],
)
def test_unsupported_uses_of_a_symbolic_uniform_raise_type_error(bad, message):
    with pytest.raises(TypeError, match=message):
        exact_distribution(bad)


def test_comparing_a_uniform_with_nan_names_the_likely_division():
    with pytest.raises(ValueError, match="NaN"):
        exact_distribution(lambda r: r.uniform() < float("nan"))


@pytest.mark.parametrize(
    "probs, message",
    [([0.3, 0.0, 0.0], "sum to 0.3"), ([1.5, -0.5], "negative"), ([float("nan"), 1.0], "non-finite"), ([[1.0]], "1-D")],
)
def test_categorical_rejects_what_is_not_a_distribution(probs, message):
    with pytest.raises(ValueError, match=message):
        exact_distribution(lambda r: r.categorical(probs))
    with pytest.raises(ValueError, match=message):
        TorchRNG(torch.Generator().manual_seed(0)).categorical(probs)


def test_a_function_that_never_stops_drawing_hits_the_draw_limit():
    def forever(r):
        while r.uniform() < 0.5:
            pass
        return 0

    with pytest.raises(RuntimeError, match="loop"):
        exact_distribution(forever)


def test_too_many_paths_hit_the_path_limit():
    with pytest.raises(RuntimeError, match="random paths"):
        exact_distribution(lambda r: tuple(r.categorical([0.5, 0.5]) for _ in range(12)), max_paths=1000)


def test_a_function_that_is_random_outside_the_rng_is_reported_as_nondeterministic():
    gen = torch.Generator().manual_seed(0)

    def sneaky(r):
        return r.uniform() < float(torch.rand((), generator=gen))

    with pytest.raises(RuntimeError, match="not deterministic"):
        exact_distribution(sneaky)


def test_torch_rng_draws_reproducibly_from_its_generator():
    a = TorchRNG(torch.Generator().manual_seed(3))
    b = TorchRNG(torch.Generator().manual_seed(3))
    draws_a = [a.uniform() for _ in range(5)] + [a.categorical([0.2, 0.3, 0.5]) for _ in range(5)]
    draws_b = [b.uniform() for _ in range(5)] + [b.categorical([0.2, 0.3, 0.5]) for _ in range(5)]
    assert draws_a == draws_b
    assert all(0 <= u < 1 for u in draws_a[:5])
    with pytest.raises(TypeError, match="torch.Generator"):
        TorchRNG(0)


def _chain():
    q = torch.tensor([[0.3, 0.6, 0.1], [0.5, 0.25, 0.25]], dtype=torch.float64)
    p = torch.tensor([[0.6, 0.3, 0.1], [0.2, 0.2, 0.6], [0.1, 0.6, 0.3]], dtype=torch.float64)
    return q, p


def _drafted(step_fn, q, p):
    """Draft x ~ q through the rng, then run the step: a whole speculative step as one function of rng."""

    def run(rng):
        draft = torch.tensor([rng.categorical(q[i]) for i in range(q.shape[0])])
        return tuple(step_fn(draft, q, p, rng))

    return run


def test_enumerating_a_learner_style_step_agrees_with_the_closed_form_of_specref_exact():
    # Two independent routes to the same numbers: this module's branch enumeration of a step written
    # against the rng interface, and the proof's closed form in specref.checks.exact.
    q, p = _chain()
    ours = exact_distribution(_drafted(step, q, p))
    formula = step_distribution_formula(p, q)
    assert set(ours) == set(formula)
    assert max(abs(ours[s] - formula[s]) for s in ours) < 1e-12


def _accept_min_ratio(rng, px, qx):
    return rng.uniform() < min(1.0, float(px / qx))


def _bonus_from_p_after_the_last_draft(rng, p, k):
    return [rng.categorical(p[k])]


def _learner_step(accepts=_accept_min_ratio, replacement=residual, stops=True,
                  bonus=_bonus_from_p_after_the_last_draft):
    """A learner's speculative step built from its parts; each broken sampler swaps one part for a typical mistake.

    accepts(rng, p(x), q(x)) -> keep the draft x; replacement(p_i, q_i) -> the distribution a rejected position
    is redrawn from; stops: whether the step ends at its first rejection; bonus(rng, p, k) -> the tokens added
    when every draft was kept.
    """

    def step_fn(draft_tokens, q, p, rng):
        out = []
        for i, x in enumerate(draft_tokens.tolist()):
            if accepts(rng, p[i, x], q[i, x]):
                out.append(x)
                continue
            out.append(rng.categorical(replacement(p[i], q[i])))
            if stops:
                return out
        return out + bonus(rng, p, len(draft_tokens))

    return step_fn


_skip_residual = _learner_step(replacement=lambda p_i, q_i: p_i)


def test_sampling_with_torch_rng_follows_the_enumerated_distribution_and_a_broken_rule_is_flagged():
    # Chi-square goodness of fit of 4000 real draws (smallest expected cell count: 8) against each exact
    # distribution; the same test must accept the rule the draws came from and reject one that skips the residual.
    q, p = _chain()
    run = _drafted(step, q, p)
    exact = exact_distribution(run)
    broken = exact_distribution(_drafted(_skip_residual, q, p))
    rng = TorchRNG(torch.Generator().manual_seed(0))
    n = 4_000
    counts: dict = {}
    for _ in range(n):
        s = run(rng)
        counts[s] = counts.get(s, 0) + 1
    keys = sorted(set(exact) | set(broken) | set(counts), key=lambda s: (len(s), s))
    assert set(counts) <= set(exact)
    observed = np.array([counts.get(s, 0) for s in keys])

    def p_value(dist):
        expected = np.array([dist.get(s, 0.0) for s in keys]) * n
        live = expected > 0
        if (observed[~live] > 0).any():
            return 0.0
        return stats.chisquare(observed[live], expected[live] * observed[live].sum() / expected[live].sum()).pvalue

    assert p_value(exact) > 1e-3
    assert p_value(broken) < 1e-3


# --------------------------------------------------------------------------------------
# Correct answers pass
# --------------------------------------------------------------------------------------


def test_correct_answers_pass_every_grader(capsys):
    accept_reject.check_worked_example(WORKED_BETA, WORKED_RES, emit_parts)
    accept_reject.check_residual(replacement)
    accept_reject.check_accept_reject_step(step)
    accept_reject.check_accept_reject_step(step_multiplied, n_cases=20, seed=5)
    speedup_grading.check_accepted_counts(simulate_accepted)
    speedup_grading.check_accepted_count_pmf(accepted_count_pmf)
    speedup_grading.check_best_k(best_k)
    assert capsys.readouterr().out.count("passed") == 7


def test_graders_leave_the_global_random_state_alone():
    before = (torch.random.get_rng_state(), np.random.get_state()[1].copy(), random.getstate())
    accept_reject.check_residual(replacement, n_cases=10)
    accept_reject.check_accept_reject_step(step, n_cases=10)
    after = (torch.random.get_rng_state(), np.random.get_state()[1].copy(), random.getstate())
    assert torch.equal(before[0], after[0]) and np.array_equal(before[1], after[1]) and before[2] == after[2]


def test_an_unsolved_stub_reaches_the_learner_as_not_implemented():
    def stub(*args):
        raise NotImplementedError()

    for check in (accept_reject.check_residual, accept_reject.check_accept_reject_step,
                  speedup_grading.check_accepted_counts, speedup_grading.check_accepted_count_pmf,
                  speedup_grading.check_best_k, speedup_grading.check_toy_measurement):
        with pytest.raises(NotImplementedError):
            check(stub)


# --------------------------------------------------------------------------------------
# Typical wrong answers fail, with the hint that names the mistake
# --------------------------------------------------------------------------------------


def _emit_parts_from(accepted, replaced):
    return lambda p, q, a: (accepted(p, q, a), replaced(p, q, a))


def _never_refuses(p, q, a):
    accepted = q * a
    return accepted, p - accepted


def _chapter_parts(p, q, a):
    return torch.minimum(p, q), (p - q).clamp(min=0)


def _normalised_missing(p, q, a):
    m = (p - q * a).clamp(min=0)
    return m / m.sum()


@pytest.mark.parametrize(
    "beta, res, parts, message",
    [
        (0.7, WORKED_RES, emit_parts, "chapter's rule's"),
        (1.3, WORKED_RES, emit_parts, "at most 1"),
        (2 / 3, WORKED_RES, emit_parts, "not uniformly nor from p"),
        (WORKED_BETA, [0.3, 0, 0.05], emit_parts, "a distribution sums to 1"),
        (WORKED_BETA, [1, 0, 0], emit_parts, "chapter's residual"),
        (WORKED_BETA, [0.6, 0.3, 0.1], emit_parts, "you returned p"),
        (None, WORKED_RES, emit_parts, "single number"),
        (WORKED_BETA, WORKED_RES, lambda p, q, a: p, "a pair"),
        # Typing in p, the known answer, is not enough: the parts must be computed.
        (WORKED_BETA, WORKED_RES, _emit_parts_from(lambda p, q, a: p, lambda p, q, a: torch.zeros_like(p)), "total P"),
        (WORKED_BETA, WORKED_RES, _emit_parts_from(lambda p, q, a: q, lambda p, q, a: p - q), "only some of the time"),
        (WORKED_BETA, WORKED_RES, _chapter_parts, "chapter's rule keeps"),
        (WORKED_BETA, WORKED_RES, _never_refuses, "Raise ValueError"),
        (WORKED_BETA, WORKED_RES, lambda p, q, a: (_ for _ in ()).throw(ValueError("no")), "can be made lossless"),
        (WORKED_BETA, WORKED_RES, _emit_parts_from(lambda p, q, a: q * a, lambda p, q, a: p - q * a), "Raise ValueError"),
        (WORKED_BETA, WORKED_RES, _emit_parts_from(lambda p, q, a: emit_parts(p, q, a)[0], _normalised_missing),
         "never rejects a draft here|weight the replacement"),
    ],
)
def test_worked_example_rejects_wrong_beta_residual_or_emit_parts(beta, res, parts, message):
    with pytest.raises(AssertionError, match=message):
        accept_reject.check_worked_example(beta, res, parts)


def test_the_worked_rules_cases_include_lossy_rules_and_rules_that_never_reject():
    cases = accept_reject._rule_cases(np.random.default_rng(7), 40)
    lossy = [c for c in cases if not accept_reject._feasible(*c[1:])]
    never_rejects = [c for c in cases if accept_reject._feasible(*c[1:]) and float((c[1] - c[2] * c[3]).sum()) < 1e-9]
    assert 5 <= len(lossy) <= 30 and never_rejects


def _unnormalized(p, q, a):
    return emit_parts(p, q, a)[1]


def _divides_by_zero(p, q, a):
    d = emit_parts(p, q, a)[1]
    return d / d.sum()


def _chapter_residual(p, q, a):
    emit_parts(p, q, a)
    return residual(p, q)


def _in_place(p, q, a):
    p.sub_(q * a).clamp_(min=0)
    return p / p.sum() if p.sum() > 0 else q


@pytest.mark.parametrize(
    "wrong, message",
    [
        (_unnormalized, "a distribution sums to 1"),
        (_divides_by_zero, "keeps every draft here"),
        (_chapter_residual, "chapter's residual"),
        (lambda p, q, a: emit_parts(p, q, a) and p, "you returned p"),
        (lambda p, q, a: _normalised_missing(p, q, a).nan_to_num(1.0), "Raise ValueError|a distribution"),
        (lambda p, q, a: replacement(p, q, a).float(), "float64"),
        (lambda p, q, a: replacement(p, q, a)[:-1], "shape"),
        (_in_place, "in place"),
    ],
)
def test_residual_grader_rejects_typical_mistakes(wrong, message):
    with pytest.raises(AssertionError, match=message):
        accept_reject.check_residual(wrong)


def _plain_decoding(draft_tokens, q, p, rng):
    return [rng.categorical(p[0])]


def _modifies_p(draft_tokens, q, p, rng):
    out = step(draft_tokens, q, p, rng)
    p.zero_()
    return out


@pytest.mark.parametrize(
    "wrong, message",
    [
        (_learner_step(accepts=lambda rng, px, qx: rng.uniform() > float(px / qx)), "comparison is inverted"),
        (_learner_step(accepts=lambda rng, px, qx: px > 0 and rng.uniform() < float(qx / px)), "ratio is upside down"),
        (_learner_step(stops=False), "after the first rejection the step emits its replacement and stops"),
        (_learner_step(bonus=lambda rng, p, k: [] if k else [rng.categorical(p[0])]), "bonus token sampled from p_"),
        (_learner_step(bonus=lambda rng, p, k: [rng.categorical(p[max(k - 1, 0)])]),
         "the bonus comes from the row after the last draft"),
        (_skip_residual, "not exact(.|\n)*You sampled p_1 itself"),
        (_learner_step(replacement=lambda p_i, q_i: q_i), "not exact(.|\n)*sampled the draft distribution q"),
        (_learner_step(replacement=lambda p_i, q_i: (p_i - q_i).clamp(min=0)), "normalize them first"),
        (_plain_decoding, "follows p, but it does not apply the speculative rule(.|\n)*accepts draft"),
        (_learner_step(accepts=lambda rng, px, qx: torch.rand(()) < min(1.0, float(px / qx))),
         "global random number generator"),
        (_learner_step(accepts=lambda rng, px, qx: float(rng.uniform()) < min(1.0, float(px / qx))),
         "symbolic value"),
        (_modifies_p, "in place"),
        (lambda d, q, p, rng: [t + 0.5 for t in step(d, q, p, rng)], "whole-number ids"),  # 3.0 would be id 3
        (lambda d, q, p, rng: [], "at least one"),
        (lambda d, q, p, rng: step(d, q, p, rng) if torch.tensor([rng.uniform()]) else [], "symbolic value"),
    ],
)
def test_step_grader_rejects_typical_mistakes(wrong, message):
    with pytest.raises(AssertionError, match=message):
        accept_reject.check_accept_reject_step(wrong)


def test_the_reference_rule_ignores_a_learner_name_that_a_grading_helper_also_has():
    # Every grader module holds the shared helpers (passed, close, ...) under their public names; a learner
    # function that reads the exercise's grader module and an attribute `.passed` of its own result uses neither.
    from specref_grading.checks.rules import reference_uses

    def answer(result):
        assert accept_reject is not None  # the exercise's grader module, a global of the learner's notebook
        return result.passed or result.close

    assert reference_uses(answer, ("specref_grading.checks",)) == []
    # The control: a check function of the same module is still a forbidden use.
    assert reference_uses(lambda r: accept_reject.check_residual, ("specref_grading.checks",)) == [
        "specref_grading.checks.accept_reject.check_residual"]


def test_a_reference_imported_inside_the_learners_function_is_found_as_one_imported_at_the_top():
    # An import in a function's body is not among its globals: the rule reads the import statements themselves.
    from specref_grading.checks.rules import reference_uses

    forbidden, allowed = ("specref.theory", "specref.checks.montecarlo"), ("specref.checks.montecarlo.ALPHA",)

    def from_import(a, c):
        from specref.theory import optimal_k
        return optimal_k(a, c, 10)

    def through_the_package(a, c):
        from specref import optimal_k  # a lazy re-export: judged where it is defined
        return optimal_k(a, c, 10)

    def module_import():
        import specref.checks.montecarlo as m
        return m.distribution_test

    def submodule_from_package():
        from specref.checks import montecarlo
        return montecarlo

    def allowed_and_unrelated():
        import math

        from specref.checks.montecarlo import ALPHA
        return math.pi, ALPHA

    assert reference_uses(from_import, forbidden) == ["specref.theory.optimal_k"]
    assert reference_uses(through_the_package, forbidden) == ["specref.theory.optimal_k"]
    assert reference_uses(module_import, forbidden) != []
    assert reference_uses(submodule_from_package, forbidden) == ["specref.checks.montecarlo"]
    assert reference_uses(allowed_and_unrelated, forbidden, allowed) == []


def test_the_broken_samplers_parts_make_a_correct_step_when_none_is_swapped(capsys):
    # The control for the test above: each broken sampler fails for the one part it swaps.
    accept_reject.check_accept_reject_step(_learner_step())


def test_step_grader_failure_shows_the_input_and_both_distributions():
    with pytest.raises(AssertionError) as e:
        accept_reject.check_accept_reject_step(_plain_decoding)
    text = str(e.value)
    for part in ("case 1 of", "draft_tokens = [", "q = [[0.3, 0.6, 0.1]]", "expected   yours", "Hint:"):
        assert part in text


# ex03 Task 1: the accepted counts by simulation. Each negative control is flagged by the chi-square test (or, for the
# generator, by the determinism checks) on the visible cases and on the hidden ones.


@pytest.mark.parametrize(
    "bug, message",
    [
        ("no_stop", "do not follow the left-to-right rule"),
        ("flipped", "do not follow the left-to-right rule|cannot happen"),
        ("one_alpha", "do not follow the left-to-right rule"),
        ("shifted", "do not follow the left-to-right rule"),
        ("global_rng", "seeded alike gave different counts"),
    ],
)
@pytest.mark.parametrize("seed, n_cases", [(0, 6), (1, 8)], ids=["visible", "hidden"])
def test_accepted_counts_grader_flags_each_negative_control(bug, message, seed, n_cases):
    with pytest.raises(AssertionError, match=message):
        speedup_grading.check_accepted_counts(lambda a, n, g: simulate_accepted(a, n, g, bug=bug),
                                              n_cases=n_cases, seed=seed)


def test_accepted_counts_grader_refuses_a_generator_seeded_inside_and_counts_out_of_range():
    with pytest.raises(AssertionError, match="seeded differently gave the same counts"):
        speedup_grading.check_accepted_counts(lambda a, n, g: simulate_accepted(a, n, torch.Generator().manual_seed(0)))
    with pytest.raises(AssertionError, match="each in 0..k"):
        speedup_grading.check_accepted_counts(lambda a, n, g: simulate_accepted(a, n, g) + 1)


def test_accepted_counts_test_has_power_against_a_small_shift():
    """Power at the grader's sample size, as its docstring states it: 0.025 of probability moved from A = k to A = 0
    at alphas = [0.8] * 4 is flagged by the 1e-6 test with probability above 0.9999 (noncentral chi-square), and a
    sample drawn from that shifted law fails; a shift of 0.01 is below the test's reach (power about 0.05)."""
    law = np.array(speedup_grading._pmf([0.8] * 4))
    n, dof = speedup_grading.COUNT_SAMPLES, len(law) - 1
    critical = stats.chi2.isf(speedup_grading._P_FAIL, dof)

    def power(d):
        shifted = law.copy()
        shifted[0] += d
        shifted[-1] -= d
        return stats.ncx2.sf(critical, dof, n * float(((shifted - law) ** 2 / law).sum())), shifted

    assert power(0.025)[0] > 0.9999 and power(0.01)[0] < 0.1
    rng = np.random.default_rng(0)
    counts = rng.multinomial(n, power(0.025)[1]).astype(np.float64)
    assert speedup_grading.chi_square(counts, law)[2] < speedup_grading._P_FAIL


def test_accepted_counts_false_fail_rate_on_the_law_itself():
    """Counts drawn from the true law, 200 times over the visible cases: the test's level is 1e-6 per case, so none
    may fail (1 in 800 runs would, were the stated rate 1e-6 off by a factor of a thousand)."""
    rng = np.random.default_rng(1)
    for alphas in speedup_grading._count_cases(6, 0):
        law = speedup_grading._pmf(alphas)
        for _ in range(200):
            counts = rng.multinomial(speedup_grading.COUNT_SAMPLES, law).astype(np.float64)
            stat, dof, p = speedup_grading.chi_square(counts, law)
            assert dof == 0 or p >= speedup_grading._P_FAIL, (alphas, stat, dof, p)


# ex03 Task 2: the law in closed form


@pytest.mark.parametrize(
    "wrong, message",
    [
        (lambda a: [float(np.prod(a[:j])) * (1 - (a + [0.0])[j]) for j in range(len(a))] + [0.0],
         "do not sum to 1"),
        (lambda a: accepted_count_pmf(a)[:-1], "k \\+ 1 = "),
        (lambda a: [float(np.prod(a[:j])) * (1 - a[j]) for j in range(len(a))]
         + [float(np.prod(a)) * (1 - a[-1]) if a else 1.0], "no rejection is left|do not sum to 1"),
        (lambda a: [0.8**j * 0.2 for j in range(len(a))] + [0.8 ** len(a)], "P\\(A >= i\\)"),
    ],
)
def test_accepted_count_pmf_grader_rejects_typical_mistakes(wrong, message):
    with pytest.raises(AssertionError, match=message):
        speedup_grading.check_accepted_count_pmf(wrong)


# ex03 Task 3: the best k when verification costs v(k), with no upper limit


def _speedup_v(alpha, c, v, k):
    return sum(alpha**i for i in range(k + 1)) / (v(k) + c * k)


def _best_k_searched(alpha, c, v, k_max=64):
    return max(range(k_max + 1), key=lambda k: (_speedup_v(alpha, c, v, k), -k))


def _best_k_flat(alpha, c, v):
    """Notebook 03's rule, as if verification cost one step whatever k: v is ignored."""
    return best_k(alpha, c, lambda k: 1.0)


def _best_k_marginal_c_only(alpha, c, v):
    """The speedup with v(k) in it, but a draft's added cost taken as c alone (v's increment forgotten)."""
    k, tokens = 0, 1.0
    while alpha ** (k + 1) / c > tokens / (v(k) + c * k):
        tokens += alpha ** (k + 1)
        k += 1
    return k


def _best_k_linearised(alpha, c, v):
    """v taken as linear with its first slope: right for 1 + g k, wrong for a roofline or a quadratic."""
    g = v(1) - v(0)
    return best_k(alpha, c, lambda k: 1 + g * k)


def _best_k_pays_for_itself(alpha, c, v):
    """Stop when a draft yields fewer tokens than it adds to the cost (not when it falls below the average)."""
    k = 0
    while alpha ** (k + 1) > c + v(k + 1) - v(k):
        k += 1
    return k


@pytest.mark.parametrize(
    "wrong, message",
    [
        (_best_k_searched, "not within the range you searched"),
        (_best_k_flat, "if verification cost one plain step"),
        (_best_k_marginal_c_only, "largest speedup"),
        (_best_k_linearised, "largest speedup"),
        (_best_k_pays_for_itself, "largest speedup"),
        (lambda a, c, v: best_k(a, c, v) + 1, "largest speedup"),
        (lambda a, c, v: str(best_k(a, c, v)), "as a whole number"),
        (lambda a, c, v: max(1, best_k(a, c, v)), "largest speedup"),
    ],
)
def test_best_k_grader_rejects_typical_mistakes(wrong, message):
    with pytest.raises(AssertionError, match=message):
        speedup_grading.check_best_k(wrong)  # the visible cases already catch each of them


@pytest.mark.parametrize("wrong", [_best_k_marginal_c_only, _best_k_linearised, _best_k_pays_for_itself,
                                   _best_k_flat, _best_k_searched])
def test_the_hidden_cases_catch_the_typical_mistakes_too(wrong):
    with pytest.raises(AssertionError, match="wrong answer"):
        speedup_grading.check_best_k(wrong, n_cases=100, seed=1)


def test_best_k_cases_span_every_shape_zero_and_the_hundreds():
    for n, seed in ((30, 0), (100, 1)):
        cases = speedup_grading._best_k_cases(n, seed)
        ks = [speedup_grading._best_k(a, c, v) for a, c, v in cases]
        assert {v.shape for _, _, v in cases} == {"flat", "linear", "roofline", "knee", "quadratic"}
        assert 0 in ks and max(ks) >= 200, (seed, sorted(ks))
        assert all(speedup_grading._separated(a, c, v) for a, c, v in cases)  # the fixed cases too


def test_best_k_reference_is_the_argmax_over_a_range_past_the_optimum():
    for alpha, c, v in speedup_grading._best_k_cases(100, 1):
        ks = np.arange(0, 20000)
        s = speedup_grading._speedups(alpha, c, v, ks)
        assert speedup_grading._best_k(alpha, c, v) == int(np.argmax(s)), (alpha, c, v)


def test_the_solution_passes_best_k_at_other_hidden_seeds():
    """The cases change with the seed; every seed's cases are separated, so a correct rule passes at any of them."""
    for seed in (2, 3, 10**12 + 7):
        speedup_grading.check_best_k(best_k, n_cases=100, seed=seed)


def test_verify_cost_refuses_what_is_not_a_whole_k():
    v = speedup_grading.VerifyCost("roofline", m=8)
    assert v(0) == 1.0 and v(15) == 2.0 and v(np.int64(15)) == 2.0 and v(torch.tensor(15)) == 2.0
    for bad in (-1, 1.5, "3", None, True):
        with pytest.raises(ValueError, match="whole number"):
            v(bad)


# --------------------------------------------------------------------------------------
# Exercise 3, Task 4: tokens per step measured on toy chains with the learner's own loop
# --------------------------------------------------------------------------------------


def measure_toy(target, draft, k, runs, n, generator, bug=None):
    """The solution notebook's loop, with `bug` in."""
    last = torch.zeros(runs, dtype=torch.long)
    emitted = torch.zeros(runs, dtype=torch.long)
    steps = tokens = accepted = examined = firsts = drafted = 0
    while bool((emitted < n).any()):
        active = torch.ones(runs, dtype=torch.bool) if bug == "all_steps" else emitted < n
        context = last[:, None]
        drafts, q = draft.propose(context, k, generator)
        p = target.score(context, drafts)
        out, n_acc = verify_chain(drafts, q, p, generator=generator)
        a = n_acc[active]
        steps += int(active.sum())
        tokens += int((a + 1).sum())
        accepted += int(a.sum())
        examined += int((a + 1).clamp(max=k).sum())
        firsts += int((a >= 1).sum())
        drafted += k * int(active.sum())
        last = out.gather(1, n_acc[:, None]).squeeze(1)
        emitted = emitted + n_acc + 1
    result = [tokens / steps, accepted / examined, firsts / steps]
    if bug == "accepted_only":
        result[0] -= 1
    if bug == "per_drafted":
        result[1] = accepted / drafted
    if bug == "swapped":
        result[1], result[2] = result[2], result[1]
    if bug == "global_rng":
        result[0] += 1e-9 * float(torch.rand(()))
    return tuple(result)


def test_toy_measurement_grader_passes_the_solution(capsys):
    speedup_grading.check_toy_measurement(measure_toy)
    assert capsys.readouterr().out.count("passed") == 1


@pytest.mark.parametrize(
    "bug, message",
    [
        ("accepted_only", "accepted drafts only"),
        ("per_drafted", "accepted per examined is off"),
        ("swapped", "looks like the first-draft rate"),
        ("global_rng", "seeded alike measured different"),
    ],
)
def test_toy_measurement_grader_rejects_typical_mistakes(bug, message):
    with pytest.raises(AssertionError, match=message):
        speedup_grading.check_toy_measurement(lambda *a: measure_toy(*a, bug=bug))


@pytest.mark.parametrize("n_cases, seed", [(3, 0), (6, 1)], ids=["visible", "hidden"])
def test_toy_measurement_cases_separate_the_two_rates(n_cases, seed):
    """Some graded pair puts accepted / examined and the first-draft rate more than twice the tolerance apart, so
    swapping them fails, visible and hidden."""
    gaps = []
    for n, (_, target, draft, k) in enumerate(speedup_grading._toy_cases(n_cases, seed), 1):
        ref = speedup_grading.toy_reference(target, draft, k, speedup_grading.TOY_N, speedup_grading._REF_RUNS,
                                            speedup_grading._reference_generator(seed, n))  # the grader's own
        tol = speedup_grading.toy_tolerances(ref)
        gaps.append(abs(ref["accepted_per_examined"] - ref["first_accepted"]) / tol["accepted_per_examined"])
    assert max(gaps) > 2


# --------------------------------------------------------------------------------------
# The hidden seed does not leak through a generator handed to learner code
# --------------------------------------------------------------------------------------

HIDDEN = 0x5DEE_CE66_2545_F491  # a 63-bit hidden seed, as grade.py draws them


def _state_words(gen: torch.Generator) -> np.ndarray:
    """Every 32-bit word of a torch generator's state (the Mersenne Twister's mt[] among them)."""
    raw = gen.get_state().numpy().tobytes()
    return np.frombuffer(raw[: len(raw) // 4 * 4], dtype="<u4").astype(np.int64)


def _near_seed(words: np.ndarray, seed: int, spread: int = 1000) -> bool:
    low = seed & 0xFFFFFFFF
    return bool((np.abs(words - low) <= spread).any())


def test_a_freshly_seeded_generator_shows_its_seed_so_the_probe_has_power():
    # Negative control: a generator seeded with the hidden seed + n holds it in its state, and the probe sees it.
    assert _near_seed(_state_words(torch.Generator().manual_seed(HIDDEN + 3)), HIDDEN)


def test_derived_seeds_are_63_bit_deterministic_and_differ_by_purpose_and_case():
    from specref_grading.checks.report import derived_seed
    a = derived_seed(HIDDEN, "measure_toy", 1)
    assert a == derived_seed(HIDDEN, "measure_toy", 1) and 0 <= a < 2**63
    assert len({a, derived_seed(HIDDEN, "measure_toy", 2), derived_seed(HIDDEN, "step", 1),
                derived_seed(HIDDEN + 1, "measure_toy", 1)}) == 4
    with pytest.raises(TypeError, match="seed must be an int"):
        derived_seed("1", "x")


def test_check_toy_measurement_hands_generators_that_do_not_reveal_the_hidden_seed():
    seen: list[np.ndarray] = []

    def probe(target, draft, k, runs, n, generator):
        seen.append(_state_words(generator))
        raise RuntimeError("probe")  # the check stops at the first case; one is enough

    with pytest.raises(AssertionError, match="probe"):
        speedup_grading.check_toy_measurement(probe, seed=HIDDEN)
    assert seen and not any(_near_seed(w, HIDDEN) for w in seen)


# --------------------------------------------------------------------------------------
# Feedback never shows the value a task asks for by hand, nor the formula it asks for (red team o01, o02)
# --------------------------------------------------------------------------------------


def _message(check, *args) -> str:
    with pytest.raises(AssertionError) as e:
        check(*args)
    return str(e.value)


@pytest.mark.parametrize("beta", [0, 0.3, 0.7, 1.3, 0.5])
def test_a_wrong_hand_computed_beta_does_not_show_the_right_one_nor_the_formula(beta):
    msg = _message(accept_reject.check_worked_example, beta, WORKED_RES, emit_parts)
    assert "beta is wrong" in msg and f"got beta = {beta:.4g}" in msg
    for leak in ("0.65", "q(x) a(x)", "q * a", "sum_x"):
        assert leak not in msg, msg


@pytest.mark.parametrize("res", [[0, 0, 0], [0.5, 0.5, 0], [0.3, 0, 0.05], [1, 0, 0], [0.6, 0.3, 0.1]])
def test_a_wrong_hand_computed_residual_does_not_show_the_right_one_nor_the_formula(res):
    msg = _message(accept_reject.check_worked_example, WORKED_BETA, res, emit_parts)
    assert "res is wrong" in msg
    for leak in ("0.857", "0.143", "6/7", "p - q", "q(x) a(x)", "expected"):
        assert leak not in msg, msg


def test_a_wrong_emit_parts_shows_its_output_not_the_expected_parts_nor_their_formulas():
    msg = _message(accept_reject.check_worked_example, WORKED_BETA, WORKED_RES,
                   _emit_parts_from(lambda p, q, a: 0.5 * (p + q), lambda p, q, a: torch.zeros_like(p)))
    assert "got accepted = " in msg
    for leak in ("expected", "q * a", "q(x) a(x)", "p - q"):
        assert leak not in msg, msg
    msg = _message(accept_reject.check_worked_example, WORKED_BETA, WORKED_RES,
                   _emit_parts_from(lambda p, q, a: emit_parts(p, q, a)[0], lambda p, q, a: 0.5 * p))
    assert "got replaced = " in msg and "lossless" in msg
    for leak in ("expected", "q * a", "q(x) a(x)", "p - q"):
        assert leak not in msg, msg


def test_a_wrong_best_k_shows_neither_the_best_k_nor_the_speedups():
    msg = _message(speedup_grading.check_best_k, lambda alpha, c, v: 3)
    assert "got k = 3" in msg and "largest speedup" in msg
    for leak in ("expected", "best k is", "speedup of", "= 8"):
        assert leak not in msg, msg


def test_a_wrong_pmf_shows_the_learners_numbers_not_the_law():
    msg = _message(speedup_grading.check_accepted_count_pmf, lambda a: [1.0] + [0.0] * len(a))
    assert "got [1.0, 0.0" in msg
    for leak in ("expected", "0.2, 0.16", "alpha^j (1 - alpha)", "cumprod"):
        assert leak not in msg, msg
