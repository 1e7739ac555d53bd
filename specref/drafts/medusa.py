"""Medusa: k heads on the target's last hidden state, each guessing one later token directly (chapter 5).

Rule (Medusa-1, Cai et al. 2024). After a verification the target has scored every token but
the row's last one, so its newest feature is f_t at t = length - 2 (the loop's `observe` hook).
Head i (0-based, `specref.drafts.heads.MedusaHeads`) maps f_t to logits for x_{t+2+i}, draft
position i + 1, without seeing the tokens between, which is why acceptance falls with the
position. No draft pass over tokens and no KV cache. q_i is head i's logits processed as p is;
drafts are drawn from it independently (one-hot on the argmax when greedy). The Medusa tree:
depth d's children are head d-1's top tokens under every node ("deterministic", one-hot q), or
i.i.d. draws from its q for a sampled `TreeShape`. A one-token prompt has no feature yet: the
first step proposes that token again with one-hot q (exact, rarely accepted).
"""

from __future__ import annotations

import torch

from ..sampling import SamplingParams
from ..tree_shapes import TreeGrower, TreeSpec, as_tree_spec
from ..trees import Tree
from .base import Draft, check_k, draw
from .features import FeatureBuffer, check_target, repeat_prompt, repeat_prompt_tree
from .heads import MedusaHeads


class MedusaDraft(Draft):
    """Medusa heads as a chain or tree draft: head i's logits on the target's newest feature give draft position i + 1.

    `target` lends its frozen LM head (the heads share it) and its width;
    `heads` is a `MedusaHeads` on the target's last hidden state (`feature_layers =
    (n_layer,)`). A chain proposes at most `heads.n_heads` tokens; a tree is at most
    that deep. Its only state is one part, `features` (a `FeatureBuffer`).
    """

    def __init__(self, target: torch.nn.Module, heads: MedusaHeads) -> None:
        if not isinstance(heads, MedusaHeads):
            raise TypeError(f"heads must be a specref.drafts.heads.MedusaHeads, got {type(heads).__name__}")
        check_target(target, heads, "the Medusa heads")
        self.features = FeatureBuffer((target.config.n_layer,), heads, "the Medusa heads")
        self.feature_layers = self.features.layers
        self.target, self.heads = target, heads
        self.vocab_size = int(target.config.vocab_size)
        self.n_heads = self.max_k = heads.n_heads  # head i drafts position i + 1

    def begin(self, batch_size: int) -> None:
        super().begin(batch_size)
        self.features.begin(batch_size, self.run_rows)

    def observe(self, features: tuple[torch.Tensor, ...], starts: torch.Tensor) -> None:  # ([B, T, C], ...), [B]
        self.begun("observe")
        self.features.observe(features, starts)

    def rollback(self, n_valid: torch.Tensor) -> None:  # [B]
        super().rollback(n_valid)
        self.features.rollback(n_valid)

    @torch.no_grad()
    def head_logits(self, tokens: torch.Tensor, lengths: torch.Tensor, n: int) -> torch.Tensor | None:  # [B, n, V]
        """Heads 0 .. n-1 on each row's newest feature f_t (t = lengths - 2); None before any feature exists."""
        self.begun()
        t = self.features.scored(tokens, lengths)  # [B]
        if t is None:
            return None  # a one-token prompt: nothing scored yet
        (f_t,) = self.features.gather(t[:, None], check=False)  # [B, 1, C]: scored(t) checked the rows hold t
        self.passes += 1
        return self.heads.logits(f_t, self.target.lm_head, n)[:, 0]  # [B, n, V]: head i -> x_{t+2+i}; only n run

    @torch.no_grad()
    def propose(
        self,
        tokens: torch.Tensor,  # [B, L]
        lengths: torch.Tensor,  # [B]
        k: int,
        params: SamplingParams,
        generator: torch.Generator | None = None,
    ) -> tuple[torch.Tensor, torch.Tensor]:  # drafts [B, k], q [B, k, V]
        """Draft position i + 1 from head i, all on f_t: argmax (q one-hot) or a draw from q = params.probs(logits)."""
        k = check_k(k, self.max_k, f"this Medusa draft has {self.n_heads} heads: head i drafts position i + 1")
        dtype = self.target.lm_head.weight.dtype
        if k == 0:
            self.begun()
            self.features.scored(tokens, lengths)  # the same checks of the buffer and lengths
            return self.empty(tokens, dtype)
        logits = self.head_logits(tokens, lengths, k)  # [B, k, V]
        if logits is None:
            return repeat_prompt(tokens, k, self.vocab_size, dtype)
        return draw(logits, params, generator)  # [B, k], [B, k, V]: each position drawn on its own

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
        """The Medusa tree: depth d's children are head d-1's top tokens (or draws from its q), under every node."""
        spec = as_tree_spec(spec)
        if spec.depth > self.n_heads:
            raise ValueError(f"a tree of depth {spec.depth} needs {spec.depth} Medusa heads, this draft has "
                             f"{self.n_heads}: use a tree at most {self.n_heads} deep")
        B = tokens.shape[0]
        logits = self.head_logits(tokens, lengths, spec.depth)  # [B, depth, V]
        if logits is None:
            return repeat_prompt_tree(tokens, spec.depth, max_depth, max_nodes)
        grower = TreeGrower(spec, B, params, generator, max_depth=max_depth, max_nodes=max_nodes)
        while not grower.done:  # the frontier lies at depth d = grower.grown: its children come from head d
            d = grower.grown
            grower.grow(logits[:, d : d + 1].expand(B, len(grower.frontier[0]), -1))
        return grower.result()
