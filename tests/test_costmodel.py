"""specref.perf.costmodel: the pass-time model, the speedup it predicts, and the k it picks (chapter 7)."""

from __future__ import annotations

import itertools
import math
from dataclasses import replace

import numpy as np
import pytest
import torch

from specref.perf.costmodel import (
    CostModel,
    PassModel,
    batch_steps,
    choose_k,
    crossover_batch,
    h100_cost_model,
    h100_worked_example,
)
from specref.theory import expected_tokens_per_step, speedup

GRID = list(itertools.product([1, 2, 4, 8, 16, 32, 64, 128, 256], range(1, 10), [64, 192]))


def rows_from(model: PassModel, noise: float = 0.0, seed: int = 0) -> list[tuple[int, int, int, float]]:
    rng = np.random.default_rng(seed)
    return [(B, T, S, model(B, T, S) * (1 + noise * rng.standard_normal())) for B, T, S in GRID]


def flat(seconds: float = 0.01) -> PassModel:
    """A pass whose time never changes with the tokens it scores: v = 1 at every k."""
    return PassModel(overhead=seconds)


def test_fit_recovers_the_coefficients_of_a_sum_model():
    true = PassModel(overhead=2e-3, kv=1e-6, per_token=1e-4, attention=1e-7)
    fit = PassModel.fit(rows_from(true), form="sum")
    for name in ("overhead", "kv", "per_token", "attention"):
        assert getattr(fit, name) == pytest.approx(getattr(true, name), rel=1e-6)
    assert fit.error.max < 1e-9 and fit.error.n == len(GRID)


def test_fit_recovers_a_roofline_and_auto_prefers_it_on_roofline_data():
    true = PassModel(weights=20e-3, per_token=1e-4, form="roofline")  # ridge at 200 tokens
    fit = PassModel.fit(rows_from(true))
    assert fit.form == "roofline" and fit.error.max < 1e-3
    assert fit.weights == pytest.approx(20e-3, rel=1e-3) and fit.per_token == pytest.approx(1e-4, rel=1e-3)
    assert fit.alternatives["sum"].rms > fit.error.rms  # the rejected form's error is kept: the choice is data


def test_fit_error_reports_the_noise_it_was_given():
    true = PassModel(overhead=2e-3, kv=1e-6, per_token=1e-4, attention=1e-7)
    fit = PassModel.fit(rows_from(true, noise=0.05), form="sum")
    assert 0.01 < fit.error.median < 0.08 and fit.error.max > fit.error.median


def test_predict_speedup_is_theory_speedup_when_verification_costs_one_step():
    model = CostModel(flat(), draft=0.05)
    for alpha, k, B in itertools.product([0.0, 0.3, 0.8, 1.0], [0, 1, 4, 8], [1, 128]):
        assert model.predict_speedup(alpha, k, B) == pytest.approx(speedup(alpha, k, 0.05))
        assert model.v(k, B) == pytest.approx(1.0)


def test_verify_factor_and_loop_count_in_verification_only():
    model = CostModel(flat(0.01), draft=0.0, loop=PassModel(overhead=0.002), verify_factor=1.5)
    assert model.plain_time(4) == pytest.approx(0.01)
    assert model.v(3, 4) == pytest.approx((1.5 * 0.01 + 0.002) / 0.01)
    assert model.predict_speedup(1.0, 3, 4) == pytest.approx(4 / 1.7)


def test_verification_cost_grows_past_the_ridge():
    model = CostModel(PassModel(weights=10e-3, per_token=1e-4, form="roofline"), draft=0.05)  # ridge 100 tokens
    assert model.v(4, 8) == pytest.approx(1.0)  # 40 tokens: memory-bound
    assert model.v(4, 128) == pytest.approx(5.0)  # 640 vs 128 tokens, both compute-bound
    assert model.predict_speedup(0.8, 4, 128) < 1 < model.predict_speedup(0.8, 4, 8)


@pytest.mark.parametrize("alpha", [0.0, 0.5, 0.8, 0.95])
def test_choose_k_equals_exhaustive_search(alpha):
    model = CostModel(PassModel(overhead=1e-3, weights=10e-3, per_token=1e-4, form="roofline"),
                      draft=PassModel(overhead=1e-4, per_token=5e-6))
    for B in [1, 4, 16, 64, 128, 256, 1024]:
        tp = [model.throughput(alpha, k, B) for k in range(9)]
        assert choose_k(alpha, B, model) == int(np.argmax(tp))  # argmax: the smallest k on ties


def test_choose_k_is_zero_when_speculation_cannot_pay():
    compute_bound = CostModel(PassModel(per_token=1e-4), draft=0.05)  # every token costs the same
    assert choose_k(0.9, 64, compute_bound) == 0
    assert choose_k(0.0, 1, CostModel(flat(), draft=0.05)) == 0  # nothing accepted: drafting only costs
    assert crossover_batch(0.8, 4, compute_bound) == 1


def test_choose_k_only_picks_allowed_k():
    model = CostModel(flat(), draft=0.05)
    assert choose_k(0.8, 1, model, k_max=8) == 8
    assert choose_k(0.8, 1, model, ks=[0, 1, 2, 4]) == 4


def test_batch_steps_one_row_is_about_n_over_E_and_a_batch_waits_for_its_slowest_row():
    n, k, alpha = 64, 4, 0.75
    one = batch_steps(alpha, k, 1, n)
    assert one == pytest.approx(n / expected_tokens_per_step(alpha, k), rel=0.05)
    steps = [batch_steps(alpha, k, B, n) for B in (1, 8, 64, 256)]
    assert steps == sorted(steps) and steps[-1] > 1.2 * one
    assert batch_steps(1.0, k, 16, n) == pytest.approx(math.ceil(n / (k + 1)))  # every draft accepted
    assert batch_steps(0.0, k, 16, n) == pytest.approx(n) and batch_steps(0.5, 0, 16, n) == n


def test_batch_steps_matches_a_simulation():
    rng = np.random.default_rng(0)
    alpha, k, B, n, runs = 0.7, 3, 16, 20, 3000
    total = 0
    for _ in range(runs):
        tokens, steps = np.zeros(B, dtype=int), 0
        while (tokens < n).any():
            accepted = np.minimum(rng.geometric(1 - alpha, size=B) - 1, k)  # P(A >= i) = alpha^i, capped at k
            tokens, steps = np.where(tokens < n, tokens + accepted + 1, tokens), steps + 1
        total += steps
    assert batch_steps(alpha, k, B, n) == pytest.approx(total / runs, rel=0.02)
    # Negative controls, told apart by the same simulation at the same tolerance: one row's n / E (the batch
    # not waiting for its slowest row), and half the batch.
    assert n / expected_tokens_per_step(alpha, k) != pytest.approx(total / runs, rel=0.02)
    assert batch_steps(alpha, k, B // 2, n) != pytest.approx(total / runs, rel=0.02)


def test_h100_worked_example_reproduces_the_chapter():
    small, large = h100_worked_example()
    assert small["tokens_per_pass"] == 40 and small["v"] == pytest.approx(1.0)
    assert small["speedup"] == pytest.approx(2.8, abs=0.05)
    assert large["tokens_per_pass"] == 640 and large["v"] == pytest.approx(5.0, rel=0.02)
    assert large["speedup"] == pytest.approx(0.65, abs=0.02)
    assert h100_cost_model().target.ridge_tokens() == pytest.approx(118, abs=1)
    assert h100_cost_model(efficiency=1.0).target.ridge_tokens() == pytest.approx(296, abs=1)


def test_cost_model_round_trips_through_a_dict():
    target = PassModel.fit(rows_from(PassModel(overhead=2e-3, per_token=1e-4)))
    model = CostModel(target, PassModel(overhead=1e-4), context=96, loop=PassModel(per_token=1e-6), verify_factor=1.2)
    again = CostModel.from_dict(model.as_dict())
    assert again == model
    assert CostModel.from_dict(CostModel(flat(), 0.1).as_dict()).draft == 0.1


def test_predict_time_counts_the_prompt_pass_and_the_steps():
    model = CostModel(flat(0.01), draft=0.0)
    assert model.predict_time(0.5, 0, 4, prompt_len=16, new_tokens=10) == pytest.approx(0.01 * 10)
    assert model.predict_time(1.0, 4, 4, prompt_len=16, new_tokens=10) == pytest.approx(0.01 + 0.01 * 10 / 5)


@pytest.mark.parametrize("call, error", [
    (lambda m: m.predict_speedup(1.5, 4, 8), ValueError),
    (lambda m: m.predict_speedup(0.8, -1, 8), ValueError),
    (lambda m: m.predict_speedup(0.8, 2.5, 8), TypeError),
    (lambda m: m.predict_speedup(0.8, 4, 0), ValueError),
    (lambda m: choose_k(0.8, 8, "not a model"), TypeError),
    (lambda m: choose_k(0.8, 8, m, k_max=-1), ValueError),
    (lambda m: choose_k(0.8, 8, m, ks=[]), ValueError),
    (lambda m: choose_k(math.nan, 8, m), ValueError),
    (lambda m: PassModel.fit([(1, 1, 64, 0.01)] * 3), ValueError),
    (lambda m: PassModel.fit([(1, 1, 64, -0.01)] * 5), ValueError),
    (lambda m: PassModel.fit([(1, 1, 64)] * 5), TypeError),
    (lambda m: PassModel.fit(rows_from(flat()), form="cubic"), ValueError),
    (lambda m: PassModel(overhead=-1.0), ValueError),
    (lambda m: PassModel(form="cubic"), ValueError),
    (lambda m: CostModel(flat(), draft=-0.1), ValueError),
    (lambda m: CostModel("target", draft=0.1), TypeError),
    (lambda m: CostModel(flat(), draft=0.1, verify_factor=0.0), ValueError),
    (lambda m: h100_cost_model(efficiency=1.5), ValueError),
    (lambda m: m.target(0, 1, 64), ValueError),
    (lambda m: batch_steps(0.8, 4, 8, 0), ValueError),
    (lambda m: crossover_batch(0.8, 4, "not a model"), TypeError),
    (lambda m: crossover_batch(0.8, 4, m, new_tokens=0), ValueError),
    (lambda m: m.throughput(0.8, 4, "8"), TypeError),
])
def test_bad_input_is_refused(call, error):
    with pytest.raises(error):
        call(CostModel(flat(), draft=0.05))


def test_batch_steps_with_a_spread_of_alpha_matches_a_simulation_of_unlike_rows():
    rng = np.random.default_rng(1)
    alpha, sd, k, B, n, runs = 0.75, 0.1, 4, 32, 24, 3000
    c = alpha * (1 - alpha) / sd**2 - 1
    total = 0
    for _ in range(runs):
        a = rng.beta(alpha * c, (1 - alpha) * c, size=B)  # each row its own alpha
        tokens, steps = np.zeros(B, dtype=int), 0
        while (tokens < n).any():
            accepted = np.minimum(rng.geometric(1 - a) - 1, k)
            tokens, steps = np.where(tokens < n, tokens + accepted + 1, tokens), steps + 1
        total += steps
    spread = batch_steps(alpha, k, B, n, alpha_sd=sd)
    assert spread == pytest.approx(total / runs, rel=0.02)
    assert spread > 1.1 * batch_steps(alpha, k, B, n)  # alike rows: the same simulation tells them apart
    assert batch_steps(alpha, k, 1, n, alpha_sd=sd) < batch_steps(alpha, k, 1, n) * 1.05  # one row: about the mean


def test_draft_fixed_counts_once_per_step_and_run_speedup_waits_for_the_slowest_row():
    base = CostModel(flat(0.01), draft=0.1)
    fixed = replace(base, draft_fixed=PassModel(overhead=0.002))
    assert fixed.step_time(4, 8) == pytest.approx(base.step_time(4, 8) + 0.002)
    assert fixed.step_time(0, 8) == base.step_time(0, 8)
    one = base.run_speedup(0.8, 4, 1, 64)
    assert one == pytest.approx(base.predict_speedup(0.8, 4, 1), rel=0.06)
    assert replace(base, alpha_sd=0.1).run_speedup(0.8, 4, 64, 64) < base.run_speedup(0.8, 4, 64, 64) < one


def test_choose_k_with_a_margin_switches_off_a_gain_smaller_than_the_margin():
    model = CostModel(flat(0.01), draft=0.3)
    best = choose_k(0.6, 1, model, ks=[0, 1, 2, 4])
    gain = model.predict_speedup(0.6, best, 1)
    assert best > 0 and 1 < gain < 1.3
    assert choose_k(0.6, 1, model, ks=[0, 1, 2, 4], margin=gain - 1 - 1e-6) == best
    assert choose_k(0.6, 1, model, ks=[0, 1, 2, 4], margin=gain - 1 + 1e-6) == 0
    assert choose_k(0.6, 1, model, ks=[1, 2], margin=1.0) in (1, 2)  # off not allowed: the best allowed k


def test_cost_model_with_every_part_round_trips():
    model = CostModel(flat(), PassModel(overhead=1e-4), 64, PassModel(per_token=1e-6), 1.0,
                      PassModel(overhead=2e-4), 0.07, PassModel(per_token=1e-4), PassModel(per_token=1e-5))
    assert CostModel.from_dict(model.as_dict()) == model
    assert model.predict_time(0.8, 2, 4, 16, 8) != replace(model, prompt_target=None).predict_time(0.8, 2, 4, 16, 8)


@pytest.mark.parametrize("call", [
    lambda: batch_steps(0.8, 4, 8, 16, alpha_sd=0.5),  # sd^2 >= alpha (1 - alpha)
    lambda: batch_steps(0.8, 4, 8, 16, alpha_sd=-0.1),
    lambda: CostModel(flat(), 0.1, alpha_sd=0.6),
    lambda: choose_k(0.8, 8, CostModel(flat(), 0.1), margin=-0.1),
    lambda: choose_k(0.8, 8, CostModel(flat(), 0.1), new_tokens=0),
])
def test_bad_spread_margin_or_length_is_refused(call):
    with pytest.raises(ValueError):
        call()


def test_a_spread_fitted_at_one_alpha_is_capped_where_a_lower_mean_cannot_have_it():
    # A random-initialised target accepts ~5 % of drafts, and its noisy step counts can fit sd = 0.28, more than
    # a Beta of mean 0.054 allows (sqrt(0.054 x 0.946) = 0.226): the model caps it instead of raising mid-analysis.
    model = replace(CostModel(flat(0.01), draft=0.1), alpha_sd=0.28)
    a = 0.054
    with pytest.raises(ValueError):
        batch_steps(a, 4, 8, 64, alpha_sd=model.alpha_sd)  # the raw spread is refused where it cannot exist
    cap = 0.99 * math.sqrt(a * (1 - a))
    assert model.spread_at(a) == pytest.approx(cap) and model.spread_at(0.8) == 0.28  # 0.28 < 0.99 x 0.4: kept
    assert model.spread_at(0.0) == 0.0 == model.spread_at(1.0)
    assert model.run_speedup(a, 4, 8, 64) == replace(model, alpha_sd=cap).run_speedup(a, 4, 8, 64)
    assert math.isfinite(model.predict_time(a, 4, 8, 32, 64))
    with pytest.raises(ValueError):
        model.spread_at(1.5)


def test_with_max_len_a_pass_is_charged_for_the_slots_specrefs_pass_attends_over():
    """specref's pass reads KVCache.capacity slots (a power of two), not the context: the model counts those."""
    from specref.models.kvcache import KVCache, attended_slots

    kv_only = PassModel(kv=1e-6)  # a pass costs its K/V reads and nothing else
    exact = CostModel(kv_only, draft=0.0, context=100)
    bucketed = CostModel(kv_only, draft=0.0, context=100, max_len=1024)
    assert exact.pass_time(1, 5) == pytest.approx(100e-6)
    assert bucketed.read_slots(5) == 128 and bucketed.pass_time(1, 5) == pytest.approx(128e-6)
    assert bucketed.read_slots(29) == 256  # 100 + 29 crosses 128
    cache = KVCache(1, 1, 1, 1, max_len=1024, device="cpu", dtype=torch.float32)
    for n in (1, 5, 40, 300):  # the same rule as the cache's
        cache.reset()
        cache.advance(n)
        assert attended_slots(n + 3, 1024) == cache.capacity(3)
    assert CostModel.from_dict(bucketed.as_dict()).max_len == 1024
    with pytest.raises(ValueError, match="max_len must leave room"):
        CostModel(kv_only, draft=0.0, context=100, max_len=100)
    tight = CostModel(kv_only, draft=0.0, context=100, max_len=104)
    assert tight.read_slots(9) == 104  # a pass past the cache reads all of it (choose_k may ask for large k)
    assert tight.predict_time(0.8, 4, 1, 300, 400) > 0  # a run sizes its own cache: prompt, tokens and drafts
    assert "max_len" not in exact.as_dict()  # a dict without it still reads as before
