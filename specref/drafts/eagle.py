"""EAGLE: one decoder layer that drafts the target's next feature from (its feature, the next token) (chapter 5).

Rule (EAGLE-1, Li et al. 2024; `specref.drafts.heads.EagleLayer`): layer row s reads g_s (the
target's feature at s, fused over `feature_layers`) and token x_{s+1}; its output f_hat_s
estimates f_{s+1}, and the target's LM head turns it into q for x_{s+2}. A row of length n
holds the target's features of positions 0 .. n-2 (`observe`), so row n-2 gives q for the
first draft x_n; draft j + 1 runs at row n-2+j on the layer's own previous output and draft j.
The cache keeps only rows computed from true features: rows from predicted features are
dropped after drafting, and the accepted drafts' rows are computed again from the features
the verification pass produced (the cache part's `fed` counts the true rows).

Trees (EAGLE-2): one layer pass per depth over the ancestors of the nodes being expanded,
tree-masked after the true rows (`DraftCache.feed_ancestors`); children are the top tokens
(one-hot q) or i.i.d. draws. EAGLE-3 and the ablation without the token are other
`EagleLayer` configs. A one-token prompt has no feature yet: the first step proposes that
token again with one-hot q (exact, rarely accepted).
"""

from __future__ import annotations

import torch

from ..sampling import SamplingParams
from ..tree_shapes import TreeSpec, as_tree_spec
from ..trees import ROOT, Tree
from .base import Draft, Sampler, check_k, draw
from .cached import DraftCache, pick
from .features import FeatureBuffer, check_target, repeat_prompt, repeat_prompt_tree
from .heads import EagleLayer, HeadsConfig, embed, load_bundled_heads


class EagleDraft(Draft):
    """An `EagleLayer` on the target's features as a chain or tree draft; q = softmax of the target's LM head.

    `target` lends its frozen embeddings, positions and LM head; `layer` must be built for
    its width and read hidden states it has (`config`, when given, is checked against
    the target too: vocabulary, depth and embedding fingerprint). `sampler` draws each chain
    token (default `draw`). Its state, two parts: `features` (a `FeatureBuffer`, the target's
    hidden states) and `cache` (a `DraftCache`, the layer's K/V; lag 1: cache row s reads
    x_{s+1}; its `fed` [B] counts the leading rows computed from the target's true features).
    """

    def __init__(self, target: torch.nn.Module, layer: EagleLayer, config: HeadsConfig | None = None,
                 sampler: Sampler = draw) -> None:
        if not isinstance(layer, EagleLayer):
            raise TypeError(f"layer must be a specref.drafts.heads.EagleLayer, got {type(layer).__name__}")
        if config is not None and (not isinstance(config, HeadsConfig) or config.kind != "eagle"):
            raise ValueError(f"config must be an 'eagle' HeadsConfig, got {config!r}")
        check_target(target, layer, "the EAGLE layer", config)
        if max(layer.feature_layers) > target.config.n_layer:
            raise ValueError(f"the EAGLE layer reads hidden states {list(layer.feature_layers)}, but the target has "
                             f"{target.config.n_layer + 1} (0..{target.config.n_layer}): it was built for another "
                             "target")
        self.features = FeatureBuffer(layer.feature_layers, layer, "the EAGLE layer")
        self.cache = DraftCache(layer, lag=1)  # cache row s reads x_{s+1}
        self.feature_layers = self.features.layers
        self.target, self.layer, self.config, self.sampler = target, layer, config, sampler
        self.window = target.config.n_positions
        self.vocab_size = int(target.config.vocab_size)

    def begin(self, batch_size: int) -> None:
        super().begin(batch_size)
        self.cache.begin(batch_size, self.window, self.session)
        self.features.begin(batch_size, self.run_rows)

    def observe(self, features: tuple[torch.Tensor, ...], starts: torch.Tensor) -> None:  # ([B, T, C], ...), [B]
        self.begun("observe")
        self.features.observe(features, starts)

    def rollback(self, n_valid: torch.Tensor) -> None:  # [B]
        super().rollback(n_valid)
        self.cache.rollback(n_valid)
        self.features.rollback(n_valid)

    @classmethod
    def bundled(cls, target: torch.nn.Module, name: str = "eagle1") -> EagleDraft:
        """The shipped layer `specref/assets/heads/<name>.safetensors`, on the target's device and dtype."""
        layer, config = load_bundled_heads(name, device=target.device, dtype=target.dtype)
        if config.kind != "eagle":
            raise ValueError(f"head set {name!r} is a {config.kind} head set, not an EAGLE layer")
        return cls(target, layer, config)

    def _rows(self, g: torch.Tensor, tokens: torch.Tensor, rows: torch.Tensor,
              mask: torch.Tensor | None = None) -> torch.Tensor:  # g [B, W, C], tokens [B, W], rows [B, W] -> [B, W, C]
        """One layer pass: row rows[b, w] reads g[b, w], token tokens[b, w] (= x_{s+1}) at position s + 1."""
        tok, pos = embed(self.target, tokens, rows + 1)
        self.passes += 1
        return self.layer(g, tok, pos, cache=self.cache.kv, attention_mask=mask, check=False)

    def context_feature(self, tokens: torch.Tensor, lengths: torch.Tensor) -> torch.Tensor | None:  # -> [B, C]
        """Feed the true rows the cache lacks (s = fed .. n-2) in one pass: f_hat_{n-2} per row, None if no feature."""
        self.begun()
        t = self.features.scored(tokens, lengths)  # [B] n - 2
        if t is None:
            return None  # a one-token prompt: the target has scored nothing yet
        r = t + 1  # true rows: s = 0 .. n-2
        rows = self.cache.catch_up(r)  # [B, W]
        real = torch.minimum(rows, t[:, None])  # padding rows repeat the last true row's inputs
        g = self.layer.fuse(self.features.gather(real, check=False))  # [B, W, C]
        out = self._rows(g, tokens.gather(1, real + 1), rows)  # [B, W, C]
        self.cache.keep_fed()  # drop the padding rows (fed = r)
        return pick(out, t[:, None] - rows[:, :1])[:, 0]  # row n-2

    @torch.no_grad()
    def propose(
        self,
        tokens: torch.Tensor,  # [B, L]
        lengths: torch.Tensor,  # [B]
        k: int,
        params: SamplingParams,
        generator: torch.Generator | None = None,
    ) -> tuple[torch.Tensor, torch.Tensor]:  # drafts [B, k], q [B, k, V]
        """k autoregressive layer steps from the newest true row: draft j + 1 reads f_hat of draft j and draft j."""
        k = check_k(k, None)
        f_hat = self.context_feature(tokens, lengths)  # [B, C]
        n_ctx = self.window
        longest = self.cache.kv.bound + 1  # >= the longest row (the cache holds its true rows, n - 1): no read back
        if longest + k - 1 > n_ctx:
            longest = int(lengths.max())  # the bound may be loose: read the lengths before refusing
            if longest + k - 1 > n_ctx:
                raise ValueError(f"k={k} drafts after {longest} tokens reach past the target's context window "
                                 f"n_positions={n_ctx}")
        if k == 0:
            return self.empty(tokens, self.target.dtype)
        if f_hat is None:
            return repeat_prompt(tokens, k, self.vocab_size, self.target.dtype)
        row = self.cache.fed.clone()  # draft 2's row: n-1
        drafts, qs = [], []
        for i in range(k):
            x, q = self.sampler(self.target.lm_head(f_hat), params, generator)  # q for x_{n+i}
            drafts.append(x)
            qs.append(q)
            if i < k - 1:  # the last draft is never fed: the target scores it
                f_hat = self._rows(f_hat[:, None], x[:, None], row[:, None])[:, 0]
                row = row + 1
        self.cache.keep_fed()  # rows from predicted features never stay
        return torch.stack(drafts, 1), torch.stack(qs, 1)

    @torch.no_grad()
    def propose_tree(
        self,
        tokens: torch.Tensor,  # [B, L]
        lengths: torch.Tensor,  # [B]
        spec: TreeSpec | tuple[int, ...] | int,
        params: SamplingParams,
        generator: torch.Generator | None = None,
        max_depth: int | None = None,
        max_nodes: int | None = None,
    ) -> list[Tree]:
        """One tree per row by a `TreeGrower`: depth 1 from f_hat_{n-2}, each deeper one a layer pass, tree-masked.

        Node v at depth d is row n-2+d: it reads its parent's output (the root's: f_hat_{n-2})
        and its own token, at position n-1+d.
        """
        spec = as_tree_spec(spec)
        f_root = self.context_feature(tokens, lengths)  # [B, C]
        if f_root is None:
            return repeat_prompt_tree(tokens, spec.depth, max_depth, max_nodes)
        context = self.cache.fed.clone()  # [B] true rows; node at depth d is row context - 1 + d
        root_logits = self.target.lm_head(f_root)[:, None]  # [B, 1, V]
        grower = self.cache.tree_grower(spec, root_logits, context, params, generator, max_depth, max_nodes)
        outputs: list[dict[int, torch.Tensor]] = [{} for _ in range(tokens.shape[0])]  # node -> its f_hat [C]
        while not grower.done:  # one layer pass per deeper depth
            ids, rows, mask, nodes, index = self.cache.feed_ancestors(grower, context)
            g = f_root[:, None].repeat(1, ids.shape[1], 1)  # [B, W, C]; padding entries read the root's output
            for b, (t, need) in enumerate(zip(grower.trees, nodes)):
                for i, v in enumerate(need):
                    if t.parents[v] != ROOT:
                        g[b, i] = outputs[b][t.parents[v]]
            out = pick(self._rows(g, ids, rows, mask), index)  # [B, n, C]
            for b, f in enumerate(grower.frontier):
                for j, n in enumerate(f):
                    outputs[b].setdefault(n, out[b, j])
            grower.grow(self.target.lm_head(out))
        return self.cache.tree_result(grower, context)
