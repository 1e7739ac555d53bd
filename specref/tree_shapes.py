"""Tree shapes and how a draft grows them: static (`TreeShape`) or confidence-driven (`DynamicTree`) (chapter 6).

A rule, not a draft: `TreeGrower` grows one tree per row a depth at a time from the draft's
logits after each depth's frontier, which its caller computes (a model draft runs a masked
pass); `grow_trees` drives it with a function that gives those logits, and `build_tree` grows
one tree from a draft given as a function (toy drafts, exact enumeration).
The trees it returns are verified by `specref.trees.verify_tree` / `verify_tree_greedy`.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass

import torch

from ._validate import as_int_tuple, check_int
from .sampling import SamplingParams, as_rng
from .trees import ROOT, Tree

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
            if cap is not None and (isinstance(cap, bool) or not isinstance(cap, int)):
                raise TypeError(f"{name} must be an int or None, got {cap!r}")
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
