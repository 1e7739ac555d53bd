"""Graders for the chapter 3 exercise: the accepted-count law, derived by simulation and in closed form, the best k
when verification costs v(k) (a stopping rule the learner derives), and tokens per step measured on toy chains with
the learner's own speculative loop.

Every `check_*` function raises AssertionError with the input, the received answer and a hint (never the answer a
task asks for), or returns None and prints one line on success. The statistical checks use generators seeded by
`derived_seed` (a fixed seed per case), a real test statistic and threshold, and state their false-fail rate and
their power where they are defined; tests/grading/test_ex02_ex03.py runs them on the solution and on negative controls.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence

import numpy as np
import torch
from scipy.stats import chi2 as scipy_chi2

from specref.checks.montecarlo import simulate
from specref.checks.toy import MarkovChain, mixture, random_chain, toy_pair

from .report import as_float, as_int, as_items, as_vector, call_learner, derived_seed, failure, passed
from .rules import graded

# The reference rule. Every task writes what these modules compute: the closed forms and the best k
# (specref.theory), the exact step law (specref.checks.exact), the toy simulation (specref.checks.montecarlo:
# simulate, which also runs the loop Task 4 asks for), the course's views that wrap them (specref.course: speedup
# curves, optimal k) and the cost model's k chooser. None of them is in the kernel's specref.
FORBIDDEN = ("specref.theory", "specref.checks.exact", "specref.checks.montecarlo", "specref.course",
             "specref.perf.costmodel", "specref_grading")
ALLOWED = ("specref_grading.checks.speedup.check_accepted_counts",
           "specref_grading.checks.speedup.check_accepted_count_pmf", "specref_grading.checks.speedup.check_best_k",
           "specref_grading.checks.speedup.check_toy_measurement")


# --------------------------------------------------------------------------------------
# The laws the graders compare with (float64, the grader's side only)
# --------------------------------------------------------------------------------------


def _pmf(alphas: Sequence[float]) -> np.ndarray:
    """[P(A = 0), ..., P(A = k)] when draft i, once reached, is accepted with probability alphas[i - 1]."""
    alphas = np.asarray(alphas, dtype=np.float64)
    reach = np.concatenate([[1.0], np.cumprod(alphas)])  # P(A >= i), i = 0..k
    return reach - np.concatenate([reach[1:], [0.0]])


# --------------------------------------------------------------------------------------
# Task 1: the accepted-count law by simulation, with an explicit generator
# --------------------------------------------------------------------------------------

COUNT_SAMPLES = 20_000  # steps simulated per case
_P_FAIL = 1e-6  # chi-square significance level per case
_SMALL = 400  # steps per call in the determinism checks


def _count_cases(n_cases: int, seed: int) -> list[list[float]]:
    rng = np.random.default_rng(derived_seed(seed, "count cases") % 2**32)
    fixed = [[0.8, 0.8, 0.8, 0.8], [0.9, 0.6, 0.3, 0.95, 0.5], [], [0.0, 0.7], [1.0, 1.0, 0.5], [0.5]]
    rand = [[round(float(a), 3) for a in rng.uniform(0.2, 0.97, int(rng.integers(1, 9)))] for _ in range(n_cases)]
    # The visible cases are the fixed ones; hidden ones are random, with the two hardest fixed ones (k = 0 and
    # five different alphas) kept.
    return (fixed + rand)[:n_cases] if seed == 0 else (fixed[1:3] + rand)[:n_cases]


def chi_square(counts: np.ndarray, probs: np.ndarray) -> tuple[float, int, float]:
    """(statistic, degrees of freedom, p-value) of observed counts against probabilities; bins expecting fewer
    than 5 are pooled (into the smallest kept bin when the pool itself expects fewer than 5)."""
    n = counts.sum()
    expected = probs * n
    big = expected >= 5
    obs, exp = list(counts[big]), list(expected[big])
    if (~big).any():
        if expected[~big].sum() >= 5 or not obs:
            obs.append(counts[~big].sum())
            exp.append(expected[~big].sum())
        else:
            j = int(np.argmin(exp))
            obs[j] += counts[~big].sum()
            exp[j] += expected[~big].sum()
    obs, exp = np.asarray(obs, dtype=np.float64), np.asarray(exp, dtype=np.float64)
    dof = len(obs) - 1
    stat = float(((obs - exp) ** 2 / exp).sum())
    return stat, dof, float(scipy_chi2.sf(stat, dof)) if dof > 0 else 1.0


def _as_counts(out: object, n: int, k: int) -> np.ndarray | None:
    v = as_vector(out)
    if v is None or v.dim() != 1 or v.shape[0] != n or not torch.isfinite(v).all():
        return None
    if not torch.equal(v, v.round()) or (v < 0).any() or (v > k).any():
        return None
    return v.numpy().astype(np.int64)


@graded(1, "check_accepted_counts", FORBIDDEN, ALLOWED)
def check_accepted_counts(fn: Callable[[list[float], int, torch.Generator], object], n_cases: int = 6,
                          seed: int = 0) -> None:
    """Grade simulate_accepted(alphas, n, generator) -> n accepted-draft counts, one per simulated step.

    Per case (per-position acceptance probabilities, `k = len(alphas)` from 0 to 8, 0 and 1 included):
    the counts must lie in 0..k; two calls with generators seeded alike must agree and two seeded differently
    must not (randomness from the generator handed in, and only from it); and the COUNT_SAMPLES counts of one
    call must fit the law P(A >= i) = alphas[0] ... alphas[i-1] by a chi-square goodness-of-fit test at level
    _P_FAIL = 1e-6.

    False-fail rate: a correct simulation fails a case with probability 1e-6 (the chi-square law is accurate here:
    every kept bin expects at least 5 counts, nearly all of them hundreds); over the 6 visible and 8 hidden cases
    at most 1.4e-5, 1 in 70,000. Power (the noncentral chi-square at 20,000 samples; tests/grading/test_ex02_ex03.py runs
    these as negative controls): drafts accepted independently without stopping at the first rejection,
    acceptance `u > alpha` instead of `u < alpha`, one alpha for every position, the alphas shifted by one
    position fail with probability 1 to machine precision (noncentrality 2.5e4, 8.8e4 and 4.1e4 on the cases
    [0.8] * 4 and [0.9, 0.6, 0.3, 0.95, 0.5], against a critical value of 33.4 on 4 degrees of freedom). The
    smallest error caught reliably: 0.025 of probability moved from A = k to A = 0 at alphas = [0.8] * 4
    (noncentrality 93) is flagged with probability 0.99998; 0.01 (noncentrality 15) only with probability 0.05.
    """
    g = "check_accepted_counts"
    for n, alphas in enumerate(_count_cases(n_cases, seed), 1):
        k = len(alphas)
        where = f"wrong answer on case {n} of {n_cases}."
        inputs = [f"alphas = {alphas} (k = {k}), n = {COUNT_SAMPLES}"]
        gen = torch.Generator().manual_seed(derived_seed(seed, "counts", n))
        out = call_learner(g, where, inputs, fn, list(alphas), COUNT_SAMPLES, gen)
        counts = _as_counts(out, COUNT_SAMPLES, k)
        if counts is None:
            raise failure(g, where, inputs + [f"got {type(out).__name__} {str(out)[:120]}"],
                          f"return n whole numbers, each in 0..k = 0..{k}: the drafts accepted in one step each.")
        law = _pmf(alphas)
        impossible = np.flatnonzero((law == 0) & (np.bincount(counts, minlength=k + 1) > 0))
        if impossible.size:
            raise failure(g, where, inputs + [f"your counts include {int(impossible[0])}, which cannot happen here"],
                          "a step stops at its first rejection: a draft accepted with probability 0 is never passed, "
                          "and one accepted with probability 1 always is.")
        # Randomness: the same seed twice gives the same counts; another seed gives others (where the law is random).
        small = [call_learner(g, where, inputs, fn, list(alphas), _SMALL,
                              torch.Generator().manual_seed(derived_seed(seed, "counts again", n, s)))
                 for s in (0, 0, 1)]
        a, b, other = (_as_counts(x, _SMALL, k) for x in small)
        if a is None or b is None or other is None or not np.array_equal(a, b):
            raise failure(g, where, inputs + ["two calls with generators seeded alike gave different counts"],
                          "draw every random number from the generator you are given "
                          "(torch.rand(..., generator=generator)), never from torch's global one.")
        if law.max() < 1 - 1e-12 and np.array_equal(a, other):
            raise failure(g, where, inputs + ["two calls with generators seeded differently gave the same counts"],
                          "draw from the generator you are given, not from a new one seeded inside your function.")
        stat, dof, p_value = chi_square(np.bincount(counts, minlength=k + 1).astype(np.float64), law)
        if dof > 0 and p_value < _P_FAIL:
            shares = np.bincount(counts, minlength=k + 1) / COUNT_SAMPLES
            raise failure(g, where + " Your counts do not follow the left-to-right rule.",
                          inputs + [f"your shares of steps with A = 0..k: {[round(float(x), 4) for x in shares]}",
                                    f"chi-square {stat:.1f} on {dof} degrees of freedom, p-value {p_value:.1e} "
                                    f"(a correct simulation falls below {_P_FAIL:g} once in a million)"],
                          "walk the drafts left to right: draft i is accepted with probability alphas[i - 1], only if "
                          "every draft before it was, and the first rejection ends the step.")
    passed(g, f"{n_cases} cases: counts in 0..k, the generator's randomness, chi-square fit at level {_P_FAIL:g}")


# --------------------------------------------------------------------------------------
# Task 2: the accepted-count law in closed form
# --------------------------------------------------------------------------------------


def _pmf_cases(n_cases: int, seed: int) -> list[list[float]]:
    rng = np.random.default_rng(derived_seed(seed, "pmf cases") % 2**32)
    fixed = [[0.8] * 4, [0.9, 0.6, 0.3], [], [0.0, 0.5], [1.0, 1.0], [0.5, 1.0, 0.0, 0.7], [0.25]]
    rand = []
    for _ in range(n_cases):
        a = rng.uniform(0, 1, int(rng.integers(0, 11)))
        a[rng.uniform(size=a.size) < 0.1] = 1.0
        rand.append([round(float(x), 4) for x in a])
    return (fixed + rand)[:n_cases]


@graded(2, "check_accepted_count_pmf", FORBIDDEN, ALLOWED)
def check_accepted_count_pmf(fn: Callable[[list[float]], object], n_cases: int = 40, seed: int = 0) -> None:
    """Grade accepted_count_pmf(alphas) -> [P(A = 0), ..., P(A = k)], exactly (float64, 1e-12)."""
    g = "check_accepted_count_pmf"
    for n, alphas in enumerate(_pmf_cases(n_cases, seed), 1):
        k = len(alphas)
        where = f"wrong answer on case {n} of {n_cases}."
        inputs = [f"alphas = {alphas} (k = {k})"]
        out = call_learner(g, where, inputs, fn, list(alphas))
        v = as_vector(out)
        if v is None or v.dim() != 1 or v.shape[0] != k + 1:
            raise failure(g, where, inputs + [f"got {str(out)[:120]}"],
                          f"return k + 1 = {k + 1} probabilities, P(A = 0) .. P(A = k): A counts accepted drafts.")
        law = _pmf(alphas)
        got = v.numpy()
        if not (np.isfinite(got).all() and np.abs(got - law).max() <= 1e-12):
            tails = np.cumsum(got[::-1])[::-1]
            hint = ("P(A >= i) is the chance that drafts 1..i are all accepted; P(A = j) is that minus "
                    "P(A >= j + 1).")
            if k > 0 and abs(got.sum() - 1) > 1e-9:
                hint = "your probabilities do not sum to 1: every step accepts some number of drafts from 0 to k."
            if k > 0 and abs(got[k] - law[k] * (1 - alphas[-1])) < 1e-12 and law[k] > 0 and alphas[-1] != 0:
                hint = "P(A = k): after the last draft is accepted no rejection is left to happen."
            raise failure(g, where, inputs + [f"got {[round(float(x), 6) for x in got]}",
                                            f"your P(A >= i), i = 0..k: {[round(float(x), 6) for x in tails]}"], hint)
    passed(g, f"{n_cases} cases, k = 0 and acceptance probabilities 0 and 1 included")


# --------------------------------------------------------------------------------------
# Task 3: the best k when verification is not free
# --------------------------------------------------------------------------------------


class VerifyCost:
    """v(k): the cost of the target pass that scores k drafts and the bonus token (k + 1 tokens), in plain steps.

    One of five convex, non-decreasing shapes with v(0) = 1: "flat" (notebook 03's 1), "linear" 1 + g k (a pass
    whose work grows with the tokens it scores, as on a CPU), "roofline" max(1, (k + 1) / m) (memory-bound up to m
    tokens, then compute-bound), "knee" 1 + g max(0, k + 1 - m) (flat, then linear), "quadratic" 1 + g k + h k^2
    (attention among the scored tokens). The learner's code calls it with a whole k >= 0; the grader evaluates it on
    arrays of k (`costs`).
    """

    def __init__(self, shape: str, g: float = 0.0, m: float = 1.0, h: float = 0.0) -> None:
        if shape not in ("flat", "linear", "roofline", "knee", "quadratic"):
            raise ValueError(f"unknown shape {shape!r}")
        self.shape, self.g, self.m, self.h = shape, float(g), float(m), float(h)

    def costs(self, k: np.ndarray) -> np.ndarray:
        k = np.asarray(k, dtype=np.float64)
        if self.shape == "flat":
            return np.ones_like(k)
        if self.shape == "linear":
            return 1 + self.g * k
        if self.shape == "roofline":
            return np.maximum(1.0, (k + 1) / self.m)
        if self.shape == "knee":
            return 1 + self.g * np.maximum(0.0, k + 1 - self.m)
        return 1 + self.g * k + self.h * k * k

    def __call__(self, k: object) -> float:
        if isinstance(k, torch.Tensor) and k.numel() == 1:
            k = k.item()
        if isinstance(k, (bool, np.bool_)) or not isinstance(k, (int, np.integer, float, np.floating)) or \
                not float(k).is_integer() or k < 0:
            raise ValueError(f"v takes a whole number of drafts k >= 0, got {k!r}")
        return float(self.costs(np.float64(k)))

    def __repr__(self) -> str:
        return {"flat": "v(k) = 1",
                "linear": f"v(k) = 1 + {self.g:g} k",
                "roofline": f"v(k) = max(1, (k + 1) / {self.m:g})",
                "knee": f"v(k) = 1 + {self.g:g} max(0, k + 1 - {self.m:g})",
                "quadratic": f"v(k) = 1 + {self.g:g} k + {self.h:g} k^2"}[self.shape]


def _speedups(alpha: float, c: float, v: VerifyCost, ks: np.ndarray) -> np.ndarray:
    """S(k) = E_k / (v(k) + c k), E_k = 1 + alpha + ... + alpha^k, for an array of k (float64)."""
    ks = np.asarray(ks, dtype=np.float64)
    return (1 - alpha ** (ks + 1)) / (1 - alpha) / (v.costs(ks) + c * ks)


def _search(alpha: float, c: float, v: VerifyCost) -> tuple[int, float, float]:
    """(best k, its speedup, the best speedup of every other k), by exhaustive search over every k that could win.

    The search needs no argument about where S turns: S(k) <= E_inf / (v(k) + c k) <= E_inf / (1 + c k) with
    E_inf = 1 / (1 - alpha), so once 1 + c k exceeds E_inf / S_second no later k can beat the best two found. The
    search runs in blocks of doubling length until that bound lies inside what was searched.
    """
    e_inf, end, s = 1 / (1 - alpha), 1024, np.empty(0)
    while True:
        s = np.concatenate([s, _speedups(alpha, c, v, np.arange(s.size, end))])
        best = int(np.argmax(s))
        second = float(np.delete(s, best).max())
        if 1 + c * end > e_inf / second:
            return best, float(s[best]), second
        end *= 2


def _best_k(alpha: float, c: float, v: VerifyCost) -> int:
    return _search(alpha, c, v)[0]


_GAP = 1e-7  # relative: a case's best speedup beats every other k's by at least this much


def _separated(alpha: float, c: float, v: VerifyCost) -> bool:
    """Whether the best k wins by at least _GAP: then a correct rule decides it right in float64 on any CPU (its
    rounding is about k * 1e-16 relative, under 1e-12 for every case here)."""
    _, best, second = _search(alpha, c, v)
    return best >= second * (1 + _GAP)


_BEST_K_FIXED = [
    (0.8, 0.05, VerifyCost("flat")),  # notebook 03's example: 8
    (0.99, 0.001, VerifyCost("flat")),  # an optimum in the hundreds
    (0.8, 0.05, VerifyCost("linear", g=0.1)),
    (0.9, 0.05, VerifyCost("linear", g=1.0)),  # every token scored costs a plain step: speculation does not pay
    (0.0, 0.1, VerifyCost("flat")),
    (0.995, 0.0005, VerifyCost("roofline", m=64)),
    (0.8, 0.02, VerifyCost("roofline", m=4)),
    (0.9, 0.01, VerifyCost("knee", g=0.05, m=8)),
    (0.97, 0.002, VerifyCost("quadratic", g=0.01, h=0.0005)),
    (0.3, 0.5, VerifyCost("flat")),
]


def _random_cost(rng: np.random.Generator) -> VerifyCost:
    shape = str(rng.choice(["flat", "linear", "roofline", "knee", "quadratic"]))
    return VerifyCost(shape, g=round(float(10 ** rng.uniform(-3, 0.2)), 5), m=int(rng.integers(2, 200)),
                      h=round(float(10 ** rng.uniform(-6, -2)), 7))


def _best_k_cases(n_cases: int, seed: int) -> list[tuple[float, float, VerifyCost]]:
    """The visible cases start with _BEST_K_FIXED; hidden ones are random (every shape, optima from 0 to the
    hundreds). A random case whose best k does not win by _GAP is drawn again."""
    rng = np.random.default_rng(derived_seed(seed, "best k cases") % 2**32)
    cases = list(_BEST_K_FIXED) if seed == 0 else [_BEST_K_FIXED[1], _BEST_K_FIXED[3]]
    while len(cases) < n_cases:
        alpha = round(float(1 - 10 ** rng.uniform(-2.5, 0)), 4)
        c = round(float(10 ** rng.uniform(-3.5, -0.3)), 5)
        v = _random_cost(rng)
        if 0 <= alpha < 1 and _separated(alpha, c, v):
            cases.append((alpha, c, v))
    return cases[:n_cases]


@graded(3, "check_best_k", FORBIDDEN, ALLOWED)
def check_best_k(fn: Callable[[float, float, Callable[[int], float]], object], n_cases: int = 30,
                 seed: int = 0) -> None:
    """Grade best_k(alpha, c, v) -> the k >= 0 with the largest speedup E_k / (v(k) + c k), no upper limit given.

    The learner's k must be the best k exactly: every case's best k beats every other k by at least _GAP = 1e-7
    relative (`_separated`), far above the rounding of a correct float64 rule, so there is no tolerance to argue
    about. The best k is found by exhaustive search to a proven bound (`_best_k`), not by the rule the learner
    derives. The cases: five shapes of v (`VerifyCost`), optima from 0 to the hundreds, and optima sitting on a
    roofline's corner, so the rule of notebook 03 (a draft costs c) fails, and so does a search over a fixed range.
    """
    g = "check_best_k"
    for n, (alpha, c, v) in enumerate(_best_k_cases(n_cases, seed), 1):
        where = f"wrong answer on case {n} of {n_cases}."
        inputs = [f"alpha = {alpha}, c = {c}, {v!r}"]
        out = call_learner(g, where, inputs, fn, alpha, c, v)
        kk = as_int(out)
        if kk is None:
            raise failure(g, where, inputs + [f"got {out!r}"], "return the best k as a whole number.")
        best = _best_k(alpha, c, v)
        if kk != best:
            hint = ("draft k + 1 adds alpha^(k+1) tokens; what does it add to the cost of a step when v is not "
                    "constant? It pays exactly while its tokens per unit of that added cost beat S(k).")
            if kk < best and kk in (8, 10, 16, 20, 32, 50, 64, 100, 128, 256):
                hint = "the best k here is not within the range you searched: no upper limit is given."
            elif v.shape != "flat" and kk == _best_k(alpha, c, VerifyCost("flat")):
                hint = "that is the best k if verification cost one plain step whatever k; here it costs v(k)."
            raise failure(g, where + " Your k does not give the largest speedup.", inputs + [f"got k = {out!r}"], hint)
    passed(g, f"{n_cases} cases, five shapes of v, k = 0 and optima in the hundreds included")


# --------------------------------------------------------------------------------------
# Task 4: tokens per step measured on toy chains, with the learner's own speculative loop
# --------------------------------------------------------------------------------------


def _toy_cases(n_cases: int, seed: int) -> list[tuple[str, object, object, int]]:
    """(label, target, draft, k): random toy pairs the learner has not seen, and a chain whose contexts persist."""
    gen = torch.Generator().manual_seed(1000 + seed)
    cases: list[tuple[str, object, object, int]] = []
    # A two-topic chain (the text stays in its topic with probability 0.9; the draft knows one topic well): there
    # accepted / examined and the first-draft rate differ a lot, so swapping them is flagged.
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


def _ratio_and_spread(num: torch.Tensor, den: torch.Tensor) -> tuple[float, float]:
    """sum(num) / sum(den) over independent runs, and its delta-method spread per run (divide by sqrt(runs))."""
    r = float(num.sum() / den.sum())
    resid = (num - r * den).double()
    return r, float(resid.pow(2).mean().sqrt() / den.double().mean())


MEASURES = ("tokens_per_step", "accepted_per_examined", "first_accepted")


def toy_reference(target, draft, k: int, n: int, runs: int, generator: torch.Generator) -> dict[str, float]:
    """What `measure_toy` should return, from `simulate` on `runs` runs, with the per-run spread of each ratio.

    Per run r, over the steps it takes until it has n tokens (the last one counted whole): S_r steps,
    T_r = tokens emitted (accepted drafts + 1 per step), A_r = accepted drafts, X_r = examined drafts
    (min(A + 1, k) per step), F_r = steps that accept their first draft. The measures are sum T / sum S,
    sum A / sum X and sum F / sum S; runs are independent, so each ratio's standard error is
    sd_r(num_r - R den_r) / (mean den_r sqrt(runs)) (delta method).
    """
    sim = simulate(target, draft, start_token=0, k=k, n=n, runs=runs, generator=generator)
    active = sim.active.double()  # [S, N]
    acc = sim.n_accepted.double()  # [S, N]
    steps = active.sum(0)  # [N]
    per_run = {
        "tokens_per_step": ((acc + 1) * active).sum(0),
        "accepted_per_examined": (acc * active).sum(0),
        "first_accepted": ((acc >= 1).double() * active).sum(0),
    }
    dens = {"tokens_per_step": steps, "accepted_per_examined": ((acc + 1).clamp(max=k) * active).sum(0),
            "first_accepted": steps}
    out: dict[str, float] = {}
    for m in MEASURES:
        out[m], out[m + "_spread"] = _ratio_and_spread(per_run[m], dens[m])
    return out


TOY_RUNS, TOY_N = 2000, 60
_REF_RUNS = 20000
_Z = 5.0  # tolerance in standard errors of the difference


def _reference_generator(seed: int, n: int) -> torch.Generator:
    """The generator of the grader's reference simulation for case n (1-based) of a given seed."""
    return torch.Generator().manual_seed(derived_seed(seed, "toy_reference", n))


def toy_tolerances(ref: dict) -> dict[str, float]:
    """How far each measure may be from the reference: _Z standard errors of the difference of the two runs."""
    scale = math.sqrt(1 / TOY_RUNS + 1 / _REF_RUNS)
    return {m: _Z * ref[m + "_spread"] * scale for m in MEASURES}


_MEASURE_HINTS = {
    "tokens_per_step": "tokens per step: accepted drafts + 1 per step, averaged over the steps every run takes until "
                       "it has n tokens (the last one counted whole).",
    "accepted_per_examined": "accepted / examined: a step with A accepted drafts examined min(A + 1, k) of them (it "
                             "stops examining at its first rejection); divide the accepted drafts by those.",
    "first_accepted": "the first-draft rate: the share of steps (the same steps as tokens per step) that accept their "
                      "first draft.",
}


@graded(4, "check_toy_measurement", FORBIDDEN, ALLOWED)
def check_toy_measurement(fn: Callable[..., object], n_cases: int = 3, seed: int = 0) -> None:
    """Grade measure_toy(target, draft, k, runs, n, generator) -> (tokens_per_step, accepted_per_examined,
    first_accepted), measured with the learner's own speculative loop (the kernel has no `simulate`).

    On toy pairs the learner has not seen, the three measures against the grader's own simulation on 10 times as
    many runs, within _Z = 5 standard errors of their difference, each standard error computed from the per-run
    spread (see `toy_reference`). At TOY_RUNS = 2000 runs of TOY_N = 60 tokens that tolerance is about 0.01 to 0.05
    tokens per step and 0.005 to 0.015 in a rate: far below an off-by-one (1 token per step) or accepted / drafted
    in place of accepted / examined (0.2 or more on these pairs); on the two-topic chain the two rates differ by
    about 0.1, many tolerances, so swapping them is flagged (tests/grading/test_ex02_ex03.py holds the cases to that). Two
    calls with generators seeded alike must agree (randomness from the generator handed in).

    False-fail rate at a random seed: each measure of a correct loop is off the reference by a difference that is
    normal to first order (2000 and 20 000 independent runs), so it misses 5 standard errors with probability
    2 Phi(-5) = 5.7e-7; over 3 measures x n_cases (6 in the hidden test, 3 visible) at most 1.6e-5, 1 in 60,000
    (tests/grading/test_false_fail.py measures it on the solution).
    """
    g = "check_toy_measurement"
    for n, (label, target, draft, k) in enumerate(_toy_cases(n_cases, seed), 1):
        where = f"wrong answer on case {n} of {n_cases} ({label})."
        inputs = [f"k = {k}, runs = {TOY_RUNS}, n = {TOY_N}, start token 0"]
        ref = toy_reference(target, draft, k, TOY_N, _REF_RUNS, _reference_generator(seed, n))
        gen = torch.Generator().manual_seed(derived_seed(seed, "measure_toy", n))  # its state tells nothing of seed
        out = call_learner(g, where, inputs, fn, target, draft, k, TOY_RUNS, TOY_N, gen)
        items = as_items(out, 3)
        vals = None if items is None else [as_float(x) for x in items]
        if vals is None or any(v is None or not math.isfinite(v) for v in vals):
            raise failure(g, where, inputs + [f"got {str(out)[:120]}"],
                          "return three numbers: (tokens_per_step, accepted_per_examined, first_accepted).")
        tol = toy_tolerances(ref)
        for m, v in zip(MEASURES, vals, strict=True):
            if abs(v - ref[m]) > tol[m]:
                hint = _MEASURE_HINTS[m]
                if m == "tokens_per_step" and abs(v + 1 - ref[m]) <= tol[m]:
                    hint = "you counted accepted drafts only; every step also emits one more token (correction or bonus)."
                if m == "accepted_per_examined" and abs(v - ref["first_accepted"]) <= tol["first_accepted"]:
                    hint = "that looks like the first-draft rate; this one divides accepted drafts by examined drafts."
                raise failure(g, where + f" Your {m.replace('_', ' ')} is off.",
                              inputs + [f"got {v:.4f}; a correct measurement lands within {tol[m]:.4f} of the "
                                        f"grader's (5 standard errors)"], hint)
        small = [call_learner(g, where, inputs, fn, target, draft, k, 50, 20,
                              torch.Generator().manual_seed(derived_seed(seed, "measure_toy again", n)))
                 for _ in range(2)]
        if [as_float(x) for x in small[0]] != [as_float(x) for x in small[1]]:
            raise failure(g, where, inputs + ["two calls with generators seeded alike measured different numbers"],
                          "hand the generator you are given to every random call (draft.propose, verify_chain), and "
                          "use no other source of randomness.")
    passed(g, f"{n_cases} toy pairs you had not seen, within 5 standard errors of a 10x larger simulation")
