"""Graders for the chapter 2 and 3 exercises, standing on the exact enumerator of `specref.symbolic_rng`.

A learner's sampler draws its randomness through a small interface, `rng`:

    rng.uniform()          -> a number u ~ U[0, 1)
    rng.categorical(probs) -> an index i with probability probs[i]

In real use `rng` is a `TorchRNG` wrapping a `torch.Generator`. A grader instead
passes a symbolic rng: `uniform()` returns an unknown u whose comparisons branch,
`categorical` branches over every index, and a depth-first search re-runs the
learner's function once per branch path. Summing path probabilities gives the
sampler's exact output distribution. The step grader compares it, within 1e-9,
with the exact distribution of specref's own `verify_chain` (enumerated over its
uniforms by `specref.exact`): no Monte-Carlo noise, no lucky seeds, and no second
copy of the rule in this module.

What a symbolic u supports is documented in `specref.symbolic_rng`.

Every `check_*` function raises AssertionError with the input, the expected and
the received answer and a hint, or returns None and prints one line on success.
"""

from __future__ import annotations

import math
import random
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import numpy as np
import torch

from .exact import enumerate_step, merge
from .symbolic_rng import _SYMBOLIC_HINT, SymbolicUniform, TorchRNG, _fmt, exact_distribution  # noqa: F401
from .rejection import residual as _ref_residual
from .rejection import verify_chain
from .theory import expected_tokens_per_step as _ref_expected
from .theory import optimal_k as _ref_optimal_k
from .theory import speedup as _ref_speedup

TOL = 1e-9  # exact checks: probabilities computed two ways in float64 agree far better than this
# --------------------------------------------------------------------------------------
# Formatting and shared helpers
# --------------------------------------------------------------------------------------


def _fail(grader: str, where: str, lines: Sequence[str], hint: str | None = None) -> AssertionError:
    msg = [f"{grader}: {where}"] + [f"  {line}" for line in lines]
    if hint:
        msg.append(f"Hint: {hint}")
    return AssertionError("\n".join(msg))


def _call(
    grader: str, where: str, inputs: Sequence[str], fn: Callable[..., object], *args: object, hint: str | None = None
) -> object:
    """Call the learner's function; an exception becomes a failure that shows the input."""
    try:
        return fn(*args)
    except NotImplementedError:
        raise
    except Exception as e:  # noqa: BLE001 - any error of the learner's code is reported with its input
        raise _fail(grader, where, list(inputs) + [f"your function raised {type(e).__name__}: {e}"], hint) from e


def _global_rng_state() -> tuple[object, ...]:
    return (torch.random.get_rng_state(), np.random.get_state()[1].copy(), random.getstate())


def _same_global_rng(a: tuple[object, ...], b: tuple[object, ...]) -> bool:
    return torch.equal(a[0], b[0]) and np.array_equal(a[1], b[1]) and a[2] == b[2]


def _as_float(x: object) -> float | None:
    """A learner's scalar answer as a float, or None when it is not a single number."""
    if isinstance(x, torch.Tensor):
        return float(x.detach().reshape(())) if x.numel() == 1 else None
    if isinstance(x, (bool, np.bool_)):
        return None
    if isinstance(x, (int, float, np.integer, np.floating)) or (isinstance(x, np.ndarray) and x.size == 1):
        return float(x)
    return None


def _as_vector(x: object) -> torch.Tensor | None:
    """A learner's vector answer as a float64 tensor, or None when it cannot be read as one."""
    try:
        if isinstance(x, torch.Tensor):
            return x.detach().to("cpu", torch.float64)
        return torch.as_tensor(np.asarray(x, dtype=np.float64))
    except (TypeError, ValueError, RuntimeError):
        return None


def _close(a: float, b: float, rel: float = 1e-9, abs_: float = 1e-12) -> bool:
    return math.isclose(a, b, rel_tol=rel, abs_tol=abs_)


def _passed(grader: str, what: str) -> None:
    print(f"{grader}: passed ({what}).")


# --------------------------------------------------------------------------------------
# Exercise 2.1: beta and the residual of the worked case
# --------------------------------------------------------------------------------------

WORKED_P = (0.6, 0.3, 0.1)
WORKED_Q = (0.3, 0.6, 0.1)


def check_worked_example(beta: object, residual: object, emit: object) -> None:
    """Grade beta, the residual and P(emit x) for p = (0.6, 0.3, 0.1), q = (0.3, 0.6, 0.1)."""
    g = "check_worked_example"
    p = torch.tensor(WORKED_P, dtype=torch.float64)
    q = torch.tensor(WORKED_Q, dtype=torch.float64)
    want_beta = float(torch.minimum(p, q).sum())
    want_res = _ref_residual(p, q)
    inputs = [f"p = {_fmt(p)}", f"q = {_fmt(q)}"]

    b = _as_float(beta)
    if b is None:
        raise _fail(g, "beta must be a single number.", inputs + [f"got beta = {beta!r}"])
    if not _close(b, want_beta, rel=1e-6):
        hint = "beta = sum over tokens of min(p(x), q(x)): the chance that a draft x ~ q is accepted."
        if _close(b, float((p - q).abs().sum()) / 2, rel=1e-6):
            hint = "that is TV(p, q); beta = 1 - TV(p, q) = sum_x min(p(x), q(x))."
        elif _close(b, float(torch.maximum(p, q).sum()), rel=1e-6):
            hint = "use min, not max: beta = sum_x min(p(x), q(x))."
        raise _fail(
            g, "beta is wrong.", inputs + [f"expected beta = {want_beta:.4g}", f"got      beta = {b:.4g}"], hint
        )

    r = _as_vector(residual)
    if r is None or r.shape != (3,):
        shape = None if r is None else tuple(r.shape)
        raise _fail(
            g, "the residual must be a vector of 3 probabilities.", inputs + [f"got {residual!r} (shape {shape})"]
        )
    if not torch.allclose(r, want_res, atol=1e-6, rtol=0):
        hint = _residual_hint(p, q, r)
        raise _fail(
            g,
            "the residual is wrong.",
            inputs + [f"expected residual = {_fmt(want_res)}", f"got      residual = {_fmt(r)}"],
            hint,
        )

    e = _as_vector(emit)
    if e is None or e.shape != (3,):
        shape = None if e is None else tuple(e.shape)
        raise _fail(g, "emit must be a vector of 3 probabilities.", inputs + [f"got {emit!r} (shape {shape})"])
    kept = torch.minimum(p, q)
    if not torch.allclose(e, p, atol=1e-6, rtol=0):
        hint = (
            "P(emit x) = min(p(x), q(x)) (drafted and accepted) + (1 - beta) * residual(x) (rejected, then replaced)."
        )
        if torch.allclose(e, kept, atol=1e-6):
            hint = (
                "that is only the accepted mass min(p, q); add the replacements after a rejection, "
                "(1 - beta) * residual."
            )
        elif torch.allclose(e, kept + want_res, atol=1e-6):
            hint = "weight the residual by the probability of a rejection, 1 - beta: it is sampled only after one."
        raise _fail(
            g,
            "emit is wrong.",
            inputs + [f"expected emit = {_fmt(p)} (= p: the rule is exact)", f"got      emit = {_fmt(e)}"],
            hint,
        )
    _passed(
        g,
        f"beta = {want_beta:.2g}, residual = {_fmt(want_res)}, "
        f"P(emit a) = {kept[0]:.1f} + {(1 - want_beta) * want_res[0]:.1f} = {p[0]:.1f}",
    )


# --------------------------------------------------------------------------------------
# Exercise 2.2: the residual distribution
# --------------------------------------------------------------------------------------


def _residual_hint(p: torch.Tensor, q: torch.Tensor, got: torch.Tensor) -> str:
    """Name the usual mistake behind a wrong residual."""
    diff = (p - q).clamp(min=0)
    mass = float(diff.sum())
    if not torch.isfinite(got).all():
        if mass == 0:
            return (
                "p == q here, so max(0, p - q) has zero mass and normalizing divides by 0. A rejection "
                "then has probability 0 and the residual is never sampled: return any valid distribution "
                "(returning p is the convention) instead of dividing by zero."
            )
        return "your result has NaN/inf: normalize max(0, p - q) (clamp first), and never divide by a zero mass."
    if (got < -1e-12).any():
        return "your residual has negative entries: clamp with max(0, p - q) before normalizing."
    if mass > 0 and torch.allclose(got, diff, atol=1e-9):
        return f"max(0, p - q) sums to {mass:.4g} here: divide it by its sum so the residual sums to 1."
    rev = (q - p).clamp(min=0)
    if float(rev.sum()) > 0 and torch.allclose(got, rev / rev.sum(), atol=1e-9):
        return "p and q are swapped: the residual keeps the tokens where the target p exceeds the draft q."
    if torch.allclose(got, p, atol=1e-9) and mass > 0:
        return "you returned p: after a rejection, sample only where p exceeds q, i.e. max(0, p - q) normalized."
    return "residual(x) = max(0, p(x) - q(x)) / sum_y max(0, p(y) - q(y))."


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


def check_residual(fn: Callable[[torch.Tensor, torch.Tensor], object], n_cases: int = 60, seed: int = 0) -> None:
    """Grade residual(p, q) -> max(0, p - q) normalized, on random [V] float64 cases.

    When p == q the residual has no mass; any valid distribution is accepted there,
    but NaN or a division by zero is not.
    """
    g = "check_residual"
    rng = np.random.default_rng(seed)
    cases: list[tuple[str, np.ndarray, np.ndarray]] = [("worked example", np.array(WORKED_P), np.array(WORKED_Q))]
    while len(cases) < n_cases:
        cases += _distribution_pairs(rng, int(rng.integers(2, 7)))
    cases = cases[:n_cases]
    for n, (label, p_np, q_np) in enumerate(cases, 1):
        p, q = torch.tensor(p_np), torch.tensor(q_np)
        where = f"wrong answer on case {n} of {len(cases)} ({label})."
        inputs = [f"p = {_fmt(p)}", f"q = {_fmt(q)}"]
        p_in, q_in = p.clone(), q.clone()
        out = _call(g, where, inputs, fn, p_in, q_in)
        if not (torch.equal(p_in, p) and torch.equal(q_in, q)):
            raise _fail(g, where, inputs, "your function changed p or q in place; compute on new tensors instead.")
        got = _as_vector(out)
        if got is None or got.shape != p.shape:
            shape = None if got is None else tuple(got.shape)
            raise _fail(
                g, where, inputs + [f"got {out!r} (shape {shape})"], f"return a tensor of shape {tuple(p.shape)}."
            )
        want = _ref_residual(p, q)
        if isinstance(out, torch.Tensor) and out.dtype != torch.float64:
            raise _fail(
                g,
                where,
                inputs + [f"got a {out.dtype} tensor"],
                "keep the input dtype (float64): exact checks compare to 1e-9.",
            )
        empty = float((p - q).clamp(min=0).sum()) == 0
        ok = (
            bool(torch.isfinite(got).all()) and bool((got >= 0).all()) and abs(float(got.sum()) - 1) <= TOL
            if empty
            else torch.allclose(got, want, atol=TOL, rtol=0)
        )
        if not ok:
            expect = "any valid distribution, e.g. p" if empty else _fmt(want)
            raise _fail(g, where, inputs + [f"expected {expect}", f"got      {_fmt(got)}"], _residual_hint(p, q, got))
    _passed(g, f"{len(cases)} cases, including p == q, one-hot and disjoint supports")


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
            f"q = {_fmt(self.q)}  (q[i] = q_{{i+1}}, the draft's distribution at position i+1)",
            f"p = {_fmt(self.p)}  (p[i] = p_{{i+1}}, the target's; p[k] is used for the bonus)",
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
    enumerated over its uniforms by `specref.exact` (so the grader holds no second copy of the rule)."""
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
    if isinstance(out, torch.Tensor):
        if out.is_floating_point() or out.dtype == torch.bool or out.dim() != 1:
            raise TypeError(
                f"return a list of int token ids (or a 1-D integer tensor), "
                f"got a {out.dtype} tensor of shape {tuple(out.shape)}"
            )
        toks = tuple(int(t) for t in out.tolist())
    elif isinstance(out, (list, tuple)):
        items = []
        for t in out:
            if isinstance(t, torch.Tensor) and t.numel() == 1 and not t.is_floating_point() and t.dtype != torch.bool:
                items.append(int(t))
            elif isinstance(t, (int, np.integer)) and not isinstance(t, (bool, np.bool_)):
                items.append(int(t))
            else:
                raise TypeError(f"the emitted tokens must be int ids; got {t!r} in {out!r}")
        toks = tuple(items)
    else:
        raise TypeError(f"return the emitted tokens as a list of ints, got {type(out).__name__}: {out!r}")
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

    before = _global_rng_state()
    try:
        dist = exact_distribution(run)
    except NotImplementedError:
        raise
    except _InPlace:
        raise _fail(
            grader, where, inputs, "your step changed draft_tokens, q or p in place; leave its inputs unchanged."
        ) from None
    except Exception as e:  # noqa: BLE001 - report any error of the learner's code with its input
        hint = None
        if "SymbolicUniform" in str(e):
            hint = _SYMBOLIC_HINT
        if not _same_global_rng(before, _global_rng_state()):
            hint = (
                "your step used the global random number generator (torch.rand, torch.multinomial, random, "
                "np.random, ...): draw only through rng.uniform() and rng.categorical(probs)."
            )
        raise _fail(grader, where, inputs + [f"running your step raised {type(e).__name__}: {e}"], hint) from e
    if not _same_global_rng(before, _global_rng_state()):
        raise _fail(
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
                    f"with k = 0 there is nothing to verify: sample the one token from p_1 = p[0] = {_fmt(p[0])}.",
                    False,
                )
            base = (
                f"after accepting all k = {k} drafts the last token follows {_fmt(dist_g)}; "
                f"the bonus is sampled from p_{k + 1} = p[{k}] = {_fmt(p[k])}."
            )
            if matches(p[k - 1]) and not matches(p[k]):
                return (
                    base + f" You sampled p_{k} = p[{k - 1}]: the bonus comes from the row after the last draft.",
                    True,
                )
            return base, False
        res = _ref_residual(p[j], q[j])
        base = (
            f"after rejecting draft {draft[j]} at position {j + 1} the replacement follows {_fmt(dist_g)}; "
            f"the rule samples the residual max(0, p_{j + 1} - q_{j + 1}) normalized = {_fmt(res)}."
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
        lines.append(f"{_fmt(list(s)):<18}  {want.get(s, 0.0):8.4f}  {got.get(s, 0.0):8.4f}{mark}")
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
                    raise _fail(g, where, [f"draft_tokens = {list(draft)}"] + case.describe(), err)
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
            raise _fail(
                g,
                where + " Your step is not exact.",
                case.describe()
                + [
                    f"with drafts sampled from q, {what} should follow p_{i + 1} = {_fmt(case.p[i])}",
                    f"yours follows {_fmt(cond)}",
                ],
                hint,
            )
        if first_bad is not None:
            raise _fail(
                g,
                where + " Your step's output follows p, but it does not apply the speculative rule.",
                [f"draft_tokens = {list(first_bad)}"]
                + case.describe()
                + _table(got_all[first_bad], want_all[first_bad]),
                hint,
            )
    _passed(g, f"{len(cases)} cases enumerated exactly, every draft sequence and every random path")


def _differs(a: dict, b: dict) -> bool:
    return any(abs(a.get(s, 0.0) - b.get(s, 0.0)) > TOL for s in set(a) | set(b))


# --------------------------------------------------------------------------------------
# Exercise 3: tokens per step and speedup (Leviathan et al. 2022)
# --------------------------------------------------------------------------------------


def check_expected_tokens_value(value: object, alpha: float = 0.6, k: int = 3) -> None:
    """Grade a hand-computed E[tokens per step] for alpha = 0.6, k = 3 (to 2 decimals)."""
    g = "check_expected_tokens_value"
    want = float(_ref_expected(alpha, k))
    v = _as_float(value)
    inputs = [f"alpha = {alpha}, k = {k}"]
    if v is None:
        raise _fail(g, "give a single number.", inputs + [f"got {value!r}"])
    if abs(v - want) > 0.005:
        hint = _expected_hint(alpha, k, v)
        raise _fail(g, "wrong value.", inputs + [f"expected {want:.2f}", f"got      {v:.4g}"], hint)
    _passed(g, f"E = {want:.2f} tokens per step")


def _expected_hint(alpha: float, k: int, got: float, tol: float = 0.005) -> str:
    def near(x: float) -> bool:
        return math.isfinite(got) and abs(got - x) <= tol * max(1.0, abs(x))

    geometric = lambda n: float(sum(alpha**i for i in range(n)))  # noqa: E731 - sum of the first n powers
    if alpha == 1 and not math.isfinite(got):
        return _ALPHA_ONE_HINT
    if k > 0 and near(geometric(k)):
        return (
            "that is (1 - alpha^k) / (1 - alpha): one term short. Tokens per step = 1 + A with "
            "P(A >= i) = alpha^i for i = 1..k, so E = sum_{i=0..k} alpha^i = (1 - alpha^(k+1)) / (1 - alpha)."
        )
    if near(geometric(k + 2)):
        return "that is one term too many (k off by one): E = sum_{i=0..k} alpha^i, k + 1 terms."
    if near(geometric(k + 1) - 1):
        return "that counts only accepted drafts; every step also emits one more token (a correction or the bonus)."
    if near(alpha * k + 1) or near(alpha * k):
        return (
            "alpha k + 1 would count every draft as accepted with probability alpha on its own; but a rejection "
            "ends the step, so draft i counts only if drafts 1..i all are accepted: P(A >= i) = alpha^i."
        )
    return "E[tokens per step] = sum_{i=0..k} alpha^i = (1 - alpha^(k+1)) / (1 - alpha)."


_ALPHA_ONE_HINT = (
    "at alpha = 1 every draft is accepted and a step emits k + 1 tokens; (1 - alpha^(k+1)) / (1 - alpha) "
    "is 0/0 there, so handle alpha == 1 separately (the limit is k + 1)."
)


def _theory_cases(n_cases: int, seed: int) -> list[tuple[float, int]]:
    rng = np.random.default_rng(seed)
    fixed = [(0.6, 3), (0.8, 4), (0.0, 3), (0.5, 0), (0.999, 5), (1.0, 4), (0.3, 1)]
    rand = [
        (round(float(rng.uniform(0, 0.995)), 3), int(rng.integers(0, 11))) for _ in range(max(0, n_cases - len(fixed)))
    ]
    return (fixed + rand)[:n_cases]


def check_expected_tokens(fn: Callable[[float, int], object], n_cases: int = 60, seed: int = 0) -> None:
    """Grade expected_tokens_per_step(alpha, k) against specref.theory on random (alpha, k), alpha = 1 included."""
    g = "check_expected_tokens"
    cases = _theory_cases(n_cases, seed)
    for n, (alpha, k) in enumerate(cases, 1):
        where = f"wrong answer on case {n} of {len(cases)}."
        inputs = [f"alpha = {alpha}, k = {k}"]
        out = _call(g, where, inputs, fn, alpha, k, hint=_ALPHA_ONE_HINT if alpha == 1 else None)
        v = _as_float(out)
        want = float(_ref_expected(alpha, k))
        if v is None:
            raise _fail(g, where, inputs + [f"got {out!r}"], "return a single number.")
        if not (math.isfinite(v) and _close(v, want, rel=1e-8)):
            raise _fail(
                g, where, inputs + [f"expected {want:.6g}", f"got      {v:.6g}"], _expected_hint(alpha, k, v, tol=1e-8)
            )
    _passed(g, f"{len(cases)} cases, alpha = 0 and alpha = 1 included")


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
        out = _call(g, where, inputs, fn, alpha, k)
        v = _as_vector(out)
        if v is None or v.dim() != 1 or v.shape[0] != k + 1:
            shape = None if v is None else tuple(v.shape)
            raise _fail(
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
                f"got pmf {_fmt(v)}",
                f"P(A >= i), i = 0..k: expected {_fmt(want_tail)}, got {_fmt(tail)}",
            ]
            raise _fail(g, where, lines, hint)
    _passed(g, f"{n_cases} cases: sums to 1, P(A >= i) = alpha^i")


def check_speedup(fn: Callable[[float, int, float], object], n_cases: int = 60, seed: int = 0) -> None:
    """Grade speedup(alpha, k, c) = E[tokens per step] / (1 + c k) against specref.theory."""
    g = "check_speedup"
    rng = np.random.default_rng(seed + 1)
    cs = [0.05, 0.05, 0.2, 0.0, 0.1, 0.5, 1.0] + [round(float(rng.uniform(0, 0.5)), 3) for _ in range(n_cases)]
    for n, ((alpha, k), c) in enumerate(zip(_theory_cases(n_cases, seed), cs[:n_cases], strict=True), 1):
        where = f"wrong answer on case {n} of {n_cases}."
        inputs = [f"alpha = {alpha}, k = {k}, c = {c}"]
        out = _call(g, where, inputs, fn, alpha, k, c, hint=_ALPHA_ONE_HINT if alpha == 1 else None)
        v = _as_float(out)
        want = float(_ref_speedup(alpha, k, c))
        if v is None:
            raise _fail(g, where, inputs + [f"got {out!r}"], "return a single number.")
        if not (math.isfinite(v) and _close(v, want, rel=1e-8)):
            e = float(_ref_expected(alpha, k))
            hint = "S = E[tokens per step] / (1 + c k): one target pass (cost 1) plus k draft steps (cost c each)."
            if math.isfinite(v) and _close(
                v * (1 + c * k), float(_ref_expected(alpha, k - 1)) if k > 0 else -1, rel=1e-8
            ):
                hint = (
                    "your numerator is (1 - alpha^k) / (1 - alpha); E[tokens per step] has k + 1 terms: "
                    "(1 - alpha^(k+1)) / (1 - alpha)."
                )
            elif math.isfinite(v) and k > 0 and c > 0 and _close(v, e / (c * k), rel=1e-8):
                hint = "the cost of a step is 1 + c k: the target pass costs 1 on top of the k draft steps."
            elif math.isfinite(v) and _close(v, e / (1 + c * (k + 1)), rel=1e-8):
                hint = "the draft runs k steps per speculative step, not k + 1: the cost is 1 + c k."
            raise _fail(g, where, inputs + [f"expected {want:.6g}", f"got      {v:.6g}"], hint)
    _passed(g, f"{n_cases} cases")


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
        out = _call(g, where, inputs, fn, alpha, c, k_max)
        if isinstance(out, torch.Tensor) and out.numel() == 1:
            out = out.item()
        if (
            isinstance(out, (bool, np.bool_))
            or not isinstance(out, (int, np.integer))
            and not (isinstance(out, (float, np.floating)) and float(out).is_integer())
        ):
            raise _fail(g, where, inputs + [f"got {out!r}"], "return the best k as an int.")
        kk = int(out)
        ks = np.arange(k_max + 1)
        s = np.asarray(_ref_speedup(alpha, ks, c))
        best = int(_ref_optimal_k(alpha, c, k_max))
        if not 0 <= kk <= k_max or s[kk] < s[best] * (1 - 1e-12):
            table = ", ".join(f"k={i}: {s[i]:.3f}" for i in range(k_max + 1))
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
            raise _fail(
                g,
                where,
                inputs
                + [f"expected k = {best} (speedup {s[best]:.4f})", f"got      k = {out!r}", f"speedups: {table}"],
                hint,
            )
    _passed(g, f"{len(cases)} cases, k = 0 allowed")
