"""Exact checks for tree verification, and the graders of the tree exercises (chapter 6).

Exactness is checked by running the code, not a re-derivation of it: a tree step
(build the tree from the draft, then verify it against the target) draws all of its
randomness through an rng, and `specref.grading.exact_distribution` enumerates
every path of draws (a symbolic uniform splits at each accept test, a categorical
draw branches over every token). That gives the exact distribution of the tokens
the step emits.

A step emits 1 to depth + 1 tokens, so "equals the target" means: finish each
outcome with the target's own next-token distributions up to a common length L;
the result must be the target's joint distribution of L tokens
(`extended_distribution` vs `target_distribution`). That is exactly the statement
that generation keeps going as if the target had decoded alone.

The toy models here are prefix-dependent (`PrefixModel`: a random next-token
distribution for every prefix), so siblings with different tokens really see
different p and q.
"""

from __future__ import annotations

import itertools
from collections.abc import Callable, Hashable, Sequence

import numpy as np
import torch

from .drafts import SamplingParams
from .grading import _call, _fail, _fmt, _passed, exact_distribution
from .trees import (
    ROOT,
    DynamicTree,
    Tree,
    TreeShape,
    as_tree_spec,
    build_tree,
    tree_attention_mask,
    tree_position_ids,
    verify_tree,
)

EXACT_TOL = 1e-12


class PrefixModel:
    """A toy language model over V tokens: a fixed random next-token distribution for every prefix.

    Distributions are Dirichlet(concentration) draws seeded by (seed, prefix), so a
    prefix always gets the same one whatever order prefixes are asked in. With
    `zero_prob` > 0 some tokens get probability exactly 0 (never all of them).
    """

    def __init__(self, vocab_size: int, seed: int, concentration: float = 1.0, zero_prob: float = 0.0) -> None:
        if isinstance(vocab_size, bool) or not isinstance(vocab_size, int) or vocab_size < 1:
            raise ValueError(f"vocab_size must be an int >= 1, got {vocab_size!r}")
        if not concentration > 0:
            raise ValueError(f"concentration must be > 0, got {concentration!r}")
        if not 0 <= zero_prob < 1:
            raise ValueError(f"zero_prob must be in [0, 1), got {zero_prob!r}")
        self.vocab_size = vocab_size
        self.seed = int(seed)
        self.concentration = float(concentration)
        self.zero_prob = float(zero_prob)
        self._memo: dict[tuple[int, ...], torch.Tensor] = {}

    def __call__(self, prefix: Sequence[int] = ()) -> torch.Tensor:  # [V] float64
        key = tuple(int(t) for t in prefix)
        if key not in self._memo:
            rng = np.random.default_rng([self.seed, len(key), *key])
            x = rng.dirichlet(np.full(self.vocab_size, self.concentration))
            if self.zero_prob:
                zero = rng.random(self.vocab_size) < self.zero_prob
                zero[int(rng.integers(self.vocab_size))] = False
                x = np.where(zero, 0.0, x)
            self._memo[key] = torch.tensor(x / x.sum(), dtype=torch.float64)
        return self._memo[key]


def target_rows(tree: Tree, target: Callable[[tuple[int, ...]], torch.Tensor], context: tuple[int, ...] = ()) -> torch.Tensor:
    """p for a tree [N+1, V]: row 0 after the context, row 1 + i after node i's path (what one target pass gives)."""
    rows = [target(context)] + [target(context + tuple(tree.path_tokens(i))) for i in range(tree.n_nodes)]
    return torch.stack(rows)


TreeRule = Callable[..., object]  # rule(tree, p, rng=...) -> TreeResult (or anything with .tokens)


def tree_step_distribution(
    spec: TreeShape | DynamicTree | tuple[int, ...] | int,
    target: Callable[[tuple[int, ...]], torch.Tensor],
    draft: Callable[[tuple[int, ...]], torch.Tensor],
    rule: TreeRule = verify_tree,
    params: SamplingParams | None = None,
    context: tuple[int, ...] = (),
    max_paths: int = 200_000,
) -> dict[Hashable, float]:
    """Exact distribution of the tokens one tree step emits: {emitted tokens: probability}.

    The step builds the tree from `draft` (sampled children are drawn through the
    rng, so every draw is enumerated, duplicates included), scores it with
    `target` and runs `rule(tree, p, rng=rng)`.
    """

    def step(rng: object) -> tuple[int, ...]:
        tree = build_tree(spec, lambda path: draft(context + path), params, rng=rng)
        return tuple(rule(tree, target_rows(tree, target, context), rng=rng).tokens)

    return exact_distribution(step, max_paths=max_paths, max_draws=10_000)


def target_distribution(
    target: Callable[[tuple[int, ...]], torch.Tensor], length: int, context: tuple[int, ...] = ()
) -> torch.Tensor:  # [V] * length
    """The target's joint distribution of its next `length` tokens, by the chain rule."""
    V = target(context).shape[0]
    out = torch.zeros((V,) * length, dtype=torch.float64)
    for seq in itertools.product(range(V), repeat=length):
        w = 1.0
        for j, y in enumerate(seq):
            w *= float(target(context + seq[:j])[y])
            if w == 0:
                break
        out[seq] = w
    return out


def extended_distribution(
    step: dict[Hashable, float],
    target: Callable[[tuple[int, ...]], torch.Tensor],
    length: int,
    context: tuple[int, ...] = (),
) -> torch.Tensor:  # [V] * length
    """Finish every outcome of a step with the target's own next-token distributions up to `length` tokens.

    A lossless step gives exactly `target_distribution(target, length)` for any
    length >= the longest outcome.
    """
    V = target(context).shape[0]
    out = torch.zeros((V,) * length, dtype=torch.float64)
    for seq, w in step.items():
        seq = tuple(seq)
        if len(seq) > length:
            raise ValueError(f"an outcome has {len(seq)} tokens, more than length={length}")
        if len(seq) == length:
            out[seq] += w
            continue
        rest = target_distribution(target, length - len(seq), context + seq)
        out[seq] += w * rest
    return out


def tree_step_error(
    spec: TreeShape | DynamicTree | tuple[int, ...] | int,
    target: Callable[[tuple[int, ...]], torch.Tensor],
    draft: Callable[[tuple[int, ...]], torch.Tensor],
    rule: TreeRule = verify_tree,
    params: SamplingParams | None = None,
) -> float:
    """max |P(step, then the target, emits y) - P(the target emits y)| over every y of depth + 1 tokens."""
    depth = spec.depth if hasattr(spec, "depth") else len(spec)
    dist = tree_step_distribution(spec, target, draft, rule, params)
    L = max(depth + 1, max(len(s) for s in dist))
    return float((extended_distribution(dist, target, L) - target_distribution(target, L)).abs().max())


# --------------------------------------------------------------------------------------
# Exercise 6.1: the tree attention mask and position ids
# --------------------------------------------------------------------------------------


def random_parents(rng: np.random.Generator, n_nodes: int) -> list[int]:
    """A random tree of n_nodes nodes, flattened breadth-first (parents never decrease)."""
    parents: list[int] = []
    depth_of: list[int] = []
    lo = ROOT  # parents of later nodes are >= the last node's parent
    for i in range(n_nodes):
        choices = list(range(lo, i)) if i else [ROOT]
        par = int(rng.choice(choices))
        parents.append(par)
        depth_of.append(1 if par == ROOT else depth_of[par] + 1)
        lo = par
    return parents


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
        return ("that is the causal (chain) mask: in a tree, node i may not see earlier siblings or "
                "cousins, only itself and its ancestors.")
    if not bool(got.diagonal().all()):
        return "every node must see itself (the diagonal is True)."
    parent_only = torch.eye(N, dtype=torch.bool)
    for i, par in enumerate(parents):
        if par >= 0:
            parent_only[i, par] = True
    if torch.equal(got, parent_only):
        return "a node sees all of its ancestors, not only its parent: follow parents up to the root."
    return "mask[i, j] is True iff j == i or j is an ancestor of i (its parent, the parent's parent, ...)."


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
        out = _call(g, where, inputs, fn, arg, start)
        if arg != parents:
            raise _fail(g, where, inputs, "your function changed `parents` in place; build new objects instead.")
        if not (isinstance(out, (tuple, list)) and len(out) == 2):
            raise _fail(g, where, inputs + [f"got {out!r}"], "return a pair (mask, positions).")
        mask = _as_bool_matrix(out[0], N)
        if mask is None:
            raise _fail(g, where, inputs + [f"got mask {out[0]!r}"], f"the mask must be an [{N}, {N}] matrix of booleans.")
        if not torch.equal(mask, want_mask):
            raise _fail(
                g, where,
                inputs + ["expected mask:", *[f"  {r}" for r in want_mask.int().tolist()],
                          "got mask:", *[f"  {r}" for r in mask.int().tolist()]],
                _mask_hint(parents, mask, want_mask),
            )
        pos = _as_int_vector(out[1], N)
        if pos is None:
            raise _fail(g, where, inputs + [f"got positions {out[1]!r}"], f"positions must be {N} integers.")
        if not torch.equal(pos, want_pos):
            hint = "position = start + depth, depth 1 for a child of the root; siblings share a position."
            if torch.equal(pos, start + torch.arange(N)) or torch.equal(pos, start + 1 + torch.arange(N)):
                hint = "those are chain positions (one per flattened index); " + hint
            elif torch.equal(pos, want_pos - 1):
                hint = "off by one: the root sits at `start`, so a depth-1 node is at start + 1."
            raise _fail(g, where, inputs + [f"expected positions {want_pos.tolist()}", f"got      positions {pos.tolist()}"], hint)
    _passed(g, f"{n_cases} random trees, masks and positions")


# --------------------------------------------------------------------------------------
# Exercise 6.2: the multi-candidate rule at one node, graded by exact enumeration
# --------------------------------------------------------------------------------------


def _one_level_cases(n_cases: int, seed: int) -> list[tuple[str, torch.Tensor, torch.Tensor, int, bool]]:
    """(label, p, q, number of children, deterministic) with the edge cases: p == q, zeros, many children."""
    rng = np.random.default_rng(seed)
    t = lambda x: torch.tensor(np.asarray(x, dtype=np.float64))
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


def check_multi_candidate(fn: Callable[..., object], n_cases: int = 40, seed: int = 0) -> None:
    """Grade fn(p, children, q, deterministic, rng) -> (accepted child index or None, token).

    Graded by exact enumeration over the children's draws and every uniform: the
    distribution of (accepted child, token) must equal the rule's, so the token
    is distributed as p and each child is accepted exactly as often as it should be.
    """
    g = "check_multi_candidate"
    for n, (label, p, q, m, det) in enumerate(_one_level_cases(n_cases, seed), 1):
        where = f"wrong answer on case {n} of {n_cases} ({label})."
        inputs = [f"p = {_fmt(p)}", f"q = {_fmt(q)}", f"deterministic = {det}"]
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
                if not (isinstance(out, (tuple, list)) and len(out) == 2):
                    raise TypeError(f"return a pair (accepted child index or None, token), got {out!r}")
                idx, tok = out
                idx = None if idx is None else int(idx)
                return (idx, int(tok))

            try:
                got = _call(g, where, case_inputs, exact_distribution, run)
            except AssertionError as e:
                if isinstance(e.__cause__, _InPlace):
                    raise _fail(g, where, case_inputs, "your function changed p or q in place; use new tensors.") from None
                raise
            for (idx, tok), prob in got.items():
                if idx is not None and not (0 <= idx < m and children[idx] == tok):
                    raise _fail(g, where, case_inputs + [f"returned child {idx} with token {tok}"],
                                "when a child is accepted, return its index in `children` and its token.")
                got_marginal[tok] += w * prob
            keys = sorted(set(want) | set(got), key=lambda k: (k[0] is None, k[0] or 0, k[1]))
            bad = [k for k in keys if abs(want.get(k, 0.0) - got.get(k, 0.0)) > 1e-9]
            if bad:
                rows = [f"  (child, token) = {k}: expected {want.get(k, 0.0):.4g}, got {got.get(k, 0.0):.4g}" for k in keys]
                raise _fail(g, where, case_inputs + ["P(outcome):"] + rows, _multi_hint(p, q, children, det, got, want))
        if not torch.allclose(got_marginal, p, atol=1e-9, rtol=0):  # pragma: no cover - implied by the check above
            raise _fail(g, where, inputs + [f"P(token) = {_fmt(got_marginal)}"], "the emitted token must follow p.")
    _passed(g, f"{n_cases} cases, sampled and top-k children, exact enumeration")


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


def sample_tree_steps(
    spec: TreeShape | DynamicTree | tuple[int, ...] | int,
    target: Callable[[tuple[int, ...]], torch.Tensor],
    draft: Callable[[tuple[int, ...]], torch.Tensor],
    n: int,
    length: int,
    generator: torch.Generator,
    rule: TreeRule = verify_tree,
    params: SamplingParams | None = None,
) -> torch.Tensor:  # [n, length]
    """Run n independent tree steps; finish each with target samples up to `length` tokens (Monte-Carlo twin of
    `extended_distribution`)."""
    from .sampling import sample

    spec = as_tree_spec(spec)
    out = torch.empty((n, length), dtype=torch.long)
    fixed = None if spec.mode == "sampled" else build_tree(spec, draft, params)  # deterministic: one tree
    for i in range(n):
        tree = fixed if fixed is not None else build_tree(spec, draft, params, generator=generator)
        seq = list(rule(tree, target_rows(tree, target), generator=generator).tokens)[:length]
        while len(seq) < length:
            seq.append(int(sample(target(tuple(seq)), generator)))
        out[i] = torch.tensor(seq)
    return out
