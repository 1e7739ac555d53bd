"""A draft with its own KV cache over the buffer's rows: catching up with the context, and feeding a tree.

`CachedDraft` keeps `cache` (a `KVCache`) and `fed` [B], how many leading cache rows hold
true inputs. Cache row s reads buffer token s + `lag` (a model draft: lag 0; EAGLE: row s
reads x_{s+1}, lag 1), so after a verification a row of n_valid kept tokens keeps the
rows s < n_valid - lag. `catch_up(upto)` makes the cache take rows fed .. upto-1 in one
pass, a row needing fewer re-feeding its last cached rows (identical K/V, no padding
tokens). A tree grows by a `TreeGrower` the draft drives (`tree_grower`): depth 1 from the
logits after the context, each deeper one from a masked pass over the ancestors of the nodes
being expanded (`feed_ancestors`), after the context's rows; `tree_result` leaves the cache
at the context.
"""

from __future__ import annotations

import torch

from ..models.kvcache import KVCache
from ..sampling import SamplingParams
from ..tree_shapes import TreeGrower, TreeSpec
from ..trees import Tree, ancestor_inputs
from .base import DraftBase

FIRST_CACHE_LEN = 32  # the cache's first size in rows; it doubles as rows grow


def pick(x: torch.Tensor, index: torch.Tensor) -> torch.Tensor:  # [B, W, D], [B, n] -> [B, n, D]
    """x[b, index[b, j]] for every row b."""
    return x.gather(1, index[..., None].expand(-1, -1, x.shape[-1]))


class CachedDraft(DraftBase):
    """A draft whose `cache_module` (a model or a layer, with `new_cache`) keeps a KV cache of `window` rows at most."""

    cache_module: torch.nn.Module
    window: int  # the most cache rows (the context window)
    lag: int = 0  # cache row s reads buffer token s + lag
    cache: KVCache | None = None
    fed: torch.Tensor | None = None  # [B] leading cache rows with true inputs

    def begin(self, batch_size: int) -> None:
        super().begin(batch_size)
        # Small at first, grown as the rows do: a batch of thousands would otherwise hold the whole window at once.
        self.cache = self.cache_module.new_cache(batch_size, max_len=min(FIRST_CACHE_LEN, self.window))
        self.fed = torch.zeros(batch_size, dtype=torch.long, device=self.cache.device)

    def rollback(self, n_valid: torch.Tensor) -> None:  # [B]
        super().rollback(n_valid)
        self.fed = torch.minimum(self.fed, (n_valid.to(self.fed.device) - self.lag).clamp(min=0))
        self.cache.truncate(self.fed)

    def room(self, n_new: int) -> None:
        """Grow the cache, if it must, to take `n_new` more rows in every row (at most the window)."""
        self.cache.make_room(n_new, limit=self.window)

    def catch_up(self, upto: torch.Tensor) -> torch.Tensor:  # [B] -> rows [B, W]
        """The rows to feed so that the cache holds rows 0 .. upto[b]-1: W = the widest gap (>= 1), ending at upto.

        Truncates the cache to each row's first fed row and makes room for W. A row whose
        upto is below W starts at 0 and its rows past upto - 1 are padding (the caller feeds
        them the last true row's inputs and truncates them away); `fed` becomes upto.
        """
        width = int((upto - self.fed).max().clamp(min=1))
        start = (upto - width).clamp(min=0)  # [B]
        self.cache.truncate(start)
        self.room(width)
        self.fed = upto.clone()
        return start[:, None] + torch.arange(width, device=upto.device)

    def tree_grower(
        self,
        spec: TreeSpec,
        root_logits: torch.Tensor,  # [B, 1, V] the draft's logits after the context
        context: torch.Tensor,  # [B] cache rows of the context
        params: SamplingParams,
        generator: torch.Generator | None,
        max_depth: int | None,
        max_nodes: int | None,
    ) -> TreeGrower:
        """A `TreeGrower` for one tree per row after the context, depth 1 grown from root_logits.

        Its node budget is cut to the rows the window has left after the context, since
        every node is fed as a cache row to grow the next depth.
        """
        room = self.window - self.lag - int(context.max())  # node rows follow the context's
        max_nodes = room if max_nodes is None else min(max_nodes, room)
        grower = TreeGrower(spec, self.begun(), params, generator, max_depth=max_depth, max_nodes=max_nodes)
        if not grower.done:
            grower.grow(root_logits)
        return grower

    def feed_ancestors(
        self, grower: TreeGrower, context: torch.Tensor  # [B] cache rows of the context
    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, list[list[int]], torch.Tensor]:
        """What the next depth's pass feeds (`specref.trees.ancestor_inputs`): ids, rows, mask, nodes, index.

        The nodes fed are the ancestors-closed set of the frontier, after the context's rows.
        The cache is reset to the context first: cached rows are visible to every new row, and
        siblings must not see each other.
        """
        self.cache.truncate(context)
        ids, rows, mask, nodes, index = ancestor_inputs(grower.trees, grower.frontier, (context - 1).tolist())
        self.room(rows.shape[1])
        self.cache.check_room(rows.shape[1], "the draft tree")
        dev = context.device
        return ids.to(dev), rows.to(dev), mask.to(dev), nodes, index.to(dev)

    def tree_result(self, grower: TreeGrower, context: torch.Tensor) -> list[Tree]:  # context [B]
        """The grown trees; the cache goes back to the context (tree rows never stay)."""
        self.cache.truncate(context)
        return grower.result()
