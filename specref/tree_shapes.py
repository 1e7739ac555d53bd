"""Tree shapes and how a draft grows them: static (`TreeShape`) or confidence-driven (`DynamicTree`) (chapter 6).

A rule, not a draft: `TreeGrower` grows one tree per row a depth at a time from the draft's
logits after each depth's frontier, which its caller computes (a model draft runs a masked
pass); `grow_trees` drives it with a function that gives those logits, and `build_tree` grows
one tree from a draft given as a function (toy drafts, exact enumeration).
The trees it returns are verified by `specref.trees.verify_tree` / `verify_tree_greedy`.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

import torch

from ._validate import as_int_tuple, check_int, check_probs
from .sampling import SamplingParams, as_rng

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



# draft_logits(trees, nodes): for each row b, the draft's logits after node nodes[b][j] of
# trees[b] (-1: after the context), as a [B, n, V] tensor. A model draft runs one forward
# pass with the tree mask; a toy draft looks the distributions up.
DraftLogits = Callable[[list[Tree], list[list[int]]], torch.Tensor]


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
        b = as_int_tuple("branching", self.branching)
        if any(x < 1 for x in b):
            raise ValueError(f"branching factors must be >= 1, got {list(b)}")
        if not isinstance(self.sampled, bool):
            raise TypeError(f"sampled must be a bool, got {self.sampled!r}")
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
        for name, what in (("budget", "nodes to keep"), ("max_depth", "levels to grow"),
                           ("top_k", "children per node"), ("beam", "nodes expanded per level")):
            check_int(name, getattr(self, name), 1, what, wrong_type=ValueError)

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


class TreeGrower:
    """Grows one draft tree per row, a depth at a time: the caller hands it the draft's logits after the frontier.

    `frontier[b]` lists the nodes of `trees[b]` to expand next (ROOT first), the same number in
    every row, all at depth `grown` (the depths grown so far); `grow(logits)`
    takes the draft's logits after them, [B, n, V], and adds their children: the draft's top
    tokens by raw logits (deterministic shapes and dynamic trees) or i.i.d. draws from
    q = params.probs(logits) (sampled shapes). Every node stores the q it was chosen from.
    `done` turns true when the tree is as deep as the spec, `max_depth` allows or its node
    budget is full (a dynamic tree: when no deeper node could make the final cut); `result()`
    cuts each tree to the budget: a static tree keeps its first nodes in breadth-first order
    (whole paths), a dynamic tree its `budget` best by path probability. Random draws come
    from `generator`, or from `rng` (uniform()/categorical(probs)).
    """

    def __init__(
        self,
        spec: TreeSpec | tuple[int, ...] | int,
        batch_size: int,
        params: SamplingParams | None = None,
        generator: torch.Generator | None = None,
        rng: object | None = None,
        max_depth: int | None = None,
        max_nodes: int | None = None,
    ) -> None:
        self.spec = spec = as_tree_spec(spec)
        self.batch_size = check_int("batch_size", batch_size, 1, "trees to grow, one per row")
        self.params = SamplingParams() if params is None else params
        if not isinstance(self.params, SamplingParams):
            raise TypeError(f"params must be a specref.sampling.SamplingParams or None, got {type(params).__name__}")
        for name, cap in (("max_depth", max_depth), ("max_nodes", max_nodes)):
            if cap is not None:
                check_int(name, cap, 0, "a cap on the tree; or None for the spec's own")
        self.source = as_rng(generator, rng)
        self.max_depth = spec.depth if max_depth is None else max(0, min(spec.depth, max_depth))
        self.budget = spec.n_nodes if max_nodes is None else max(0, min(spec.n_nodes, max_nodes))
        self.trees = [Tree([], [], None, spec.mode) for _ in range(self.batch_size)]
        self.scores: list[list[float]] = [[] for _ in range(self.batch_size)]  # log path probability of each node
        self.frontier: list[list[int]] = [[ROOT] for _ in range(self.batch_size)]
        self.grown = 0  # how many depths are grown (the next grow call adds depth grown + 1)
        self.done = self.max_depth == 0 or self.budget == 0

    def grow(self, logits: torch.Tensor) -> None:  # [B, n, V] after frontier[b][j]
        """Add one depth: the children of every frontier node, chosen from the draft's logits after it."""
        if self.done:
            raise RuntimeError("the trees are grown: read result()")
        B, n, spec = self.batch_size, len(self.frontier[0]), self.spec
        if not isinstance(logits, torch.Tensor) or logits.dim() != 3 or logits.shape[:2] != (B, n):
            raise ValueError(f"the draft's logits must be a [B, n, V] = [{B}, {n}, V] tensor, "
                             f"got {getattr(logits, 'shape', type(logits).__name__)}")
        d = self.grown + 1  # the depth this call grows
        q = self.params.probs(logits)  # [B, n, V]
        logp = torch.log_softmax(logits.to(torch.float64), -1)  # the draft's own confidence, for ranking
        trees, scores, frontier = list(self.trees), [list(s) for s in self.scores], list(self.frontier)
        for b in range(B):  # on new lists: a call that raises leaves the grower as it was
            parents, tokens, q_rows, new_scores = [], [], [], []
            for j, node in enumerate(frontier[b]):
                if isinstance(spec, TreeShape) and spec.sampled:
                    kids = [self.source.categorical(q[b, j]) for _ in range(spec.branching[d - 1])]
                else:
                    width = spec.branching[d - 1] if isinstance(spec, TreeShape) else spec.top_k
                    kids = torch.topk(logits[b, j], min(width, logits.shape[-1])).indices.tolist()
                base = 0.0 if node == ROOT else scores[b][node]
                for x in kids:
                    parents.append(node)
                    tokens.append(int(x))
                    q_rows.append(q[b, j])
                    new_scores.append(base + float(logp[b, j, x]))
            first_new = len(scores[b])  # one score per node
            trees[b] = trees[b].grow(parents, tokens, q_rows)
            scores[b] += new_scores
            new_nodes = list(range(first_new, len(scores[b])))
            if isinstance(spec, DynamicTree):
                frontier[b] = sorted(sorted(new_nodes, key=lambda i: (-scores[b][i], i))[: spec.beam])
            else:
                frontier[b] = new_nodes
        self.trees, self.scores, self.frontier, self.grown = trees, scores, frontier, d
        if isinstance(spec, TreeShape):
            self.done = d == self.max_depth or len(scores[0]) >= self.budget
        else:  # stop when no deeper node could make the final cut: save the remaining draft passes
            self.done = d == self.max_depth or all(_hopeless(scores[b], frontier[b], self.budget) for b in range(B))

    def result(self) -> list[Tree]:
        """The trees, each cut to the node budget."""
        out = []
        for b, tree in enumerate(self.trees):
            if len(self.scores[b]) <= self.budget:
                out.append(tree)
            elif isinstance(self.spec, DynamicTree):
                # Ties go to the earlier node, so a parent (earlier, never a lower score) beats its child.
                best = sorted(range(len(self.scores[b])), key=lambda i: (-self.scores[b][i], i))[: self.budget]
                out.append(tree.subtree(best))
            else:
                out.append(tree.subtree(range(self.budget)))
        return out


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
    """One draft tree per row, grown by a `TreeGrower` with one `draft_logits(trees, frontier)` call per depth."""
    grower = TreeGrower(spec, batch_size, params, generator, rng, max_depth, max_nodes)
    while not grower.done:
        grower.grow(draft_logits(grower.trees, grower.frontier))
    return grower.result()


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
