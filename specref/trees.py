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

import numpy as np
import torch

from ._validate import check_probs, check_tensor
from .sampling import SamplingParams
from .rejection import residual
from .sampling import sample

CHILD_MODES = ("sampled", "deterministic")
ROOT = -1  # the parent of depth-1 nodes: the last token of the context


def _as_int_tuple(name: str, x: object) -> tuple[int, ...]:
    if isinstance(x, torch.Tensor):
        if x.is_floating_point() or x.is_complex() or x.dtype == torch.bool:
            raise TypeError(f"{name} must hold integers, got dtype {x.dtype}")
        if x.dim() != 1:
            raise ValueError(f"{name} must be 1-D ([N]), got shape {tuple(x.shape)}")
        return tuple(int(v) for v in x.tolist())
    if isinstance(x, (str, bytes)) or not isinstance(x, Sequence):
        raise TypeError(f"{name} must be a sequence of ints or a 1-D integer tensor, got {type(x).__name__}")
    out = []
    for v in x:
        if isinstance(v, (bool, np.bool_)) or not isinstance(v, (int, np.integer)):
            raise TypeError(f"{name} must hold ints, got {v!r}")
        out.append(int(v))
    return tuple(out)


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
        parents = _as_int_tuple("parents", self.parents)
        tokens = _as_int_tuple("tokens", self.tokens)
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

    def leaves(self) -> list[int]:
        return [i for i in range(self.n_nodes) if not self._children[i + 1]]

    def subtree(self, keep: Sequence[int]) -> Tree:
        """The tree restricted to `keep` (which must contain every kept node's parent), renumbered in order."""
        kept = sorted(set(_as_int_tuple("keep", keep)))
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


# -- building trees from a draft ----------------------------------------------------------------

# draft_logits(trees, nodes): for each row b, the draft's logits after node nodes[b][j] of
# trees[b] (-1: after the context), as a [B, n, V] tensor. A model draft runs one forward
# pass with the tree mask; a toy draft looks the distributions up.
DraftLogits = Callable[[list[Tree], list[list[int]]], torch.Tensor]


class _GeneratorRNG:
    """uniform() and categorical(probs) drawn from a torch.Generator (None: torch's default)."""

    def __init__(self, generator: torch.Generator | None) -> None:
        if generator is not None and not isinstance(generator, torch.Generator):
            raise TypeError(f"generator must be a torch.Generator or None, got {type(generator).__name__}")
        self.generator = generator
        self.device = generator.device if generator is not None else torch.device("cpu")

    def uniform(self) -> float:
        return float(torch.rand((), generator=self.generator, dtype=torch.float64, device=self.device))

    def categorical(self, probs: torch.Tensor) -> int:  # [V]
        u = torch.rand((), generator=self.generator, dtype=torch.float64, device=self.device)
        return int(sample(probs, u=u.to(probs.device)))


def _rng(generator: torch.Generator | None, rng: object | None) -> object:
    if rng is not None:
        if generator is not None:
            raise ValueError("give a generator or an rng, not both")
        if not (hasattr(rng, "uniform") and hasattr(rng, "categorical")):
            raise TypeError("rng must have uniform() and categorical(probs) methods")
        return rng
    return _GeneratorRNG(generator)


@dataclass(frozen=True)
class TreeShape:
    """A static tree: every node at depth d has branching[d-1] children.

    (2, 2) is top-2 at depth 1 and top-2 under each: [a, b, a1, a2, b1, b2].
    sampled=False takes the draft's top-b tokens (distinct, "deterministic" mode);
    sampled=True draws b children i.i.d. from q, with replacement ("sampled" mode).
    """

    branching: tuple[int, ...]
    sampled: bool = False

    def __post_init__(self) -> None:
        b = _as_int_tuple("branching", self.branching)
        if any(x < 1 for x in b):
            raise ValueError(f"branching factors must be >= 1, got {list(b)}")
        object.__setattr__(self, "branching", b)

    @property
    def depth(self) -> int:
        return len(self.branching)

    @property
    def n_nodes(self) -> int:
        return sum(math.prod(self.branching[: d + 1]) for d in range(self.depth))

    @property
    def mode(self) -> str:
        return "sampled" if self.sampled else "deterministic"


@dataclass(frozen=True)
class DynamicTree:
    """A confidence-driven tree in the spirit of EAGLE-2: grow where the draft's path probability is highest.

    Depth by depth, the `beam` most probable nodes of the newest depth are expanded
    with their `top_k` most probable children; a node's score is its path
    probability under the draft, the product of softmax(draft logits) along its
    path. At the end the `budget` highest-scoring nodes are kept. A child never
    scores above its parent, so the kept set always contains whole paths.
    Children are the draft's top tokens, so the tree is "deterministic".
    """

    budget: int
    max_depth: int = 6
    top_k: int = 4
    beam: int = 4

    def __post_init__(self) -> None:
        for name in ("budget", "max_depth", "top_k", "beam"):
            v = getattr(self, name)
            if isinstance(v, bool) or not isinstance(v, int) or v < 1:
                raise ValueError(f"{name} must be an int >= 1, got {v!r}")

    @property
    def depth(self) -> int:
        return self.max_depth

    @property
    def n_nodes(self) -> int:
        return self.budget

    @property
    def mode(self) -> str:
        return "deterministic"


TreeSpec = TreeShape | DynamicTree


def as_tree_spec(spec: object) -> TreeSpec:
    """A TreeShape or DynamicTree; a tuple of ints means a static shape, an int a dynamic node budget."""
    if isinstance(spec, (TreeShape, DynamicTree)):
        return spec
    if isinstance(spec, int) and not isinstance(spec, bool):
        return DynamicTree(budget=spec)
    if isinstance(spec, (tuple, list)):
        return TreeShape(tuple(spec))
    raise TypeError(
        f"tree must be a TreeShape, a DynamicTree, a tuple of branching factors (static shape) "
        f"or an int (dynamic node budget), got {spec!r}"
    )


def _append(tree: Tree, parents: list[int], tokens: list[int], q_rows: list[torch.Tensor], mode: str) -> Tree:
    q_new = torch.stack(q_rows) if q_rows else None
    q = q_new if tree.q is None else (tree.q if q_new is None else torch.cat([tree.q, q_new.to(tree.q)]))
    return _trusted_tree(list(tree.parents) + parents, list(tree.tokens) + tokens, q, mode)


def grow_trees(
    spec: TreeSpec | tuple[int, ...] | int,
    draft_logits: DraftLogits,
    batch_size: int,
    params: SamplingParams | None = None,
    generator: torch.Generator | None = None,
    rng: object | None = None,
    max_depth: int | None = None,
    max_nodes: int | None = None,
) -> list[Tree]:
    """One draft tree per row, grown depth by depth with one `draft_logits` call per depth.

    Children are the draft's top tokens by raw logits (deterministic shapes and
    dynamic trees) or are drawn i.i.d. from q = params.probs(logits) (sampled
    shapes). Every node stores the q it was chosen from. `max_depth` and
    `max_nodes` cap the tree (near the end of the token budget or the context
    window); a static tree cut by `max_nodes` keeps its first nodes in
    breadth-first order, which are whole paths. Random draws come from
    `generator`, or from `rng` (uniform()/categorical(probs)).
    """
    spec = as_tree_spec(spec)
    params = SamplingParams() if params is None else params
    source = _rng(generator, rng)
    depth = spec.depth if max_depth is None else max(0, min(spec.depth, max_depth))
    budget = spec.n_nodes if max_nodes is None else max(0, min(spec.n_nodes, max_nodes))
    trees = [Tree([], [], None, spec.mode) for _ in range(batch_size)]
    if depth == 0 or budget == 0:
        return trees
    scores: list[list[float]] = [[] for _ in range(batch_size)]  # log path probability of each node
    frontier: list[list[int]] = [[ROOT] for _ in range(batch_size)]
    for d in range(1, depth + 1):
        logits = draft_logits(trees, frontier)  # [B, n, V]
        if not isinstance(logits, torch.Tensor) or logits.dim() != 3 or logits.shape[:2] != (batch_size, len(frontier[0])):
            raise ValueError(f"draft_logits must return a [B, n, V] = [{batch_size}, {len(frontier[0])}, V] tensor, "
                             f"got {getattr(logits, 'shape', type(logits).__name__)}")
        q = params.probs(logits)  # [B, n, V]
        logp = torch.log_softmax(logits.to(torch.float64), -1)  # the draft's own confidence, for ranking
        for b in range(batch_size):
            parents, tokens, q_rows, new_scores = [], [], [], []
            for j, node in enumerate(frontier[b]):
                if isinstance(spec, TreeShape) and spec.sampled:
                    kids = [source.categorical(q[b, j]) for _ in range(spec.branching[d - 1])]
                else:
                    width = spec.branching[d - 1] if isinstance(spec, TreeShape) else spec.top_k
                    kids = torch.topk(logits[b, j], min(width, logits.shape[-1])).indices.tolist()
                base = 0.0 if node == ROOT else scores[b][node]
                for x in kids:
                    parents.append(node)
                    tokens.append(int(x))
                    q_rows.append(q[b, j])
                    new_scores.append(base + float(logp[b, j, x]))
            first_new = trees[b].n_nodes
            trees[b] = _append(trees[b], parents, tokens, q_rows, spec.mode)
            scores[b] += new_scores
            new_nodes = list(range(first_new, trees[b].n_nodes))
            if isinstance(spec, DynamicTree):
                frontier[b] = sorted(sorted(new_nodes, key=lambda i: (-scores[b][i], i))[: spec.beam])
            else:
                frontier[b] = new_nodes
        if isinstance(spec, TreeShape) and trees[0].n_nodes >= budget:
            break
        if isinstance(spec, DynamicTree) and all(_hopeless(scores[b], frontier[b], budget) for b in range(batch_size)):
            break  # no deeper node could make the final cut: save the remaining draft passes
    out = []
    for b, tree in enumerate(trees):
        if tree.n_nodes <= budget:
            out.append(tree)
        elif isinstance(spec, DynamicTree):
            # Ties go to the earlier node, so a parent (earlier, never a lower score) beats its child.
            out.append(tree.subtree(sorted(range(tree.n_nodes), key=lambda i: (-scores[b][i], i))[:budget]))
        else:
            out.append(tree.subtree(range(budget)))
    return out


def _hopeless(scores: list[float], frontier: list[int], budget: int) -> bool:
    """True when every child of the frontier would score below the budget-th best node kept so far.

    A child's path probability is at most its parent's, so nothing grown from this
    frontier could enter the final top-`budget` selection.
    """
    if len(scores) < budget:
        return False
    cut = sorted(scores, reverse=True)[budget - 1]
    return max(scores[i] for i in frontier) < cut


def build_tree(
    spec: TreeSpec | tuple[int, ...] | int,
    draft_probs: Callable[[tuple[int, ...]], torch.Tensor],
    params: SamplingParams | None = None,
    generator: torch.Generator | None = None,
    rng: object | None = None,
) -> Tree:
    """One tree from a draft given as a function: draft_probs(path tokens) -> q [V] after that path.

    The draft's logits are taken as log(q) (processing with `params` is then applied
    as for a model). The small-vocabulary tests, the exact enumeration and the
    notebooks' toy examples build trees this way.
    """

    def logits_of(trees: list[Tree], nodes: list[list[int]]) -> torch.Tensor:
        tree = trees[0]
        rows = [draft_probs(tuple(tree.path_tokens(n)) if n != ROOT else ()) for n in nodes[0]]
        return torch.stack([torch.as_tensor(r, dtype=torch.float64).log() for r in rows])[None]

    return grow_trees(spec, logits_of, 1, params, generator, rng)[0]


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
    final: torch.Tensor | None  # [V] the distribution the last token came from (None for greedy)

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
    return TreeResult([tree.tokens[i] for i in path] + [best[deepest + 1]], path, trials, None)


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
    source = _rng(generator, rng)
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
            return TreeResult([tree.tokens[i] for i in path] + [int(final)], path, trials, dist)
        path.append(nxt)
        node = nxt
        dist = p[nxt + 1]
