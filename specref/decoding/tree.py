"""Tree speculative decoding with a model draft: grow a tree, score it in one target pass, keep one path (chapter 6).

One step (`tree_step`), per sequence:

1. The draft grows a tree (a `specref.drafts.TreeDraft`: `TreeModelDraft`, `EagleDraft`, ...; a `TreeGrower`):
   one draft pass per depth, each feeding the nodes grown so far with the tree attention mask.
2. The target scores [root, node_0 .. node_{N-1}] in one pass, with the tree mask
   and positions root + depth (`score_tree`). Row 0 is p after the context, row
   1 + i is p after node i.
3. `verify_tree_greedy` / `verify_tree` keep a root-to-leaf path and add one token.
4. The target's cache now holds the whole flattened tree after the context; only
   the accepted path survives, copied to consecutive slots (`keep_path`). Every
   node was written with position root + depth, which is exactly the position it
   has once the path is laid out as a sequence, so the cache is what decoding the
   path one token at a time would have built. The emitted token gets its entry
   when it is fed as the next step's root. A draft that reads the target's
   features observes the same rows: the root's and the accepted path's
   (`path_rows`), laid out as a sequence.

`tree_generate` is a loop over that step (`specref.decoding.loop.decode`). `commit_tree`
is step 4 for any tree-shaped result, lookahead's included.
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import partial

import torch

from .._validate import check_tensor
from ..drafts import ModelDraft, TreeDraft, as_tree_draft
from ..models.kvcache import KVCache
from ..sampling import SamplingParams
from ..tree_shapes import DynamicTree, TreeShape, as_tree_spec
from ..trees import Tree, TreeResult, stack_tree_masks, verify_tree, verify_tree_greedy
from .loop import Sequences, SpecStats, StepObserver, clock, decode, target_pass


def score_tree(
    model: torch.nn.Module,
    cache: KVCache,
    roots: torch.Tensor,  # [B] the last context token of each row (not yet in the cache)
    trees: list[Tree],
) -> torch.Tensor:  # [B, N+1, V]
    """One target pass over [root, flattened tree] per row, with the tree mask and positions root + depth.

    The cache must hold each row's context except its root; the root's position is
    therefore cache.lengths[b]. Row 0 of the result is the next-token logits after
    the context; row 1 + i those after node i. Rows with fewer nodes than the
    widest tree are padded (their extra rows are meaningless).
    """
    ids, pos, mask = tree_inputs(model, cache, roots, trees)
    return model(ids, cache=cache, position_ids=pos, attention_mask=mask)


def tree_inputs(
    model: torch.nn.Module, cache: KVCache, roots: torch.Tensor, trees: list[Tree], starts: list[int] | None = None
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:  # ids [B, N+1], positions [B, N+1], mask [B, N+1, N+1]
    """What `score_tree` feeds the model: [root, flattened tree] per row, positions root + depth, the tree mask.

    `starts` [B], the cache's lengths as the caller knows them on the host (the decoding loop
    does); None reads them back.
    """
    if not isinstance(cache, KVCache):
        raise TypeError(f"cache must be a KVCache, got {type(cache).__name__}")
    if not isinstance(trees, (list, tuple)) or not all(isinstance(t, Tree) for t in trees):
        raise TypeError("trees must be a list of specref.trees.Tree, one per row")
    roots = check_tensor("roots", roots)
    if roots.is_floating_point() or roots.is_complex() or roots.dtype == torch.bool:
        raise TypeError(f"roots must be an integer tensor of token ids, got {roots.dtype}")
    B = cache.batch_size
    if len(trees) != B or roots.shape != (B,):
        raise ValueError(f"the cache holds {B} rows: give {B} roots ([B]) and {B} trees, "
                         f"got roots {tuple(roots.shape)} and {len(trees)} trees")
    starts = cache.lengths.tolist() if starts is None else starts
    n_ctx = model.config.n_positions
    for b, t in enumerate(trees):
        if starts[b] + t.depth >= n_ctx:
            raise ValueError(f"row {b}: a tree of depth {t.depth} after the root at position {starts[b]} "
                             f"reaches past the context window n_positions={n_ctx}")
    mask, pos = stack_tree_masks(trees, starts, with_root=True)  # [B, T, T], [B, T]
    cache.check_room(pos.shape[1], "the tree")
    dev = cache.device
    ids = torch.zeros(pos.shape, dtype=torch.long, device=dev)
    ids[:, 0] = roots
    for b, t in enumerate(trees):
        if t.n_nodes:
            ids[b, 1 : 1 + t.n_nodes] = torch.tensor(t.tokens, device=dev)
    return ids, pos.to(dev), mask.to(dev)


def path_rows(
    rows: tuple[torch.Tensor, ...],  # ([B, N+1, C], ...) one pass's rows: the root's, then node i's at 1 + i
    paths: list[list[int]],  # [B] accepted node indices, depth 1 first
) -> tuple[torch.Tensor, ...]:  # ([B, 1 + longest path, C], ...)
    """The root's row, then the accepted path's, per row: what a sequential pass over the kept tokens gives.

    Shorter paths are padded with their last row; those positions lie past what the
    row keeps, so the draft's rollback drops them.
    """
    width = 1 + max(map(len, paths))
    index = [[0] + [1 + i for i in p] + [1 + p[-1] if p else 0] * (width - 1 - len(p)) for p in paths]
    idx = torch.tensor(index, dtype=torch.long, device=rows[0].device)  # [B, width]
    return tuple(r.gather(1, idx[..., None].expand(-1, -1, r.shape[-1])) for r in rows)


def keep_path(
    cache: KVCache,
    context_lengths: torch.Tensor,  # [B] tokens before each tree, root included
    paths: list[list[int]],  # accepted node indices per row, depth 1 first
) -> None:
    """Drop every tree node but the accepted path: node i sits at slot context + i; the path moves to context, context + 1, ...

    After this the cache holds context + path, laid out as if decoded one token at a time.
    """
    if len(paths) != cache.batch_size or context_lengths.shape != (cache.batch_size,):
        raise ValueError(f"give one path and one context length per cached row ({cache.batch_size})")
    kept = []
    contexts, held = torch.stack([context_lengths.to(cache.device), cache.lengths]).tolist()  # one read back
    for b, path in enumerate(paths):
        c = contexts[b]
        if c > held[b]:
            raise ValueError(f"row {b}: context length {c} exceeds the cache length {held[b]}")
        slots = [c + i for i in path]
        if any(s >= held[b] for s in slots):
            raise ValueError(f"row {b}: path {path} refers to nodes the cache does not hold "
                             f"(it holds {held[b] - c} slots after the context)")
        kept.append(list(range(c)) + slots)
    cache.compact(kept)


@dataclass
class TreeSpecStats(SpecStats):
    """SpecStats for trees: `proposed` counts tree nodes (nodes_per_step: what one target pass verified) and
    `examined` the children the rule tried, so acceptance_rate is accepted / tried children."""

    tree: str = ""

    @property
    def nodes(self) -> int:
        """Tree nodes verified, over row-steps (what `proposed` counts for a tree)."""
        return self.proposed

    @property
    def nodes_per_step(self) -> float:
        """Mean number of tree nodes a target pass verified per sequence."""
        return self.nodes / max(self.steps, 1)

    def as_dict(self) -> dict[str, float | int | list[int] | str]:
        d = super().as_dict()
        d.update(tree=self.tree, nodes=self.nodes, nodes_per_step=self.nodes_per_step)
        return d


@dataclass(frozen=True)
class TreeStep:
    """What one `tree_step` did (rows that were already done keep nothing)."""

    trees: list[Tree]  # [B] the draft's trees
    logits: torch.Tensor  # [B, N+1, V] the target's pass: row 0 after the context, row 1 + i after node i
    results: list[TreeResult]  # [B] the accepted path and the emitted tokens
    kept: list[int]  # [B] tokens each row appended: n_accepted + 1, cut by the budget or at EOS


@torch.no_grad()
def tree_step(
    target: torch.nn.Module,
    draft: TreeDraft,
    seqs: Sequences,
    cache: KVCache,  # the target's: every token of each row but its last
    spec: TreeShape | DynamicTree,
    params: SamplingParams,
    generator: torch.Generator | None = None,
    eos_token_id: int | None = None,
    stats: TreeSpecStats | None = None,
) -> TreeStep:
    """One tree step for every unfinished row: grow a tree, one target pass, keep one path, commit.

    Near the end of the budget the tree is made shallower, and near the end of the
    context window smaller, so nothing is drafted that could never be emitted or stored.
    """
    stats = TreeSpecStats(k=spec.depth) if stats is None else stats
    dev = seqs.tokens.device
    max_depth = max(0, seqs.tokens_left() - 1)  # the last token always comes from the target
    # Context + root + nodes fit the window and the cache (allocated once for the run: it never grows).
    max_nodes = max(0, min(target.config.n_positions, cache.max_len) - max(seqs.lengths_h))
    # 1. Draft: one tree per row.
    passes = draft.passes
    with clock(stats, "time_draft", dev):
        trees = draft.propose_tree(seqs.tokens, seqs.lengths, spec, params, generator, max_depth, max_nodes)
    stats.draft_passes += draft.passes - passes
    # 2. One target pass over [root, flattened tree] per row (and its features, for a draft that reads them).
    with clock(stats, "time_target", dev):
        starts = [n - 1 for n in seqs.lengths_h]  # the cache holds every token but the last
        ids, pos, mask = tree_inputs(target, cache, seqs.last_tokens()[:, 0], trees, starts)  # as `score_tree` does
        logits, features = target_pass(target, draft.feature_layers, ids, cache=cache, position_ids=pos,
                                       attention_mask=mask)
    stats.target_passes += 1
    # 3. Walk down each tree: keep one root-to-leaf path, then one token from the target.
    with clock(stats, "time_verify", dev):
        results = [verify_tree_greedy(t, logits[b, : t.n_nodes + 1]) if params.greedy
                   else verify_tree(t, params.probs(logits[b, : t.n_nodes + 1]), generator)
                   for b, t in enumerate(trees)]
    # 4. Commit the kept tokens; the target's cache keeps context + root + the accepted path only.
    if features is not None:  # the root (position lengths - 1) and the accepted path; rollback keeps what a row kept
        draft.observe(path_rows(features, [r.path for r in results]), seqs.lengths - 1)
    kept, n_valid = commit_tree(seqs, cache, trees, results, seqs.lengths, eos_token_id, stats)
    draft.rollback(n_valid)
    return TreeStep(trees, logits, results, kept)


def commit_tree(
    seqs: Sequences,
    cache: KVCache,  # the target's, after a pass over [root, nodes] per row
    trees: list[Tree],  # [B] what each row verified
    results: list[TreeResult],  # [B] each row's accepted path and emitted tokens
    contexts: torch.Tensor,  # [B] tokens before each row's tree, its root included (see `keep_path`)
    eos_token_id: int | None,
    stats: SpecStats,
    offsets: list[int] | None = None,  # [B] pass entries between the root and each row's tree (default 0)
    release_done: bool = False,  # let finished rows hold no cache (room for the others)
) -> tuple[list[int], torch.Tensor]:  # kept [B], n_valid [B] (see `Sequences.commit`)
    """Step 4 of any tree-shaped step: append each row's emitted tokens, keep context + root + accepted path.

    The accepted path moves to consecutive slots after the root (`keep_path`); a cut by the
    budget or EOS keeps less. Counts the step over the rows it served: the tree's nodes as
    proposed, the children the rule tried as examined.
    """
    width = max(len(r.tokens) for r in results)
    out_h = [r.tokens + [0] * (width - len(r.tokens)) for r in results]
    out = torch.tensor(out_h, dtype=torch.long, device=seqs.tokens.device)  # [B, width]
    kept, n_valid = seqs.commit(out, [r.n_accepted for r in results], eos_token_id, out_h)
    shift = offsets or [0] * len(results)
    paths = [[s + i for i in r.path] if m else [] for r, m, s in zip(results, kept, shift)]
    if any(paths):
        keep_path(cache, contexts, paths)
    else:  # nothing accepted: keeping context + root is a truncation, no copy (the pass wrote past it)
        cache.truncate(contexts, check=False)
    ends = torch.minimum(cache.lengths, seqs.lengths.to(cache.device) - 1)  # a cut by budget or EOS keeps less
    if release_done:
        ends = torch.where(torch.tensor(seqs.done_h, device=cache.device), 0, ends)
    # ends <= lengths, by the minimum; the bound counts only the rows that keep their cache (a released row is 0)
    live = [n - 1 for n, done in zip(seqs.lengths_h, seqs.done_h) if not (release_done and done)]
    cache.truncate(ends, check=False, bound=max(live, default=0))
    served = [b for b, m in enumerate(kept) if m]
    stats.count_step([results[b].n_accepted for b in served], sum(kept), sum(trees[b].n_nodes for b in served),
                     sum(len(results[b].trials) for b in served))  # examined: the children the rule tried
    return kept, n_valid


@torch.no_grad()
def tree_generate(
    target: torch.nn.Module,
    draft: torch.nn.Module | ModelDraft | TreeDraft,
    input_ids: torch.Tensor,  # [B, T] or [T]
    tree: TreeShape | DynamicTree | tuple[int, ...] | int,
    max_new_tokens: int = 64,
    temperature: float = 1.0,
    top_k: int | None = None,
    top_p: float | None = None,
    generator: torch.Generator | None = None,
    eos_token_id: int | None = None,
    on_step: StepObserver | None = None,
    timing: bool | None = None,
) -> tuple[torch.Tensor, TreeSpecStats]:  # [B, T + max_new_tokens], stats
    """Tree speculative decoding: the output distribution is exactly the target's (greedy: the same tokens).

    `tree` is a static shape (a tuple of branching factors or a TreeShape, top-k or
    sampled children) or a dynamic tree (an int node budget or a DynamicTree).
    Exactly `max_new_tokens` tokens per row unless it emits `eos_token_id`.
    `on_step(step)`, if given, sees each step's `TreeStep` (`specref.decoding.loop.decode`);
    `timing` as in `speculative_generate`.
    """
    spec = as_tree_spec(tree)
    drafter = as_tree_draft(draft)
    stats = TreeSpecStats(k=spec.depth, tree=repr(spec))
    step = partial(tree_step, target, drafter, spec=spec, generator=generator, eos_token_id=eos_token_id, stats=stats)
    # Room for a full tree past the budget; `tree_step` cuts a draft's tree to the room the cache has. A dynamic
    # tree's draft scores every candidate it grows (at most beam x top_k per level) before the budget keeps
    # n_nodes of them, and its cache holds them all until the step rolls it back.
    room = spec.n_nodes
    if isinstance(spec, DynamicTree):
        room += spec.max_depth * spec.beam * spec.top_k
    out = decode(target, input_ids, max_new_tokens, (temperature, top_k, top_p), generator, eos_token_id, step,
                 stats, room=room, draft=drafter, on_step=on_step, timing=timing)
    return out, stats
