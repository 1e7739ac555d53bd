"""Graders for the chapter 6 exercises: the tree a mask belongs to, the multi-candidate rule, and how often a node
accepts one of its children.

The tree is graded exactly: on trees' masks against the one tree `specref.trees.tree_attention_mask` maps to that
mask, and on masks no tree has, which must be refused.

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
from specref.trees import ROOT, Tree, tree_attention_mask, verify_tree

from .report import as_float, as_int, as_ints, as_items, call_learner, failure, fmt, passed
from .rules import graded

# The reference rule: the tasks write what specref.trees does, or read its mask backwards (its tree_attention_mask
# would check such an answer for free); specref.residual stays allowed (the setup imports it).
FORBIDDEN = ("specref.trees", "specref.chain_verify", "specref_grading")
ALLOWED = ("specref_grading.checks.trees.check_tree_from_mask", "specref_grading.checks.trees.check_multi_candidate",
           "specref_grading.checks.trees.check_node_acceptance")


# --------------------------------------------------------------------------------------
# Exercise 6.1: which tree has this mask? (the mask read backwards)
# --------------------------------------------------------------------------------------


def tree_of_mask(mask: torch.Tensor) -> list[int] | None:
    """The parents of the one breadth-first `Tree` whose `tree_attention_mask` is `mask` ([N, N] bool), or None.

    Decided with the reference itself: a tree's parents come before their children, so the ancestors of node i
    are among nodes 0..i-1, and the nearest of them (the largest index) is its parent. That reading gives one
    candidate per mask; the mask is a tree's iff the candidate is a `Tree` (parents first, breadth-first) whose
    mask, rebuilt by `tree_attention_mask`, is `mask` again. The answer is unique: a mask fixes every node's
    ancestors, hence its parent. tests/test_trees.py holds this against every tree and every mask of a few nodes.
    """
    if mask.dim() != 2 or mask.shape[0] != mask.shape[1]:
        return None
    N = mask.shape[0]
    candidate = []
    for i in range(N):
        seen = [j for j in range(i) if bool(mask[i, j])]
        candidate.append(seen[-1] if seen else ROOT)
    try:
        tree = Tree(candidate, list(range(N)))
    except ValueError:
        return None
    return candidate if torch.equal(tree_attention_mask(tree), mask) else None


def why_not_a_tree(mask: torch.Tensor) -> str | None:
    """The first reason no breadth-first tree has `mask` (for hints), or None when one has it."""
    if mask.dim() != 2 or mask.shape[0] != mask.shape[1]:
        return f"the mask has shape {tuple(mask.shape)}, not [N, N]"
    N = mask.shape[0]
    parents = []
    for i in range(N):
        if not bool(mask[i, i]):
            return f"node {i} does not see itself"
        later = [j for j in range(i + 1, N) if bool(mask[i, j])]
        if later:
            return f"node {i} sees node {later[0]}, which comes after it in the flattened order"
        seen = [j for j in range(i) if bool(mask[i, j])]
        par = seen[-1] if seen else ROOT
        if par != ROOT and not torch.equal(mask[i, :par], mask[par, :par]):
            return f"the nodes that node {i} sees are not all on one branch from the root"
        if parents and par < parents[-1]:
            return (f"the only tree with this mask hangs node {i} under {'the root' if par == ROOT else f'node {par}'} "
                    f"after node {i - 1} hung under {'the root' if parents[-1] == ROOT else f'node {parents[-1]}'}: "
                    "its nodes are not listed breadth-first")
        parents.append(par)
    return None


def _mask_cases(n_cases: int, seed: int) -> list[tuple[str, torch.Tensor]]:
    """(label, mask [N, N] bool): trees' masks, masks one change away from a tree's (some of which are still a
    tree's, most of which are no tree's), and a tree's mask with its nodes listed in another order (any order, or
    parents first in a random order: a tree's mask only when that order happens to be breadth-first)."""
    rng = np.random.default_rng(seed)

    def mask_of(parents: list[int]) -> torch.Tensor:
        return tree_attention_mask(Tree(parents, list(range(len(parents)))))

    def changed(m: torch.Tensor, i: int, j: int) -> torch.Tensor:
        m = m.clone()
        m[i, j] = not bool(m[i, j])
        return m

    top2 = mask_of([-1, -1, 0, 0, 1, 1])
    chain = mask_of([-1, 0, 1, 2])
    cases = [
        ("the tree [a, b, a1, a2, b1, b2]", top2),
        ("a chain of 4 drafts", chain),
        ("one node", mask_of([-1])),
        ("three siblings", mask_of([-1, -1, -1])),
        ("a deeper tree", mask_of([-1, -1, 0, 0, 1, 2, 2, 4])),
        ("a node that does not see itself", changed(top2, 3, 3)),
        ("a node that sees a later node", changed(top2, 0, 1)),
        ("a node that sees two siblings", changed(mask_of([-1, -1, 0]), 2, 1)),
        ("a node that skips its grandparent", changed(chain, 2, 0)),
        ("a tree not listed breadth-first", torch.tensor([[1, 0, 0], [1, 1, 0], [0, 0, 1]], dtype=torch.bool)),
        ("a mask that is not square", torch.ones((2, 3), dtype=torch.bool).tril()),
    ]
    while len(cases) < n_cases:
        parents = random_parents(rng, int(rng.integers(1, 13)))
        m, N = mask_of(parents), len(parents)
        kind = len(cases) % 4
        if kind == 0:
            cases.append((f"a random tree of {N} nodes", m))
        elif kind == 1:  # one entry below the diagonal flipped
            if N < 2:
                continue
            i = int(rng.integers(1, N))
            cases.append((f"a random tree of {N} nodes, one entry below the diagonal changed",
                          changed(m, i, int(rng.integers(0, i)))))
        elif kind == 2:  # one entry on or above the diagonal flipped
            i = int(rng.integers(0, N))
            cases.append((f"a random tree of {N} nodes, one entry on or above the diagonal changed",
                          changed(m, i, int(rng.integers(i, N)))))
        elif len(cases) % 8 == 3:  # the same tree, its nodes listed in any order
            order = torch.as_tensor(rng.permutation(N))
            cases.append((f"a random tree of {N} nodes listed in another order", m[order][:, order]))
        else:  # the same tree, listed parents first in a random order: the first of a few that is not breadth-first
            for _ in range(8):
                order, ready = [], [i for i in range(N) if parents[i] == ROOT]
                while ready:
                    order.append(ready.pop(int(rng.integers(len(ready)))))
                    ready += [c for c in range(N) if parents[c] == order[-1]]
                relabelled = m[order][:, order]
                if tree_of_mask(relabelled) is None:
                    break
            cases.append((f"a random tree of {N} nodes listed parents first, in a random order", relabelled))
    return cases[:n_cases]


def _call_mask_answer(g: str, where: str, inputs: list[str], fn: Callable[[torch.Tensor], object],
                      mask: torch.Tensor) -> tuple[bool, object]:
    """(raised ValueError, output) of fn on a copy of mask; another exception, or a change to mask, fails."""
    arg = mask.clone()
    try:
        out, raised = fn(arg), False
    except ValueError as e:
        out, raised = e, True
    except NotImplementedError:
        raise
    except Exception as e:  # noqa: BLE001 - any error of the learner's code is reported with its input
        raise failure(g, where, inputs + [f"your function raised {type(e).__name__}: {e}"],
                      "a mask that no tree has is refused with ValueError; other exceptions are errors.") from e
    if not torch.equal(arg, mask):
        raise failure(g, where, inputs, "your function changed `mask` in place; build new objects instead.")
    return raised, out


def _parents_hint(mask: torch.Tensor, want: list[int], got: list[int]) -> str:
    first = [next((j for j in range(i) if bool(mask[i, j])), ROOT) for i in range(len(want))]
    if got == first and first != want:
        return ("a node sees every node on its branch, not only its parent: of those, which one is its parent, "
                "whatever the tree's depth?")
    if got == [par + 1 if par != ROOT else ROOT for par in want] or got == [par + 1 for par in want]:
        return "off by one: nodes are numbered from 0 in the flattened order, and -1 stands for the root."
    return "node i's parent is a node that node i sees; which one, for every tree?"


@graded(1, "check_tree_from_mask", FORBIDDEN, ALLOWED)
def check_tree_from_mask(fn: Callable[[torch.Tensor], object], n_cases: int = 40, seed: int = 0) -> None:
    """Grade fn(mask) -> parents: the breadth-first tree whose attention mask is `mask`, or ValueError.

    Every mask is [N, N] bool (one is not square). On a tree's mask the answer must be that tree's parents (the
    only ones, `tree_of_mask`), as N whole numbers in a list, tuple or tensor; on a mask that no breadth-first tree
    has (a node blind to itself, one that sees a later node, a node whose visible nodes are not one branch, a tree
    listed in another order, a mask that is not square) it must raise ValueError. Exact, no draw.
    """
    g = "check_tree_from_mask"
    for n, (label, mask) in enumerate(_mask_cases(n_cases, seed), 1):
        where = f"wrong answer on case {n} of {n_cases} ({label})."
        inputs = ["mask:", *[f"  {r}" for r in mask.int().tolist()]]
        want = tree_of_mask(mask)
        raised, out = _call_mask_answer(g, where, inputs, fn, mask)
        if want is None:
            if not raised:
                raise failure(g, where, inputs + [f"got {out!r}"],
                              f"no breadth-first tree has this mask ({why_not_a_tree(mask)}): raise ValueError.")
            continue
        if raised:
            raise failure(g, where, inputs + [f"your function raised ValueError: {out}"],
                          f"this is the mask of the tree with parents {want}: a tree has it, so return its parents.")
        got = as_ints(out, len(want))
        if got is None:
            raise failure(g, where, inputs + [f"got {out!r}"],
                          f"return the parents: {len(want)} whole numbers, one per node (-1 for the root).")
        if got != want:
            raise failure(g, where, inputs + [f"expected parents {want}", f"got      parents {got}"],
                          _parents_hint(mask, want, got))
    passed(g, f"{n_cases} masks, trees' and no tree's")


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
