"""Graders for the chapter 7 exercise: a pass-time model fitted to noisy timings, the speedup and the
crossover it predicts, and a load-aware k with a margin for the model's error.

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
  fit (the slowest passes dominate) misses it on about 4 tables in 10 (tests/test_grading_ex07.py).
* The speedup and the crossover (Task 2) are graded by value against `specref.perf.costmodel`
  (`CostModel.predict_speedup`; the crossover from the same model over every B) at a relative
  REL = 1e-9: a closed form in float64 rounds a few ulps apart, any wrong formula far more.
* The policy (Task 3) is graded by what it achieves on the TRUE model of unseen noisy tables: at
  every batch size at least SAFE = 0.90x plain decoding, and over the batch sizes on average at
  least EFFICIENT = 0.85 of the best k's throughput (an oracle that knows the true costs).

False-fail rates at a random seed (the grader draws a fresh seed per grading; tests/test_grade_false_fail.py
measures each on the solution's answers):
* the fit: each coefficient misses Z_FIT = 5 standard errors with probability 2 Phi(-5) = 5.7e-7 (first order;
  BIAS_FIT covers the second-order bias), so a correct fit fails the hidden check (12 tables x 3 coefficients)
  with probability at most 2.1e-5, 1 in 48,000, and the visible one (4 tables) at most 6.9e-6;
* the policy: no closed form (it depends on the learner's margin). Measured on the solution's (a 10th-percentile
  bootstrap margin) over 2,500 hidden checks of consecutive seeds: about 4e-4 (1 failure, a mean share of 0.81 on
  one table; 95% upper bound 1.9e-3). The floors keep the check's power: a fixed k = 4 or a policy that never
  speculates fails nearly every check (tests/test_grade_false_fail.py; the figures in benchmarks/history).

Visible and hidden checks are separate functions with their own case generators (other grids,
noise levels and batch sizes); the hidden ones draw from the grader's seed. Feedback shows the
input and the learner's output and names the property that failed, never the expected value.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence

import numpy as np

from specref.course.server import SERVER as _SERVER
from specref.course.server import noisy_rows, server_rows  # noqa: F401 (the exercise's given table)
from specref.perf.costmodel import CostModel, PassModel

from .report import as_float, call_learner, failure, passed
from .rules import graded

PARAMS = ("overhead", "per_token", "kv")  # the coefficients, in this order
Z_FIT = 5.0  # standard errors a fitted coefficient may stray from the truth
BIAS_FIT = 2.0  # plus this many sigma^2 of the coefficient (relative weighting's bias, about 1.5 sigma^2)
REL = 1e-9  # closed forms in float64
SAFE = 0.90  # the policy's worst batch size, in plain decoding's throughput (the docstring: false-fail rate)
EFFICIENT = 0.85  # the policy's mean share of the best k's throughput
DAY, NIGHT = 256, 8  # the chapter's question: batch 256 by day, 8 at night
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


# -- Task 2: speedup and crossover ------------------------------------------------------------------


def reference_speedup(theta: Sequence[float], alpha: float, c: float, context: int, k: int, B: int) -> float:
    return _model(theta, c, context).predict_speedup(alpha, k, B)


def _speedups(theta: Sequence[float], alpha: float, c: float, context: int, k: int, b_max: int) -> np.ndarray:
    """specref's predicted speedup of k at every B = 1..b_max: [b_max]."""
    return speedup_grid(theta, alpha, c, context, np.arange(1, b_max + 1), k)[:, k]


def _speedup_case(rng: np.random.Generator, theta: np.ndarray) -> tuple:
    return (theta, float(rng.choice([rng.uniform(0.3, 0.95), rng.uniform(0, 1)])), float(rng.uniform(0, 0.4)),
            int(rng.choice([32, 64, 256, 1000])), int(rng.integers(0, 11)), int(rng.choice([1, 3, 8, 40, 256, 700])))


def _visible_speedup_cases(seed: int) -> list[tuple]:
    rng = np.random.default_rng([seed, 2])
    theta = SERVER
    cases = [(theta, 0.8, 0.05, 256, 0, 8), (theta, 0.8, 0.05, 256, 4, 8), (theta, 0.0, 0.1, 64, 3, 1),
             (theta, 1.0, 0.1, 64, 3, 16), (theta, 0.7, 0.0, 64, 5, 256)]
    return cases + [_speedup_case(rng, _visible_theta(rng)) for _ in range(15)]


def _unseen_speedup_cases(seed: int) -> list[tuple]:
    rng = np.random.default_rng([seed, 73])
    cases = []
    for _ in range(40):
        theta = _unseen_table(rng)[0] * np.exp(rng.normal(0, 0.3, 3))  # fitted-looking: not the visible shapes
        cases.append((theta, float(rng.uniform(0, 1)), float(rng.uniform(0, 0.6)), int(rng.integers(0, 2049)),
                      int(rng.integers(0, 16)), int(rng.integers(1, 1025))))
    return cases


def _case(theta, alpha: float, c: float, S: int, k: int, last: str, value: int) -> tuple[list[float], list[str]]:
    """A case's parameters as plain floats, and the line that shows the learner what their function was given."""
    params = [float(x) for x in theta]
    return params, [f"params = [{', '.join(f'{x:.6g}' for x in params)}], alpha = {alpha:.6g}, c = {c:.6g}, "
                    f"context = {S}, k = {k}, {last} = {value}"]


def _grade_speedup(g: str, fn: Callable, cases: list[tuple]) -> None:
    for n, (theta, alpha, c, S, k, B) in enumerate(cases, 1):
        where = f"case {n} of {len(cases)}."
        params, inputs = _case(theta, alpha, c, S, k, "batch_size", B)
        out = call_learner(g, where, inputs, fn, params, alpha, c, S, k, B)
        got = as_float(out)
        if got is None:
            raise failure(g, where, inputs + [f"got {out!r}"], "return one number: the speedup over plain decoding.")
        want = reference_speedup(theta, alpha, c, S, k, B)
        if not math.isclose(got, want, rel_tol=REL):
            hint = ("k = 0 is plain decoding itself." if k == 0 else
                    "a speculative step is one pass over k + 1 tokens per row plus k draft steps, each c plain "
                    "passes; it yields the expected tokens per step of notebook 03, against one token per plain pass. "
                    "Use the pass-time model at this batch size and context.")
            raise failure(g, where, inputs + [f"your speedup: {got!r}"], hint)
    passed(g, f"{len(cases)} cases against specref's cost model")


@graded(2, "check_speedup", FORBIDDEN, ALLOWED)
def check_speedup(speedup: Callable, seed: int = 0) -> None:
    """Grade speedup(params, alpha, c, context, k, batch_size) -> float by value."""
    _grade_speedup("check_speedup", speedup, _visible_speedup_cases(seed))


@graded(2, "check_speedup_unseen", FORBIDDEN, ALLOWED)
def check_speedup_unseen(speedup: Callable, seed: int) -> None:
    """The hidden test of Task 2's speedup: other coefficients, contexts and k, drawn from `seed`."""
    _grade_speedup("check_speedup_unseen", speedup, _unseen_speedup_cases(seed))


def crossover_ok(theta: Sequence[float], alpha: float, c: float, context: int, k: int, b_max: int, got: int) -> bool:
    """Is `got` the largest B in 1..b_max where k still beats plain (0: none; b_max: all)? Fair at near-ties.

    The sum model's speedup falls as B grows (v(k) rises toward its large-batch limit), so one step of the
    curve decides: k wins at `got` (up to rounding) and does not win at got + 1.
    """
    if not 0 <= got <= b_max:
        return False
    s = _speedups(theta, alpha, c, context, k, b_max)
    return (got == 0 or s[got - 1] >= 1 - REL) and (got == b_max or s[got] <= 1 + REL)


def _crossover_cases(rng: np.random.Generator, theta_of: Callable, n: int) -> list[tuple]:
    cases = []
    while len(cases) < n:
        theta = theta_of(rng)
        alpha, c, S = float(rng.uniform(0.3, 0.95)), float(rng.uniform(0, 0.3)), int(rng.choice([64, 256, 512]))
        cases.append((theta, alpha, c, S, int(rng.integers(1, 9)), int(rng.choice([64, 512, 4096]))))
    return cases


def _grade_crossover(g: str, fn: Callable, cases: list[tuple]) -> None:
    for n, (theta, alpha, c, S, k, b_max) in enumerate(cases, 1):
        where = f"case {n} of {len(cases)}."
        params, inputs = _case(theta, alpha, c, S, k, "b_max", b_max)
        out = call_learner(g, where, inputs, fn, params, alpha, c, S, k, b_max)
        if isinstance(out, (bool, np.bool_)) or not isinstance(out, (int, np.integer)):
            raise failure(g, where, inputs + [f"got {out!r}"], "return one integer batch size (0 if k never pays).")
        got = int(out)
        if not crossover_ok(theta, alpha, c, S, k, b_max, got):
            s = _speedups(theta, alpha, c, S, k, b_max)
            if not 0 <= got <= b_max:
                why = f"it is not a batch size in 0..b_max = 0..{b_max}."
            elif got >= 1 and s[got - 1] < 1 - REL:
                why = f"by this cost model k = {k} does not beat plain decoding at batch {got}."
            else:
                why = f"by this cost model k = {k} still beats plain decoding at batch {got + 1}."
            raise failure(g, where, inputs + [f"your crossover: {got}: {why}"],
                        "B*(k) is the largest batch size in 1..b_max at which k still beats plain decoding "
                        "(speedup > 1); 0 if it beats it nowhere, b_max if everywhere.")
    passed(g, f"{len(cases)} cases, B*(k) against specref's cost model at every batch size")


@graded(2, "check_crossover", FORBIDDEN, ALLOWED)
def check_crossover(crossover: Callable, seed: int = 0) -> None:
    """Grade crossover(params, alpha, c, context, k, b_max) -> B*(k)."""
    rng = np.random.default_rng([seed, 3])
    theta = SERVER
    cases = [(theta, 0.8, 0.05, 256, 4, 4096), (theta, 0.0, 0.05, 256, 2, 64), (theta, 0.99, 0.0, 64, 1, 16)]
    _grade_crossover("check_crossover", crossover, cases + _crossover_cases(rng, _visible_theta, 9))


@graded(2, "check_crossover_unseen", FORBIDDEN, ALLOWED)
def check_crossover_unseen(crossover: Callable, seed: int) -> None:
    """The hidden test of Task 2's crossover: other coefficients, drawn from `seed`."""
    rng = np.random.default_rng([seed, 79])
    _grade_crossover("check_crossover_unseen", crossover,
                     _crossover_cases(rng, lambda r: _unseen_table(r)[0], 30))


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
        try:
            ks = [int(k) for k in out] if not isinstance(out, (str, bytes)) else None
            if ks is not None and any(isinstance(k, (bool, np.bool_)) or int(k) != k for k in out):
                ks = None
        except (TypeError, ValueError):
            ks = None
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
