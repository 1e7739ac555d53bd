"""Graders for the chapter 3 exercises: tokens per step and speedup, compared with `specref.theory`.

Every `check_*` function raises AssertionError with the input, the expected and
the received answer and a hint, or returns None and prints one line on success.
"""

from __future__ import annotations

import math
from collections.abc import Callable

import numpy as np
import torch

from specref.checks.montecarlo import simulate
from specref.checks.toy import MarkovChain, mixture, random_chain, toy_pair
from specref.rejection import acceptance_probability
from specref.theory import expected_tokens_per_step as _ref_expected
from specref.theory import optimal_k as _ref_optimal_k
from specref.theory import speedup as _ref_speedup
from .report import as_float, as_vector, call_learner, close, derived_seed, failure, fmt, passed
from .rules import graded

# The reference rule: Tasks 1-5 write the formulas of specref.theory; Task 6 measures with the course's simulator
# (its setup imports), but not with the grader's own reference measurement.
FORBIDDEN = ("specref.theory", "specref.checks.exact", "specref_grading")
FORBIDDEN_MEASURE = ("specref_grading",)
ALLOWED = tuple(f"specref_grading.checks.speedup.{n}" for n in (
    "check_accepted_count_pmf", "check_expected_tokens", "check_expected_tokens_value", "check_optimal_k",
    "check_speedup", "check_toy_measurement"))


# --------------------------------------------------------------------------------------
# Exercise 3: tokens per step and speedup (Leviathan et al. 2022)
# --------------------------------------------------------------------------------------


def check_expected_tokens_value(value: object, alpha: float = 0.6, k: int = 3) -> None:
    """Grade a hand-computed E[tokens per step] for alpha = 0.6, k = 3 (to 2 decimals)."""
    g = "check_expected_tokens_value"
    want = float(_ref_expected(alpha, k))
    v = as_float(value)
    inputs = [f"alpha = {alpha}, k = {k}"]
    if v is None:
        raise failure(g, "give a single number.", inputs + [f"got {value!r}"])
    if not abs(v - want) <= 0.005:  # NaN is no answer: written as `> 0.005`, NaN would pass
        hint = _expected_hint(alpha, k, v)  # says what is wrong, never the value the task asks for by hand
        raise failure(g, "wrong value: yours is not E[tokens per step] at this alpha and k (to 2 decimals).",
                      inputs + [f"got {v:.4g}"], hint)
    passed(g, f"E = {want:.2f} tokens per step")


def _expected_hint(alpha: float, k: int, got: float, tol: float = 0.005) -> str:
    def near(x: float) -> bool:
        return math.isfinite(got) and abs(got - x) <= tol * max(1.0, abs(x))

    geometric = lambda n: float(sum(alpha**i for i in range(n)))  # noqa: E731 - sum of the first n powers
    if alpha == 1 and not math.isfinite(got):
        return _ALPHA_ONE_HINT
    if k > 0 and near(geometric(k)):
        return ("that looks one term short: a step emits 1 to k + 1 tokens, the correction or bonus included; "
                "count every one of them.")
    if near(geometric(k + 2)):
        return "that looks one term too many (k off by one): a step emits at most k + 1 tokens."
    if near(geometric(k + 1) - 1):
        return "that counts only accepted drafts; every step also emits one more token (a correction or the bonus)."
    if near(alpha * k + 1) or near(alpha * k):
        return ("that counts every draft as accepted with probability alpha on its own; but a rejection ends the "
                "step, so a draft counts only if every draft before it was accepted too.")
    return ("recompute it: a step emits 1 token at alpha = 0 and k + 1 at alpha = 1; in between, a draft counts only "
            "if every draft before it was accepted, and the correction or bonus always counts.")


# Hints never spell out the formula the task asks for: they name the property that failed.
_ALPHA_ONE_HINT = (
    "at alpha = 1 every draft is accepted and a step emits k + 1 tokens; a closed form with 1 - alpha in its "
    "denominator is 0/0 there, so handle alpha == 1 separately (the limit is k + 1)."
)


def _theory_cases(n_cases: int, seed: int) -> list[tuple[float, int]]:
    rng = np.random.default_rng(seed)
    fixed = [(0.6, 3), (0.8, 4), (0.0, 3), (0.5, 0), (0.999, 5), (1.0, 4), (0.3, 1)]
    rand = [
        (round(float(rng.uniform(0, 0.995)), 3), int(rng.integers(0, 11))) for _ in range(max(0, n_cases - len(fixed)))
    ]
    return (fixed + rand)[:n_cases]


@graded(3, "check_expected_tokens", FORBIDDEN, ALLOWED)
def check_expected_tokens(fn: Callable[[float, int], object], n_cases: int = 60, seed: int = 0) -> None:
    """Grade expected_tokens_per_step(alpha, k) against specref.theory on random (alpha, k), alpha = 1 included."""
    g = "check_expected_tokens"
    cases = _theory_cases(n_cases, seed)
    for n, (alpha, k) in enumerate(cases, 1):
        where = f"wrong answer on case {n} of {len(cases)}."
        inputs = [f"alpha = {alpha}, k = {k}"]
        out = call_learner(g, where, inputs, fn, alpha, k, hint=_ALPHA_ONE_HINT if alpha == 1 else None)
        v = as_float(out)
        want = float(_ref_expected(alpha, k))
        if v is None:
            raise failure(g, where, inputs + [f"got {out!r}"], "return a single number.")
        if not (math.isfinite(v) and close(v, want, rel=1e-8)):
            raise failure(g, where + " Yours is not E[tokens per step] there.", inputs + [f"got {v:.6g}"],
                          _expected_hint(alpha, k, v, tol=1e-8))
    passed(g, f"{len(cases)} cases, alpha = 0 and alpha = 1 included")


@graded(1, "check_accepted_count_pmf", FORBIDDEN, ALLOWED)
def check_accepted_count_pmf(fn: Callable[[float, int], object], n_cases: int = 40, seed: int = 0) -> None:
    """Grade accepted_count_pmf(alpha, k) -> [P(A = 0), ..., P(A = k)] for i.i.d. acceptance.

    Checked against the chapter's fact rather than a second formula: every tail
    P(A >= i) equals alpha^i (i = 0 gives the sum 1). Then 1 + E[A] = sum_i P(A >= i)
    is specref.theory.expected_tokens_per_step.
    """
    g = "check_accepted_count_pmf"
    for n, (alpha, k) in enumerate(_theory_cases(n_cases, seed), 1):
        where = f"wrong answer on case {n} of {n_cases}."
        inputs = [f"alpha = {alpha}, k = {k}"]
        out = call_learner(g, where, inputs, fn, alpha, k)
        v = as_vector(out)
        if v is None or v.dim() != 1 or v.shape[0] != k + 1:
            shape = None if v is None else tuple(v.shape)
            raise failure(
                g,
                where,
                inputs + [f"got {out!r} (shape {shape})"],
                f"return k + 1 = {k + 1} probabilities, P(A = 0) .. P(A = k): A counts accepted drafts, 0 to k.",
            )
        tail = [float(v[i:].sum()) for i in range(k + 1)]
        want_tail = [alpha**i for i in range(k + 1)]
        bad = next((i for i in range(k + 1) if abs(tail[i] - want_tail[i]) > 1e-9), None)
        if bad is not None or not torch.isfinite(v).all() or (v < -1e-12).any():
            hint = (
                "a draft is accepted only if all earlier ones were, so P(A >= i) = alpha^i; "
                "P(A = j) = alpha^j (1 - alpha) for j < k, and P(A = k) = alpha^k (no rejection is left to happen)."
            )
            if k > 0 and abs(float(v.sum()) - 1) > 1e-9 and abs(float(v[k]) - alpha**k * (1 - alpha)) < 1e-9:
                hint = (
                    "P(A = k) is alpha^k: after the last draft is accepted there is no further rejection "
                    "to multiply by (1 - alpha)."
                )
            lines = inputs + [
                f"got pmf {fmt(v)}",
                f"P(A >= i), i = 0..k: expected {fmt(want_tail)}, got {fmt(tail)}",
            ]
            raise failure(g, where, lines, hint)
    passed(g, f"{n_cases} cases: sums to 1, P(A >= i) = alpha^i")


@graded(4, "check_speedup", FORBIDDEN, ALLOWED)
def check_speedup(fn: Callable[[float, int, float], object], n_cases: int = 60, seed: int = 0) -> None:
    """Grade speedup(alpha, k, c) = E[tokens per step] / (1 + c k) against specref.theory."""
    g = "check_speedup"
    rng = np.random.default_rng(seed + 1)
    cs = [0.05, 0.05, 0.2, 0.0, 0.1, 0.5, 1.0] + [round(float(rng.uniform(0, 0.5)), 3) for _ in range(n_cases)]
    for n, ((alpha, k), c) in enumerate(zip(_theory_cases(n_cases, seed), cs[:n_cases], strict=True), 1):
        where = f"wrong answer on case {n} of {n_cases}."
        inputs = [f"alpha = {alpha}, k = {k}, c = {c}"]
        out = call_learner(g, where, inputs, fn, alpha, k, c, hint=_ALPHA_ONE_HINT if alpha == 1 else None)
        v = as_float(out)
        want = float(_ref_speedup(alpha, k, c))
        if v is None:
            raise failure(g, where, inputs + [f"got {out!r}"], "return a single number.")
        if not (math.isfinite(v) and close(v, want, rel=1e-8)):
            e = float(_ref_expected(alpha, k))
            hint = ("recompute it: S is what a step yields per unit of its cost, against plain decoding's one token "
                    "per target pass; a step is one target pass (cost 1) plus k draft steps (cost c each).")
            if math.isfinite(v) and close(
                v * (1 + c * k), float(_ref_expected(alpha, k - 1)) if k > 0 else -1, rel=1e-8
            ):
                hint = "your numerator looks one term short: a step emits 1 to k + 1 tokens, so count k + 1 terms."
            elif math.isfinite(v) and k > 0 and c > 0 and close(v, e / (c * k), rel=1e-8):
                hint = "the cost of a step is 1 + c k: the target pass costs 1 on top of the k draft steps."
            elif math.isfinite(v) and close(v, e / (1 + c * (k + 1)), rel=1e-8):
                hint = "the draft runs k steps per speculative step, not k + 1: the cost is 1 + c k."
            # no expected value: S times the cost would give E, the number Task 2 asks for by hand
            raise failure(g, where + " Yours is not the speedup there.", inputs + [f"got {v:.6g}"], hint)
    passed(g, f"{n_cases} cases")


@graded(5, "check_optimal_k", FORBIDDEN, ALLOWED)
def check_optimal_k(fn: Callable[[float, float, int], object], n_cases: int = 60, seed: int = 0) -> None:
    """Grade optimal_k(alpha, c, k_max) -> the k in 0..k_max with the largest speedup.

    Any k whose speedup is within 1e-12 (relative) of the best is accepted, so
    near-ties decided by rounding do not count as mistakes.
    """
    g = "check_optimal_k"
    rng = np.random.default_rng(seed + 2)
    fixed = [
        (0.8, 0.05, 10),
        (0.8, 0.2, 10),
        (0.6, 0.05, 16),
        (0.0, 0.1, 8),
        (0.9, 0.0, 6),
        (0.3, 0.5, 8),
        (1.0, 0.0, 5),
    ]
    rand = [
        (round(float(rng.uniform(0, 0.99)), 3), round(float(rng.uniform(0, 0.4)), 3), int(rng.integers(1, 17)))
        for _ in range(n_cases)
    ]
    cases = (fixed + rand)[:n_cases]
    for n, (alpha, c, k_max) in enumerate(cases, 1):
        where = f"wrong answer on case {n} of {len(cases)}."
        inputs = [f"alpha = {alpha}, c = {c}, k_max = {k_max}"]
        out = call_learner(g, where, inputs, fn, alpha, c, k_max)
        if isinstance(out, torch.Tensor) and out.numel() == 1:
            out = out.item()
        if (
            isinstance(out, (bool, np.bool_))
            or not isinstance(out, (int, np.integer))
            and not (isinstance(out, (float, np.floating)) and float(out).is_integer())
        ):
            raise failure(g, where, inputs + [f"got {out!r}"], "return the best k as an int.")
        kk = int(out)
        ks = np.arange(k_max + 1)
        s = np.asarray(_ref_speedup(alpha, ks, c))
        best = int(_ref_optimal_k(alpha, c, k_max))
        if not 0 <= kk <= k_max or s[kk] < s[best] * (1 - 1e-12):
            hint = "compute the speedup for every k in 0..k_max and return the k with the largest one."
            if kk == k_max and best < k_max:
                hint = (
                    "tokens per step grows with k, but the draft cost 1 + c k grows too: maximize the speedup, not E."
                )
            elif best == 0 and kk >= 1:
                hint = (
                    "k = 0 (no speculation, speedup 1) is allowed and wins when drafts are rarely accepted or costly."
                )
            elif abs(kk - best) == 1:
                hint = "off by one: check the range 0..k_max and that index i of your list means k = i."
            # neither the best k nor the speedups: those are Task 4's answers (and, times the cost, Task 2's)
            raise failure(g, where + " Your k does not give the largest speedup in 0..k_max.",
                          inputs + [f"got k = {out!r}"], hint)
    passed(g, f"{len(cases)} cases, k = 0 allowed")


# --------------------------------------------------------------------------------------
# Exercise 3.6: tokens per step measured on toy chains, and which alpha the formula needs
# --------------------------------------------------------------------------------------


def _toy_cases(n_cases: int, seed: int) -> list[tuple[str, object, object, int]]:
    """(label, target, draft, k): random toy pairs the learner has not seen, and a chain whose contexts persist."""
    gen = torch.Generator().manual_seed(1000 + seed)
    cases: list[tuple[str, object, object, int]] = []
    # A two-topic chain (the text stays in its topic with probability 0.9; the draft knows one topic well):
    # here the step starts are far from uniform over the states, so the two alphas differ a lot.
    a, b = random_chain(3, 2.0, gen), random_chain(3, 2.0, gen)
    T = torch.full((6, 6), 0.1 / 3, dtype=torch.float64)
    T[:3, :3], T[3:, 3:] = 0.9 * a.transition, 0.9 * b.transition
    topics = MarkovChain(T)
    noise = random_chain(6, 2.0, gen)
    good, poor = mixture(topics, noise, 0.95), mixture(topics, noise, 0.3)
    cases.append(("two-topic chain, k = 3", topics, MarkovChain(torch.cat([good.transition[:3], poor.transition[3:]])), 3))
    while len(cases) < n_cases:
        V = int(torch.randint(3, 9, (1,), generator=gen))
        sharp = float(torch.empty(()).uniform_(1.0, 3.0, generator=gen))
        weight = float(torch.empty(()).uniform_(0.3, 0.9, generator=gen))
        k = int(torch.randint(1, 6, (1,), generator=gen))
        target, draft = toy_pair(gen, vocab_size=V, sharpness=sharp, draft_weight=weight)
        cases.append((f"random toy pair, V = {V}, sharpness {sharp:.2f}, draft weight {weight:.2f}, k = {k}",
                      target, draft, k))
    return cases[:n_cases]


def _ratio_and_se(num: torch.Tensor, den: torch.Tensor) -> tuple[float, float]:
    """sum(num) / sum(den) over independent runs, and its delta-method standard error per run count."""
    r = float(num.sum() / den.sum())
    resid = (num - r * den).double()
    return r, float(resid.pow(2).mean().sqrt() / den.double().mean())  # divide by sqrt(runs) for the SE


def toy_reference(target, draft, k: int, n: int, runs: int, generator: torch.Generator) -> dict[str, float]:
    """What `measure_toy` should return, from `simulate` on `runs` runs, with the per-run spread of each mean.

    Per run r: T_r = tokens its steps emitted (accepted drafts + 1, every step until it has n tokens, the last
    one counted whole), S_r = its steps, B_r = the sum of beta(c) over its steps' start contexts c. The
    measured tokens per step is sum T / sum S and alpha over steps is sum B / sum S; runs are independent, so
    each ratio's standard error is sd_r(T_r - R S_r) / (mean S_r sqrt(runs)) (delta method). For alpha the
    larger of that and the spread of the share of steps accepting their first draft is returned.
    """
    sim = simulate(target, draft, start_token=0, k=k, n=n, runs=runs, generator=generator)
    beta = acceptance_probability(target.transition, draft.transition)  # [V]
    active = sim.active.double()  # [S, N]
    steps = active.sum(0)  # [N]
    tokens = ((sim.n_accepted + 1).double() * active).sum(0)
    betas = (beta[sim.context] * active).sum(0)
    firsts = ((sim.n_accepted >= 1).double() * active).sum(0)  # steps accepting their first draft
    tps, tps_spread = _ratio_and_se(tokens, steps)
    alpha_steps, alpha_spread = _ratio_and_se(betas, steps)
    # The share of steps that accept their first draft estimates the same alpha (P(accept | c) = beta(c)) with
    # more noise; the tolerance allows for it, so a learner who measures alpha that way is not failed by chance.
    alpha_spread = max(alpha_spread, _ratio_and_se(firsts, steps)[1])
    return {"tokens_per_step": tps, "tokens_per_step_spread": tps_spread, "alpha_states": float(beta.mean()),
            "alpha_steps": alpha_steps, "alpha_steps_spread": alpha_spread}


TOY_RUNS, TOY_N = 2000, 60
_REF_RUNS = 20000
_Z = 5.0  # tolerance in standard errors: a correct measurement fails with probability about 6e-7


def _reference_generator(seed: int, n: int) -> torch.Generator:
    """The generator of the grader's reference simulation for case n (1-based) of a given seed."""
    return torch.Generator().manual_seed(derived_seed(seed, "toy_reference", n))


def toy_tolerances(ref: dict) -> tuple[float, float]:
    """How far tokens per step and alpha_steps may be from the reference: _Z standard errors of the difference."""
    scale = math.sqrt(1 / TOY_RUNS + 1 / _REF_RUNS)
    return _Z * ref["tokens_per_step_spread"] * scale, _Z * ref["alpha_steps_spread"] * scale


@graded(6, "check_toy_measurement", FORBIDDEN_MEASURE, ALLOWED)
def check_toy_measurement(fn: Callable[..., object], n_cases: int = 3, seed: int = 0) -> None:
    """Grade measure_toy(target, draft, k, runs, n, generator) -> (tokens_per_step, alpha_states, alpha_steps).

    On toy pairs the learner has not seen: alpha_states (the unweighted mean of beta over the states) exactly;
    the two simulated means against the grader's own simulation on 10 times as many runs, within 5 standard
    errors of their difference, each standard error computed from the per-run spread (see `toy_reference`).
    At TOY_RUNS = 2000 runs of TOY_N = 60 tokens, that tolerance is 0.004 to 0.05 tokens per step and 0.004
    to 0.016 in alpha (it allows for alpha measured as the share of steps accepting their first draft): far below an off-by-one (1 token per step). The gap between the two alphas exceeds
    twice the tolerance on at least one pair of the visible cases and of the hidden ones (tests/test_grading.py
    holds both to that), so returning the unweighted mean for alpha_steps is flagged.

    False-fail rate at a random seed: a correct measurement's two means are each off the reference by a
    difference that is normal to first order (2000 and 20 000 independent runs), so each misses _Z = 5 standard
    errors with probability 2 Phi(-5) = 5.7e-7; over 2 means x n_cases (6 in the hidden test) at most 7e-6,
    1 in 140,000 (tests/test_grade_false_fail.py measures it; alpha_states is compared exactly).
    """
    g = "check_toy_measurement"
    for n, (label, target, draft, k) in enumerate(_toy_cases(n_cases, seed), 1):
        where = f"wrong answer on case {n} of {n_cases} ({label})."
        inputs = [f"k = {k}, runs = {TOY_RUNS}, n = {TOY_N}, start token 0"]
        ref = toy_reference(target, draft, k, TOY_N, _REF_RUNS, _reference_generator(seed, n))
        with torch.random.fork_rng(devices=[]):
            torch.manual_seed(derived_seed(seed, "global", n))
            gen = torch.Generator().manual_seed(derived_seed(seed, "measure_toy", n))  # its state tells nothing of seed
            out = call_learner(g, where, inputs, fn, target, draft, k, TOY_RUNS, TOY_N, gen)
        vals = [as_float(x) for x in out] if isinstance(out, (tuple, list)) and len(out) == 3 else None
        if vals is None or any(v is None or not math.isfinite(v) for v in vals):
            raise failure(g, where, inputs + [f"got {out!r}"], "return three numbers: (tokens_per_step, alpha_states, alpha_steps).")
        tps, a_states, a_steps = vals
        if not close(a_states, ref["alpha_states"], rel=1e-9):
            hint = "alpha_states is the plain mean of beta(c) = sum_x min(p(x | c), q(x | c)) over the V states c."
            if abs(a_states - ref["alpha_steps"]) < abs(a_states - ref["alpha_states"]):
                hint = "that looks weighted by the steps; alpha_states weighs every state equally: beta.mean()."
            raise failure(g, where, inputs + [f"expected alpha_states = {ref['alpha_states']:.6f}",
                                            f"got      alpha_states = {a_states:.6f}"], hint)
        tol_t, tol_a = toy_tolerances(ref)
        if abs(tps - ref["tokens_per_step"]) > tol_t:
            hint = ("tokens per step: the mean of (accepted drafts + 1) over the steps every run takes until it has "
                    "n tokens (active steps only; the last one counted whole).")
            if abs(tps + 1 - ref["tokens_per_step"]) <= tol_t:
                hint = "you counted accepted drafts only; every step also emits one more token (correction or bonus)."
            raise failure(g, where, inputs + [f"expected tokens per step {ref['tokens_per_step']:.4f} +- {tol_t:.4f}",
                                            f"got      {tps:.4f}"], hint)
        if abs(a_steps - ref["alpha_steps"]) > tol_a:
            hint = ("alpha_steps: beta(c) of each step's start context c (the run's last token before the step), "
                    "averaged over the active steps.")
            if close(a_steps, ref["alpha_states"], rel=1e-9):
                hint = "that is the unweighted mean over states; weight beta by how often steps start in each state."
            raise failure(g, where, inputs + [f"expected alpha_steps {ref['alpha_steps']:.5f} +- {tol_a:.5f}",
                                            f"got      {a_steps:.5f}"], hint)
    passed(g, f"{n_cases} toy pairs you had not seen, within 5 standard errors of a 10x larger simulation")
