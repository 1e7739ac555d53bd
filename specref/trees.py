"""Tree verification: a tree of drafts scored in one target pass (SpecInfer; EAGLE-2).

A chain drafts one continuation; a tree drafts several, sharing prefixes. The
tree is *flattened* in breadth-first order, e.g. top-2 at depth 1 and top-2
under each gives the order [a, b, a1, a2, b1, b2] with parents [-1, -1, 0, 0, 1, 1]
(-1 is the root: the last token of the context). One target pass over
[root, a, b, a1, a2, b1, b2] scores every node at once when

* the attention mask lets a node see the whole context, itself and its
  ancestors, and never a sibling or cousin (`tree_attention_mask`), and
* a node's position is start + depth, start being the root's position, so
  siblings share one position (`tree_position_ids`).

Row 0 of that pass is p after the context, row 1 + i is p after node i.
Verification walks down from the root and keeps one root-to-leaf path:

Greedy (`verify_tree_greedy`): follow the child equal to the target's argmax
while there is one; then emit the argmax (a correction, or a bonus at a leaf).

Sampling (`verify_tree`, the multi-candidate rule of SpecInfer): at a node, try
its children in order. Child x is accepted with probability min(1, p(x)/q_i(x));
after a rejection p becomes residual(p, q_i) = max(0, p - q_i) normalized before
the next child is tried; if every child is rejected, the emitted token is
sampled from what is left of p. q_i, the distribution child i stands for,
depends on how the children were made:

* sampled: children drawn i.i.d. from the draft's q (with replacement, so
  duplicates happen): q_i = q for every sibling.
  Why exact: induction on the number of children m. One child is the chain
  rule: P(emit x) = min(p, q)(x) + (1 - beta) residual(p, q)(x) = p(x). With m
  children, child 1 emits x with probability min(p, q)(x); it is rejected with
  probability 1 - beta, and then the other m - 1 children are still i.i.d. q
  draws, independent of that rejection, so by induction they emit exactly
  residual(p, q). Total: min(p, q) + (1 - beta) residual(p, q) = p.
* deterministic: distinct children chosen without randomness (top-k of the
  draft): q_i = onehot(x_i). Child x is accepted with probability p(x) and a
  rejection removes x: residual(p, onehot(x)) = p without x, renormalized.
  Why exact: a fixed token is a draft from the one-hot distribution on it, so
  the one-child case is the chain rule with q = onehot(x): P(emit x) = p(x), and
  a rejection (probability 1 - p(x)) leaves p conditioned on "not x". The next
  child is again a fixed token, now tried against that conditional; by
  induction the node emits exactly p.
  Using the draft's softmax q here is NOT exact: x was not drawn from q, so the
  min(1, p(x)/q(x)) correction for q's sampling bias has nothing to correct.

Below a node the same argument applies to its subtree with p after that node,
so the emitted tokens follow the target's distribution; `specref.checks.exact_trees`
checks it by exact enumeration.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

import torch

from ._validate import check_int, check_probs, check_tensor
from .rejection import residual
from .sampling import as_rng

# The tree itself lives with the shapes that grow it (specref.tree_shapes); importable from here as before.
from .tree_shapes import CHILD_MODES, ROOT, Tree, _check_parents, _trusted_tree  # noqa: F401


def _check_tree(tree: object) -> Tree:
    if not isinstance(tree, Tree):
        raise TypeError(f"tree must be a specref.trees.Tree, got {type(tree).__name__}")
    return tree


# -- one pass over the whole tree ------------------------------------------------------------


def tree_attention_mask(tree: Tree, with_root: bool = False) -> torch.Tensor:  # [N, N] (or [N+1, N+1]) bool
    """mask[i, j] = True iff node j is node i or one of its ancestors (True = may attend).

    The context is always visible, so it is not part of the mask: a node sees the
    whole context, itself and its ancestors, never a sibling or a cousin. With
    `with_root=True` the root (the last context token, fed in the same pass) is
    added as row and column 0; every node sees it.
    """
    tree = _check_tree(tree)
    N = tree.n_nodes
    mask = torch.zeros((N, N), dtype=torch.bool)
    for i, par in enumerate(tree.parents):
        # Parents come first, so the parent's row (its ancestors and itself) is already complete.
        if par != ROOT:
            mask[i] = mask[par]
        mask[i, i] = True
    if not with_root:
        return mask
    full = torch.zeros((N + 1, N + 1), dtype=torch.bool)
    full[:, 0] = True
    full[1:, 1:] = mask
    return full


def tree_position_ids(
    tree: Tree,
    start: int,
    with_root: bool = False,
    n_positions: int | None = None,
) -> torch.Tensor:  # [N] (or [N+1]) long
    """position[i] = start + depth[i], where `start` is the root's position (context length - 1).

    Siblings share a position: each is "the token after its parent", whatever its
    place in the flattened order. With `with_root=True` the root's own position
    `start` comes first. If `n_positions` (the model's context window) is given,
    a tree that does not fit raises a ValueError.
    """
    tree = _check_tree(tree)
    check_int("start", start, 0, "the root's position", wrong_type=ValueError)
    if n_positions is not None and start + tree.depth >= n_positions:
        raise ValueError(
            f"a tree of depth {tree.depth} after position {start} needs positions up to {start + tree.depth}, "
            f"beyond the context window n_positions={n_positions}"
        )
    depths = ([0] if with_root else []) + list(tree.depths)
    return start + torch.tensor(depths, dtype=torch.long)


def stack_tree_masks(
    trees: Sequence[Tree], starts: Sequence[int], with_root: bool
) -> tuple[torch.Tensor, torch.Tensor]:  # mask [B, T, T], positions [B, T]
    """One row per tree: its `tree_attention_mask` and `tree_position_ids`, padded to the largest tree.

    A padding entry sees only itself and sits at a valid position; nothing attends
    to it, and its output is dropped.
    """
    if len(trees) == 0 or len(trees) != len(starts):
        raise ValueError(f"give one start per tree and at least one tree, got {len(trees)} trees "
                         f"and {len(starts)} starts")
    extra = 1 if with_root else 0
    T = max(_check_tree(t).n_nodes for t in trees) + extra
    mask = torch.eye(T, dtype=torch.bool).repeat(len(trees), 1, 1)
    pos = torch.zeros((len(trees), T), dtype=torch.long)
    for b, (tree, s) in enumerate(zip(trees, starts)):
        n = tree.n_nodes + extra
        mask[b, :n, :n] = tree_attention_mask(tree, with_root=with_root)
        pos[b, :n] = tree_position_ids(tree, s, with_root=with_root)
        pos[b, n:] = s + extra
    return mask, pos


def ancestor_inputs(
    trees: Sequence[Tree], frontier: Sequence[Sequence[int]], starts: Sequence[int]
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, list[list[int]], torch.Tensor]:
    """What one masked pass feeds to read a draft's logits after each row's frontier: ids, positions, mask, nodes, index.

    Row b feeds `nodes[b]`, the ancestors-closed set of frontier[b] in node order, as a
    subtree placed after position starts[b] (`stack_tree_masks` without the root): ids [B, W]
    (0 past a row's nodes), positions [B, W], mask [B, W, W] (a node sees its ancestors and
    itself, never a sibling), and index [B, n]: where frontier[b][j] sits among nodes[b]. Every
    row's frontier holds n nodes.
    """
    if len(trees) != len(frontier) or len({len(f) for f in frontier}) > 1:
        raise ValueError(f"give one frontier per tree, each as long, got {len(trees)} trees and frontiers of "
                         f"lengths {[len(f) for f in frontier]}")
    subtrees, nodes, index = [], [], []
    for t, f in zip(trees, frontier):
        need = sorted({a for n in f for a in _check_tree(t).path(n)})
        nodes.append(need)
        subtrees.append(t.subtree(need))
        index.append([need.index(n) for n in f])
    mask, pos = stack_tree_masks(subtrees, starts, with_root=False)  # [B, W, W], [B, W]
    ids = torch.zeros(pos.shape, dtype=torch.long)
    for b, s in enumerate(subtrees):
        ids[b, : s.n_nodes] = torch.tensor(s.tokens, dtype=torch.long)
    return ids, pos, mask, nodes, torch.tensor(index, dtype=torch.long)


# -- verification ------------------------------------------------------------------------------


@dataclass(frozen=True)
class Trial:
    """One child tried: accepted iff u * q_x < p_x, i.e. u < min(1, p_x / q_x)."""

    node: int
    token: int
    p_x: float  # what is left of p at the token
    q_x: float  # the probability of the token under the distribution the child stands for
    u: object  # the uniform drawn (a float; symbolic under exact enumeration; nan for greedy)
    accepted: bool

    @property
    def threshold(self) -> float:
        return min(1.0, self.p_x / self.q_x)


@dataclass(frozen=True)
class TreeResult:
    """What one tree verification emits: the accepted path's tokens, then one token from the target."""

    tokens: list[int]  # accepted path tokens + the correction/bonus token
    path: list[int]  # node indices of the accepted path, depth 1 first
    trials: list[Trial]  # every child tried, in order

    @property
    def n_accepted(self) -> int:
        return len(self.path)


def _check_p(tree: Tree, p: object, probs: bool) -> torch.Tensor:
    p = check_probs("p", p, min_dim=2) if probs else check_tensor("p", p)
    if not p.is_floating_point():
        raise TypeError(f"p must be a floating-point tensor, got {p.dtype}")
    N = tree.n_nodes
    if p.dim() != 2 or p.shape[0] != N + 1:
        raise ValueError(
            f"p must have shape [N+1, V] = [{N + 1}, V]: row 0 after the context, row 1+i after node i; "
            f"got {tuple(p.shape)}"
        )
    V = p.shape[1]
    if any(t >= V for t in tree.tokens):
        raise ValueError(f"tree tokens must lie in [0, V={V}) of p, got {list(tree.tokens)}")
    if tree.q is not None and tree.q.shape[1] != V:
        raise ValueError(f"tree.q has V={tree.q.shape[1]} but p has V={V}: both must cover one vocabulary")
    if not probs and torch.isnan(p).any():
        raise ValueError("p contains NaN")
    return p


def verify_tree_greedy(
    tree: Tree,
    p: torch.Tensor,  # [N+1, V] target probabilities or logits: row 0 after the context, row 1+i after node i
) -> TreeResult:
    """Greedy rule: keep the longest path of nodes that each equal the target's argmax; then emit the argmax.

    A node matches when its token is the target's argmax after its parent and its
    parent matches too (the root always does). The deepest matching node (the
    first in flattened order on ties) ends the accepted path; the emitted token
    after it is the target's argmax there: a correction if it has children, none
    of which matched, a bonus if it is a leaf. Only the argmax of p is used.
    """
    tree = _check_tree(tree)
    p = _check_p(tree, p, probs=False)
    best = p.argmax(-1).tolist()  # [N+1]
    matched, trials = [], []
    for c, par in enumerate(tree.parents):
        ok = (par == ROOT or matched[par]) and tree.tokens[c] == best[par + 1]
        matched.append(ok)
        if par == ROOT or matched[par]:
            trials.append(Trial(c, tree.tokens[c], float(ok), 1.0, math.nan, ok))
    deepest = max((c for c in range(tree.n_nodes) if matched[c]), key=lambda c: (tree.depths[c], -c), default=ROOT)
    path = [] if deepest == ROOT else tree.path(deepest)
    return TreeResult([tree.tokens[i] for i in path] + [best[deepest + 1]], path, trials)


def verify_tree(
    tree: Tree,
    p: torch.Tensor,  # [N+1, V] target probabilities: row 0 after the context, row 1+i after node i
    generator: torch.Generator | None = None,
    rng: object | None = None,
) -> TreeResult:
    """Multi-candidate rule: try children in order, accept x w.p. min(1, p(x)/q_i(x)), else p <- residual(p, q_i).

    q_i = tree.q[child] for a "sampled" tree (the same q for every sibling: children
    drawn i.i.d. from it) and onehot(x_i) for a "deterministic" one (then a rejection
    removes x_i from p). If every child of a node is rejected, the last token is
    sampled from what is left of p; after a leaf, from p after the leaf (the bonus).
    See the module docstring for why both are exact. Randomness: one uniform per
    child tried and one categorical draw, from `generator`, or from `rng`
    (uniform()/categorical(probs); exact enumeration passes a symbolic one).
    """
    tree = _check_tree(tree)
    p = _check_p(tree, p, probs=True)
    source = as_rng(generator, rng)
    sampled = tree.mode == "sampled"
    q_all = tree.q.to(device=p.device, dtype=torch.promote_types(p.dtype, tree.q.dtype)) if sampled and tree.n_nodes else None
    dist = p[0]
    node, path, trials = ROOT, [], []
    while True:
        nxt = None
        for c in tree.children(node):
            x = tree.tokens[c]
            q_c = q_all[c] if sampled else torch.nn.functional.one_hot(torch.tensor(x, device=p.device), p.shape[1]).to(p.dtype)
            p_x, q_x = float(dist[x]), float(q_c[x])
            u = source.uniform()
            ok = bool(u * q_x < p_x)
            trials.append(Trial(c, x, p_x, q_x, u, ok))
            if ok:
                nxt = c
                break
            dist = residual(dist, q_c)
        if nxt is None:
            final = source.categorical(dist)
            return TreeResult([tree.tokens[i] for i in path] + [int(final)], path, trials)
        path.append(nxt)
        node = nxt
        dist = p[nxt + 1]
