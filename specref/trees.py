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
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

import torch

from ._validate import as_int_tuple, check_probs, check_tensor
from .rejection import residual
from .sampling import as_rng

CHILD_MODES = ("sampled", "deterministic")
ROOT = -1  # the parent of depth-1 nodes: the last token of the context


def _check_parents(parents: tuple[int, ...]) -> None:
    """Raise unless parents describe a tree listed parents-first, in breadth-first order."""
    N = len(parents)
    for i, par in enumerate(parents):
        if par < ROOT or par >= N:
            raise ValueError(f"parents[{i}] = {par} is not a node: parents must be -1 (the root) or in [0, {N})")
    for i, par in enumerate(parents):
        if par == i:
            raise ValueError(f"parents[{i}] = {i}: node {i} is its own parent (a cycle), so this is not a tree")
        if par > i:
            # Walk up from i: a return to i is a cycle, otherwise the list is out of order.
            seen, j = [i], par
            while j != ROOT and j not in seen and len(seen) <= N:
                seen.append(j)
                j = parents[j]
            if j == i:
                raise ValueError(f"parents form a cycle {' -> '.join(map(str, seen + [i]))}: this is not a tree")
            raise ValueError(
                f"parents[{i}] = {par} is a forward reference: a node's parent must come before it "
                "(flatten the tree in breadth-first order)"
            )
        if i > 0 and par < parents[i - 1]:
            raise ValueError(
                f"nodes are not in breadth-first order: node {i} (parent {par}) comes after node {i - 1} "
                f"(parent {parents[i - 1]}); in breadth-first order parents never decrease"
            )


@dataclass(frozen=True, eq=False)
class Tree:
    """A draft tree, flattened breadth-first: node i has parent `parents[i]` (-1: the root) and token `tokens[i]`.

    q[i] is the draft distribution node i was chosen from: the draft's q after the
    context and node i's ancestors (siblings share it). `mode` says how children
    were made: "sampled" (i.i.d. from q, with replacement) or "deterministic"
    (distinct tokens, e.g. the draft's top-k); `verify_tree` needs q only for
    "sampled" trees. depths[i] is 1 for a child of the root.
    """

    parents: tuple[int, ...]  # [N]
    tokens: tuple[int, ...]  # [N]
    q: torch.Tensor | None = None  # [N, V]
    mode: str = "deterministic"
    depths: tuple[int, ...] = field(init=False)  # [N]
    _children: tuple[tuple[int, ...], ...] = field(init=False, repr=False)  # [N + 1]: root first

    def __post_init__(self) -> None:
        parents = as_int_tuple("parents", self.parents)
        tokens = as_int_tuple("tokens", self.tokens)
        N = len(parents)
        if len(tokens) != N:
            raise ValueError(f"parents and tokens must have one entry per node, got {N} and {len(tokens)}")
        _check_parents(parents)
        if self.mode not in CHILD_MODES:
            raise ValueError(f"mode must be one of {CHILD_MODES}, got {self.mode!r}")
        if any(t < 0 for t in tokens):
            raise ValueError(f"tokens must be ids >= 0, got {list(tokens)}")
        depths: list[int] = []
        children: list[list[int]] = [[] for _ in range(N + 1)]
        for i, par in enumerate(parents):
            depths.append(1 if par == ROOT else depths[par] + 1)
            children[par + 1].append(i)
        q = self.q
        if q is not None:
            q = check_probs("q", q, min_dim=2)
            if q.dim() != 2 or q.shape[0] != N:
                raise ValueError(f"q must have shape [N, V] = [{N}, V] (one row per node), got {tuple(q.shape)}")
            V = q.shape[1]
            if any(t >= V for t in tokens):
                raise ValueError(f"tokens must lie in [0, V={V}), got {list(tokens)}")
            q = q.detach().clone()  # the tree owns its q: later edits of the caller's tensor cannot reach it
            for kids in children:
                for c in kids[1:]:
                    if not torch.equal(q[c], q[kids[0]]):
                        raise ValueError(
                            f"siblings {kids[0]} and {c} have different q rows: children of one node are drawn "
                            "from the one distribution the draft gives after their parent"
                        )
        if self.mode == "sampled" and N:
            if q is None:
                raise ValueError("a 'sampled' tree needs q: its children were drawn from q, and verify_tree uses it")
            drawn = q[torch.arange(N, device=q.device), torch.tensor(tokens, dtype=torch.long, device=q.device)]
            if bool((drawn <= 0).any()):
                bad = int(torch.nonzero(drawn <= 0)[0])
                raise ValueError(f"node {bad} has q(token) = 0: a sampled child must be drawn from q (q(x) > 0)")
        else:
            for kids in children:
                toks = [tokens[c] for c in kids]
                if len(set(toks)) != len(toks):
                    raise ValueError(
                        f"siblings {list(kids)} repeat a token ({toks}): deterministic children are distinct "
                        "(use mode='sampled' for children drawn with replacement)"
                    )
        object.__setattr__(self, "parents", parents)
        object.__setattr__(self, "tokens", tokens)
        object.__setattr__(self, "q", q)
        object.__setattr__(self, "depths", tuple(depths))
        object.__setattr__(self, "_children", tuple(tuple(k) for k in children))

    # -- structure ---------------------------------------------------------------------
    @property
    def n_nodes(self) -> int:
        return len(self.parents)

    def __len__(self) -> int:
        return len(self.parents)

    @property
    def depth(self) -> int:
        """The deepest node's depth (0 for an empty tree): the most drafts one step can accept."""
        return max(self.depths, default=0)

    @property
    def vocab_size(self) -> int | None:
        return None if self.q is None else self.q.shape[1]

    def children(self, node: int = ROOT) -> tuple[int, ...]:
        """The children of `node` (-1: the root), in the order they are tried."""
        if not ROOT <= node < self.n_nodes:
            raise ValueError(f"node must be -1 (the root) or in [0, {self.n_nodes}), got {node}")
        return self._children[node + 1]

    def path(self, node: int) -> list[int]:
        """Node indices from depth 1 down to `node`."""
        if not 0 <= node < self.n_nodes:
            raise ValueError(f"node must be in [0, {self.n_nodes}), got {node}")
        out = []
        while node != ROOT:
            out.append(node)
            node = self.parents[node]
        return out[::-1]

    def path_tokens(self, node: int) -> list[int]:
        """The tokens from depth 1 down to `node`: what this branch would append to the context."""
        return [self.tokens[i] for i in self.path(node)]

    def subtree(self, keep: Sequence[int]) -> Tree:
        """The tree restricted to `keep` (which must contain every kept node's parent), renumbered in order."""
        kept = sorted(set(as_int_tuple("keep", keep)))
        if kept and not (0 <= kept[0] and kept[-1] < self.n_nodes):
            raise ValueError(f"keep must hold node indices in [0, {self.n_nodes}), got {kept}")
        new_index = {old: new for new, old in enumerate(kept)}
        parents = []
        for old in kept:
            par = self.parents[old]
            if par != ROOT and par not in new_index:
                raise ValueError(f"keep holds node {old} but not its parent {par}: a subtree keeps whole paths")
            parents.append(ROOT if par == ROOT else new_index[par])
        q = None if self.q is None else self.q[torch.tensor(kept, dtype=torch.long, device=self.q.device)]
        return _trusted_tree(parents, [self.tokens[i] for i in kept], q, self.mode)

    def grow(self, parents: Sequence[int], tokens: Sequence[int], q_rows: Sequence[torch.Tensor]) -> Tree:
        """This tree with new nodes appended (a whole depth, breadth-first), each with its q row [V].

        Not re-validated: a draft growing a tree builds one per depth, and checking q's
        rows (V floats each) every time would cost more than its own pass on a small model.
        """
        q_new = torch.stack(list(q_rows)) if len(q_rows) else None
        q = q_new if self.q is None else (self.q if q_new is None else torch.cat([self.q, q_new.to(self.q)]))
        return _trusted_tree(list(self.parents) + list(parents), list(self.tokens) + list(tokens), q, self.mode)

    def describe(self, token_str: Callable[[int], str] | None = None) -> str:
        """One line per node, indented by depth: `[i] token` (children in the order they are tried)."""
        show = token_str or str
        lines = ["(root)"]

        def walk(node: int) -> None:
            for c in self.children(node):
                lines.append(f"{'  ' * self.depths[c]}[{c}] {show(self.tokens[c])}")
                walk(c)

        walk(ROOT)
        return "\n".join(lines)

    def __repr__(self) -> str:
        return f"Tree(n_nodes={self.n_nodes}, depth={self.depth}, mode={self.mode!r}, parents={list(self.parents)}, tokens={list(self.tokens)})"


def _trusted_tree(parents: Sequence[int], tokens: Sequence[int], q: torch.Tensor | None, mode: str) -> Tree:
    """A Tree built by this module from a valid one (appending children, taking a subtree): no re-validation.

    Growing a tree builds a new Tree per depth; checking q's rows (V floats each) every
    time would cost more than the draft's own pass on a small model.
    """
    tree = object.__new__(Tree)
    parents, tokens = tuple(parents), tuple(tokens)
    depths: list[int] = []
    children: list[list[int]] = [[] for _ in range(len(parents) + 1)]
    for i, par in enumerate(parents):
        depths.append(1 if par == ROOT else depths[par] + 1)
        children[par + 1].append(i)
    for name, value in (("parents", parents), ("tokens", tokens), ("q", q), ("mode", mode), ("depths", tuple(depths)),
                        ("_children", tuple(tuple(k) for k in children))):
        object.__setattr__(tree, name, value)
    return tree


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
    if isinstance(start, bool) or not isinstance(start, int) or start < 0:
        raise ValueError(f"start must be an int >= 0 (the root's position), got {start!r}")
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
