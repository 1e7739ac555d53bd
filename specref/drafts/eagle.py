"""EAGLE: one decoder layer that drafts the target's next feature from (its feature, the next token) (chapter 5).

Rule (EAGLE-1, Li et al. 2024), with the alignment of `specref.drafts.heads.EagleLayer`:
layer row s reads g_s (the target's feature at position s, fused over `feature_layers`),
the embedding of token x_{s+1} and the position embedding of s + 1; its output f_hat_s
estimates the target's feature f_{s+1}, and the target's frozen LM head turns it into
q for x_{s+2}. After a verification a row of length n holds the target's features of
positions 0 .. n-2 (the loop's `observe` hook, `specref.drafts.features`): every row
s <= n-2 reads a TRUE feature, and row n-2 (x_{n-1} = the target's own token) gives q for
the first draft x_n. Draft j + 1 runs at row n-2+j and reads the layer's own previous
output as g with the embedding of draft j: one layer pass per draft, over the layer's
1-layer KV cache.

The cache keeps only rows computed from the target's true features: after drafting,
the rows built from predicted features are dropped, and after the target has verified
the drafts the rows of the accepted ones are computed again, from the true features the
verification pass produced (`fed` counts the true rows; `rollback` cuts it to what the
row kept). A row that re-feeds fewer rows than the batch's widest catch-up re-feeds its
last true rows, which rewrites identical entries.

Trees (EAGLE-2): `DynamicTree` (or a static `TreeShape`) grown by `grow_trees`, one layer
pass per depth over the ancestors of the nodes being expanded, with the tree attention
mask after the true rows; node v at depth d is row n-2+d, reads its parent's output (the
root's: f_hat_{n-2}) and its own token, at position n-1+d. As for a model draft, the
children are the draft's top tokens (one-hot q, "deterministic") or i.i.d. draws.

EAGLE-3's options are other `EagleLayer` configs of the same class: `feature_layers`
fused (low, mid, top) and training-time test; `use_token=False` is the ablation without
the token one step ahead. A one-token prompt has no feature yet: the first step proposes
that token again with one-hot q (exact, rarely accepted).
"""

from __future__ import annotations

import torch

from .._validate import check_int, check_tensor
from ..models.kvcache import KVCache
from ..sampling import SamplingParams
from ..trees import ROOT, Tree, stack_tree_masks
from .base import ChainOrTreeDraft, draw
from .features import FeatureDraft, check_features_fit
from .heads import EagleLayer, HeadsConfig, embed, load_bundled_heads
from .model import FIRST_CACHE_LEN
from .shapes import DynamicTree, TreeShape, as_tree_spec, grow_trees


class EagleDraft(FeatureDraft, ChainOrTreeDraft):
    """An `EagleLayer` on the target's features as a chain or tree draft; q = softmax of the target's LM head.

    `target` lends its frozen embeddings, positions and LM head; `layer` must be built for
    its width and read hidden states it has (`config`, when given, is checked against
    the target too: vocabulary, depth and embedding fingerprint). `propose` drafts a
    chain for an int k, or one tree per row for a `TreeShape` / `DynamicTree`. State:
    the feature buffer (`FeatureDraft`), the layer's cache `cache` and `fed` [B], the
    number of leading cache rows computed from the target's true features.
    """

    def __init__(self, target: torch.nn.Module, layer: EagleLayer, config: HeadsConfig | None = None) -> None:
        if not isinstance(layer, EagleLayer):
            raise TypeError(f"layer must be a specref.drafts.heads.EagleLayer, got {type(layer).__name__}")
        tc = getattr(target, "config", None)
        if not isinstance(target, torch.nn.Module) or tc is None or not hasattr(target, "lm_head") \
                or not hasattr(target, "transformer"):
            raise TypeError(f"target must be a GPT-2 model (specref.models.gpt2.GPT2), got {type(target).__name__}")
        if config is not None:
            if not isinstance(config, HeadsConfig) or config.kind != "eagle":
                raise ValueError(f"config must be an 'eagle' HeadsConfig, got {config!r}")
            config.check_target(target)  # before the width check: it names the target the layer was trained on
        if layer.n_embd != tc.n_embd:
            raise ValueError(f"the EAGLE layer reads features of width {layer.n_embd}, but the target's n_embd is "
                             f"{tc.n_embd}: it was built for another target")
        if max(layer.feature_layers) > tc.n_layer:
            raise ValueError(f"the EAGLE layer reads hidden states {list(layer.feature_layers)}, but the target has "
                             f"{tc.n_layer + 1} (0..{tc.n_layer}): it was built for another target")
        p = next(layer.parameters())
        if p.device != target.device or p.dtype != target.dtype:
            raise ValueError(f"the EAGLE layer is {p.dtype} on {p.device}, the target {target.dtype} on "
                             f"{target.device}: move the layer with layer.to(target.device, target.dtype)")
        super().__init__(layer.feature_layers)
        self.target, self.layer, self.config = target, layer, config
        self.vocab_size = int(tc.vocab_size)
        self.cache: KVCache | None = None
        self.fed: torch.Tensor | None = None  # [B]
        self.passes = 0

    @classmethod
    def bundled(cls, target: torch.nn.Module, name: str = "eagle1") -> EagleDraft:
        """The shipped layer `specref/assets/heads/<name>.safetensors`, on the target's device and dtype."""
        layer, config = load_bundled_heads(name, device=target.device, dtype=target.dtype)
        if config.kind != "eagle":
            raise ValueError(f"head set {name!r} is a {config.kind} head set, not an EAGLE layer")
        return cls(target, layer, config)

    # -- state -------------------------------------------------------------------------------
    def begin(self, batch_size: int) -> None:
        super().begin(batch_size)
        # Small at first and grown as the rows do (`_rows`), as `ModelDraft`'s cache is.
        self.cache = self.layer.new_cache(batch_size, max_len=min(FIRST_CACHE_LEN, self.target.config.n_positions))
        self.fed = torch.zeros(batch_size, dtype=torch.long, device=self.target.device)

    def observe(self, features: tuple[torch.Tensor, ...], starts: torch.Tensor) -> None:  # ([B, T, C], ...), [B]
        check_features_fit(features, self.layer.n_embd, self.layer, "the EAGLE layer")
        super().observe(features, starts)

    def rollback(self, n_valid: torch.Tensor) -> None:  # [B]
        super().rollback(n_valid)  # checks n_valid
        # Row s read x_{s+1}: it survives while tokens 0 .. s+1 do, i.e. s < n_valid - 1.
        self.fed = torch.minimum(self.fed, (n_valid.to(self.fed.device) - 1).clamp(min=0))
        self.cache.truncate(self.fed)

    # -- drafting ----------------------------------------------------------------------------
    def _rows(self, g: torch.Tensor, tokens: torch.Tensor, rows: torch.Tensor, cache: KVCache,
              mask: torch.Tensor | None = None) -> torch.Tensor:  # g [B, W, C], tokens [B, W], rows [B, W] -> [B, W, C]
        """One layer pass: row rows[b, w] reads g[b, w], token tokens[b, w] (= x_{s+1}) at position s + 1."""
        tok, pos = embed(self.target, tokens, rows + 1)
        cache.make_room(tokens.shape[1], limit=self.target.config.n_positions)
        self.passes += 1
        return self.layer(g, tok, pos, cache=cache, attention_mask=mask)

    def _catch_up(self, tokens: torch.Tensor, lengths: torch.Tensor) -> torch.Tensor | None:  # -> f_hat [B, C]
        """Feed the true rows the cache lacks (s = fed .. n-2) in one pass: f_hat_{n-2} per row, None if no feature."""
        B = self._check_begun("propose")
        tokens, lengths = check_tensor("tokens", tokens), check_tensor("lengths", lengths)
        if tokens.dim() != 2 or tokens.shape[0] != B or tokens.is_floating_point() or tokens.dtype == torch.bool:
            raise ValueError(f"tokens must be an integer [B, L] tensor with B = {B} (from begin), "
                             f"got {tokens.dtype} {tuple(tokens.shape)}")
        if tuple(lengths.shape) != (B,) or lengths.is_floating_point() or lengths.dtype == torch.bool:
            raise ValueError(f"lengths must be an integer tensor of shape [B] = [{B}], got {lengths.dtype} "
                             f"{tuple(lengths.shape)}")
        lengths = lengths.to(self.fed.device, torch.long)
        if bool(((lengths < 1) | (lengths > tokens.shape[1])).any()):
            raise ValueError(f"lengths must be in [1, {tokens.shape[1]}] (the buffer's width), got {lengths.tolist()}")
        r = lengths - 1  # [B] true rows: s = 0 .. n-2
        if bool((r == 0).all()):
            return None  # a one-token prompt: the target has scored nothing yet
        held = self.held().to(r.device)
        if bool(((r == 0) | (held < r)).any()):
            raise RuntimeError(f"the draft holds the target's features of {held.tolist()} positions but needs "
                               f"those of {r.tolist()}: the loop must call observe(features, starts) after every "
                               f"target pass")
        width = int((r - self.fed).max().clamp(min=1))
        start = (r - width).clamp(min=0)  # [B]; a row with fewer true rows than width pads after its last one
        rows = start[:, None] + torch.arange(width, device=r.device)  # [B, W]
        real = torch.minimum(rows, (r - 1)[:, None])  # padding rows repeat the last true row's inputs
        self.cache.truncate(start)
        g = self.layer.fuse(self.gather(real))  # [B, W, C]
        out = self._rows(g, tokens.gather(1, real + 1), rows, self.cache)  # [B, W, C]
        self.fed = r.clone()
        self.cache.truncate(r)  # drop the padding rows
        C = out.shape[-1]
        return out.gather(1, (r - 1 - start)[:, None, None].expand(B, 1, C))[:, 0]  # row n-2

    def _draw(self, logits: torch.Tensor, params: SamplingParams,
              generator: torch.Generator | None) -> tuple[torch.Tensor, torch.Tensor]:  # [B, V] -> x [B], q [B, V]
        """A draft token and the q it was drawn from (`draw`); the hook a broken draft overrides, as in `ModelDraft`."""
        return draw(logits, params, generator)

    @torch.no_grad()
    def propose_chain(
        self,
        tokens: torch.Tensor,  # [B, L]
        lengths: torch.Tensor,  # [B]
        k: int,
        params: SamplingParams,
        generator: torch.Generator | None = None,
    ) -> tuple[torch.Tensor, torch.Tensor]:  # drafts [B, k], q [B, k, V]
        """k autoregressive layer steps from the newest true row: draft j + 1 reads f_hat of draft j and draft j."""
        k = check_int("k", k, 0, "tokens to propose")
        f_hat = self._catch_up(tokens, lengths)  # [B, C]
        B, V, dtype = tokens.shape[0], self.vocab_size, self.target.dtype
        n_ctx = self.target.config.n_positions
        if int(lengths.max()) + k - 1 > n_ctx:
            raise ValueError(f"k={k} drafts after {int(lengths.max())} tokens reach past the target's context window "
                             f"n_positions={n_ctx}")
        if k == 0:
            return tokens.new_zeros((B, 0)), torch.zeros((B, 0, V), dtype=dtype, device=tokens.device)
        if f_hat is None:
            return self.prompt_again(tokens, k, dtype)
        row = self.fed.clone()  # draft 2's row: n-1
        drafts, qs = [], []
        for i in range(k):
            x, q = self._draw(self.target.lm_head(f_hat), params, generator)  # q for x_{n+i}
            drafts.append(x)
            qs.append(q)
            if i < k - 1:  # the last draft is never fed: the target scores it
                f_hat = self._rows(f_hat[:, None], x[:, None], row[:, None], self.cache)[:, 0]
                row = row + 1
        self.cache.truncate(self.fed)  # rows from predicted features never stay
        return torch.stack(drafts, 1), torch.stack(qs, 1)

    @torch.no_grad()
    def propose_tree(
        self,
        tokens: torch.Tensor,  # [B, L]
        lengths: torch.Tensor,  # [B]
        spec: TreeShape | DynamicTree | tuple[int, ...] | int,
        params: SamplingParams,
        generator: torch.Generator | None = None,
        max_depth: int | None = None,
        max_nodes: int | None = None,
    ) -> list[Tree]:
        """One tree per row by `grow_trees`: depth 1 from f_hat_{n-2}, each deeper one a layer pass, tree-masked."""
        spec = as_tree_spec(spec)
        f_root = self._catch_up(tokens, lengths)  # [B, C]
        B, dev = tokens.shape[0], tokens.device
        if f_root is None:
            return self.prompt_again_tree(tokens, spec.depth, max_depth, max_nodes)
        context = self.fed.clone()  # [B] true rows; node at depth d is row context - 1 + d
        room = self.target.config.n_positions - int(lengths.max())  # nodes sit at positions n .. n-1+depth
        max_nodes = room if max_nodes is None else min(max_nodes, room)
        root_logits = self.target.lm_head(f_root)[:, None]  # [B, 1, V]
        outputs: list[dict[int, torch.Tensor]] = [{} for _ in range(B)]  # node -> its f_hat [C]

        def draft_logits(trees: list[Tree], frontier: list[list[int]]) -> torch.Tensor:  # [B, n, V]
            if all(f == [ROOT] for f in frontier):
                return root_logits
            # Feed the ancestors of the frontier after the true rows (the cache is reset to them first:
            # cached rows are visible to every new row, and siblings must not see each other).
            subtrees, index, need = [], [], []
            for t, f in zip(trees, frontier):
                nodes = sorted({a for n in f for a in t.path(n)})
                need.append(nodes)
                subtrees.append(t.subtree(nodes))
                index.append([nodes.index(n) for n in f])
            self.cache.truncate(context)
            mask, rows = stack_tree_masks(subtrees, (context - 1).tolist(), with_root=False)  # [B, W, W], [B, W]
            self.cache.make_room(rows.shape[1], limit=self.target.config.n_positions)
            self.cache.check_room(rows.shape[1], "the draft tree")
            W = rows.shape[1]
            g = f_root[:, None].repeat(1, W, 1)  # [B, W, C]; padding entries read the root's output
            ids = torch.zeros((B, W), dtype=torch.long, device=dev)
            for b, (t, nodes) in enumerate(zip(trees, need)):
                parents = [t.parents[v] for v in nodes]
                if nodes:
                    ids[b, : len(nodes)] = torch.tensor([t.tokens[v] for v in nodes], device=dev)
                for i, par in enumerate(parents):
                    if par != ROOT:
                        g[b, i] = outputs[b][par]
            out = self._rows(g, ids, rows.to(dev), self.cache, mask.to(dev))  # [B, W, C]
            for b, (f, nodes) in enumerate(zip(frontier, need)):
                for n, i in zip(f, index[b]):
                    outputs[b].setdefault(n, out[b, i])
            sel = torch.tensor(index, device=dev)  # [B, n]
            return self.target.lm_head(out.gather(1, sel[..., None].expand(-1, -1, out.shape[-1])))

        trees = grow_trees(spec, draft_logits, B, params, generator, max_depth=max_depth, max_nodes=max_nodes)
        self.cache.truncate(context)  # tree rows never stay
        return trees
