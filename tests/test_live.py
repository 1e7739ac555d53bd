"""specref.perf.live: live timing with its spread, the counted parts of decoding runs, and the model's view of them.

Timings are never compared with a number: the tests check the bookkeeping (rows, repeats,
pairing), the counted facts against decoding run directly, and the arithmetic of every
formula against the library's own functions, each with a case that must fail it.
"""

from __future__ import annotations

import math
from dataclasses import replace

import pytest
import torch
from model_factory import noisy_copy, small_gpt2

from specref import CostModel, PassModel, batch_steps, crossover_batch, speculative_generate
from specref.perf.costmodel import h100_cost_model, h100_worked_example
from specref.perf.live import (
    DecodingTiming,
    Repeats,
    alpha_spread,
    break_even_tokens,
    error_margin,
    first_loss,
    pass_rows,
    predicted_speedup,
    speedup_row,
    time_decoding,
    time_passes,
)
from specref.perf.verify_cost import PassCosts, measure_pass_costs
from specref.theory import expected_tokens_per_step


@pytest.fixture(scope="module")
def pair():
    target = small_gpt2(vocab=64, n_embd=32, n_layer=2, seed=0, dtype=torch.float32)
    return target, noisy_copy(target, 0.3, seed=1)


def _prompts(B: int, P: int = 6, seed: int = 0) -> torch.Tensor:
    return torch.randint(0, 64, (B, P), generator=torch.Generator().manual_seed(seed))


# -- Repeats ---------------------------------------------------------------------------------------

def test_repeats_give_median_range_and_spread():
    r = Repeats((0.3, 0.1, 0.2))
    assert (r.median, r.low, r.high) == (0.2, 0.1, 0.3)
    assert r.spread == pytest.approx((0.3 - 0.1) / 0.2)
    assert Repeats((0.5,)).spread == 0


@pytest.mark.parametrize("times", [(), (0.1, 0.0), (0.1, -1.0), (0.1, math.nan), (0.1, True), (0.1, "1")])
def test_repeats_refuse_what_is_no_time(times):
    with pytest.raises(ValueError, match="times|time"):
        Repeats(times)


# -- pass grid ---------------------------------------------------------------------------------------

def test_time_passes_gives_one_row_per_cell_that_the_fit_reads(pair):
    target, _ = pair
    rows = time_passes(target, [1, 3], [1, 2], context=8, repeats=2, clock="wall", max_len=16)
    cells = [(r["batch_size"], r["n_tokens"], r["context"]) for r in rows]
    assert cells == [(1, 1, 8), (1, 2, 8), (3, 1, 8), (3, 2, 8)]
    for r in rows:
        assert 0 < r["low"] <= r["seconds"] <= r["high"]
    fit = PassModel.fit(rows)
    assert fit.error is not None and fit.error.n == 4


def test_time_passes_refuses_bad_grids(pair):
    target, _ = pair
    with pytest.raises(ValueError, match="at least one"):
        time_passes(target, [], [1], context=8)
    with pytest.raises(TypeError, match="batch_sizes"):
        time_passes(target, [1.5], [1], context=8)
    with pytest.raises(TypeError, match="repeats"):
        time_passes(target, [1], [1], context=8, repeats=2.0)
    with pytest.raises(ValueError, match="clock"):
        time_passes(target, [1], [1], context=8, clock="sundial")


# -- break-even tokens -------------------------------------------------------------------------------

def test_break_even_is_the_ridge_on_a_roofline_and_fixed_over_per_token_in_a_sum():
    h100 = h100_cost_model()
    assert break_even_tokens(h100.target) == pytest.approx(h100.target.ridge_tokens(), rel=1e-12)
    s = PassModel(overhead=6e-3, kv=1e-6, per_token=150e-6, attention=1e-6)
    assert break_even_tokens(s, 0) == pytest.approx(6e-3 / 150e-6)
    assert break_even_tokens(s, 50) == pytest.approx(6e-3 / (150e-6 + 50e-6))  # attention counts per token
    assert break_even_tokens(s, 50) != pytest.approx(6e-3 / 150e-6)  # ... and the context is not ignored
    assert break_even_tokens(PassModel(overhead=1e-3)) == math.inf
    with pytest.raises(TypeError, match="PassModel"):
        break_even_tokens(h100)
    with pytest.raises(ValueError, match="context"):
        break_even_tokens(s, -1)


# -- the chapter's formula at one batch size ---------------------------------------------------------

def test_speedup_row_reproduces_the_h100_worked_example():
    h100 = h100_cost_model()
    for row, ref in zip([speedup_row(h100, 0.8, 4, B) for B in (8, 128)], h100_worked_example()):
        for key in ("batch_size", "tokens_per_pass", "E", "v", "c", "speedup"):
            assert row[key] == pytest.approx(ref[key], rel=1e-12), key
    assert speedup_row(h100, 0.8, 4, 8)["speedup"] == pytest.approx(3.3616 / 1.2, rel=1e-12)


def test_speedup_row_is_e_over_v_plus_ck_on_any_model():
    m = CostModel(PassModel(overhead=6e-3, kv=1e-6, per_token=150e-6), PassModel(overhead=1e-3, per_token=20e-6), 32)
    for B in (1, 16, 256):
        row = speedup_row(m, 0.7, 3, B)
        assert row["speedup"] == pytest.approx(row["E"] / (row["v"] + row["c"] * 3), rel=1e-12)
        assert row["E"] == pytest.approx(float(expected_tokens_per_step(0.7, 3)))
    with pytest.raises(ValueError, match="alpha"):
        speedup_row(m, 1.5, 3, 1)
    with pytest.raises(ValueError, match="k"):
        speedup_row(m, 0.7, 0, 1)
    with pytest.raises(TypeError, match="CostModel"):
        speedup_row(m.target, 0.7, 3, 1)


# -- margin --------------------------------------------------------------------------------------------

def test_error_margin_is_the_largest_relative_error_either_way():
    assert error_margin([1.2, 0.9], [1.0, 1.0]) == pytest.approx(0.2)
    assert error_margin([0.5], [1.0]) == pytest.approx(0.5)  # pessimism counts too
    assert error_margin([1.0, 2.0], [1.0, 2.0]) == 0
    with pytest.raises(ValueError, match="one length"):
        error_margin([1.0], [1.0, 1.0])
    with pytest.raises(ValueError, match="> 0"):
        error_margin([1.0], [0.0])


# -- crossover by bisection ---------------------------------------------------------------------------

@pytest.mark.parametrize("efficiency", [0.4, 1.0])
def test_first_loss_finds_what_the_linear_scan_finds(efficiency):
    h100 = h100_cost_model(efficiency=efficiency)
    for k in (1, 2, 4, 8):
        for alpha in (0.5, 0.8, 0.9):
            assert first_loss(lambda B, alpha=alpha, k=k: h100.predict_speedup(alpha, k, B), 512) == crossover_batch(alpha, k, h100,
                                                                                                   b_max=512)


def test_first_loss_edges_and_its_evaluations():
    calls = []

    def s(B: int) -> float:
        calls.append(B)
        return 1.2 if B < 100 else 0.9

    assert first_loss(s, 1000) == 100 and len(calls) <= 2 * math.ceil(math.log2(1000)) + 2
    assert first_loss(s, 99) is None and first_loss(s, 100) == 100
    assert first_loss(lambda B: 0.5) == 1
    assert first_loss(lambda B: 1.0, 64) is None  # 1 is not a loss
    with pytest.raises(TypeError, match="b_max"):
        first_loss(lambda B: 0.5, 2.0)


# -- the rows' spread of alpha -------------------------------------------------------------------------

def test_alpha_spread_reproduces_the_counted_steps():
    alike = batch_steps(0.75, 4, 32, 32)
    for steps in (alike + 1, alike + 4):
        sd = alpha_spread(0.75, 4, 32, 32, steps)
        assert sd > 0 and batch_steps(0.75, 4, 32, 32, sd) == pytest.approx(steps, abs=1e-4)
    assert alpha_spread(0.75, 4, 32, 32, alike - 1) == 0.0  # fewer steps than alike rows: no spread to find
    top = 0.99 * math.sqrt(0.75 * 0.25)
    assert alpha_spread(0.75, 4, 32, 32, 32) == pytest.approx(top)  # more than any spread explains: the cap
    assert alpha_spread(1.0, 4, 32, 32, 10) == 0.0
    with pytest.raises(ValueError, match="steps"):
        alpha_spread(0.75, 4, 32, 32, 40)


# -- decoding, timed and counted -----------------------------------------------------------------------

def test_time_decoding_counts_what_decoding_counts_and_pairs_the_repeats(pair):
    target, draft = pair
    batches = [_prompts(1, seed=i) for i in range(2)]
    run = time_decoding(target, draft, batches, k=3, new_tokens=12, repeats=2, clock="wall")
    stats = [speculative_generate(target, draft, x, k=3, max_new_tokens=12, temperature=0)[1] for x in batches]
    assert run.alpha == pytest.approx(sum(s.accepted for s in stats) / sum(s.examined for s in stats))
    assert run.tokens_per_step == pytest.approx(sum(s.emitted for s in stats) / sum(s.steps for s in stats))
    assert run.steps == sum(s.target_passes - 1 for s in stats)  # the prompt's pass is not a verification
    assert (run.batch_size, run.batches, run.tokens) == (1, 2, 24)
    assert len(run.plain.times) == len(run.speculative.times) == 2
    assert run.speedups == tuple(p / s for p, s in zip(run.plain.times, run.speculative.times))
    assert 0 <= run.outside_passes < 1


def test_time_decoding_samples_reproducibly_at_temperature_one(pair):
    target, draft = pair
    a = time_decoding(target, draft, [_prompts(3)], k=2, new_tokens=8, repeats=1, clock="cpu", temperature=1.0)
    b = time_decoding(target, draft, [_prompts(3)], k=2, new_tokens=8, repeats=1, clock="cpu", temperature=1.0)
    c = time_decoding(target, draft, [_prompts(3)], k=2, new_tokens=8, repeats=1, clock="cpu", temperature=1.0,
                      seed=5)
    assert (a.alpha, a.steps) == (b.alpha, b.steps)
    assert (a.alpha, a.steps) != (c.alpha, c.steps)  # the seed is used


def test_time_decoding_refuses_bad_batches(pair):
    target, draft = pair
    with pytest.raises(TypeError, match="batches"):
        time_decoding(target, draft, _prompts(2), k=2, new_tokens=4)
    with pytest.raises(ValueError, match="same number of rows"):
        time_decoding(target, draft, [_prompts(2), _prompts(3)], k=2, new_tokens=4)
    with pytest.raises(ValueError, match=r"\[B, P\]"):
        time_decoding(target, draft, [torch.zeros(4, dtype=torch.long)], k=2, new_tokens=4)
    with pytest.raises(ValueError, match="k"):
        time_decoding(target, draft, [_prompts(2)], k=0, new_tokens=4)


# -- the model's prediction for a run ------------------------------------------------------------------

def _run(B: int = 4, batches: int = 2, steps: int = 20) -> DecodingTiming:
    t = Repeats((1.0,))
    return DecodingTiming(batch_size=B, batches=batches, k=3, new_tokens=16, plain=t, speculative=t, alpha=0.7,
                          tokens_per_step=2.0, steps=steps, outside_passes=0.1)


def test_predicted_speedup_prices_the_counted_passes():
    target, draft = PassModel(overhead=6e-3, kv=1e-6, per_token=150e-6), PassModel(overhead=1e-3, per_token=20e-6)
    m = CostModel(target, draft, context=24)
    run = _run()
    B, P = 4, 8
    prompt = target(B, P, 24)
    plain = 2 * (prompt + 15 * target(B, 1, 24))
    spec = 2 * (prompt + draft(B, P, 24)) + 20 * (target(B, 4, 24) + 3 * draft(B, 1, 24))
    assert predicted_speedup(m, run, P) == pytest.approx(plain / spec, rel=1e-12)
    # more counted steps, a slower prediction; the run's times are never read
    assert predicted_speedup(m, _run(steps=30), P) < predicted_speedup(m, run, P)
    slow = replace(run, plain=Repeats((9.0,)), speculative=Repeats((0.1,)))
    assert predicted_speedup(m, slow, P) == predicted_speedup(m, run, P)
    with pytest.raises(TypeError, match="DecodingTiming"):
        predicted_speedup(m, {"steps": 3}, P)
    with pytest.raises(ValueError, match="prompt_len"):
        predicted_speedup(m, run, 0)


def test_predicted_speedup_at_another_batch_prices_the_same_counted_passes_there():
    target, draft = PassModel(overhead=6e-3, kv=1e-6, per_token=150e-6), PassModel(overhead=1e-3, per_token=20e-6)
    m = CostModel(target, draft, context=24)
    run, P = _run(B=1, batches=1, steps=10), 8
    assert predicted_speedup(m, run, P, batch_size=1) == predicted_speedup(m, run, P)
    B = 8  # eight copies of the run's row: the same 10 steps, each a pass over 8 x 4 tokens
    plain = target(B, P, 24) + 15 * target(B, 1, 24)
    spec = target(B, P, 24) + draft(B, P, 24) + 10 * (target(B, 4, 24) + 3 * draft(B, 1, 24))
    assert predicted_speedup(m, run, P, batch_size=B) == pytest.approx(plain / spec, rel=1e-12)
    with pytest.raises(ValueError, match="batch_size"):
        predicted_speedup(m, run, P, batch_size=0)


# -- rows from the one v(k) measurement ---------------------------------------------------------------------

def _costs(B: int, context: int = 16, draft: bool = True) -> PassCosts:
    one = (0.010 * B, 0.012 * B, 0.011 * B)
    return PassCosts(ks=(1, 3), one=one, verify={1: tuple(1.1 * t for t in one), 3: tuple(2.0 * t for t in one)},
                     draft=tuple(0.1 * t for t in one) if draft else None, context=context, batch_size=B, threads=1,
                     clock="cpu", kernel="torch")


def test_pass_rows_give_every_timed_pass_as_a_row_the_fit_reads():
    target, draft = pass_rows([_costs(1), _costs(2)])
    assert [(r["batch_size"], r["n_tokens"]) for r in target] == [(1, 1), (1, 2), (1, 4), (2, 1), (2, 2), (2, 4)]
    one = next(r for r in target if (r["batch_size"], r["n_tokens"]) == (2, 4))
    assert (one["seconds"], one["low"], one["high"]) == pytest.approx((2.0 * 0.022, 2.0 * 0.020, 2.0 * 0.024))
    assert [(r["batch_size"], r["n_tokens"], r["context"]) for r in draft] == [(1, 1, 16), (2, 1, 16)]
    assert draft[1]["seconds"] == pytest.approx(0.1 * 0.022)
    assert PassModel.fit(target).error.n == 6
    assert pass_rows([_costs(1, draft=False)])[1] == []


def test_pass_rows_agree_with_measure_pass_costs_medians(pair):
    target, draft = pair
    costs = [measure_pass_costs(target, [2], draft=draft, context=8, batch_size=B, repeats=3) for B in (1, 2)]
    rows, drows = pass_rows(costs)
    for c in costs:
        verify = next(r for r in rows if (r["batch_size"], r["n_tokens"]) == (c.batch_size, 3))
        assert verify["seconds"] == pytest.approx(sorted(c.verify[2])[1])
        assert next(r for r in drows if r["batch_size"] == c.batch_size)["high"] == max(c.draft)


def test_pass_rows_refuse_what_is_no_list_of_one_context():
    with pytest.raises(TypeError, match="PassCosts"):
        pass_rows(_costs(1))
    with pytest.raises(TypeError, match="PassCosts"):
        pass_rows([_costs(1), {"one": 1}])
    with pytest.raises(TypeError, match="PassCosts"):
        pass_rows([])
    with pytest.raises(ValueError, match="one context"):
        pass_rows([_costs(1, context=16), _costs(2, context=32)])
