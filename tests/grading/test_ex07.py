"""Exercise 7's graders (specref_grading.checks.batch): a fitted pass-time model, its v(k, B) and crossover, and a
load-aware k judged on the true costs.

The reference answers below are the solution's; every wrong answer is one a learner could write (an unweighted
fit, a design without the KV term, the chapter's v = 1, a limit never derived, a crossover searched batch by batch
(to 4096, or to 10^5 and then "every batch"), one off either way or 1 % off, no margin, a constant), and each must fail, on the visible checks and on hidden
ones at other seeds. One-line cheats (a constant, a call of specref.perf, a formula from the task's text) fail
too, and so does an untouched stub, with a message that names its task.
"""

from __future__ import annotations

import contextlib
import io
import json
import math
from pathlib import Path

import numpy as np
import pytest

from specref_grading.checks import batch as G

ROOT = Path(__file__).resolve().parents[2]


# -- the solution's answers ---------------------------------------------------------------------


def fit_pass_time(rows):
    a = np.asarray(rows, dtype=np.float64)
    B, T, S, t = a.T
    X = np.stack([np.ones_like(t), B * T, B * S], axis=1)
    return np.linalg.lstsq(X / t[:, None], np.ones_like(t), rcond=None)[0]


def tokens_per_step(alpha, k):
    return k + 1.0 if alpha == 1 else (1 - alpha ** (k + 1)) / (1 - alpha)


def verify_cost(params, context, k, batch_size):
    overhead, per_token, kv = params
    plain_row, verify_row = per_token + kv * context, per_token * (k + 1) + kv * context
    if math.isinf(batch_size):
        return 1.0 if plain_row == 0 else verify_row / plain_row
    return (overhead + batch_size * verify_row) / (overhead + batch_size * plain_row)


def speedup(params, alpha, c, context, k, batch_size):
    return tokens_per_step(alpha, k) / (verify_cost(params, context, k, batch_size) + c * k)


def crossover(params, alpha, c, context, k):
    if speedup(params, alpha, c, context, k, 1) <= 1:
        return 0
    if speedup(params, alpha, c, context, k, math.inf) >= 1:
        return math.inf
    overhead, per_token, kv = params
    D = tokens_per_step(alpha, k) - 1 - c * k
    return max(math.ceil(D * overhead / (per_token * k - (per_token + kv * context) * D)) - 1, 1)


def load_aware_k(rows, alpha, c, context, batch_sizes, k_max):
    """The solution's policy (bootstrap refits, 10th percentile of each k's speedup), vectorised for speed."""
    a = np.asarray(rows, dtype=np.float64)
    rng = np.random.default_rng(0)
    fits = np.array([fit_pass_time(a)] + [fit_pass_time(a[rng.integers(0, len(a), len(a))]) for _ in range(100)])
    o, per_token, kv = fits.T  # [F] each
    B = np.asarray(batch_sizes, dtype=np.float64)[:, None, None]  # [nB, 1, 1]
    k = np.arange(k_max + 1)[None, :, None]  # [1, K, 1]
    tokens = k + 1.0 if alpha == 1 else (1 - alpha ** (k + 1)) / (1 - alpha)
    plain = o + per_token * B + kv * B * context  # [nB, 1, F]
    spd = tokens * plain / (o + per_token * B * (k + 1) + kv * B * context + k * c * plain)  # [nB, K, F]
    low = np.quantile(spd, 0.1, axis=2)  # [nB, K]
    best = low.argmax(axis=1)
    return [int(b) if low[i, b] > 1 else 0 for i, b in enumerate(best)]


def solution_policy(rows, alpha, c, context, batch_sizes, k_max):
    """The notebook's loop form of the same policy."""
    a = np.asarray(rows, dtype=np.float64)
    rng = np.random.default_rng(0)
    fits = [fit_pass_time(a)] + [fit_pass_time(a[rng.integers(0, len(a), len(a))]) for _ in range(100)]
    ks = []
    for B in batch_sizes:
        low = [np.quantile([speedup(f, alpha, c, context, k, B) for f in fits], 0.1) for k in range(k_max + 1)]
        best = int(np.argmax(low))
        ks.append(best if low[best] > 1 else 0)
    return ks


def learner(source: str, name: str):
    """A function as a learner's notebook defines it: the answer cell's code run in a `__main__` namespace."""
    namespace = {"__name__": "__main__"}
    exec(source, namespace)  # noqa: S102 - the tests' own cheat submissions
    return namespace[name]


def quiet(check, *args, **kwargs):
    with contextlib.redirect_stdout(io.StringIO()):
        check(*args, **kwargs)


# -- Task 1 ---------------------------------------------------------------------------------------


@pytest.mark.parametrize("seed", [1, 2, 3])
def test_the_solutions_fit_passes_the_visible_and_hidden_checks(seed):
    quiet(G.check_fit, fit_pass_time)
    quiet(G.check_fit_unseen, fit_pass_time, seed=seed)


def test_the_tolerance_holds_a_correct_fit_at_far_more_than_the_checks_draw():
    # 300 tables of each kind: the worst coefficient of a correct fit stays well inside its tolerance, so a
    # check of 4 or 12 tables does not fail an honest learner by chance.
    rng = np.random.default_rng(12)
    worst = 0.0
    for make in (G._visible_table, G._unseen_table):
        for _ in range(300):
            theta, rows, sigma = make(rng)
            worst = max(worst, float((np.abs(fit_pass_time(rows) - theta) / G.fit_tolerance(theta, rows, sigma)).max()))
    assert worst < 0.8


def unweighted(rows):  # least squares in seconds: the slowest passes decide
    a = np.asarray(rows, dtype=np.float64)
    B, T, S, t = a.T
    return np.linalg.lstsq(np.stack([np.ones_like(t), B * T, B * S], 1), t, rcond=None)[0]


def no_kv_term(rows):  # the design without the cache reads
    a = np.asarray(rows, dtype=np.float64)
    B, T, S, t = a.T
    c = np.linalg.lstsq(np.stack([np.ones_like(t), B * T], 1) / t[:, None], np.ones_like(t), rcond=None)[0]
    return [c[0], c[1], 0.0]


def per_row_not_per_token(rows):  # per_token multiplying B instead of B * T
    a = np.asarray(rows, dtype=np.float64)
    B, T, S, t = a.T
    return np.linalg.lstsq(np.stack([np.ones_like(t), B, B * S], 1) / t[:, None], np.ones_like(t), rcond=None)[0]


@pytest.mark.parametrize("wrong", [unweighted, no_kv_term, per_row_not_per_token, lambda rows: [3e-3, 80e-6, 5e-8]],
                         ids=["unweighted", "no_kv_term", "per_row", "constant"])
def test_a_wrong_weighting_design_or_constant_fails_visible_and_hidden(wrong):
    with pytest.raises(AssertionError, match="check_fit: table"):
        quiet(G.check_fit, wrong)
    for seed in (1, 2, 3):
        with pytest.raises(AssertionError, match="check_fit_unseen: table"):
            quiet(G.check_fit_unseen, wrong, seed=seed)


def test_the_unweighted_fit_fails_a_large_share_of_tables_on_its_own():
    # Not one unlucky table: the unweighted fit misses the tolerance on about 4 tables in 10.
    rng = np.random.default_rng(5)
    misses = 0
    for _ in range(200):
        theta, rows, sigma = G._unseen_table(rng)
        misses += bool((np.abs(unweighted(rows) - theta) > G.fit_tolerance(theta, rows, sigma)).any())
    assert misses >= 50


def test_a_fit_that_calls_specref_scores_zero_and_says_why():
    cheat = learner("from specref.perf.costmodel import PassModel\n\n"
                    "def cheat(rows):\n"
                    "    m = PassModel.fit(rows, form='sum')\n"
                    "    return [m.overhead, m.per_token, m.kv]\n", "cheat")

    with pytest.raises(AssertionError, match=r"Task 1: your cheat uses specref\.perf\.costmodel\.PassModel"):
        G.check_fit(cheat)


def test_an_untouched_stub_names_its_task():
    def fit_pass_time(rows):
        raise NotImplementedError("Task 1: write fit_pass_time (see the task above)")

    with pytest.raises(NotImplementedError, match="^Task 1 is not done yet: write fit_pass_time"):
        G.check_fit(fit_pass_time)


def test_feedback_shows_the_input_and_output_but_not_the_true_coefficients():
    with pytest.raises(AssertionError) as e:
        quiet(G.check_fit, unweighted)
    text = str(e.value)
    theta = G._visible_table(np.random.default_rng(0))[0]
    assert "rows:" in text and "your fit:" in text and "overhead" in text
    assert all(f"{x:.4g}" not in text for x in theta)


# -- Task 2 ---------------------------------------------------------------------------------------


@pytest.mark.parametrize("seed", [1, 2, 3])
def test_the_solutions_verify_cost_and_crossover_pass(seed):
    quiet(G.check_verify_cost, verify_cost)
    quiet(G.check_verify_cost_unseen, verify_cost, seed=seed)
    quiet(G.check_crossover, crossover)
    quiet(G.check_crossover_unseen, crossover, seed=seed)


def test_the_references_are_specrefs_cost_model_and_its_limit():
    from specref.perf.costmodel import CostModel, PassModel

    rng = np.random.default_rng(3)
    for _ in range(30):
        theta = G._fitted_theta(rng)
        alpha, c, S, k = float(rng.uniform(0, 1)), float(rng.uniform(0, 0.5)), int(rng.integers(0, 5000)), int(rng.integers(0, 12))
        model = CostModel(PassModel(overhead=theta[0], per_token=theta[1], kv=theta[2]), c, S)
        for B in (1, 7, 300, 10**6):
            assert np.isclose(G.reference_v(theta, S, k, B), model.v(k, B), rtol=1e-12, atol=0)
            assert np.isclose(G.reference_speedup(theta, alpha, c, S, k, B), model.predict_speedup(alpha, k, B),
                              rtol=1e-12, atol=0)
        assert np.isclose(G.reference_v(theta, S, k, math.inf), model.v(k, 10**15), rtol=1e-9)  # the limit


def test_the_graders_crossover_is_the_brute_force_one_where_a_search_reaches():
    rng = np.random.default_rng(4)
    seen = set()
    for _ in range(200):
        case = (G._fitted_theta(rng), float(rng.uniform(0, 1)), float(rng.uniform(0, 0.4)),
                int(rng.choice([64, 256, 1024])), int(rng.integers(1, 9)))
        want = G.true_crossover(*case)
        if want == math.inf or want > 3000:
            continue
        wins = [B for B in range(1, 3002) if G.reference_speedup(*case, B) > 1]
        assert G.crossover_ok(*case, max(wins, default=0)) and G.crossover_ok(*case, want)
        seen.add(want == 0)
    assert seen == {True, False}  # both "never" and finite crossovers were compared


def test_the_cases_hold_every_kind_of_crossover():
    kinds = {"0": 0, "finite": 0, "beyond 10^5": 0, "inf": 0}
    for seed in (0, 1, 2):
        cases = G._visible_crossover_cases(seed) + G._unseen_crossover_cases(seed + 1)
        for case in cases:
            B = G.true_crossover(*case)
            kinds["0" if B == 0 else "inf" if B == math.inf else "beyond 10^5" if B > 10**5 else "finite"] += 1
    assert min(kinds.values()) >= 6, kinds


def v_is_one(params, context, k, batch_size):  # the chapter's memory-bound v = 1
    return 1.0


def v_without_the_limit(params, context, k, batch_size):  # inf / inf is NaN: the limit is never derived
    o, p, kv = params
    return (o + batch_size * (p * (k + 1) + kv * context)) / (o + batch_size * (p + kv * context))


def v_cache_read_per_token(params, context, k, batch_size):  # the cache read taken per token, not per row
    o, p, kv = params
    return verify_cost([o, p + kv * context, 0.0], context, k, batch_size)


def v_limit_without_the_flat_case(params, context, k, batch_size):  # 0 / 0 where nothing grows with the batch
    o, p, kv = params
    if math.isinf(batch_size):
        return (p * (k + 1) + kv * context) / (p + kv * context) if p + kv * context else float("nan")
    return verify_cost(params, context, k, batch_size)


@pytest.mark.parametrize("wrong", [v_is_one, v_without_the_limit, v_cache_read_per_token, lambda *a: 2.0],
                         ids=["v_is_one", "no_limit", "cache_per_token", "constant"])
def test_wrong_verify_costs_fail_visible_and_hidden(wrong):
    with pytest.raises(AssertionError, match="check_verify_cost: case"):
        quiet(G.check_verify_cost, wrong)
    for seed in (1, 2, 3):
        with pytest.raises(AssertionError, match="check_verify_cost_unseen: case"):
            quiet(G.check_verify_cost_unseen, wrong, seed=seed)


def test_a_limit_that_forgets_the_flat_model_fails_visible_and_hidden():
    with pytest.raises(AssertionError, match="check_verify_cost: case 6 of"):  # only a fixed cost
        quiet(G.check_verify_cost, v_limit_without_the_flat_case)
    with pytest.raises(AssertionError, match="check_verify_cost_unseen: case"):
        quiet(G.check_verify_cost_unseen, v_limit_without_the_flat_case, seed=4)


def searched(params, alpha, c, context, k):  # batch by batch up to 4096: misses the far and the infinite ones
    return max((B for B in range(1, 4097) if speedup(params, alpha, c, context, k, B) > 1), default=0)


def searched_to_1e5_else_inf(params, alpha, c, context, k):  # a search that gives up at 10^5 and says "every B"
    if speedup(params, alpha, c, context, k, 1) <= 1:
        return 0
    B = 1
    while B < 10**5 and speedup(params, alpha, c, context, k, B + 1) > 1:
        B += 1
    return math.inf if B == 10**5 else B


def one_short(params, alpha, c, context, k):  # off by one the other way: the last batch that wins is left out
    B = crossover(params, alpha, c, context, k)
    return B if B in (0, math.inf) else B - 1


def one_percent_high(params, alpha, c, context, k):  # right to within 1 %: a far crossover read off a plot
    B = crossover(params, alpha, c, context, k)
    return B if B in (0, math.inf) else int(B * 1.01)


def first_losing_batch(params, alpha, c, context, k):  # off by one: where k starts to lose
    B = crossover(params, alpha, c, context, k)
    return B if B == math.inf else B + 1


def none_for_every_batch(params, alpha, c, context, k):
    B = crossover(params, alpha, c, context, k)
    return None if B == math.inf else B


def alpha_one_not_handled(params, alpha, c, context, k):  # the closed form of E divides by zero at alpha = 1
    (1 - alpha ** (k + 1)) / (1 - alpha)
    return crossover(params, alpha, c, context, k)


@pytest.mark.parametrize("wrong", [searched, searched_to_1e5_else_inf, first_losing_batch, one_short, one_percent_high,
                                   none_for_every_batch, lambda *a: 16, lambda *a: float(crossover(*a)) + 0.5],
                         ids=["searched", "searched_to_1e5", "first_loss", "one_short", "one_percent_high",
                              "none_for_inf", "constant", "float"])
def test_wrong_crossovers_fail_visible_and_hidden(wrong):
    with pytest.raises(AssertionError, match="check_crossover: case"):
        quiet(G.check_crossover, wrong)
    for seed in (1, 2, 3):
        with pytest.raises(AssertionError, match="check_crossover_unseen: case"):
            quiet(G.check_crossover_unseen, wrong, seed=seed)


def test_alpha_one_and_no_fixed_cost_are_visible_and_hidden_cases():
    with pytest.raises(AssertionError, match=r"(?s)check_crossover: case 7 of.*ZeroDivisionError"):
        quiet(G.check_crossover, alpha_one_not_handled)
    with pytest.raises(AssertionError, match="ZeroDivisionError"):
        quiet(G.check_crossover_unseen, alpha_one_not_handled, seed=1)
    cases = G._visible_crossover_cases(0)
    assert any(case[1] == 1 for case in cases) and any(case[0][0] == 0 for case in cases)

    def solved_without_the_ends(params, alpha, c, context, k):  # the closed form alone: no check at B = 1 or inf
        o, p, kv = params
        D = tokens_per_step(alpha, k) - 1 - c * k
        return max(math.ceil(D * o / (p * k - (p + kv * context) * D)) - 1, 1)

    with pytest.raises(AssertionError, match="check_crossover: case"):
        quiet(G.check_crossover, solved_without_the_ends)


@pytest.mark.parametrize("seed", range(4, 12))
def test_the_solutions_crossover_passes_the_hidden_check_at_more_seeds(seed):
    quiet(G.check_crossover_unseen, crossover, seed=seed)


def test_every_crossover_case_is_clear_and_a_float_closed_form_lands_well_inside_the_tie_allowance():
    # The exact grading is fair only if a float64 closed form finds the exact crossing point to far better than TIE:
    # measured here with two ways of computing E, on every case of 20 seeds.
    from fractions import Fraction

    worst, far = 0.0, 0
    for seed in range(20):
        cases = G._visible_crossover_cases(seed) + G._unseen_crossover_cases(seed)
        for case in cases:
            B, x = G.exact_crossover(*case)
            assert B <= G.FAR_MAX or B == math.inf
            far += G.FAR_MIN < B <= G.FAR_MAX
            if x is None or x <= 1:
                continue
            (o, p, kv), alpha, c, S, k = [float(v) for v in case[0]], *case[1:]
            for E in (tokens_per_step(alpha, k), sum(alpha**i for i in range(k + 1))):
                D = E - 1 - c * k
                worst = max(worst, float(abs(Fraction(D * o / (p * k - (p + kv * S) * D)) - x) / x))
    assert worst < G.TIE / 10, worst
    assert far >= 20 * 8


def test_the_exact_decision_rejects_what_a_speedup_tolerance_let_through():
    # A far case: its speedup is flat to within 1e-9 over a factor of 100 in B, yet only B* (or a tie) passes.
    cases = [case for case in G._visible_crossover_cases(0) if G.FAR_MIN < G.true_crossover(*case) < math.inf]
    assert cases
    for case in cases:
        b = G.true_crossover(*case)
        assert G.crossover_ok(*case, b)
        for wrong in (b + 1, b - 1, b // 100, b * 100, b * 2, math.inf, 10**5):
            assert not G.crossover_ok(*case, wrong), wrong


def test_a_near_tie_accepts_both_sides_and_nothing_further():
    theta = G._far(None, np.array(G.SERVER), 0.8, 0.05, 256, 3, 100.0)  # the crossing point at 100, to rounding
    case = (theta, 0.8, 0.05, 256, 3)
    B, x = G.exact_crossover(*case)
    assert abs(float(x) - 100) < 1e-9 and B in (99, 100)
    assert G.crossover_ok(*case, 99) and G.crossover_ok(*case, 100)
    assert not G.crossover_ok(*case, 98) and not G.crossover_ok(*case, 101) and not G.crossover_ok(*case, math.inf)


def test_the_crossover_is_fair_at_a_near_tie_and_at_the_ends():
    theta = G.SERVER
    b = crossover(theta, 0.8, 0.05, 256, 4)
    assert G.crossover_ok(theta, 0.8, 0.05, 256, 4, b)
    assert not G.crossover_ok(theta, 0.8, 0.05, 256, 4, b + 1)
    assert not G.crossover_ok(theta, 0.8, 0.05, 256, 4, b - 1)
    assert not G.crossover_ok(theta, 0.8, 0.05, 256, 4, math.inf)
    assert G.crossover_ok(theta, 0.0, 0.05, 256, 4, 0)  # alpha = 0: k never pays
    assert crossover(theta, 0.8, 0.05, 4096, 3) == math.inf  # long contexts: the shared cache read dominates
    assert G.crossover_ok(theta, 0.8, 0.05, 4096, 3, math.inf) and not G.crossover_ok(theta, 0.8, 0.05, 4096, 3, 10**9)


def test_verify_cost_and_crossover_cheats_that_call_specref_score_zero():
    cheat = learner("from specref.perf.costmodel import CostModel, PassModel\n\n"
                    "def cheat(params, context, k, batch_size):\n"
                    "    target = PassModel(overhead=params[0], per_token=params[1], kv=params[2])\n"
                    "    return CostModel(target, 0.0, context).v(k, batch_size)\n", "cheat")
    with pytest.raises(AssertionError, match="Task 2: your cheat uses specref.perf"):
        G.check_verify_cost(cheat)
    cheat = learner("from specref.theory import expected_tokens_per_step\n\n"
                    "def cheat(params, alpha, c, context, k):\n"
                    "    return expected_tokens_per_step(alpha, k)\n", "cheat")
    with pytest.raises(AssertionError, match="Task 2: your cheat uses specref.theory"):
        G.check_crossover(cheat)


def test_crossover_feedback_names_the_property_not_the_answer():
    for wrong, said in ((first_losing_batch, "does not beat plain decoding at batch"),
                        (one_short, "still beats plain decoding at batch"),
                        (searched_to_1e5_else_inf, "stops beating plain decoding at some batch size"),
                        (searched, "still beats plain decoding at batch")):
        with pytest.raises(AssertionError) as e:
            quiet(G.check_crossover, wrong)
        text = str(e.value)
        assert said in text and "your crossover:" in text and "speedup at" not in text


# -- Task 3 ---------------------------------------------------------------------------------------


def test_the_solutions_policy_passes_visible_and_hidden():
    quiet(G.check_policy, load_aware_k)
    for seed in (1, 2):
        quiet(G.check_policy_unseen, load_aware_k, seed=seed)


@pytest.mark.parametrize("wrong, why", [
    (lambda rows, a, c, S, Bs, km: [0] * len(Bs), "on average over the batch sizes"),
    (lambda rows, a, c, S, Bs, km: [min(4, km)] * len(Bs), "never fall below 0.9x plain"),
    (lambda rows, a, c, S, Bs, km: [km + 1] * len(Bs), "one integer k in 0..k_max"),
    (lambda rows, a, c, S, Bs, km: [1] * (len(Bs) - 1), "one integer k in 0..k_max"),
], ids=["always_off", "fixed_k4", "out_of_range", "too_short"])
def test_constant_policies_fail_visible_and_hidden(wrong, why):
    with pytest.raises(AssertionError, match="check_policy: table") as e:
        quiet(G.check_policy, wrong)
    assert why in str(e.value)
    with pytest.raises(AssertionError, match="check_policy_unseen: table"):
        quiet(G.check_policy_unseen, wrong, seed=3)


def test_a_margin_that_refuses_every_gain_fails():
    def timid(rows, alpha, c, context, batch_sizes, k_max):  # speculate only on a predicted 3x
        p = fit_pass_time(rows)
        out = []
        for B in batch_sizes:
            k = max(range(k_max + 1), key=lambda k: speedup(p, alpha, c, context, k, B))
            out.append(k if speedup(p, alpha, c, context, k, B) > 3 else 0)
        return out

    with pytest.raises(AssertionError, match="on average over the batch sizes"):
        quiet(G.check_policy, timid)


def test_the_policy_is_judged_on_the_true_costs():
    # The judgement itself: on the true model a fixed k = 8 at batch 512 loses, and the best k everywhere scores 1.
    theta = G.SERVER
    sp, share = G.policy_outcome(theta, 0.8, 0.05, 256, (8, 512), 8, [8, 8])
    assert sp[1] < G.SAFE and share[1] < 1
    best = [max(range(9), key=lambda k: speedup(theta, 0.8, 0.05, 256, k, B)) for B in (8, 512)]
    assert np.allclose(G.policy_outcome(theta, 0.8, 0.05, 256, (8, 512), 8, best)[1], 1.0)


def test_a_policy_that_calls_specrefs_choose_k_scores_zero():
    cheat = learner("import specref.perf.costmodel as cm\n\n"
                    "def cheat(rows, alpha, c, context, batch_sizes, k_max):\n"
                    "    model = cm.CostModel(cm.PassModel.fit(rows, form='sum'), c, context)\n"
                    "    return [cm.choose_k(alpha, B, model, k_max) for B in batch_sizes]\n", "cheat")

    with pytest.raises(AssertionError, match="Task 3: your cheat uses specref.perf"):
        G.check_policy(cheat)


# -- the notebook -----------------------------------------------------------------------------------


def test_the_server_table_asks_a_real_chats_and_documents_question():
    rows = G.server_rows()
    assert load_aware_k(rows, 0.8, 0.05, 256, G.POLICY_BATCHES, 8) == solution_policy(rows, 0.8, 0.05, 256,
                                                                                       G.POLICY_BATCHES, 8)
    # Task 4: at the same batch of 256, off for chats (256 cached tokens), drafting for long documents (4,096),
    # where the solution's fit predicts a gain at every batch size; the true costs agree with both choices.
    assert load_aware_k(rows, 0.8, 0.05, 256, [256], 8) == [0] and load_aware_k(rows, 0.8, 0.05, 4096, [256], 8) == [2]
    params = fit_pass_time(rows)
    assert crossover(params, 0.8, 0.05, 256, 1) < 256 and crossover(params, 0.8, 0.05, 4096, 2) == math.inf
    assert speedup(G.SERVER, 0.8, 0.05, 256, 1, 256) < 1 < speedup(G.SERVER, 0.8, 0.05, 4096, 2, 256)
    assert len(rows) == 90 and all(isinstance(r[3], float) and r[3] > 0 for r in rows)


def test_the_setup_imports_nothing_that_solves_a_task_and_no_docstring_gives_a_formula():
    nb = json.loads((ROOT / "solutions" / "ex07_load_aware_k.ipynb").read_text())
    setup = next("".join(c["source"]) for c in nb["cells"] if c["cell_type"] == "code")
    assert "specref.perf" not in setup and "specref.theory" not in setup
    imported = setup.split("import (")[-1] if "import (" in setup else setup.split("batch import")[1].split("\n")[0]
    assert {n.strip() for n in imported.split(",")} == {"check_crossover", "check_fit", "check_policy",
                                                        "check_verify_cost"}
    given = "".join([c for c in nb["cells"] if c["cell_type"] == "code"][1]["source"])
    assert "from specref.course.server import server_rows" in given  # the table, in a learner's copy too
    text = "\n".join("".join(c["source"]) for c in nb["cells"])
    for formula in ("1 - alpha ** (k + 1)", "(1 - alpha^(k+1))", "E / (v + c k)", "/ t[:, None]"):
        outside = [c for c in nb["cells"] if formula in "".join(c["source"]) and "### BEGIN SOLUTION" not in "".join(c["source"])]
        assert not outside, formula
    first_answer = next(i for i, c in enumerate(nb["cells"]) if c["metadata"].get("nbgrader", {}).get("solution"))
    before = "\n".join("".join(c["source"]) for c in nb["cells"][:first_answer] if c["cell_type"] == "code")
    assert "HIDDEN_SEED = 1" in before and text.count("seed=HIDDEN_SEED") == 4  # the setup may span cells


def test_the_graders_speedup_grid_is_specrefs_cost_model():
    from specref.perf.costmodel import CostModel, PassModel

    rng = np.random.default_rng(3)
    for _ in range(20):
        theta = G._unseen_table(rng)[0]
        alpha, c, S = float(rng.uniform(0, 1)), float(rng.uniform(0, 0.5)), int(rng.integers(0, 1000))
        batches = [1, 7, 64, 300]
        grid = G.speedup_grid(theta, alpha, c, S, batches, 9)
        model = CostModel(PassModel(overhead=theta[0], per_token=theta[1], kv=theta[2]), c, S)
        want = [[model.predict_speedup(alpha, k, B) for k in range(10)] for B in batches]
        assert np.allclose(grid, want, rtol=1e-12, atol=0)
