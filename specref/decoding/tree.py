"""Tree speculative decoding with a model draft: grow a tree, score it in one target pass, keep one path.

One step, per sequence:

1. The draft grows a tree (`specref.trees.grow_trees`): one draft pass per depth,
   each feeding the nodes grown so far with the tree attention mask.
2. The target scores [root, node_0 .. node_{N-1}] in one pass, with the tree mask
   and positions root + depth (`score_tree`). Row 0 is p after the context, row
   1 + i is p after node i.
3. `verify_tree_greedy` / `verify_tree` keep a root-to-leaf path and add one token.
4. The target's cache now holds the whole flattened tree after the context; only
   the accepted path survives, copied to consecutive slots (`keep_path`). Every
   node was written with position root + depth, which is exactly the position it
   has once the path is laid out as a sequence, so the cache is what decoding the
   path one token at a time would have built. The emitted token gets its entry
   when it is fed as the next step's root.
"""

from __future__ import annotations

import time
from dataclasses import dataclass

import numpy as np
import torch

from .chain import SpecStats, _check_common, _finish, _new_buffer, _prefill, _sync
from ..drafts import ModelDraft
from ..sampling import SamplingParams
from ..models.kvcache import KVCache
from ..trees import (
    ROOT,
    DynamicTree,
    Tree,
    TreeShape,
    as_tree_spec,
    grow_trees,
    tree_attention_mask,
    tree_position_ids,
    verify_tree,
    verify_tree_greedy,
)


def _pad_masks_and_positions(
    trees: list[Tree], starts: list[int], with_root: bool
) -> tuple[torch.Tensor, torch.Tensor, int]:  # mask [B, T, T], positions [B, T], T
    """Stack per-row tree masks and positions; rows with fewer nodes get padding entries that see only themselves."""
    extra = 1 if with_root else 0
    T = max(t.n_nodes for t in trees) + extra
    B = len(trees)
    mask = torch.eye(T, dtype=torch.bool).repeat(B, 1, 1)
    pos = torch.zeros((B, T), dtype=torch.long)
    for b, (tree, s) in enumerate(zip(trees, starts)):
        n = tree.n_nodes + extra
        mask[b, :n, :n] = tree_attention_mask(tree, with_root=with_root)
        pos[b, :n] = tree_position_ids(tree, s, with_root=with_root)
        pos[b, n:] = s + extra  # padding: a valid position; nothing attends to it and it is dropped
    return mask, pos, T


def _check_cache_room(cache: KVCache, T: int, what: str) -> None:
    need = int(cache.lengths.max()) + T
    if need > cache.max_len:
        raise ValueError(
            f"{what} needs {T} new cache slots after {int(cache.lengths.max())} cached tokens, "
            f"but the cache holds at most max_len={cache.max_len}: use a smaller tree near the end of the window"
        )


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
    if not isinstance(cache, KVCache):
        raise TypeError(f"cache must be a KVCache, got {type(cache).__name__}")
    if not isinstance(trees, (list, tuple)) or not all(isinstance(t, Tree) for t in trees):
        raise TypeError("trees must be a list of specref.trees.Tree, one per row")
    B = cache.batch_size
    if len(trees) != B or roots.shape != (B,):
        raise ValueError(f"the cache holds {B} rows: give {B} roots ([B]) and {B} trees, "
                         f"got roots {tuple(roots.shape)} and {len(trees)} trees")
    starts = cache.lengths.tolist()
    n_ctx = model.config.n_positions
    for b, t in enumerate(trees):
        if starts[b] + t.depth >= n_ctx:
            raise ValueError(f"row {b}: a tree of depth {t.depth} after the root at position {starts[b]} "
                             f"reaches past the context window n_positions={n_ctx}")
    mask, pos, T = _pad_masks_and_positions(trees, starts, with_root=True)
    _check_cache_room(cache, T, "the tree")
    dev = cache.device
    ids = torch.zeros((B, T), dtype=torch.long, device=dev)
    ids[:, 0] = roots
    for b, t in enumerate(trees):
        if t.n_nodes:
            ids[b, 1 : 1 + t.n_nodes] = torch.tensor(t.tokens, device=dev)
    return model(ids, cache=cache, position_ids=pos.to(dev), attention_mask=mask.to(dev))


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
    for b, path in enumerate(paths):
        c = int(context_lengths[b])
        if c > int(cache.lengths[b]):
            raise ValueError(f"row {b}: context length {c} exceeds the cache length {int(cache.lengths[b])}")
        slots = [c + i for i in path]
        if any(s >= int(cache.lengths[b]) for s in slots):
            raise ValueError(f"row {b}: path {path} refers to nodes the cache does not hold "
                             f"(it holds {int(cache.lengths[b]) - c} slots after the context)")
        kept.append(list(range(c)) + slots)
    cache.compact(kept)


class TreeModelDraft(ModelDraft):
    """A smaller language model that grows one draft tree per row, with its own KV cache.

    At each step the cache is brought up to the context (tokens not yet fed are fed
    in one pass, which gives q after the context), then each depth is one pass that
    feeds the tree's nodes needed so far (the ancestors of the nodes being expanded)
    with the tree mask, after the context. `rollback` forgets all tree entries.
    It shares `ModelDraft`'s cache bookkeeping (`begin`, `rollback`); only `propose`
    differs: it grows a tree instead of a chain.
    """

    def __init__(self, model: torch.nn.Module) -> None:
        if not (isinstance(model, torch.nn.Module) and hasattr(model, "new_cache")):
            raise TypeError(f"the tree draft must be a GPT2-like model with new_cache(), got {type(model).__name__}")
        super().__init__(model)
        self.passes = 0

    @torch.no_grad()
    def propose(
        self,
        tokens: torch.Tensor,  # [B, L] buffer; row b holds lengths[b] valid tokens
        lengths: torch.Tensor,  # [B]
        spec: TreeShape | DynamicTree,
        params: SamplingParams,
        generator: torch.Generator | None = None,
        max_depth: int | None = None,
        max_nodes: int | None = None,
    ) -> list[Tree]:
        if self.cache is None or self.fed is None:
            raise RuntimeError("call begin(batch_size) before propose")
        dev = tokens.device
        width = int((lengths - self.fed).max().clamp(min=1))
        start = lengths - width  # rows needing fewer re-feed their last cached tokens (identical K/V)
        self.cache.truncate(start)
        chunk = tokens.gather(1, start[:, None] + torch.arange(width, device=dev))
        root_logits = self.model(chunk, cache=self.cache, logits_to_keep=1)  # [B, 1, V]
        self.passes += 1
        self.fed = lengths.clone()
        context = lengths.clone()
        # The draft's room: context + fed nodes must fit its window.
        room = self.model.config.n_positions - int(context.max())
        max_nodes = room if max_nodes is None else min(max_nodes, room)

        def draft_logits(trees: list[Tree], frontier: list[list[int]]) -> torch.Tensor:
            if all(f == [ROOT] for f in frontier):
                return root_logits
            # Feed the ancestors-closed set of the frontier; the cache is reset to the context first,
            # because cached entries are visible to every new token and siblings must not see each other.
            subtrees, index = [], []
            for t, f in zip(trees, frontier):
                need = sorted({a for n in f for a in t.path(n)})
                subtrees.append(t.subtree(need))
                index.append([need.index(n) for n in f])
            self.cache.truncate(context)
            mask, pos, T = _pad_masks_and_positions(subtrees, (context - 1).tolist(), with_root=False)
            _check_cache_room(self.cache, T, "the draft tree")
            ids = torch.zeros((len(trees), T), dtype=torch.long, device=dev)
            for b, s in enumerate(subtrees):
                ids[b, : s.n_nodes] = torch.tensor(s.tokens, device=dev)
            logits = self.model(ids, cache=self.cache, position_ids=pos.to(dev), attention_mask=mask.to(dev))
            self.passes += 1
            rows = torch.tensor(index, device=dev)  # [B, n]
            return logits.gather(1, rows[..., None].expand(-1, -1, logits.shape[-1]))

        trees = grow_trees(spec, draft_logits, tokens.shape[0], params, generator,
                           max_depth=max_depth, max_nodes=max_nodes)
        self.cache.truncate(context)
        return trees


@dataclass
class TreeSpecStats(SpecStats):
    """SpecStats for trees: `proposed` counts tree nodes (nodes_per_step: what one target pass verified) and
    `examined` the children the rule tried, so acceptance_rate is accepted / tried children."""

    tree: str = ""
    nodes: int = 0  # tree nodes verified, over row-steps

    @property
    def nodes_per_step(self) -> float:
        """Mean number of tree nodes a target pass verified per sequence."""
        return self.nodes / max(self.steps, 1)

    def as_dict(self) -> dict[str, float | int | list[int] | str]:
        d = super().as_dict()
        d.update(tree=self.tree, nodes=self.nodes, nodes_per_step=self.nodes_per_step)
        return d


def _as_model(draft: object) -> torch.nn.Module:
    if isinstance(draft, TreeModelDraft):
        return draft.model
    if isinstance(draft, ModelDraft):
        return draft.model
    if isinstance(draft, torch.nn.Module) and hasattr(draft, "new_cache"):
        return draft
    raise TypeError(
        f"tree drafting needs a draft model (a GPT2-like module or a ModelDraft), got {type(draft).__name__}"
    )


@torch.no_grad()
def tree_generate(
    target: torch.nn.Module,
    draft: torch.nn.Module | ModelDraft | TreeModelDraft,
    input_ids: torch.Tensor,  # [B, T] or [T]
    tree: TreeShape | DynamicTree | tuple[int, ...] | int,
    max_new_tokens: int = 64,
    temperature: float = 1.0,
    top_k: int | None = None,
    top_p: float | None = None,
    generator: torch.Generator | None = None,
    eos_token_id: int | None = None,
) -> tuple[torch.Tensor, TreeSpecStats]:  # [B, T + max_new_tokens], stats
    """Tree speculative decoding: the output distribution is exactly the target's (greedy: the same tokens).

    `tree` is a static shape (a tuple of branching factors or a TreeShape, top-k or
    sampled children) or a dynamic tree (an int node budget or a DynamicTree).
    Exactly `max_new_tokens` tokens per row unless it emits `eos_token_id`. Near the
    end of the budget the tree is made shallower, and near the end of the context
    window smaller, so that nothing is drafted that could never be emitted or stored.
    """
    spec = as_tree_spec(tree)
    params = SamplingParams(temperature, top_k, top_p)  # raises on bad sampling arguments
    model = _as_model(draft)
    drafter = draft if isinstance(draft, TreeModelDraft) else TreeModelDraft(model)
    if drafter.vocab_size != target.config.vocab_size:
        raise ValueError(f"draft and target vocabularies differ ({drafter.vocab_size} vs "
                         f"{target.config.vocab_size}): they must share one tokenizer")
    if model.device != target.device:
        raise ValueError(f"target is on {target.device} but the draft is on {model.device}: put both on one device")
    input_ids = _check_common(target, input_ids, max_new_tokens, "the target")
    dev = target.device
    B, T = input_ids.shape
    n_ctx = target.config.n_positions
    stats = TreeSpecStats(k=spec.depth, accepted_hist=np.zeros(spec.depth + 1, dtype=np.int64), tree=repr(spec))
    tokens, lengths, done = _new_buffer(input_ids, max_new_tokens)
    if max_new_tokens == 0:
        return tokens, stats

    t_start = time.perf_counter()
    cache = target.new_cache(B)
    drafter.begin(B)
    passes_before = drafter.passes
    _prefill(target, input_ids, cache, stats)  # the last prompt token is fed as the first root

    while not bool(done.all()):
        remaining = T + max_new_tokens - lengths  # [B]
        room = int(remaining[~done].max())
        max_depth = max(0, room - 1)  # the last token always comes from the target
        max_nodes = max(0, n_ctx - int(lengths.max()))  # context + root + nodes must fit the window

        _sync(dev)
        t0 = time.perf_counter()
        trees = drafter.propose(tokens, lengths, spec, params, generator, max_depth, max_nodes)
        _sync(dev)
        stats.time_draft += time.perf_counter() - t0

        t0 = time.perf_counter()
        roots = tokens.gather(1, (lengths - 1)[:, None])[:, 0]
        logits = score_tree(target, cache, roots, trees)  # [B, N+1, V]
        _sync(dev)
        stats.time_target += time.perf_counter() - t0
        stats.target_passes += 1

        t0 = time.perf_counter()
        results = []
        for b, t in enumerate(trees):
            rows = logits[b, : t.n_nodes + 1]
            if params.greedy:
                results.append(verify_tree_greedy(t, rows))
            else:
                results.append(verify_tree(t, params.probs(rows), generator))
        stats.time_verify += time.perf_counter() - t0  # the rules return Python lists: nothing left to sync
        n_acc = torch.tensor([r.n_accepted for r in results], device=dev)
        n_out = torch.minimum(n_acc + 1, remaining)
        hit_eos = torch.zeros_like(done)
        if eos_token_id is not None:
            for b, r in enumerate(results):
                if eos_token_id in r.tokens[: int(n_out[b])]:
                    n_out[b] = r.tokens.index(eos_token_id) + 1
                    hit_eos[b] = True
        n_out = torch.where(done, torch.zeros_like(n_out), n_out)

        active = ~done
        stats.steps += int(active.sum())
        stats.nodes += sum(t.n_nodes for b, t in enumerate(trees) if active[b])
        stats.proposed = stats.nodes
        # The children the rule actually tried: the tree's analogue of the chain's examined drafts.
        stats.examined += sum(len(r.trials) for b, r in enumerate(results) if active[b])
        stats.accepted += int(n_acc[active].sum())
        stats.emitted += int(n_out.sum())
        for b in torch.nonzero(active).flatten().tolist():
            stats.accepted_hist[int(n_acc[b])] += 1

        for b in torch.nonzero(n_out).flatten().tolist():
            s, n = int(lengths[b]), int(n_out[b])
            tokens[b, s : s + n] = torch.tensor(results[b].tokens[:n], device=dev)
        # Keep context + root + accepted path; done rows keep their context only.
        paths = [r.path if not done[b] else [] for b, r in enumerate(results)]
        keep_path(cache, lengths, paths)
        lengths = lengths + n_out
        cache.truncate(torch.minimum(cache.lengths, lengths - 1))  # a cut by budget or EOS keeps less
        done = done | hit_eos | (lengths >= T + max_new_tokens)
        drafter.rollback(torch.minimum(drafter.fed, lengths))

    stats.draft_passes = drafter.passes - passes_before
    stats.time_total = time.perf_counter() - t_start
    return _finish(tokens, lengths, eos_token_id), stats
