"""Graders for the chapter 2 exercises, standing on the exact enumerator of `specref.checks.rng`.

A learner's sampler draws its randomness through a small interface, `rng`:

    rng.uniform()          -> a number u ~ U[0, 1)
    rng.categorical(probs) -> an index i with probability probs[i]

In real use `rng` is a `TorchRNG` wrapping a `torch.Generator`. A grader instead
passes a symbolic rng: `uniform()` returns an unknown u whose comparisons branch,
`categorical` branches over every index, and a depth-first search re-runs the
learner's function once per branch path. Summing path probabilities gives the
sampler's exact output distribution. The step grader compares it, within 1e-9,
with the exact distribution of specref's own `verify_chain` (enumerated over its
uniforms by `specref.checks.exact`): no Monte-Carlo noise, no lucky seeds, and no second
copy of the rule in this module.

What a symbolic u supports is documented in `specref.checks.rng`.

Every `check_*` function raises AssertionError with the input, the expected and
the received answer and a hint, or returns None and prints one line on success.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass

import numpy as np
import torch

from specref.chain_verify import verify_chain
from specref.checks.exact import enumerate_step, merge
from specref.checks.rng import _SYMBOLIC_HINT, exact_distribution
from specref.rejection import residual as _ref_residual

from .report import (
    TOL,
    as_float,
    as_ints,
    as_items,
    as_vector,
    close,
    failure,
    fmt,
    global_rng_state,
    passed,
    same_global_rng,
)
from .rules import graded

# The reference rule: the tasks write the rule, so its implementations in specref are out of bounds, under
# whatever name they go: ex08's samplers (specref.checks.samplers: a residual and an accept/reject step of their
# own, private helpers included) and the lectures' views (specref.course.plots and .widgets: beta, min(p, q) and
# the residual of a worked case) compute the same answers.
FORBIDDEN = ("specref.rejection", "specref.chain_verify", "specref.checks.exact", "specref.checks.montecarlo",
             "specref.checks.broken", "specref.checks.pitfalls", "specref.checks.samplers", "specref.course.plots",
             "specref.course.widgets", "specref.typical", "specref.trees", "specref_grading")
ALLOWED = ("specref_grading.checks.accept_reject.check_worked_example",
           "specref_grading.checks.accept_reject.check_residual",
           "specref_grading.checks.accept_reject.check_accept_reject_step")


# --------------------------------------------------------------------------------------
# Exercise 2.1: where each emitted token comes from, for any acceptance rule
# --------------------------------------------------------------------------------------

WORKED_P = (0.6, 0.3, 0.1)
WORKED_Q = (0.3, 0.6, 0.1)
WORKED_A = (1.0, 0.5, 0.5)  # a rule that keeps a drafted a always, a drafted b or c half the time
ROUNDING = 1e-9  # the contract: a rule that keeps x more often than p allows by at most this is rounding, not a fault


def _kept(p: torch.Tensor, q: torch.Tensor, a: torch.Tensor) -> torch.Tensor:  # [V] x3 -> [V]
    """P(x is drafted and kept) under the rule that keeps a drafted x with probability a(x)."""
    return q * a


def _missing(p: torch.Tensor, q: torch.Tensor, a: torch.Tensor) -> torch.Tensor:  # [V] x3 -> [V]
    """What the kept drafts leave of p: the mass a rejection's replacement must supply, (1 - beta) r(x)."""
    return (p - _kept(p, q, a)).clamp(min=0)


def _feasible(p: torch.Tensor, q: torch.Tensor, a: torch.Tensor) -> bool:
    """Some replacement distribution makes the output p: the rule never keeps x more often than p(x)."""
    return bool((_kept(p, q, a) <= p + ROUNDING).all())


def _chapter_a(p: np.ndarray, q: np.ndarray, rng: np.random.Generator) -> np.ndarray:
    """The chapter's rule, min(1, p/q); where q(x) = 0 (x never drafted) any value, drawn at random."""
    a = rng.choice([0.0, 0.5, 1.0], size=len(p))
    on = q > 0
    a[on] = np.minimum(1.0, p[on] / q[on])
    return a


def _rule_cases(rng: np.random.Generator, n_cases: int) -> list[tuple[str, torch.Tensor, torch.Tensor, torch.Tensor]]:
    """(label, p, q, a): the worked case, then rules over random pairs: the chapter's, scaled-down ones, 'never keep',
    'always keep' (lossless only when p == q), random a (lossless or not), on pairs with p == q, one-hot and
    disjoint supports among them."""
    cases: list[tuple[str, np.ndarray, np.ndarray, np.ndarray]] = [
        ("worked case", np.array(WORKED_P), np.array(WORKED_Q), np.array(WORKED_A))]
    while len(cases) < n_cases:
        V = int(rng.integers(2, 7))
        for label, p, q in _distribution_pairs(rng, V):
            kind = int(rng.integers(5))
            if kind == 0 or label == "p == q":
                a, rule = _chapter_a(p, q, rng), "the chapter's rule"
            elif kind == 1:
                a, rule = _chapter_a(p, q, rng) * rng.choice([0.25, 0.5, 0.75]), "the chapter's rule, scaled down"
            elif kind == 2:
                a, rule = np.zeros(V), "never keep a draft"
            elif kind == 3:
                a, rule = np.ones(V), "always keep the draft"
            else:
                a, rule = rng.choice([0.0, 0.25, 0.5, 0.75, 1.0], size=V), "random a"
            cases.append((f"{label}, {rule}", p, q, a))
    return [(label, torch.tensor(p), torch.tensor(q), torch.tensor(a)) for label, p, q, a in cases[:n_cases]]


def _call_rule(g: str, where: str, inputs: list[str], fn: Callable[..., object], p: torch.Tensor, q: torch.Tensor,
               a: torch.Tensor, who: str) -> tuple[bool, object]:
    """(raised ValueError, output) of fn(p, q, a) on copies; another exception, or a change to an input, fails."""
    p_in, q_in, a_in = p.clone(), q.clone(), a.clone()
    try:
        out, raised = fn(p_in, q_in, a_in), False
    except ValueError as e:
        out, raised = e, True
    except NotImplementedError:
        raise
    except Exception as e:  # noqa: BLE001 - any error of the learner's code is reported with its input
        raise failure(g, where, inputs + [f"your function raised {type(e).__name__}: {e}"]) from e
    if not (torch.equal(p_in, p) and torch.equal(q_in, q) and torch.equal(a_in, a)):
        raise failure(g, where, inputs, f"{who} changed p, q or a in place; compute on new tensors instead.")
    return raised, out


def _feasibility_failure(g: str, where: str, inputs: list[str], feasible: bool, out: object) -> AssertionError:
    if feasible:
        return failure(g, where, inputs + [f"your function raised ValueError: {out}"],
                       "this rule can be made lossless: some replacement distribution gives every token x exactly "
                       "p(x). Count what the kept drafts already give each token (and allow for rounding, up to 1e-9).")
    return failure(g, where, inputs + [f"got {out!r}"],
                   "no replacement can make this rule's output p: it keeps some token more often than p allows, and "
                   "a replacement can only add probability. Raise ValueError (naming `a`) then.")


@graded(1, "check_worked_example", FORBIDDEN, ALLOWED, learner_args=3)
def check_worked_example(
    beta: object, residual: object, emit_parts: Callable[[torch.Tensor, torch.Tensor, torch.Tensor], object],
    n_cases: int = 40, seed: int = 0,
) -> None:
    """Grade beta and the replacement distribution of the worked rule (p = (0.6, 0.3, 0.1), q = (0.3, 0.6, 0.1),
    a = (1, 0.5, 0.5)), then emit_parts(p, q, a) -> (accepted, replaced) on random rules.

    accepted[x] = P(x is drafted and kept) = q(x) a(x); replaced[x] = P(a rejection, then x) = p(x) - q(x) a(x),
    what makes the output p. A rule with q(x) a(x) > p(x) + ROUNDING for some x cannot be made lossless: ValueError.
    """
    g = "check_worked_example"
    p, q, a = (torch.tensor(v, dtype=torch.float64) for v in (WORKED_P, WORKED_Q, WORKED_A))
    want_beta = float(_kept(p, q, a).sum())
    miss = _missing(p, q, a)
    want_res = miss / miss.sum()
    inputs = [f"p = {fmt(p)}", f"q = {fmt(q)}", f"a = {fmt(a)}"]

    b = as_float(beta)
    if b is None:
        raise failure(g, "beta must be a single number.", inputs + [f"got beta = {beta!r}"])
    if not close(b, want_beta, rel=1e-6):  # the messages never show the by-hand value nor its formula
        hint = ("recompute it by hand: beta is the chance that a draft x ~ q is kept by this rule, summed over the "
                "tokens x it can be.")
        if close(b, float(torch.minimum(p, q).sum()), rel=1e-6):
            hint = "that is the chapter's rule's; this rule keeps a drafted c only half the time."
        elif close(b, float(a.sum()) / len(a), rel=1e-6) or close(b, float((p * a).sum()), rel=1e-6):
            hint = "the draft x is drawn from q, not uniformly nor from p: weight each token by how often it is drafted."
        elif b > 1:
            hint = "a probability is at most 1."
        raise failure(g, "beta is wrong: yours is not the probability that this rule keeps the draft.",
                      inputs + [f"got beta = {b:.4g}"], hint)

    r = as_vector(residual)
    if r is None or r.shape != (3,):
        shape = None if r is None else tuple(r.shape)
        raise failure(
            g, "res must be a vector of 3 probabilities.", inputs + [f"got {residual!r} (shape {shape})"]
        )
    if not torch.allclose(r, want_res, atol=1e-6, rtol=0):
        raise failure(g, "res is wrong: yours is not the distribution a rejection must draw from for this rule's "
                         "output to be p.", inputs + [f"got res = {fmt(r)}"], _residual_hint(p, q, a, r))

    cases = _rule_cases(np.random.default_rng(seed + 7), n_cases)
    for n, (label, pc, qc, ac) in enumerate(cases, 1):
        where = f"emit_parts is wrong on case {n} of {len(cases)} ({label})."
        case_inputs = [f"p = {fmt(pc)}", f"q = {fmt(qc)}", f"a = {fmt(ac)}"]
        raised, out = _call_rule(g, where, case_inputs, emit_parts, pc, qc, ac, "emit_parts")
        feasible = _feasible(pc, qc, ac)
        if raised != (not feasible):
            raise _feasibility_failure(g, where, case_inputs, feasible, out)
        if raised:
            continue
        pair = as_items(out, 2)
        parts = None if pair is None else [as_vector(x) for x in pair]
        if parts is None or any(x is None or x.shape != pc.shape for x in parts):
            raise failure(g, where, case_inputs + [f"got {out!r}"],
                          f"return a pair (accepted, replaced) of two vectors of shape {tuple(pc.shape)}.")
        accepted, replaced = parts
        want_acc, want_rep = _kept(pc, qc, ac), _missing(pc, qc, ac)
        if not torch.allclose(accepted, want_acc, atol=1e-9, rtol=0):
            hint = "accepted[x] is P(x is drafted, then kept by this rule); yours is not, for this p, q and a."
            if torch.allclose(accepted, pc, atol=1e-9):
                hint = ("that is p, the total P(emit x); accepted is only the part where x was drafted and kept. "
                        "The rest comes from replacements.")
            elif torch.allclose(accepted, qc, atol=1e-9) and not torch.allclose(ac, torch.ones_like(ac)):
                hint = "q(x) is the chance x is drafted; the rule then keeps it only some of the time."
            elif torch.allclose(accepted, torch.minimum(pc, qc), atol=1e-9):
                hint = "that is what the chapter's rule keeps; this rule keeps a drafted x with its own a(x)."
            elif not torch.isfinite(accepted).all():
                hint = "where q(x) = 0 the draft x never occurs: nothing to divide there."
            raise failure(g, where, case_inputs + [f"got accepted = {fmt(accepted)}"], hint)
        if not torch.allclose(replaced, want_rep, atol=1e-9, rtol=0):
            hint = "replaced[x] is P(a rejection, then x as the replacement); yours is not, for this p, q and a."
            if not torch.isfinite(replaced).all():
                hint = ("this rule never rejects a draft here, so there is nothing to make up for: replaced is all "
                        "zeros. Do not divide by that zero mass.")
            elif torch.allclose(replaced, (pc - qc).clamp(min=0), atol=1e-9):
                hint = "that is what the chapter's rule leaves to replace; this rule keeps drafts with its own a."
            elif float(want_rep.sum()) > ROUNDING and torch.allclose(replaced, want_rep / want_rep.sum(), atol=1e-9):
                hint = "weight the replacement distribution by the probability of a rejection: it is drawn only after one."
            elif not torch.allclose(accepted + replaced, pc, atol=1e-9):
                hint = f"accepted + replaced must be p (lossless); yours sum to {fmt(accepted + replaced)}."
            raise failure(g, where, case_inputs + [f"got replaced = {fmt(replaced)}"], hint)
    passed(g, f"beta and res of the worked rule; emit_parts right on {len(cases)} rules, "
              f"{sum(not _feasible(p, q, a) for _, p, q, a in cases)} of them refused as lossy")


# --------------------------------------------------------------------------------------
# Exercise 2.2: the replacement distribution
# --------------------------------------------------------------------------------------


def _residual_hint(p: torch.Tensor, q: torch.Tensor, a: torch.Tensor, got: torch.Tensor) -> str:
    """Name the usual mistake behind a wrong replacement distribution."""
    miss = _missing(p, q, a)
    mass = float(miss.sum())
    if not torch.isfinite(got).all():
        if mass <= ROUNDING:
            return ("this rule keeps every draft here, so nothing is left to replace and normalising divides by 0. A "
                    "rejection then has probability 0 and the replacement is never drawn: return any valid "
                    "distribution (returning p is the convention) instead of dividing by zero.")
        return "your result has NaN/inf: never divide by a zero mass."
    if mass <= ROUNDING:
        return ("this rule never rejects here, so any valid distribution will do; yours is not one: a distribution has "
                "no negative entries and sums to 1.")
    if (got < -1e-12).any():
        return "your replacement has negative entries: no token is drawn with a negative probability."
    if mass > 0 and torch.allclose(got, miss, atol=1e-9):
        return f"yours sums to {float(got.sum()):.4g} here: a distribution sums to 1."
    chapter = (p - q).clamp(min=0)
    if float(chapter.sum()) > 0 and torch.allclose(got, chapter / chapter.sum(), atol=1e-9):
        return "that is the chapter's residual, for the chapter's rule; this rule keeps drafts with its own a."
    rev = (q * a - p).clamp(min=0)
    if float(rev.sum()) > 0 and torch.allclose(got, rev / rev.sum(), atol=1e-9):
        return "p and q look swapped: the replacement makes up for tokens the kept drafts give less than p."
    if torch.allclose(got, p, atol=1e-9) and mass > 0:
        return ("you returned p: the replacement must make up only for what the kept drafts under-supply, or those "
                "tokens come out too often overall.")
    return ("the kept drafts plus the replacements must give each token x exactly p(x): count what the kept drafts "
            "give, then what is missing.")


def _distribution_pairs(rng: np.random.Generator, V: int) -> list[tuple[str, np.ndarray, np.ndarray]]:
    """(label, p, q) pairs over V tokens covering the edge cases: p == q, one-hot, disjoint supports, zeros."""
    a, b = _random_dist(rng, V), _random_dist(rng, V)
    one = np.eye(V)[rng.integers(V)]
    perm = rng.permutation(V)
    cut = int(rng.integers(1, V))
    left, right = np.zeros(V), np.zeros(V)
    left[perm[:cut]] = _random_dist(rng, cut)
    right[perm[cut:]] = _random_dist(rng, V - cut)
    return [
        ("random p and q", a, b),
        ("p == q", a, a.copy()),
        ("one-hot q", a, one),
        ("one-hot p", one, b),
        ("disjoint supports", left, right),
    ]


def _random_dist(rng: np.random.Generator, V: int) -> np.ndarray:
    """A distribution in multiples of 0.05, so messages stay readable; zeros happen on purpose."""
    counts = rng.multinomial(20, rng.dirichlet(np.ones(V)))
    return counts / 20.0


@graded(2, "check_residual", FORBIDDEN, ALLOWED)
def check_residual(fn: Callable[[torch.Tensor, torch.Tensor, torch.Tensor], object], n_cases: int = 60,
                   seed: int = 0) -> None:
    """Grade replacement(p, q, a) -> the distribution a rejection draws from, on random rules over [V] float64 pairs.

    The reference is (p - q a) normalised. When the rule never rejects (no mass left) any valid distribution is
    accepted, but NaN or a division by zero is not; a rule that no replacement can make lossless must raise ValueError.
    """
    g = "check_residual"
    cases = _rule_cases(np.random.default_rng(seed), n_cases)
    for n, (label, p, q, a) in enumerate(cases, 1):
        where = f"wrong answer on case {n} of {len(cases)} ({label})."
        inputs = [f"p = {fmt(p)}", f"q = {fmt(q)}", f"a = {fmt(a)}"]
        raised, out = _call_rule(g, where, inputs, fn, p, q, a, "your function")
        feasible = _feasible(p, q, a)
        if raised != (not feasible):
            raise _feasibility_failure(g, where, inputs, feasible, out)
        if raised:
            continue
        got = as_vector(out)
        if got is None or got.shape != p.shape:
            shape = None if got is None else tuple(got.shape)
            raise failure(
                g, where, inputs + [f"got {out!r} (shape {shape})"], f"return a tensor of shape {tuple(p.shape)}."
            )
        if isinstance(out, torch.Tensor) and out.dtype != torch.float64:
            raise failure(g, where, inputs + [f"got a {out.dtype} tensor"],
                          "keep the input dtype (float64): exact checks compare to 1e-9.")
        miss = _missing(p, q, a)
        empty = float(miss.sum()) <= ROUNDING
        ok = (
            bool(torch.isfinite(got).all()) and bool((got >= 0).all()) and abs(float(got.sum()) - 1) <= TOL
            if empty
            else torch.allclose(got, miss / miss.sum(), atol=TOL, rtol=0)
        )
        if not ok:
            expect = "any valid distribution, e.g. p" if empty else fmt(miss / miss.sum())
            raise failure(g, where, inputs + [f"expected {expect}", f"got      {fmt(got)}"],
                          _residual_hint(p, q, a, got))
    passed(g, f"{len(cases)} rules, including p == q, one-hot and disjoint supports, lossy ones refused")


# --------------------------------------------------------------------------------------
# Exercise 2.3: the accept/reject step, graded by exact enumeration
# --------------------------------------------------------------------------------------


@dataclass
class _StepCase:
    label: str
    q: torch.Tensor  # [k, V]
    p: torch.Tensor  # [k+1, V]

    @property
    def k(self) -> int:
        return self.q.shape[0]

    @property
    def V(self) -> int:
        return self.p.shape[1]

    def describe(self) -> list[str]:
        return [
            f"q = {fmt(self.q)}  (q[i] = q_{{i+1}}, the draft's distribution at position i+1)",
            f"p = {fmt(self.p)}  (p[i] = p_{{i+1}}, the target's; p[k] is used for the bonus)",
        ]


def _step_cases(n_cases: int, seed: int) -> list[_StepCase]:
    """Worked example, plain decoding (k = 0), then random chains whose positions mix the edge cases."""
    rng = np.random.default_rng(seed)
    t = lambda rows: torch.tensor(np.array(rows), dtype=torch.float64)  # noqa: E731
    cases = [
        _StepCase("worked example, k = 1", t([WORKED_Q]), t([WORKED_P, [0.2, 0.5, 0.3]])),
        _StepCase("k = 0: no drafts, plain decoding", t(np.zeros((0, 3))), t([[0.5, 0.25, 0.25]])),
    ]
    shapes = [(1, 2), (1, 3), (1, 4), (2, 2), (2, 3), (2, 4), (3, 2), (3, 3)]
    while len(cases) < n_cases:
        k, V = shapes[int(rng.integers(len(shapes)))]
        labels, qs, ps = [], [], []
        for i in range(k):
            # Half the positions are generic, so most drafts get accepted with a probability strictly
            # between 0 and 1; the other half are the edge cases.
            label, p_i, q_i = _distribution_pairs(rng, V)[int(rng.choice(5, p=[0.5, 0.125, 0.125, 0.125, 0.125]))]
            labels.append(f"position {i + 1}: {label}")
            qs.append(q_i)
            ps.append(p_i)
        ps.append(_random_dist(rng, V))
        cases.append(_StepCase(f"k = {k}, V = {V}; " + ", ".join(labels), t(qs), t(ps)))
    return cases[:n_cases]


def _reference_step_distribution(
    draft: tuple[int, ...], q: torch.Tensor, p: torch.Tensor
) -> dict[tuple[int, ...], float]:
    """The rule's exact output distribution for one draft sequence: specref's own `verify_chain`,
    enumerated over its uniforms by `specref.checks.exact` (so the grader holds no second copy of the rule)."""
    k = len(draft)
    drafts = torch.tensor([draft], dtype=torch.long).reshape(1, k)  # [1, k]
    tokens, prob = enumerate_step(drafts, q[None], p[None], torch.ones(1, dtype=torch.float64), verify_chain)
    return merge(tokens, prob)


def _draft_sequences(q: torch.Tensor) -> list[tuple[tuple[int, ...], float]]:  # q: [k, V]
    """Every draft sequence x with q(x) > 0 and its probability prod_i q_i(x_i)."""
    seqs: list[tuple[tuple[int, ...], float]] = [((), 1.0)]
    for row in q.tolist():
        seqs = [(s + (x,), w * qx) for s, w in seqs for x, qx in enumerate(row) if qx > 0]
    return seqs


def _as_tokens(out: object, V: int) -> tuple[int, ...]:
    """The learner's emitted tokens as a tuple of ints, or a TypeError/ValueError saying why not."""
    if isinstance(out, torch.Tensor) and out.dim() != 1:
        raise TypeError(f"return a list of int token ids (or a 1-D tensor), got a tensor of shape {tuple(out.shape)}")
    if as_items(out) is None:
        raise TypeError(f"return the emitted tokens as a list of ints, got {type(out).__name__}: {out!r}")
    ids = as_ints(out)
    if ids is None:
        raise TypeError(f"the emitted tokens must be whole-number ids; got {out!r}")
    toks = tuple(ids)
    if any(not 0 <= t < V for t in toks):
        raise ValueError(f"emitted token ids {list(toks)} must lie in [0, {V})")
    return toks


def _step_distribution(
    grader: str, where: str, fn: Callable[..., object], case: _StepCase, draft: tuple[int, ...]
) -> dict[tuple[int, ...], float]:
    """Enumerate the learner's step for one draft; every failure is reported with the input."""
    inputs = [f"draft_tokens = {list(draft)}"] + case.describe()
    d_t = torch.tensor(draft, dtype=torch.long)

    def run(rng: object) -> tuple[int, ...]:
        d_in, q_in, p_in = d_t.clone(), case.q.clone(), case.p.clone()
        out = fn(d_in, q_in, p_in, rng)
        if not (torch.equal(d_in, d_t) and torch.equal(q_in, case.q) and torch.equal(p_in, case.p)):
            raise _InPlace()
        return _as_tokens(out, case.V)

    before = global_rng_state()
    try:
        dist = exact_distribution(run)
    except NotImplementedError:
        raise
    except _InPlace:
        raise failure(
            grader, where, inputs, "your step changed draft_tokens, q or p in place; leave its inputs unchanged."
        ) from None
    except Exception as e:  # noqa: BLE001 - report any error of the learner's code with its input
        hint = None
        if "SymbolicUniform" in str(e):
            hint = _SYMBOLIC_HINT
        if not same_global_rng(before, global_rng_state()):
            hint = (
                "your step used the global random number generator (torch.rand, torch.multinomial, random, "
                "np.random, ...): draw only through rng.uniform() and rng.categorical(probs)."
            )
        raise failure(grader, where, inputs + [f"running your step raised {type(e).__name__}: {e}"], hint) from e
    if not same_global_rng(before, global_rng_state()):
        raise failure(
            grader,
            where,
            inputs,
            "your step used the global random number generator (torch.rand, torch.multinomial, random, "
            "np.random, ...): draw only through rng.uniform() and rng.categorical(probs), "
            "so that it can be graded exactly.",
        )
    return dist


class _InPlace(Exception):
    pass


def _structure_error(seq: tuple[int, ...], draft: tuple[int, ...]) -> str | None:
    """Why an emitted sequence cannot come from a speculative step, or None when it can."""
    k = len(draft)
    if len(seq) == 0:
        return "the step emitted no token: a step always emits at least one (a correction or the bonus)."
    if len(seq) > k + 1:
        return f"the step emitted {len(seq)} tokens; with k = {k} drafts a step emits at most k + 1 = {k + 1}."
    if seq[:-1] != draft[: len(seq) - 1]:
        return (
            f"the step emitted {list(seq)}, but every token before the last must be an accepted draft, in order "
            f"(drafts {list(draft)}): after the first rejection the step emits its replacement and stops."
        )
    return None


def _split(dist: dict[tuple[int, ...], float], k: int, V: int) -> tuple[list[float], list[list[float]]]:
    """A step distribution as its parts: reach[i] = P(at least i+1 tokens); final[j] = P(j+1 tokens, last = y)."""
    final = [[0.0] * V for _ in range(k + 1)]
    for seq, w in dist.items():
        final[len(seq) - 1][seq[-1]] += w
    ends = [sum(f) for f in final]
    reach = [sum(ends[i:]) for i in range(k + 1)]
    return reach, final


def _step_hint(case: _StepCase, draft: tuple[int, ...], got: dict, want: dict, never_full: bool) -> tuple[str, bool]:
    """Locate the first part of the step that differs from the rule: (hint, whether it names the mistake)."""
    k, V, p, q = case.k, case.V, case.p, case.q
    g_reach, g_final = _split(got, k, V)
    w_reach, w_final = _split(want, k, V)
    # A missing bonus turns "all k accepted + bonus" into "the k drafts alone", for every draft.
    all_accepted = sum(w_final[k])
    if (
        never_full
        and k > 0
        and all_accepted > TOL
        and abs(got.get(draft, 0.0) - want.get(draft, 0.0) - all_accepted) <= TOL
    ):
        return (
            f"your step never emits k + 1 = {k + 1} tokens: when all k = {k} drafts are accepted, "
            f"it must also emit a bonus token sampled from p_{k + 1} = p[{k}].",
            True,
        )
    for i, x in enumerate(draft):
        if w_reach[i] <= TOL or g_reach[i] <= TOL:
            break
        a_want = w_reach[i + 1] / w_reach[i]
        a_got = g_reach[i + 1] / g_reach[i]
        if abs(a_got - a_want) > 1e-7:
            px, qx = float(p[i, x]), float(q[i, x])
            base = (
                f"at position {i + 1} your step accepts draft x_{i + 1} = {x} with probability {a_got:.4g}; "
                f"the rule accepts with min(1, p_{i + 1}(x) / q_{i + 1}(x)) = "
                f"min(1, {px:.4g} / {qx:.4g}) = {a_want:.4g}."
            )
            return base, False  # patterns in the accept test are named case-wide by _acceptance_pattern
    for j in range(k + 1):
        if w_reach[j] <= TOL:
            break
        n_w, n_g = sum(w_final[j]), sum(g_final[j])
        if n_w <= TOL or n_g <= TOL:
            continue
        dist_w = [v / n_w for v in w_final[j]]
        dist_g = [v / n_g for v in g_final[j]]
        if _near(dist_w, dist_g):
            continue

        def matches(row: torch.Tensor, dist_g: list[float] = dist_g) -> bool:
            return _near(dist_g, row.tolist())

        if j == k:
            if k == 0:
                return (
                    f"with k = 0 there is nothing to verify: sample the one token from p_1 = p[0] = {fmt(p[0])}.",
                    False,
                )
            base = (
                f"after accepting all k = {k} drafts the last token follows {fmt(dist_g)}; "
                f"the bonus is sampled from p_{k + 1} = p[{k}] = {fmt(p[k])}."
            )
            if matches(p[k - 1]) and not matches(p[k]):
                return (
                    base + f" You sampled p_{k} = p[{k - 1}]: the bonus comes from the row after the last draft.",
                    True,
                )
            return base, False
        res = _ref_residual(p[j], q[j])
        base = (
            f"after rejecting draft {draft[j]} at position {j + 1} the replacement follows {fmt(dist_g)}; "
            f"the rule samples the residual max(0, p_{j + 1} - q_{j + 1}) normalized = {fmt(res)}."
        )
        if matches(p[j]):
            return base + f" You sampled p_{j + 1} itself: that counts the mass min(p, q) twice.", True
        if matches(q[j]):
            return base + " You sampled the draft distribution q: the replacement must come from the residual.", True
        return base, False
    return "compare your step with the rule line by line: accept, residual on the first rejection, stop, bonus.", False


def _near(a: Sequence[float], b: Sequence[float], tol: float = 1e-7) -> bool:
    return max(abs(x - y) for x, y in zip(a, b, strict=True)) <= tol


def _acceptance_pattern(case: _StepCase, got_all: dict, want_all: dict) -> str | None:
    """A mistake in the accept test that holds at every draft and position of a case, named; else None."""
    pairs = []  # (accept prob the rule gives, accept prob the learner's step gives, p(x), q(x))
    for draft, got in got_all.items():
        g_reach, _ = _split(got, case.k, case.V)
        w_reach, _ = _split(want_all[draft], case.k, case.V)
        for i, x in enumerate(draft):
            if w_reach[i] <= TOL or g_reach[i] <= TOL:
                break
            pairs.append(
                (w_reach[i + 1] / w_reach[i], g_reach[i + 1] / g_reach[i], float(case.p[i, x]), float(case.q[i, x]))
            )
    if not any(abs(a - b) > 1e-7 for a, b, _, _ in pairs):
        return None
    if all(abs(b - (1 - a)) < 1e-7 for a, b, _, _ in pairs):
        return "The comparison is inverted: accept when u < min(1, p(x)/q(x)), reject otherwise."
    if all(px > 0 and abs(b - min(1.0, qx / px)) < 1e-7 for _, b, px, qx in pairs):
        return "The ratio is upside down: accept with min(1, p(x)/q(x)), target over draft."
    return None


def _table(got: dict, want: dict, limit: int = 12) -> list[str]:
    rows = sorted(set(got) | set(want), key=lambda s: (len(s), s))
    bad = [s for s in rows if abs(got.get(s, 0.0) - want.get(s, 0.0)) > TOL]
    show = (bad + [s for s in rows if s not in bad])[:limit]
    show.sort(key=lambda s: (len(s), s))
    lines = ["emitted tokens      expected   yours"]
    for s in show:
        mark = "  <-" if s in bad else ""
        lines.append(f"{fmt(list(s)):<18}  {want.get(s, 0.0):8.4f}  {got.get(s, 0.0):8.4f}{mark}")
    if len(rows) > limit:
        lines.append(f"... ({len(rows) - limit} more sequences)")
    return lines


def _lossless_error(
    case: _StepCase, marginal: dict[tuple[int, ...], float]
) -> tuple[int, tuple[int, ...], list[float]] | None:
    """Where the step stops matching the target: (i, prefix, conditional of token i+1) or None.

    With drafts x ~ q, given that the step emitted `prefix` and goes on, token i+1 must
    follow p_{i+1}: this is what makes speculative output distributed as the target's.
    """
    cont: dict[tuple[int, ...], list[float]] = {}
    for seq, w in marginal.items():
        for i in range(len(seq)):
            cont.setdefault(seq[:i], [0.0] * case.V)[seq[i]] += w
    for prefix in sorted(cont, key=lambda s: (len(s), s)):
        row = cont[prefix]
        total = sum(row)
        target = case.p[len(prefix)].tolist()
        if total > TOL and any(abs(r - total * t) > TOL for r, t in zip(row, target, strict=True)):
            return len(prefix), prefix, [r / total for r in row]
    return None


@graded(3, "check_accept_reject_step", FORBIDDEN, ALLOWED)
def check_accept_reject_step(fn: Callable[..., object], n_cases: int = 60, seed: int = 0) -> None:
    """Grade speculative_step(draft_tokens, q, p, rng) -> emitted tokens by exact enumeration.

    For each case every draft sequence x ~ q is enumerated with its probability and
    the learner's step is enumerated over all of its rng draws. Checked in order:
    the emitted sequences are possible at all; the step is exact (first token ~ p_1,
    and every later token ~ p_{i+1} given the accepted prefix); and its output
    distribution for each draft equals the rule's, within 1e-9.
    """
    g = "check_accept_reject_step"
    cases = _step_cases(n_cases, seed)
    for n, case in enumerate(cases, 1):
        where = f"case {n} of {len(cases)} ({case.label})."
        drafts = _draft_sequences(case.q)
        got_all, want_all = {}, {}
        for draft, _ in drafts:
            got = _step_distribution(g, where, fn, case, draft)
            for seq in got:
                err = _structure_error(seq, draft)
                if err:
                    raise failure(g, where, [f"draft_tokens = {list(draft)}"] + case.describe(), err)
            got_all[draft] = got
            want_all[draft] = _reference_step_distribution(draft, case.q, case.p)

        bad = [d for d, _ in drafts if _differs(got_all[d], want_all[d])]
        never_full = all(len(s) <= case.k for d in got_all for s in got_all[d])  # no step emitted k + 1 tokens
        hints = [(d, *_step_hint(case, d, got_all[d], want_all[d], never_full)) for d in bad]
        # Report the first draft whose difference names a known mistake, else the first that differs.
        first_bad, hint, _ = next((h for h in hints if h[2]), hints[0] if hints else (None, None, False))
        if first_bad is not None:
            hint = f"for draft_tokens = {list(first_bad)}: {hint}"
            pattern = _acceptance_pattern(case, got_all, want_all)
            if pattern and pattern not in hint:
                hint += " " + pattern
        marginal: dict[tuple[int, ...], float] = {}
        for draft, w in drafts:
            for seq, pr in got_all[draft].items():
                marginal[seq] = marginal.get(seq, 0.0) + w * pr
        loss = _lossless_error(case, marginal)
        if loss is not None:
            i, prefix, cond = loss
            what = (
                "the first emitted token"
                if i == 0
                else f"token {i + 1}, given that the step emitted {list(prefix)} and went on,"
            )
            raise failure(
                g,
                where + " Your step is not exact.",
                case.describe()
                + [
                    f"with drafts sampled from q, {what} should follow p_{i + 1} = {fmt(case.p[i])}",
                    f"yours follows {fmt(cond)}",
                ],
                hint,
            )
        if first_bad is not None:
            raise failure(
                g,
                where + " Your step's output follows p, but it does not apply the speculative rule.",
                [f"draft_tokens = {list(first_bad)}"]
                + case.describe()
                + _table(got_all[first_bad], want_all[first_bad]),
                hint,
            )
    passed(g, f"{len(cases)} cases enumerated exactly, every draft sequence and every random path")


def _differs(a: dict, b: dict) -> bool:
    return any(abs(a.get(s, 0.0) - b.get(s, 0.0)) > TOL for s in set(a) | set(b))


