"""Exact checks for tree verification (chapter 6).

Exactness is checked by running the code, not a re-derivation of it: a tree step
(build the tree from the draft, then verify it against the target) draws all of its
randomness through an rng, and `specref.checks.rng.exact_distribution` enumerates
every path of draws (a symbolic uniform splits at each accept test, a categorical
draw branches over every token). That gives the exact distribution of the tokens
the step emits.

A step emits 1 to depth + 1 tokens, so "equals the target" means: finish each
outcome with the target's own next-token distributions up to a common length L;
the result must be the target's joint distribution of L tokens
(`extended_distribution` vs `target_distribution`). That is exactly the statement
that generation keeps going as if the target had decoded alone.

A check is only as good as its power: `tree_step_error` must flag the deliberately
broken tree rules of `specref.checks.broken` (`BROKEN_TREE_RULES`, negative controls).

The toy models here are prefix-dependent (`PrefixModel`: a random next-token
distribution for every prefix), so siblings with different tokens really see
different p and q.
"""

from __future__ import annotations

import itertools
from collections.abc import Callable, Hashable, Sequence

import numpy as np
import torch

from .._validate import check_int
from ..sampling import SamplingParams, sample
from ..tree_shapes import DynamicTree, TreeShape, as_tree_spec, build_tree
from ..trees import ROOT, Tree, verify_tree
from .broken import (  # noqa: F401 - the broken tree rules, importable from here as before
    BROKEN_TREE_RULES,
    verify_tree_always_accept,
    verify_tree_bonus_off_by_one,
    verify_tree_skip_residual,
    verify_tree_softmax_q,
)
from .rng import exact_distribution

EXACT_TOL = 1e-12


class PrefixModel:
    """A toy language model over V tokens: a fixed random next-token distribution for every prefix.

    Distributions are Dirichlet(concentration) draws seeded by (seed, prefix), so a
    prefix always gets the same one whatever order prefixes are asked in. With
    `zero_prob` > 0 some tokens get probability exactly 0 (never all of them).
    """

    def __init__(self, vocab_size: int, seed: int, concentration: float = 1.0, zero_prob: float = 0.0) -> None:
        check_int("vocab_size", vocab_size, 1, "tokens in the vocabulary", wrong_type=ValueError)
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
