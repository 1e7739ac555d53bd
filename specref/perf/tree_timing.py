"""Trees timed: what a tree-masked pass costs, and tree decoding against chains and plain decoding (chapter 6).

A tree of n nodes is verified in one target pass over n + 1 tokens (the root and the nodes), with the
tree mask and positions root + depth. Where the target's weights stream from memory, that pass costs
about one plain step while n + 1 rows stay below the machine's ridge, and more past it. Two
measurements, each paired repeat by repeat so that a machine that slows down moves both sides:

    v(n)    = time of one tree pass over n + 1 tokens / time of one pass over 1 token
              (`measure_tree_pass_costs`: a `PassCosts` keyed by the node count n)
    speedup = plain decoding's time / tree decoding's time, same prompts, same repeat
              (`time_tree_decoding`)

Beside the times, each decoding run keeps what it counted (steps, tokens per step, nodes and draft
passes per step): counts are the draft's and the text's, times the machine's.
"""

from __future__ import annotations

import statistics
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

import torch

from .._validate import as_int_tuple, check_int
from ..decoding.chain import generate
from ..decoding.tree import tree_generate, tree_inputs
from ..models.gpt2 import unchecked
from ..tree_shapes import DynamicTree, TreeShape
from ..trees import Tree
from .costs import repeat_times
from .live import Repeats
from .verify_cost import PassCosts, _kernel_of, timing_setup


def complete_tree(n_nodes: int, branching: int = 2) -> Tree:
    """The first `n_nodes` nodes, breadth-first, of the tree where every node has `branching` children.

    Node i < branching hangs under the root; node i >= branching under node (i - branching) // branching.
    Node i holds token id i (siblings must differ; a pass's time does not depend on the ids).
    """
    n = check_int("n_nodes", n_nodes, 1, "tree nodes")
    b = check_int("branching", branching, 1, "children per node")
    parents = tuple(-1 if i < b else (i - b) // b for i in range(n))
    return Tree(parents=parents, tokens=tuple(range(n)))


@torch.no_grad()
def measure_tree_pass_costs(
    target: torch.nn.Module,
    n_nodes: Sequence[int],
    draft: torch.nn.Module | None = None,
    context: int = 64,
    repeats: int = 5,
    branching: int = 2,
    clock: str | None = None,
    generator: torch.Generator | None = None,
) -> PassCosts:
    """Time the target's pass over 1 token and its tree passes over n + 1 tokens (and the draft's over 1).

    The same protocol as `measure_pass_costs`, batch 1: every pass runs after `context` cached
    tokens (the cache rolled back before each), `repeats` paired repeats in a fixed order, each
    pass the unchecked one a decoding loop runs. A tree pass feeds [root, n nodes] with the tree
    mask and positions root + depth, as `score_tree` does, for `complete_tree(n, branching)`:
    its shape changes what each row attends to, not how many rows multiply every weight. The
    result's `ks` are the node counts, so `v(n)` is a tree pass over n + 1 tokens in one-token passes.
    """
    ns = as_int_tuple("n_nodes", n_nodes)
    if not ns or min(ns) < 1 or len(set(ns)) != len(ns):
        raise ValueError(f"n_nodes must hold distinct node counts >= 1, got {list(ns)}")
    if max(ns) > target.config.vocab_size:
        raise ValueError(f"n_nodes must be at most the vocabulary size {target.config.vocab_size} (node i holds "
                         f"token i), got {max(ns)}")
    check_int("context", context, 1, "cached tokens")
    check_int("repeats", repeats, 1, "paired repeats")
    trees = {n: complete_tree(n, branching) for n in ns}
    dev = target.device
    n_max = context + max(ns) + 1
    clock, generator = timing_setup(target, draft, clock, n_max, "context + max(n_nodes) + 1", generator)
    ids = torch.randint(0, target.config.vocab_size, (1, context + 1), generator=generator).to(dev)
    caches = {}
    for model in (target, draft):
        if model is not None:
            caches[id(model)] = cache = model.new_cache(1, max_len=n_max)
            model(ids[:, :context], cache=cache)

    def one_token(model: torch.nn.Module):
        cache, step = caches[id(model)], unchecked(model)

        def run() -> None:
            cache.truncate(context, check=False, bound=context)
            step(ids[:, context:], cache=cache)
        return run

    def tree_pass(tree: Tree):
        cache, step = caches[id(target)], unchecked(target)
        cache.truncate(context, check=False, bound=context)
        x, pos, mask = tree_inputs(target, cache, ids[:, context], [tree], [context])  # [1, n+1] each, mask [1, n+1, n+1]

        def run() -> None:
            cache.truncate(context, check=False, bound=context)
            step(x, cache=cache, position_ids=pos, attention_mask=mask)
        return run

    passes = {("t", 0): one_token(target), **{("t", n): tree_pass(trees[n]) for n in ns}}
    if draft is not None:
        passes[("d", 0)] = one_token(draft)
    times: dict[tuple[str, int], list[float]] = {key: [] for key in passes}
    for fn in passes.values():  # warm every path once
        fn()
    for _ in range(repeats):
        for key, fn in passes.items():
            times[key] += repeat_times(fn, dev, repeats=1, warmup=0, clock=clock)
    return PassCosts(ks=ns, one=tuple(times[("t", 0)]), verify={n: tuple(times[("t", n)]) for n in ns},
                     draft=None if draft is None else tuple(times[("d", 0)]), context=context, batch_size=1,
                     threads=torch.get_num_threads(), clock=clock, kernel=_kernel_of(target, max(ns) + 1))


@dataclass(frozen=True)
class DecodingRun:
    """One tree's decoding of the prompts, timed and counted.

    Counted over one repeat's runs (every repeat decodes the same tokens): steps are target
    passes after the prompt's, one per row-step at batch 1.
    """

    label: str
    spec: str  # the tree's repr
    times: Repeats  # seconds of each repeat, all prompts
    steps: int
    emitted: int  # new tokens, all prompts
    nodes: int  # tree nodes verified, all steps
    draft_passes: int
    same_as_plain: bool  # the run emitted plain greedy decoding's tokens

    @property
    def tokens_per_step(self) -> float:
        return self.emitted / self.steps

    @property
    def nodes_per_step(self) -> float:
        """Drafted tokens the target verified per pass (the pass scores one more: the root)."""
        return self.nodes / self.steps

    @property
    def draft_passes_per_step(self) -> float:
        return self.draft_passes / self.steps

    @property
    def step_times(self) -> Repeats:
        """Seconds per step of each repeat: the run's time / its steps (the prompt's pass included in the time)."""
        return Repeats(tuple(t / self.steps for t in self.times.times))

    @property
    def tokens_per_second(self) -> Repeats:
        """New tokens per second of each repeat, as a Repeats (its median is the median repeat's rate)."""
        return Repeats(tuple(self.emitted / t for t in self.times.times))


@dataclass(frozen=True)
class TreeTimings:
    """Plain decoding and every run of `time_tree_decoding`, repeat by repeat."""

    new_tokens: int
    prompts: int
    plain: Repeats
    runs: dict[str, DecodingRun]
    clock: str

    def speedups(self, label: str) -> tuple[float, ...]:
        """Plain time / this run's time, repeat by repeat (repeat i of each ran in the same round)."""
        return tuple(p / t for p, t in zip(self.plain.times, self.runs[label].times.times))

    def speedup(self, label: str) -> float:
        """The median of the paired speedups."""
        return statistics.median(self.speedups(label))

    def speedup_range(self, label: str) -> tuple[float, float]:
        s = self.speedups(label)
        return min(s), max(s)

    def plain_step(self) -> Repeats:
        """Seconds per token of plain decoding, each repeat (one token per step)."""
        return Repeats(tuple(t / (self.prompts * self.new_tokens) for t in self.plain.times))


@torch.no_grad()
def time_tree_decoding(
    target: torch.nn.Module,
    draft: torch.nn.Module,
    prompts: Sequence[torch.Tensor],  # each [1, P]
    new_tokens: int,
    trees: Mapping[str, TreeShape | DynamicTree],  # label -> the tree each step verifies
    repeats: int = 3,
    clock: str = "cpu",
) -> TreeTimings:
    """Greedy plain decoding and `tree_generate` with each tree, of the same prompts, one at a time, interleaved.

    Each repeat decodes every prompt plainly, then with each tree in turn, so a change in the
    machine's load falls on all of them; a short untimed run of each comes first (warm-up). A
    chain is the tree with one child per node (`TreeShape((1,) * k)`): it then runs through the
    same draft, the same target pass and the same greedy rule as any other tree, and only the
    shape differs. Greedy, so every run must emit the target's own tokens
    (`DecodingRun.same_as_plain` records that it did). `clock` as in `repeat_times`.
    """
    if isinstance(prompts, torch.Tensor) or not isinstance(prompts, Sequence) or not prompts:
        raise TypeError("prompts must be a non-empty list of [1, P] token-id tensors")
    for x in prompts:
        if not isinstance(x, torch.Tensor) or x.dim() != 2 or x.shape[0] != 1:
            raise ValueError(f"each prompt must be a [1, P] tensor, got {getattr(x, 'shape', type(x).__name__)}")
    n = check_int("new_tokens", new_tokens, 1, "tokens per prompt")
    check_int("repeats", repeats, 1, "timed rounds")
    if not isinstance(trees, Mapping) or not trees:
        raise ValueError("trees must map at least one label to a TreeShape or a DynamicTree")
    for label, spec in trees.items():
        if not isinstance(spec, (TreeShape, DynamicTree)):
            raise TypeError(f"trees[{label!r}] must be a TreeShape or a DynamicTree, got {spec!r}")
    if "plain" in trees:
        raise ValueError("'plain' names plain decoding: give the trees other labels")

    def plain(m: int) -> list[torch.Tensor]:
        return [generate(target, x, m, temperature=0.0) for x in prompts]

    def run(label: str, m: int) -> list:  # [(output [1, P + m], TreeSpecStats)] per prompt
        return [tree_generate(target, draft, x, trees[label], max_new_tokens=m, temperature=0.0) for x in prompts]

    plain(min(n, 4))  # warm-up: the allocator, the kernels, every code path
    for label in trees:
        run(label, min(n, 4))
    dev = target.device
    outputs: dict[str, list] = {}
    times: dict[str, list[float]] = {label: [] for label in ["plain", *trees]}

    def keep(key: str, fn):
        def call() -> None:
            outputs[key] = fn()
        return call

    for _ in range(repeats):
        times["plain"] += repeat_times(keep("plain", lambda: plain(n)), dev, repeats=1, warmup=0, clock=clock)
        for label in trees:
            times[label] += repeat_times(keep(label, lambda label=label: run(label, n)), dev, repeats=1, warmup=0,
                                         clock=clock)
    runs = {}
    for label, spec in trees.items():
        done = outputs[label]  # the last repeat's outputs and stats (every repeat decodes the same tokens)
        stats = [s for _, s in done]
        runs[label] = DecodingRun(
            label=label, spec=repr(spec), times=Repeats(tuple(times[label])), steps=sum(s.steps for s in stats),
            emitted=sum(s.emitted for s in stats), nodes=sum(s.nodes for s in stats),
            draft_passes=sum(s.draft_passes for s in stats),
            same_as_plain=all(torch.equal(out, ref) for (out, _), ref in zip(done, outputs["plain"])))
    return TreeTimings(new_tokens=n, prompts=len(prompts), plain=Repeats(tuple(times["plain"])), runs=runs,
                       clock=clock)
