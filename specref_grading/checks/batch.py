"""Graders for the chapter 7 exercise: a pass-time model fitted to noisy timings, the verification cost and the
crossover it implies, solved rather than searched, and a load-aware k with a margin for the model's error.

Every table here is generated from a seed with a known true model (the sum form of
`specref.perf.costmodel.PassModel`, without a weight floor or attention term):

    t(B, T, S) = overhead + per_token * B * T + kv * B * S        seconds, one pass

times multiplicative noise exp(sigma z), z standard normal, independently per row: a measured
pass on a busy machine is off by a percentage of its time, not by a fixed number of seconds.

* The fit (Task 1) is graded against the TRUE coefficients. Relative-error least squares has,
  to first order, coefficients distributed around the truth with covariance
  sigma^2 (Xw^T Xw)^-1, Xw the design with each row divided by its true time, and a bias of about
  -1.5 sigma^2 of each coefficient (lognormal noise: the mean of exp(-sigma z) is exp(sigma^2 / 2)).
  The tolerance on coefficient j is Z_FIT = 5 of its standard errors plus BIAS_FIT = 2 sigma^2 of
  its size: a correct fit misses it with probability below 1e-6 per coefficient, while an unweighted
  fit (the slowest passes dominate) misses it on about 4 tables in 10 (tests/grading/test_ex07.py).
* Task 2 is graded on the sum model of given coefficients. v(k, B) = t(B, k + 1, S) / t(B, 1, S), and its limit
  as B grows (batch_size = math.inf), by value at a relative REL = 1e-9: a closed form in float64 rounds a few
  ulps apart, any wrong formula far more. The crossover B*(k) (the largest B at which k beats plain decoding; 0 if
  none, inf if every B) is a count, decided exactly by `crossover_ok`: the float inputs are read as exact
  rationals (fractions.Fraction), the speedup exceeds 1 at B iff D o > B g (D = E - 1 - c k, g = per_token k -
  (per_token + kv S) D), and the answer must be that exact B*(k). The one allowance: a neighbour B* +- 1 passes
  when the batch the two disagree about lies within TIE = 1e-9 (relative) of the exact crossing point D o / g,
  where a float64 closed form may round either way; inf passes only where B* is inf. That allowance is enough
  because every random case is clear (`_clear`): B* at most FAR_MAX = 10^7 or inf, and the limit speedup at least
  LIMIT_GAP = 1e-5 from 1, so the cancellation in g costs a float64 closed form about 1e-11 of the crossing point
  (tests/grading/test_ex07.py measures it). The cases mix crossovers of a few batches, crossovers between 10^5 and
  10^7 (no search batch by batch to 10^5 reaches them), none and every batch size (long contexts, where the cache
  read that a plain and a verification pass share dominates), alpha 0 and 1, no fixed cost, no per-token cost.
  The speedup itself is not graded (it is the chapter's E / (v + c k)); Task 3 judges what the learner does with it.
* The policy (Task 3) is graded by what it achieves on the TRUE model of unseen noisy tables: at
  every batch size at least SAFE = 0.90x plain decoding, and over the batch sizes on average at
  least EFFICIENT = 0.80 of the best k's throughput (an oracle that knows the true costs).

False-fail rates at a random seed (the grader draws a fresh seed per grading; tests/grading/test_false_fail.py
measures each on the solution's answers):
* the fit: each coefficient misses Z_FIT = 5 standard errors with probability 2 Phi(-5) = 5.7e-7 (first order;
  BIAS_FIT covers the second-order bias), so a correct fit fails the hidden check (12 tables x 3 coefficients)
  with probability at most 2.1e-5, 1 in 48,000, and the visible one (4 tables) at most 6.9e-6;
* the policy: no closed form (it depends on the learner's margin). Measured on the solution's (a 10th-percentile
  bootstrap margin) over N = 5,250 hidden checks of consecutive seeds (42,000 tables): 0 failures; the lowest
  mean share of a table was 0.811 (the next 0.885), the worst batch 0.93x plain. The one-sided 95% Clopper-Pearson
  upper bound on the rate, scipy.stats.beta.ppf(0.95, 1, N), is 5.7e-4: below 1 in 1,000. The floors keep the check's power: a
  fixed k = 4 fails every one of 100 hidden checks, a policy that never speculates every one too (EFFICIENT = 0.75
  would let 2 of those 100 pass; tests/grading/test_false_fail.py holds the figures and rechecks them).

Visible and hidden checks are separate functions with their own case generators (other grids,
noise levels and batch sizes); the hidden ones draw from the grader's seed. Feedback shows the
input and the learner's output and names the property that failed, never the expected value.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from fractions import Fraction

import numpy as np

from specref.course.server import SERVER as _SERVER
from specref.course.server import noisy_rows, server_rows  # noqa: F401 (the exercise's given table)
from specref.perf.costmodel import CostModel, PassModel

from .report import as_float, as_int, as_ints, call_learner, failure, passed
from .rules import graded

PARAMS = ("overhead", "per_token", "kv")  # the coefficients, in this order
Z_FIT = 5.0  # standard errors a fitted coefficient may stray from the truth
BIAS_FIT = 2.0  # plus this many sigma^2 of the coefficient (relative weighting's bias, about 1.5 sigma^2)
REL = 1e-9  # closed forms in float64
TIE = 1e-9  # a crossover's neighbour passes only this close (relative) to the exact crossing point
LIMIT_GAP = 1e-5  # a random crossover case keeps its limit speedup at least this far from 1
FAR_MIN, FAR_MAX = 10**5, 10**7  # the far crossovers: beyond a search batch by batch, within float64's reach
SAFE = 0.90  # the policy's worst batch size, in plain decoding's throughput (the docstring: false-fail rate)
EFFICIENT = 0.80  # the policy's mean share of the best k's throughput (the docstring: false-fail rate)
SERVER = np.array(_SERVER)  # the exercise's server (specref.course.server): overhead, per_token, kv (seconds)
POLICY_NOISE = (0.1, 0.25)  # the policy's tables: a quick measurement, 10-25 % noise per pass
POLICY_BATCHES = (1, 2, 3, 4, 6, 8, 12, 16, 24, 32, 48, 64, 96, 128, 192, 256, 384, 512)

# Answers must not call the reference of what the tasks ask for: the cost model and the theory.
FORBIDDEN = ("specref.perf", "specref.theory", "specref_grading.checks.batch")
ALLOWED = ("specref.course.server.server_rows",)  # the setup's own import; the kernel's specref has it


# -- the true model and its tables ------------------------------------------------------------------


def _t(theta: np.ndarray, B: np.ndarray, T: np.ndarray, S: np.ndarray) -> np.ndarray:
    return theta[0] + theta[1] * B * T + theta[2] * B * S


def _model(theta: Sequence[float], c: float, context: int) -> CostModel:
    """specref's cost model of these coefficients, a draft step costing c plain passes."""
    return CostModel(PassModel(overhead=float(theta[0]), per_token=float(theta[1]), kv=float(theta[2])),
                     draft=float(c), context=int(context))


def _noisy(rng: np.random.Generator, theta: np.ndarray, Bs, Ts, Ss, sigma: float) -> np.ndarray:  # [n, 4]
    return noisy_rows(rng, theta, Bs, Ts, Ss, sigma)


def _visible_theta(rng: np.random.Generator) -> np.ndarray:
    overhead = rng.uniform(1e-3, 20e-3)
    per_token = overhead * 10 ** rng.uniform(-2.5, -1.0)  # compute equals the overhead at 10-300 tokens
    return np.array([overhead, per_token, per_token * 10 ** rng.uniform(-2.7, -1.7)])


def _visible_table(rng: np.random.Generator) -> tuple[np.ndarray, np.ndarray, float]:
    """(true coefficients, rows, sigma): a full grid, a few per cent of noise."""
    theta, sigma = _visible_theta(rng), float(rng.uniform(0.03, 0.08))
    return theta, _noisy(rng, theta, [1, 2, 4, 8, 16, 32, 64, 128, 256], [1, 2, 3, 5, 9], [64, 256], sigma), sigma


def _unseen_table(rng: np.random.Generator) -> tuple[np.ndarray, np.ndarray, float]:
    """Another kind of table: irregular batch sizes up to 512, up to 12 tokens per row, 2-3 contexts, 2-12 % noise."""
    overhead = rng.uniform(0.5e-3, 40e-3)
    per_token = overhead * 10 ** rng.uniform(-3.0, -0.8)
    theta = np.array([overhead, per_token, per_token * 10 ** rng.uniform(-3.0, -1.5)])
    Bs = np.unique(np.round(2 ** rng.uniform(0, 9, size=int(rng.integers(5, 10))))).astype(int)
    Bs = np.union1d(Bs, [1, int(rng.integers(200, 513))])
    Ts = np.union1d([1], rng.choice(np.arange(2, 13), size=int(rng.integers(2, 5)), replace=False))
    Ss = np.sort(rng.choice([16, 32, 96, 160, 320, 640, 1024], size=int(rng.integers(2, 4)), replace=False))
    sigma = float(rng.uniform(0.02, 0.12))
    return theta, _noisy(rng, theta, Bs, Ts, Ss, sigma), sigma


def _show_rows(rows: np.ndarray) -> list[str]:
    Bs, Ts, Ss = (sorted({int(x) for x in rows[:, j]}) for j in range(3))
    head = ", ".join(f"({int(b)}, {int(t)}, {int(s)}, {x:.4g})" for b, t, s, x in rows[:3])
    return [f"rows: {len(rows)} (batch sizes {Bs}, tokens per row {Ts}, contexts {Ss}); first: [{head}, ...]"]


def _as_rows(rows: np.ndarray) -> list[list[float]]:
    """What the learner receives: a fresh list of [B, T, S, seconds] lists (plain data, theirs to keep)."""
    return [[int(b), int(t), int(s), float(x)] for b, t, s, x in rows]


# -- Task 1: the fit --------------------------------------------------------------------------------


def fit_tolerance(theta: np.ndarray, rows: np.ndarray, sigma: float) -> np.ndarray:
    """Per coefficient: Z_FIT standard errors of a relative-error fit on this design, plus BIAS_FIT sigma^2 of it."""
    B, T, S = rows[:, 0], rows[:, 1], rows[:, 2]
    Xw = np.stack([np.ones_like(B), B * T, B * S], 1) / _t(theta, B, T, S)[:, None]
    se = sigma * np.sqrt(np.diag(np.linalg.inv(Xw.T @ Xw)))
    return Z_FIT * se + BIAS_FIT * sigma**2 * np.abs(theta)


def _as_params(x: object) -> np.ndarray | None:
    try:
        a = np.asarray(x, dtype=np.float64)
    except (TypeError, ValueError):
        return None
    return a if a.shape == (3,) else None


def _grade_fit(g: str, fn: Callable[[list], object], cases: list[tuple[np.ndarray, np.ndarray, float]]) -> None:
    for n, (theta, rows, sigma) in enumerate(cases, 1):
        where = f"table {n} of {len(cases)}."
        inputs = _show_rows(rows) + [f"noise: each time off by about {sigma:.0%} of itself"]
        out = call_learner(g, where, inputs, fn, _as_rows(rows))
        got = _as_params(out)
        if got is None:
            raise failure(g, where, inputs + [f"got {out!r}"],
                        "return the three coefficients [overhead, per_token, kv] in seconds (a list or an array).")
        tol = fit_tolerance(theta, rows, sigma)
        bad = [j for j in range(3) if not abs(got[j] - theta[j]) <= tol[j]]  # NaN fails too
        if bad:
            shown = ", ".join(f"{PARAMS[j]} = {got[j]:.4g} s" for j in range(3))
            names = " and ".join(PARAMS[j] for j in bad)
            raise failure(g, where, inputs + [f"your fit: {shown}"],
                        f"{names} lies farther from the table's true cost than this table's noise explains "
                        f"({Z_FIT:g} standard errors of a fit in relative error). Check the design matrix "
                        "(which quantity each coefficient multiplies) and the weighting: the noise is a share of "
                        "each time, so a fit in seconds lets the slowest passes decide everything.")
    passed(g, f"{len(cases)} tables, each coefficient within {Z_FIT:g} standard errors of the true one")


@graded(1, "check_fit", FORBIDDEN, ALLOWED)
def check_fit(fit_pass_time: Callable[[list], object], n_tables: int = 4, seed: int = 0) -> None:
    """Grade fit_pass_time(rows) -> [overhead, per_token, kv] against the true coefficients of generated tables."""
    rng = np.random.default_rng(seed)
    _grade_fit("check_fit", fit_pass_time, [_visible_table(rng) for _ in range(n_tables)])


@graded(1, "check_fit_unseen", FORBIDDEN, ALLOWED)
def check_fit_unseen(fit_pass_time: Callable[[list], object], seed: int, n_tables: int = 12) -> None:
    """The hidden test of Task 1: tables of another kind (irregular grids, 2-12 % noise) drawn from `seed`."""
    rng = np.random.default_rng([seed, 71])
    _grade_fit("check_fit_unseen", fit_pass_time, [_unseen_table(rng) for _ in range(n_tables)])


# -- Task 2: the verification cost and the crossover, solved ----------------------------------------


def _tokens(alpha: float, k) -> np.ndarray | float:
    """Expected tokens per speculative step (notebook 03): the grader's own, kept out of the task's text."""
    k = np.asarray(k, dtype=np.float64)
    return k + 1.0 if alpha == 1 else (1 - alpha ** (k + 1)) / (1 - alpha)


def reference_v(theta: Sequence[float], context: int, k: int, B: float) -> float:
    """v(k, B) = t(B, k + 1, S) / t(B, 1, S) of the sum model; at B = inf its limit (1 when no term grows with B)."""
    o, p, kv = (float(x) for x in theta)
    if math.isinf(B):
        a = p + kv * context
        return 1.0 if a == 0 else (p * (k + 1) + kv * context) / a
    return (o + B * (p * (k + 1) + kv * context)) / (o + B * (p + kv * context))


def reference_speedup(theta: Sequence[float], alpha: float, c: float, context: int, k: int, B: float) -> float:
    """E / (v(k, B) + c k): specref's `CostModel.predict_speedup` for finite B, and its limit at B = inf."""
    return float(_tokens(alpha, k)) / (reference_v(theta, context, k, B) + c * k)


def _fitted_theta(rng: np.random.Generator) -> np.ndarray:
    """Coefficients as a fit of an unseen table might give them: other shapes than the visible ones."""
    return _unseen_table(rng)[0] * np.exp(rng.normal(0, 0.3, 3))


def _v_case(rng: np.random.Generator, theta: np.ndarray) -> tuple:
    B = rng.choice([1, 2, int(rng.integers(3, 300)), int(rng.integers(300, 10**6)), math.inf])
    return theta, int(rng.choice([0, 32, 256, int(rng.integers(1, 8193))])), int(rng.integers(0, 13)), B


def _visible_v_cases(seed: int) -> list[tuple]:
    rng = np.random.default_rng([seed, 2])
    t = SERVER
    cases = [(t, 256, 4, 8), (t, 256, 0, 8), (t, 256, 4, math.inf), (t, 0, 3, 1), (t, 4096, 2, 128),
             (np.array([2e-3, 0.0, 0.0]), 256, 4, math.inf)]  # only a fixed cost: nothing grows with the batch
    return cases + [_v_case(rng, _visible_theta(rng)) for _ in range(14)]


def _unseen_v_cases(seed: int) -> list[tuple]:
    rng = np.random.default_rng([seed, 73])
    cases = [_v_case(rng, _fitted_theta(rng)) for _ in range(36)]
    o = float(rng.uniform(1e-3, 30e-3))
    return cases + [(np.array([0.0, *_fitted_theta(rng)[1:]]), int(rng.integers(1, 2049)), 3, 7),  # no fixed cost
                    (np.array([o, 0.0, 0.0]), 512, int(rng.integers(1, 9)), math.inf),
                    (np.array([o, 0.0, 0.0]), 512, 2, int(rng.integers(1, 1000))),
                    (np.array([o, _fitted_theta(rng)[1], 0.0]), 2048, 5, math.inf)]  # no cache reads


def _case(theta, alpha: float | None, c: float | None, S: int, k: int, last: str, value) -> tuple[list[float], list[str]]:
    """A case's parameters as plain floats, and the line that shows the learner what their function was given."""
    params = [float(x) for x in theta]
    shown = f"params = [{', '.join(f'{x:.6g}' for x in params)}], "
    if alpha is not None:
        shown += f"alpha = {alpha:.6g}, c = {c:.6g}, "
    shown += f"context = {S}, k = {k}" + (f", {last} = {value}" if last else "")
    return params, [shown]


def _grade_v(g: str, fn: Callable, cases: list[tuple]) -> None:
    for n, (theta, S, k, B) in enumerate(cases, 1):
        where = f"case {n} of {len(cases)}."
        B = math.inf if math.isinf(B) else int(B)  # plain Python numbers, as a learner would pass them
        params, inputs = _case(theta, None, None, S, k, "batch_size", B)
        out = call_learner(g, where, inputs, fn, params, S, k, B)
        got = as_float(out)
        if got is None:
            raise failure(g, where, inputs + [f"got {out!r}"],
                          "return one number: the verification pass's time in plain passes at this batch size.")
        if not math.isclose(got, reference_v(theta, S, k, B), rel_tol=REL):  # NaN fails too
            if k == 0:
                hint = "with k = 0 the verification pass is a plain pass."
            elif math.isinf(B):
                hint = ("batch_size = math.inf asks for the limit as the batch grows: which terms of a pass grow with "
                        "B, and what is left of the ratio when they dominate? If none grows, nothing changes with B.")
            else:
                hint = ("a verification pass scores k + 1 new tokens per row after the same cached ones; a plain pass "
                        "scores one. Use the pass-time model at this batch size and context.")
            raise failure(g, where, inputs + [f"your v: {got!r}"], hint)
    passed(g, f"{len(cases)} cases, v(k, B) against the pass-time model (batch sizes up to the limit B = inf)")


@graded(2, "check_verify_cost", FORBIDDEN, ALLOWED)
def check_verify_cost(verify_cost: Callable, seed: int = 0) -> None:
    """Grade verify_cost(params, context, k, batch_size) -> v(k, B) by value; batch_size may be math.inf."""
    _grade_v("check_verify_cost", verify_cost, _visible_v_cases(seed))


@graded(2, "check_verify_cost_unseen", FORBIDDEN, ALLOWED)
def check_verify_cost_unseen(verify_cost: Callable, seed: int) -> None:
    """The hidden test of Task 2's v(k, B): other coefficients, contexts, k and batch sizes, drawn from `seed`."""
    _grade_v("check_verify_cost_unseen", verify_cost, _unseen_v_cases(seed))


def _exact(theta: Sequence[float], alpha: float, c: float, context: int, k: int) -> tuple[Fraction, ...]:
    """(o, a, E, D, g) as exact rationals of the float inputs: a = per_token + kv S (what a row adds to a plain
    pass), E the tokens per step, D = E - 1 - c k, g = per_token k - a D. k wins at a finite B iff D o > B g."""
    o, p, kv = (Fraction(float(x)) for x in theta)
    al, a = Fraction(float(alpha)), p + kv * int(context)
    E = sum(al**i for i in range(int(k) + 1))
    D = E - 1 - Fraction(float(c)) * int(k)
    return o, a, E, D, p * int(k) - a * D


def exact_crossover(theta: Sequence[float], alpha: float, c: float, context: int, k: int) -> tuple[float, Fraction | None]:
    """B*(k) in exact rational arithmetic, and the crossing point x = D o / g (None where the speedup never falls).

    The speedup E / (v(k, B) + c k) exceeds 1 iff E (o + B a) > (1 + c k)(o + B a) + B per_token k, i.e. D o > B g.
    With g > 0 the largest such B >= 1 is ceil(x) - 1 (0 if x <= 1); with g < 0 every B wins (then D > 0), with
    g = 0 every B wins if D o > 0 and none does otherwise.
    """
    o, _, _, D, g = _exact(theta, alpha, c, context, k)
    if g > 0:
        x = D * o / g
        return (math.ceil(x) - 1 if x > 0 else 0), x
    return (math.inf if g < 0 or D * o > 0 else 0), None


def exact_limit_speedup(theta: Sequence[float], alpha: float, c: float, context: int, k: int) -> Fraction:
    """E / (v(k, inf) + c k) in exact rational arithmetic (v(k, inf) = 1 where nothing grows with the batch)."""
    _, a, E, _, _ = _exact(theta, alpha, c, context, k)
    p = Fraction(float(theta[1]))
    v = Fraction(1) if a == 0 else (a + p * int(k)) / a
    return E / (v + Fraction(float(c)) * int(k))


def crossover_ok(theta: Sequence[float], alpha: float, c: float, context: int, k: int, got: float) -> bool:
    """Is `got` the largest B >= 1 where k still beats plain (0: none; inf: every B)? Decided exactly.

    `got` must equal the exact B*(k) of the float inputs (`exact_crossover`). The one tolerance: a neighbour of B*
    (B* - 1 or B* + 1) passes when the batch at which the two disagree lies within TIE (relative) of the exact
    crossing point D o / g, where a closed form in float64 may round either way. inf passes only where B* is inf.
    """
    want, x = exact_crossover(theta, alpha, c, context, k)
    if got == want:
        return True
    if math.isinf(got) or math.isinf(want) or x is None or got < 0 or abs(got - want) != 1:
        return False
    edge = Fraction(int(max(got, want)))  # the batch the two answers disagree about
    return abs(edge - x) <= Fraction(TIE) * abs(x)


def true_crossover(theta: Sequence[float], alpha: float, c: float, context: int, k: int) -> float:
    """The grader's own B*(k), exact (for building and sorting cases)."""
    return exact_crossover(theta, alpha, c, context, k)[0]


def _clear(case: tuple) -> bool:
    """A random case a float64 closed form can answer: B* at most FAR_MAX (or inf), and the limit speedup at least
    LIMIT_GAP from 1, which keeps the cancellation in g = per_token k - a D to about 1e-11 of g."""
    B = true_crossover(*case)
    return (B <= FAR_MAX or math.isinf(B)) and abs(exact_limit_speedup(*case) - 1) >= LIMIT_GAP


def _far(rng: np.random.Generator, theta: np.ndarray, alpha: float, c: float, S: int, k: int, target: float):
    """theta with kv moved so that B*(k) lands near `target` (a batch no search reaches); None if k never pays."""
    o, p = float(theta[0]), float(theta[1])
    D = float(_tokens(alpha, k)) - 1 - c * k
    if D <= 0 or p == 0 or S == 0:
        return None
    # g = p k - (p + kv S) D = D o / target: solve for kv; it must stay >= 0.
    kv = ((p * k - D * o / target) / D - p) / S
    return None if kv < 0 else np.array([o, p, kv])


def _crossover_case(rng: np.random.Generator, theta: np.ndarray, kind: str) -> tuple:
    for _ in range(1000):
        alpha, c = float(rng.uniform(0.3, 0.97)), float(rng.uniform(0, 0.3))
        S, k = int(rng.choice([64, 256, 512, int(rng.integers(1, 8193))])), int(rng.integers(1, 11))
        t = theta
        if kind == "far":
            t = _far(rng, theta, alpha, c, S, k, float(10 ** rng.uniform(np.log10(FAR_MIN) + 0.2, np.log10(FAR_MAX))))
        if t is not None and _clear(case := (t, alpha, c, S, k)):
            B = true_crossover(*case)
            if kind == "any" or kind == "far" and FAR_MIN < B <= FAR_MAX or kind == "inf" and math.isinf(B):
                return case
        theta = _fitted_theta(rng) if kind != "inf" else theta * np.array([1, 10 ** rng.uniform(-2, 0), 1])
    raise RuntimeError(f"no {kind} case found")  # pragma: no cover - the loops above find one at once


def _visible_crossover_cases(seed: int) -> list[tuple]:
    rng = np.random.default_rng([seed, 3])
    t = SERVER
    cases = [(t, 0.8, 0.05, 256, 4), (t, 0.0, 0.05, 256, 2), (t, 0.99, 0.0, 64, 1), (t, 0.8, 0.05, 4096, 3),
             (t, 0.6, 0.5, 256, 4), (np.array([3e-3, 0.0, 0.05e-6]), 0.7, 0.05, 256, 4),
             (t, 1.0, 0.05, 256, 3),  # alpha = 1: every draft accepted
             (np.array([0.0, *t[1:]]), 0.8, 0.05, 4096, 2)]  # no fixed cost: the same speedup at every batch
    return (cases + [_crossover_case(rng, _visible_theta(rng), "any") for _ in range(4)]
            + [_crossover_case(rng, _visible_theta(rng), "far") for _ in range(2)])


def _unseen_crossover_cases(seed: int) -> list[tuple]:
    rng = np.random.default_rng([seed, 79])
    cases = [_crossover_case(rng, _fitted_theta(rng), "any") for _ in range(20)]
    cases += [_crossover_case(rng, _fitted_theta(rng), "far") for _ in range(6)]
    cases += [_crossover_case(rng, _fitted_theta(rng), "inf") for _ in range(4)]
    while True:  # redrawn until every one is clear (`_clear`), as the random cases are
        o, p, kv = _fitted_theta(rng)
        k = int(rng.integers(1, 9))
        edges = [(np.array([o, p, kv]), 0.0, float(rng.uniform(0, 0.2)), 256, k),  # alpha = 0: never
                 (np.array([o, p, kv]), 1.0, float(rng.uniform(0, 0.1)), int(rng.integers(1, 4097)), k),  # alpha = 1
                 (np.array([o, p, kv]), float(rng.uniform(0.5, 0.9)), 1.0, 256, k),  # a draft as dear as the target
                 (np.array([0.0, p, kv]), float(rng.uniform(0.5, 0.95)), float(rng.uniform(0, 0.1)), 128, k),
                 (np.array([o, 0.0, kv]), float(rng.uniform(0.5, 0.95)), float(rng.uniform(0, 0.1)), 128, k)]
        if all(_clear(case) for case in edges):
            return cases + edges


def _as_count(out: object) -> float | None:
    """A batch size as the answer gives it: an int (numpy's too) or math.inf; None for anything else."""
    if as_int(out) is not None:
        return as_int(out)  # a whole float is the same batch size
    x = as_float(out)
    return math.inf if x is not None and math.isinf(x) and x > 0 else None


def _grade_crossover(g: str, fn: Callable, cases: list[tuple]) -> None:
    for n, (theta, alpha, c, S, k) in enumerate(cases, 1):
        where = f"case {n} of {len(cases)}."
        params, inputs = _case(theta, alpha, c, S, k, "", None)
        out = call_learner(g, where, inputs, fn, params, alpha, c, S, k)
        got = _as_count(out)
        if got is None:
            raise failure(g, where, inputs + [f"got {out!r}"],
                          "return an int batch size (0 if k never pays), or math.inf if k pays at every one.")
        if not crossover_ok(theta, alpha, c, S, k, got):
            want = true_crossover(theta, alpha, c, S, k)
            if got < 0:
                why = "it is not a batch size."
            elif math.isinf(got):
                why = f"by this cost model k = {k} stops beating plain decoding at some batch size."
            elif got > want:
                why = f"by this cost model k = {k} does not beat plain decoding at batch {got}."
            else:
                why = f"by this cost model k = {k} still beats plain decoding at batch {got + 1}."
            raise failure(g, where, inputs + [f"your crossover: {got}: {why}"],
                          "B*(k) is the largest batch size at which k still beats plain decoding (speedup > 1); 0 if "
                          "it beats it nowhere, math.inf if at every batch size. It can be far beyond any batch you "
                          "could try one by one: solve the inequality speedup > 1 for B.")
    passed(g, f"{len(cases)} cases, B*(k) against the pass-time model (none, finite, beyond 10^5, every batch size)")


@graded(2, "check_crossover", FORBIDDEN, ALLOWED)
def check_crossover(crossover: Callable, seed: int = 0) -> None:
    """Grade crossover(params, alpha, c, context, k) -> B*(k), an int or math.inf."""
    _grade_crossover("check_crossover", crossover, _visible_crossover_cases(seed))


@graded(2, "check_crossover_unseen", FORBIDDEN, ALLOWED)
def check_crossover_unseen(crossover: Callable, seed: int) -> None:
    """The hidden test of Task 2's crossover: other coefficients, alphas, c, contexts and k, drawn from `seed`."""
    _grade_crossover("check_crossover_unseen", crossover, _unseen_crossover_cases(seed))


# -- Task 3: the policy, judged on the true model ---------------------------------------------------


def _policy_table(rng: np.random.Generator, unseen: bool) -> tuple:
    """(true coefficients, a quick noisy measurement of them, alpha, c, context, batch sizes, k_max)."""
    if unseen:
        theta = _unseen_table(rng)[0]
        top = int(rng.integers(256, 513))  # the largest batch the server runs, and measured
        Bs = np.union1d([1, top], np.round(2 ** rng.uniform(1, np.log2(top), size=int(rng.integers(2, 5))))).astype(int)
        Ts = [1, int(rng.integers(3, 7)), int(rng.integers(8, 13))]
        Ss = [int(rng.integers(32, 128)), int(rng.integers(192, 640))]
        batches = tuple(sorted({int(b) for b in np.round(2 ** rng.uniform(0, np.log2(top), size=20))} | {1, top}))
    else:
        theta, Bs, Ts, Ss, batches = _visible_theta(rng), [1, 8, 64, 256], [1, 5, 9], [64, 256], POLICY_BATCHES
    sigma = float(rng.uniform(*POLICY_NOISE))
    rows = _noisy(rng, theta, Bs, Ts, Ss, sigma)
    return (theta, rows, float(rng.uniform(0.5, 0.9)), float(rng.uniform(0.02, 0.3)),
            int(rng.choice([64, 128, 256])), batches, int(rng.choice([4, 6, 8])))


def speedup_grid(theta, alpha: float, c: float, context: int, batches, k_max: int) -> np.ndarray:  # [nB, k_max + 1]
    """specref's predicted speedup (`CostModel.predict_speedup`) of every k at every batch size, as one array."""
    model = _model(theta, c, context)
    B = np.asarray(batches, dtype=np.float64)
    plain = model.target(B, 1, context)  # [nB]
    cols = []
    for k in range(k_max + 1):
        E = k + 1.0 if alpha == 1 else (1 - alpha ** (k + 1)) / (1 - alpha)
        cols.append(E * plain / (model.target(B, k + 1, context) + k * c * plain))
    return np.stack(cols, 1)


def policy_outcome(theta, alpha, c, context, batches, k_max, ks) -> tuple[np.ndarray, np.ndarray]:
    """On the true model: each chosen k's speedup over plain, and its share of the best k's throughput."""
    grid = speedup_grid(theta, alpha, c, context, batches, k_max)
    sp = grid[np.arange(len(ks)), ks]
    return sp, sp / grid.max(axis=1)


def _grade_policy(g: str, fn: Callable, cases: list[tuple]) -> None:
    for n, (theta, rows, alpha, c, S, batches, k_max) in enumerate(cases, 1):
        where = f"table {n} of {len(cases)}."
        inputs = _show_rows(rows) + [f"alpha = {alpha:.4g}, c = {c:.4g}, context = {S}, k_max = {k_max}, "
                                     f"batch_sizes = {list(batches)}"]
        out = call_learner(g, where, inputs, fn, _as_rows(rows), alpha, c, S, list(batches), k_max)
        ks = as_ints(out)
        if ks is None or len(ks) != len(batches) or not all(0 <= k <= k_max for k in ks):
            raise failure(g, where, inputs + [f"got {out!r}"],
                        f"return one integer k in 0..k_max for each batch size, in order ({len(batches)} of them).")
        sp, share = policy_outcome(theta, alpha, c, S, batches, k_max, ks)
        if not (sp >= SAFE).all():
            i = int(np.argmin(sp))
            raise failure(g, where, inputs + [f"your k per batch size: {ks}",
                                            f"at batch {batches[i]} your k = {ks[i]} runs at {sp[i]:.3f}x plain "
                                            "on the server's true costs"],
                        f"a policy must never fall below {SAFE}x plain: where the fitted gain is within the "
                        "fit's own error of 1, do not trust it.")
        if not share.mean() >= EFFICIENT:
            raise failure(g, where, inputs + [f"your k per batch size: {ks}",
                                            f"your throughput, as a share of the best k's at each batch size: "
                                            f"{', '.join(f'{x:.2f}' for x in share)} (mean {share.mean():.3f})"],
                        f"on average over the batch sizes the policy must reach {EFFICIENT} of the best k's "
                        "throughput: a margin wider than the fit's error gives away real gains.")
    passed(g, f"{len(cases)} tables judged on their true costs: never below {SAFE}x plain, "
               f"on average at least {EFFICIENT} of the best k")


@graded(3, "check_policy", FORBIDDEN, ALLOWED)
def check_policy(load_aware_k: Callable, n_tables: int = 3, seed: int = 0) -> None:
    """Grade load_aware_k(rows, alpha, c, context, batch_sizes, k_max) -> [k per batch size] on the true costs."""
    rng = np.random.default_rng([seed, 5])
    _grade_policy("check_policy", load_aware_k, [_policy_table(rng, False) for _ in range(n_tables)])


@graded(3, "check_policy_unseen", FORBIDDEN, ALLOWED)
def check_policy_unseen(load_aware_k: Callable, seed: int, n_tables: int = 8) -> None:
    """The hidden test of Task 3: measurements of other shapes and batch sizes, drawn from `seed`."""
    rng = np.random.default_rng([seed, 83])
    _grade_policy("check_policy_unseen", load_aware_k, [_policy_table(rng, True) for _ in range(n_tables)])
