"""A draft's own KV cache over the buffer's rows: catching up with the context, rolling back, feeding a tree.

`DraftCache` is a part a draft holds (a model draft's whole model, EAGLE's one layer): `kv`
(a `KVCache`) and `fed` [B], how many leading cache rows hold true inputs. Cache row s reads
buffer token s + `lag` (a model draft: lag 0; EAGLE: row s reads x_{s+1}, lag 1), so after a
verification a row of n_valid kept tokens keeps the rows s < n_valid - lag (`rollback`).
`catch_up(upto)` makes the cache take rows fed .. upto-1 in one pass, a row needing fewer
re-feeding its last cached rows (identical K/V, no padding tokens). A tree grows by a
`TreeGrower` the draft drives (`tree_grower`): depth 1 from the logits after the context, each
deeper one from a masked pass over the ancestors of the nodes being expanded (`feed_ancestors`),
after the context's rows; `tree_result` leaves the cache at the context. The tree's node budget
is cut to the cache's room: its free slots, in the one sense `KVCache.check_room` uses.
"""

from __future__ import annotations

import torch

from ..models.kvcache import KVCache
from ..models.session import Session
from ..sampling import SamplingParams
from ..tree_shapes import TreeGrower, TreeSpec
from ..trees import Tree, ancestor_inputs


def pick(x: torch.Tensor, index: torch.Tensor) -> torch.Tensor:  # [B, W, D], [B, n] -> [B, n, D]
    """x[b, index[b, j]] for every row b."""
    return x.gather(1, index[..., None].expand(-1, -1, x.shape[-1]))


class DraftCache:
    """The KV cache of `module` (a model or a layer, with `new_cache`) over the buffer's rows, and how many are true.

    The owning draft calls `begin` from its own `begin` and `rollback` from its own `rollback`;
    every other method runs inside a generation (the owner has checked `Draft.begun`).
    """

    def __init__(self, module: torch.nn.Module, lag: int = 0) -> None:
        self.module = module
        self.lag = lag  # cache row s reads buffer token s + lag
        self.window = 0  # the most rows a row may reach (the context window), from `begin`
        self.kv: KVCache | None = None
        self.fed: torch.Tensor | None = None  # [B] leading cache rows with true inputs
        self.padded = False  # whether the last catch-up fed some row padding (rows of unequal length)

    @property
    def lengths(self) -> torch.Tensor:  # [B]
        """The rows the KV cache holds per batch row (tree and draft rows included until dropped)."""
        return self.kv.lengths

    def begin(self, batch_size: int, window: int, session: Session | None) -> None:
        """An empty cache for `batch_size` rows of at most `window` tokens, from the generation's `session`.

        Allocated once, at the size the generation needs (the session's rows): a batch of thousands
        would otherwise hold the whole window per row. Without a session: a new cache of the window.
        """
        self.window = window
        if session is None:
            self.kv = self.module.new_cache(batch_size, max_len=window)
        else:
            self.kv = session.cache(self.module, "draft", batch_size, min(window, session.rows), window)
        self.fed = torch.zeros(batch_size, dtype=torch.long, device=self.kv.device)

    def rollback(self, n_valid: torch.Tensor) -> None:  # [B]
        """Keep the rows s < n_valid[b] - lag: those that read only tokens the row kept."""
        self.fed = torch.minimum(self.fed, (n_valid.to(self.fed.device) - self.lag).clamp(min=0))
        self.kv.truncate(self.fed, check=False)  # fed only shrinks, and the cache holds fed rows: no read back

    def keep_fed(self) -> None:
        """Drop every row past the true ones (rows fed a draft's own guesses never stay)."""
        self.kv.truncate(self.fed, check=False)

    def catch_up(self, upto: torch.Tensor, limit: int | None = None) -> torch.Tensor:  # [B] -> rows [B, W]
        """The rows to feed so that the cache holds rows 0 .. upto[b]-1: W = the widest gap (>= 1), ending at upto.

        One read back per call: W, and the largest upto (the cache's host bound). With `limit`
        (the buffer's width), upto must lie in [1, limit] (the same read checks it). Truncates
        the cache to each row's first fed row. A row whose upto is below W starts at 0 and its
        rows past upto - 1 are padding (the caller feeds them the last true row's inputs and
        truncates them away); `fed` becomes upto, and `padded` says whether any row was padded.
        """
        lo, hi, gap = torch.stack([upto.min(), upto.max(), (upto - self.fed).max()]).tolist()  # one read back
        if limit is not None and (lo < 1 or hi > limit):
            raise ValueError(f"lengths must be in [1, {limit}] (the buffer's width), got {upto.tolist()}")
        width = max(gap, 1)
        self.padded = lo < width  # some row starts at 0 and is fed padding past upto - 1
        start = (upto - width).clamp(min=0)  # [B]
        self.kv.truncate(start, check=False, bound=max(hi - width, 0))  # start <= fed = the cached rows
        self.kv.check_room(width, "the draft's catch-up")
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

        Its node budget is cut to the cache's room after the context (within the window), since
        every node is fed as a cache row to grow the next depth.
        """
        # Node rows follow the context's, in the cache and (lag further) in the window.
        room = min(self.window - self.lag, self.kv.max_len) - int(context.max())
        max_nodes = room if max_nodes is None else min(max_nodes, room)
        grower = TreeGrower(spec, root_logits.shape[0], params, generator, max_depth=max_depth, max_nodes=max_nodes)
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
        held = context.tolist()  # one read back per depth: the trees are built on the host
        self.kv.truncate(context, check=False, bound=max(held))  # the rows the cache held before the tree
        ids, rows, mask, nodes, index = ancestor_inputs(grower.trees, grower.frontier, [n - 1 for n in held])
        self.kv.check_room(rows.shape[1], "the draft tree")
        dev = context.device
        return ids.to(dev), rows.to(dev), mask.to(dev), nodes, index.to(dev)

    def tree_result(self, grower: TreeGrower, context: torch.Tensor) -> list[Tree]:  # context [B]
        """The grown trees; the cache goes back to the context (tree rows never stay)."""
        self.kv.truncate(context, check=False)
        return grower.result()
