"""A smaller language model as the draft, with its own KV cache: a chain of k tokens (`ModelDraft`) or a tree
(`TreeModelDraft`) per step (chapters 4-6)."""

from __future__ import annotations

import torch

from .._validate import check_int
from ..sampling import SamplingParams
from ..trees import ROOT, Tree, stack_tree_masks
from .base import Draft, TreeDraft, draw
from .shapes import DynamicTree, TreeShape, grow_trees


FIRST_CACHE_LEN = 32  # the draft cache's first size in tokens per row; it doubles as rows grow


class ModelDraft(Draft):
    """A smaller language model as draft: k autoregressive steps with its own KV cache.

    The cache holds the first `fed[b]` tokens of each row. Tokens not yet fed (the
    target's correction, or the last accepted draft) are fed at the next `propose`;
    rows needing fewer re-feed their last cached tokens, which rewrites identical
    K/V and keeps the batch rectangular without padding tokens.
    """

    def __init__(self, model: torch.nn.Module) -> None:
        if getattr(getattr(model, "config", None), "vocab_size", None) is None:
            raise TypeError(f"the draft must be a GPT2-like model (with config.vocab_size), got {type(model).__name__}")
        self.model = model
        self.vocab_size = int(model.config.vocab_size)
        self.cache = None
        self.fed: torch.Tensor | None = None  # [B]

    def begin(self, batch_size: int) -> None:
        # Small at first, grown as the rows do (`_room`): a batch of thousands would otherwise hold the
        # whole window from the start (1 GB at B = 2,000 in float64 for the bundled 1-layer draft's 256).
        self.cache = self.model.new_cache(batch_size, max_len=min(FIRST_CACHE_LEN, self.model.config.n_positions))
        self.fed = torch.zeros(batch_size, dtype=torch.long, device=self.model.device)

    @torch.no_grad()
    def propose(
        self,
        tokens: torch.Tensor,  # [B, L]
        lengths: torch.Tensor,  # [B]
        k: int,
        params: SamplingParams,
        generator: torch.Generator | None = None,
    ) -> tuple[torch.Tensor, torch.Tensor]:
        if self.cache is None or self.fed is None:
            raise RuntimeError("call begin(batch_size) before propose")
        k = check_int("k", k, 0, "tokens to propose")
        B, V = tokens.shape[0], self.vocab_size
        dev = tokens.device
        if k == 0:
            return tokens.new_zeros((B, 0)), torch.zeros((B, 0, V), device=dev)
        logits = self._catch_up(tokens, lengths)  # [B, V]
        drafts, qs = [], []
        for i in range(k):
            if params.greedy:  # q is one-hot on the argmax; build it once, after the loop
                x = logits.argmax(-1)
            else:
                x, q = self._draw(logits, params, generator)
                qs.append(q)
            drafts.append(x)
            if i < k - 1:  # the last draft is never fed: the target scores it
                self._room(1)
                logits = self.model(x[:, None], cache=self.cache)[:, -1]
        self.fed = lengths + (k - 1)
        x = torch.stack(drafts, 1)  # [B, k]
        if params.greedy:
            return x, torch.nn.functional.one_hot(x, V).to(logits.dtype)
        return x, torch.stack(qs, 1)

    def _draw(
        self, logits: torch.Tensor, params: SamplingParams, generator: torch.Generator | None
    ) -> tuple[torch.Tensor, torch.Tensor]:  # [B, V] -> x [B], q [B, V]
        """One sampled draft: x ~ q = process_logits(logits), and the q it was drawn from (`draw`).

        The one place a broken draft (`specref.checks.broken`) changes to break the contract.
        """
        return draw(logits, params, generator)

    def _catch_up(self, tokens: torch.Tensor, lengths: torch.Tensor) -> torch.Tensor:  # [B, L], [B] -> [B, V]
        """Feed each row's tokens the cache has not seen, in one pass: the logits after the whole context.

        Rows needing fewer re-feed their last cached tokens, which rewrites identical K/V
        and keeps the batch rectangular without padding tokens.
        """
        width = int((lengths - self.fed).max().clamp(min=1))
        start = lengths - width  # [B]
        self.cache.truncate(start)
        self._room(width)
        chunk = tokens.gather(1, start[:, None] + torch.arange(width, device=tokens.device))  # [B, width]
        return self.model(chunk, cache=self.cache, logits_to_keep=1)[:, -1]

    def _room(self, n_new: int) -> None:
        """Grow the cache, if it must, to take `n_new` more tokens in every row (at most the model's window)."""
        self.cache.make_room(n_new, limit=self.model.config.n_positions)

    def rollback(self, n_valid: torch.Tensor) -> None:  # [B]
        if self.fed is None:
            raise RuntimeError("call begin(batch_size) before rollback")
        self.fed = torch.minimum(self.fed, n_valid)
        self.cache.truncate(self.fed)


def as_draft(draft: object) -> Draft:
    """Wrap a bare model as a `ModelDraft`; pass `Draft` objects through."""
    if isinstance(draft, Draft):
        return draft
    if isinstance(draft, torch.nn.Module) and hasattr(draft, "new_cache"):
        return ModelDraft(draft)
    raise TypeError(f"draft must be a Draft or a GPT2-like model with new_cache(), got {type(draft).__name__}")


class TreeModelDraft(ModelDraft, TreeDraft):
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
        """One tree per row after its context, grown by `grow_trees` (one draft pass per depth)."""
        if self.cache is None or self.fed is None:
            raise RuntimeError("call begin(batch_size) before propose")
        dev = tokens.device
        root_logits = self._catch_up(tokens, lengths)[:, None]  # [B, 1, V]
        self.passes += 1
        self.fed = lengths.clone()
        context = lengths.clone()
        # The draft's room: context + fed nodes must fit its window.
        room = self.model.config.n_positions - int(context.max())
        max_nodes = room if max_nodes is None else min(max_nodes, room)

        def draft_logits(trees: list[Tree], frontier: list[list[int]]) -> torch.Tensor:  # [B, n, V]
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
            mask, pos = stack_tree_masks(subtrees, (context - 1).tolist(), with_root=False)  # [B, T, T], [B, T]
            self._room(pos.shape[1])
            self.cache.check_room(pos.shape[1], "the draft tree")
            ids = torch.zeros(pos.shape, dtype=torch.long, device=dev)
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


def as_tree_draft(draft: object) -> TreeDraft:
    """A tree draft: pass a `TreeDraft` through; wrap a `ModelDraft`'s model or a bare model as a `TreeModelDraft`."""
    if isinstance(draft, TreeDraft):
        return draft
    if isinstance(draft, ModelDraft):
        return TreeModelDraft(draft.model)
    if isinstance(draft, torch.nn.Module) and hasattr(draft, "new_cache"):
        return TreeModelDraft(draft)
    raise TypeError(
        f"tree drafting needs a TreeDraft, a draft model (a GPT2-like module) or a ModelDraft, "
        f"got {type(draft).__name__}"
    )
