"""Graders for the chapter 6 exercises: the tree mask and position ids, the multi-candidate rule, and how often
a node accepts one of its children.

The rule is graded by exact enumeration (`specref.checks.rng.exact_distribution`)
against `specref.trees.verify_tree`, on one level of a tree with sampled or top-k children; the acceptance
probability against the same enumeration on small nodes and against its closed form on large ones.
False-fail rate: 0 (no check draws a sample).
"""

from __future__ import annotations

import math
from collections.abc import Callable

import numpy as np
import torch

from specref.checks.exact_trees import random_parents
from specref.checks.rng import exact_distribution
from specref.trees import ROOT, Tree, tree_attention_mask, tree_position_ids, verify_tree

from .report import as_float, as_int, as_items, call_learner, failure, fmt, passed
from .rules import graded

# The reference rule: the tasks write what specref.trees does; specref.residual stays allowed (the setup imports it).
FORBIDDEN = ("specref.trees", "specref.chain_verify", "specref_grading")
ALLOWED = ("specref_grading.checks.trees.check_tree_mask", "specref_grading.checks.trees.check_multi_candidate",
           "specref_grading.checks.trees.check_node_acceptance")


# --------------------------------------------------------------------------------------
# Exercise 6.1: the tree attention mask and position ids
# --------------------------------------------------------------------------------------


def _as_bool_matrix(x: object, N: int) -> torch.Tensor | None:
    try:
        t = x.detach().cpu() if isinstance(x, torch.Tensor) else torch.as_tensor(np.asarray(x))
    except (TypeError, ValueError, RuntimeError):
        return None
    if tuple(t.shape) != (N, N):
        return None
    if t.dtype != torch.bool:
        if t.is_floating_point() and not bool(((t == 0) | (t == 1)).all()):
            return None
        t = t != 0
    return t


def _as_int_vector(x: object, N: int) -> torch.Tensor | None:
    try:
        t = x.detach().cpu() if isinstance(x, torch.Tensor) else torch.as_tensor(np.asarray(x))
    except (TypeError, ValueError, RuntimeError):
        return None
    if tuple(t.shape) != (N,) or t.dtype == torch.bool:
        return None
    if t.is_floating_point():
        if not bool((t == t.round()).all()):
            return None
        t = t.round()
    return t.long()


def _mask_hint(parents: list[int], got: torch.Tensor, want: torch.Tensor) -> str:
    N = len(parents)
    if torch.equal(got, want.T):
        return "your mask is transposed: row i is the query node i, column j the node it may attend to."
    causal = torch.ones((N, N), dtype=torch.bool).tril()
    if torch.equal(got, causal):
        return ("that is the causal (chain) mask: it lets a node see tokens that are not on its own branch, which a "
                "plain pass over the context and that branch never contains.")
    if not bool(got.diagonal().all()):
        return "every node must see itself (the diagonal is True)."
    parent_only = torch.eye(N, dtype=torch.bool)
    for i, par in enumerate(parents):
        if par >= 0:
            parent_only[i, par] = True
    if torch.equal(got, parent_only):
        return "a plain pass over the node's branch sees more than the node and its parent: which tokens does it hold?"
    return ("for each node, list the tokens a plain causal pass over the context and the node's own branch contains; "
            "the node may see exactly those.")


@graded(1, "check_tree_mask", FORBIDDEN, ALLOWED)
def check_tree_mask(fn: Callable[[list[int], int], object], n_cases: int = 40, seed: int = 0) -> None:
    """Grade fn(parents, start) -> (mask [N, N] bool, positions [N]) on random breadth-first trees.

    mask[i, j]: node i may attend to node j (itself or an ancestor); positions[i] =
    start + depth of node i, start being the position of the root (the last context token).
    """
    g = "check_tree_mask"
    rng = np.random.default_rng(seed)
    cases = [([-1, -1, 0, 0, 1, 1], 9), ([-1, 0, 1, 2], 3), ([-1], 0), ([-1, -1, -1], 5)]
    while len(cases) < n_cases:
        cases.append((random_parents(rng, int(rng.integers(1, 13))), int(rng.integers(0, 50))))
    for n, (parents, start) in enumerate(cases[:n_cases], 1):
        N = len(parents)
        tree = Tree(parents, list(range(N)))
        want_mask = tree_attention_mask(tree)
        want_pos = tree_position_ids(tree, start)
        where = f"wrong answer on case {n} of {n_cases}."
        inputs = [f"parents = {parents}", f"start = {start}"]
        arg = list(parents)
        out = call_learner(g, where, inputs, fn, arg, start)
        if arg != parents:
            raise failure(g, where, inputs, "your function changed `parents` in place; build new objects instead.")
        pair = as_items(out, 2)
        if pair is None:
            raise failure(g, where, inputs + [f"got {out!r}"], "return a pair (mask, positions).")
        out = tuple(pair)
        mask = _as_bool_matrix(out[0], N)
        if mask is None:
            raise failure(g, where, inputs + [f"got mask {out[0]!r}"], f"the mask must be an [{N}, {N}] matrix of booleans.")
        if not torch.equal(mask, want_mask):
            raise failure(
                g, where,
                inputs + ["expected mask:", *[f"  {r}" for r in want_mask.int().tolist()],
                          "got mask:", *[f"  {r}" for r in mask.int().tolist()]],
                _mask_hint(parents, mask, want_mask),
            )
        pos = _as_int_vector(out[1], N)
        if pos is None:
            raise failure(g, where, inputs + [f"got positions {out[1]!r}"], f"positions must be {N} integers.")
        if not torch.equal(pos, want_pos):
            hint = "a node's position is the one it would have in the plain sequence of the context and its branch."
            if torch.equal(pos, start + torch.arange(N)) or torch.equal(pos, start + 1 + torch.arange(N)):
                hint = "those are chain positions (one per flattened index); " + hint
            elif torch.equal(pos, want_pos - 1):
                hint = "off by one: the root sits at `start`, and a node comes after the root on its branch."
            raise failure(g, where, inputs + [f"expected positions {want_pos.tolist()}", f"got      positions {pos.tolist()}"], hint)
    passed(g, f"{n_cases} random trees, masks and positions")


# --------------------------------------------------------------------------------------
# Exercise 6.2: the multi-candidate rule at one node, graded by exact enumeration
# --------------------------------------------------------------------------------------


def _one_level_cases(n_cases: int, seed: int) -> list[tuple[str, torch.Tensor, torch.Tensor, int, bool]]:
    """(label, p, q, number of children, deterministic) with the edge cases: p == q, zeros, many children."""
    rng = np.random.default_rng(seed)

    def t(x) -> torch.Tensor:
        return torch.tensor(np.asarray(x, dtype=np.float64))

    cases = [
        ("worked example, 2 sampled children", t([0.6, 0.3, 0.1]), t([0.3, 0.6, 0.1]), 2, False),
        ("worked example, top-2 children", t([0.6, 0.3, 0.1]), t([0.3, 0.6, 0.1]), 2, True),
        ("p == q, 3 sampled children", t([0.5, 0.25, 0.25]), t([0.5, 0.25, 0.25]), 3, False),
    ]
    while len(cases) < n_cases:
        V = int(rng.integers(2, 5))
        m = int(rng.integers(1, 4))
        det = bool(rng.integers(2))
        m = min(m, V) if det else m
        p = rng.dirichlet(np.ones(V))
        q = rng.dirichlet(np.ones(V))
        kind = int(rng.integers(4))
        label = "random p and q"
        if kind == 1:
            q = p.copy()
            label = "p == q"
        elif kind == 2:
            p[int(rng.integers(V))] = 0
            p = p / p.sum()
            label = "p has a zero"
        cases.append((f"{label}, V = {V}, {m} {'top-' + str(m) if det else 'sampled'} children", t(p), t(q), m, det))
    return cases[:n_cases]


def _children_draws(q: torch.Tensor, m: int, deterministic: bool) -> list[tuple[tuple[int, ...], float]]:
    if deterministic:
        return [(tuple(torch.topk(q, m).indices.tolist()), 1.0)]
    seqs: list[tuple[tuple[int, ...], float]] = [((), 1.0)]
    for _ in range(m):
        seqs = [(s + (x,), w * float(q[x])) for s, w in seqs for x in range(q.shape[0]) if q[x] > 0]
    return seqs


def _reference_one_level(p: torch.Tensor, q: torch.Tensor, children: tuple[int, ...], deterministic: bool) -> dict:
    tree = Tree([ROOT] * len(children), list(children), q.expand(len(children), -1) if len(children) else None,
                "deterministic" if deterministic else "sampled")
    p_rows = torch.cat([p[None], p.expand(len(children), -1)])
    def outcome(rng: object) -> tuple[int | None, int]:
        r = verify_tree(tree, p_rows, rng=rng)
        return (r.path[0] if r.path else None, r.tokens[0])

    return exact_distribution(outcome)


@graded(2, "check_multi_candidate", FORBIDDEN, ALLOWED)
def check_multi_candidate(fn: Callable[..., object], n_cases: int = 40, seed: int = 0) -> None:
    """Grade fn(p, children, q, deterministic, rng) -> (accepted child index or None, token).

    Graded by exact enumeration over the children's draws and every uniform: the
    distribution of (accepted child, token) must equal the rule's, so the token
    is distributed as p and each child is accepted exactly as often as it should be.
    """
    g = "check_multi_candidate"
    for n, (label, p, q, m, det) in enumerate(_one_level_cases(n_cases, seed), 1):
        where = f"wrong answer on case {n} of {n_cases} ({label})."
        inputs = [f"p = {fmt(p)}", f"q = {fmt(q)}", f"deterministic = {det}"]
        got_marginal = torch.zeros_like(p)
        for children, w in _children_draws(q, m, det):
            case_inputs = inputs + [f"children = {list(children)}"]
            want = _reference_one_level(p, q, children, det)

            def run(rng: object, children: tuple[int, ...] = children, p: torch.Tensor = p, q: torch.Tensor = q,
                    det: bool = det) -> tuple[object, int]:
                p_in, q_in = p.clone(), q.clone()
                out = fn(p_in, list(children), q_in, det, rng)
                if not (torch.equal(p_in, p) and torch.equal(q_in, q)):
                    raise _InPlace
                pair = as_items(out, 2)
                idx, tok = (None, None) if pair is None else (pair[0] if pair[0] is None else as_int(pair[0]),
                                                              as_int(pair[1]))
                if pair is None or tok is None or (idx is None and pair[0] is not None):
                    raise TypeError(f"return a pair (accepted child index or None, token), got {out!r}")
                return (idx, tok)

            try:
                got = call_learner(g, where, case_inputs, exact_distribution, run)
            except AssertionError as e:
                if isinstance(e.__cause__, _InPlace):
                    raise failure(g, where, case_inputs, "your function changed p or q in place; use new tensors.") from None
                raise
            for (idx, tok), prob in got.items():
                if idx is not None and not (0 <= idx < m and children[idx] == tok):
                    raise failure(g, where, case_inputs + [f"returned child {idx} with token {tok}"],
                                "when a child is accepted, return its index in `children` and its token.")
                got_marginal[tok] += w * prob
            keys = sorted(set(want) | set(got), key=lambda k: (k[0] is None, k[0] or 0, k[1]))
            bad = [k for k in keys if abs(want.get(k, 0.0) - got.get(k, 0.0)) > 1e-9]
            if bad:
                rows = [f"  (child, token) = {k}: expected {want.get(k, 0.0):.4g}, got {got.get(k, 0.0):.4g}" for k in keys]
                raise failure(g, where, case_inputs + ["P(outcome):"] + rows,
                              _multi_hint(p, q, children, det, got, want))
        if not torch.allclose(got_marginal, p, atol=1e-9, rtol=0):  # pragma: no cover - implied by the check above
            raise failure(g, where, inputs + [f"P(token) = {fmt(got_marginal)}"], "the emitted token must follow p.")
    passed(g, f"{n_cases} cases, sampled and top-k children, exact enumeration")


class _InPlace(Exception):
    pass


def _multi_hint(p, q, children, det, got, want) -> str:
    first_acc_want = sum(v for k, v in want.items() if k[0] == 0)
    first_acc_got = sum(v for k, v in got.items() if k[0] == 0)
    x = children[0]
    if det and abs(first_acc_got - min(1.0, float(p[x] / q[x]))) < 1e-9 and abs(first_acc_want - first_acc_got) > 1e-9:
        return ("a top-k child was not drawn from q, so min(1, p/q) with the draft's q is wrong here: treat a "
                "deterministic child as drawn from onehot(x) (accept with probability p(x), then remove x from p).")
    if abs(first_acc_want - first_acc_got) > 1e-9:
        return "the first child is accepted with probability min(1, p(x)/q_1(x)) (q_1 = q if sampled, onehot(x) if deterministic)."
    return ("after a rejection, replace p by residual(p, q_i) = max(0, p - q_i) normalized before trying the next "
            "child; if all are rejected, sample the token from what is left of p.")




# --------------------------------------------------------------------------------------
# Exercise 6.3: how often a node accepts one of its children, in closed form
# --------------------------------------------------------------------------------------


def _acceptance_by_enumeration(p: torch.Tensor, q: torch.Tensor, m: int, deterministic: bool) -> float:
    """P(some child is accepted) under `verify_tree`, enumerated over the children's draws and every uniform."""
    total = 0.0
    for children, w in _children_draws(q, m, deterministic):
        dist = _reference_one_level(p, q, children, deterministic)
        total += w * sum(prob for (idx, _), prob in dist.items() if idx is not None)
    return total


def _acceptance_closed_form(p: torch.Tensor, q: torch.Tensor, m: int, deterministic: bool) -> float:
    """The same probability without enumerating: top-m children accept with the target's mass on them; m children
    drawn from q are each a fresh draw against the residual left by the rejections before them (which does not
    depend on the rejected tokens), so each is accepted with beta_i = sum min(p_i, q) and P = 1 - prod(1 - beta_i).
    tests/test_trees.py holds it against `_acceptance_by_enumeration`."""
    if deterministic:
        return float(p[torch.topk(q, m).indices].sum())
    reject, cur = 1.0, p
    for _ in range(m):
        beta = float(torch.minimum(cur, q).sum())
        reject *= 1.0 - beta
        diff = (cur - q).clamp(min=0)
        cur = diff / diff.sum() if float(diff.sum()) > 0 else cur
    return 1.0 - reject


def _acceptance_cases(n_cases: int, seed: int) -> list[tuple[str, torch.Tensor, torch.Tensor, int, bool, bool]]:
    """(label, p, q, m, deterministic, small): small cases are graded against enumeration, large ones (up to 40
    tokens and 4 children, far too many draws to enumerate in a grading run) against the closed form."""
    rng = np.random.default_rng(seed)

    def t(x) -> torch.Tensor:
        return torch.tensor(np.asarray(x, dtype=np.float64))

    cases = [
        ("worked example, 2 sampled children", t([0.6, 0.3, 0.1]), t([0.3, 0.6, 0.1]), 2, False, True),
        ("worked example, top-2 children", t([0.6, 0.3, 0.1]), t([0.3, 0.6, 0.1]), 2, True, True),
        ("p == q, 3 sampled children", t([0.5, 0.3, 0.2]), t([0.5, 0.3, 0.2]), 3, False, True),
        ("one sampled child", t([0.2, 0.7, 0.1]), t([0.5, 0.2, 0.3]), 1, False, True),
    ]
    while len(cases) < n_cases:
        small = len(cases) % 2 == 0
        V = int(rng.integers(2, 5)) if small else int(rng.integers(8, 41))
        m = int(rng.integers(1, 4)) if small else int(rng.integers(2, 5))
        det = bool(rng.integers(2))
        m = min(m, V)
        p = rng.dirichlet(np.full(V, 0.7))
        q = rng.dirichlet(np.full(V, 0.7))
        kind = int(rng.integers(4))
        label = "random p and q"
        if kind == 1:
            q = 0.5 * p + 0.5 * q  # a draft close to the target
            label = "q close to p"
        elif kind == 2:
            p[np.argsort(-q)[0]] = 0  # the draft's favourite is impossible for the target
            p = p / p.sum()
            label = "p is 0 at q's top token"
        cases.append((f"{label}, V = {V}, {m} {'top-' + str(m) if det else 'sampled'} children", t(p), t(q), m, det,
                      small))
    return cases[:n_cases]



@graded(3, "check_node_acceptance", FORBIDDEN, ALLOWED)
def check_node_acceptance(fn: Callable[..., object], n_cases: int = 30, seed: int = 0) -> None:
    """Grade fn(p, q, m, deterministic) -> float: the exact probability that a node accepts one of its m children.

    Sampled children are m i.i.d. draws from q (the probability averaged over the draws); deterministic children are
    the top-m tokens of q (no ties in the cases). Small cases are compared with an exact enumeration of
    `verify_tree` over every draw and uniform, large ones with the closed form that enumeration confirms; to 1e-9.
    """
    g = "check_node_acceptance"
    for n, (label, p, q, m, det, small) in enumerate(_acceptance_cases(n_cases, seed), 1):
        where = f"wrong answer on case {n} of {n_cases} ({label})."
        inputs = [f"p = {fmt(p)}" if small else f"p over {p.shape[0]} tokens",
                  f"q = {fmt(q)}" if small else f"q over {q.shape[0]} tokens", f"m = {m}", f"deterministic = {det}"]
        p_in, q_in = p.clone(), q.clone()
        got = call_learner(g, where, inputs, fn, p_in, q_in, m, det)
        if not (torch.equal(p_in, p) and torch.equal(q_in, q)):
            raise failure(g, where, inputs, "your function changed p or q in place; use new tensors.")
        value = as_float(got)
        if value is None or not math.isfinite(value):
            raise failure(g, where, inputs + [f"got {got!r}"], "return the probability as a float.")
        want = _acceptance_by_enumeration(p, q, m, det) if small else _acceptance_closed_form(p, q, m, det)
        if abs(value - want) > 1e-9:
            raise failure(g, where, inputs + [f"expected {want:.6f}", f"got      {value:.6f}"], _acceptance_hint(
                p, q, m, det, value))
    passed(g, f"{n_cases} nodes, sampled and top-k children, small ones against exact enumeration")


def _acceptance_hint(p: torch.Tensor, q: torch.Tensor, m: int, det: bool, value: float) -> str:
    if det:
        return ("a top-k child x is a draft from onehot(x): accepted with what is left of p at x, and a rejection "
                "removes x from p. Follow the children in turn.")
    beta = float(torch.minimum(p, q).sum())
    if abs(value - (1 - (1 - beta) ** m)) < 1e-9 and m > 1:
        return ("after a rejection the next child is tried against the residual of p, not against p: its acceptance "
                "probability is not the first child's.")
    return ("average over the children's draws: the i-th child is a fresh draw from q, tried against what the "
            "rejections before it left of p. Does what is left depend on which tokens were rejected?")
