"""Medusa: k heads on the target's last hidden state, each guessing one later token directly (chapter 5).

Rule (Medusa-1, Cai et al. 2024). After a verification the target has scored every
token but the row's last one, x_{t+1} (its own correction or bonus, not yet fed), so
its newest feature is f_t = hidden_states[n_layer] at position t = length - 2. Head i
(0-based) maps f_t to logits for x_{t+2+i}, draft position i + 1
(`specref.drafts.heads.MedusaHeads`). All k drafts come from f_t alone: head i never
sees x_{t+1} .. x_{t+1+i}, the tokens between, which is why acceptance falls with the
draft position. No draft pass over tokens, no KV cache: per step, one residual block
per head and the shared LM head, on a feature the verification pass computed anyway
(the loop's `observe` hook, `specref.drafts.features`).

q: the same `SamplingParams` processing as p applied to head i's logits; drafts are
drawn from it independently (a draft may depend on anything the draft knew; q_i need
not condition on x_1 .. x_{i-1}), one-hot on the argmax when greedy. Trees (the Medusa
tree): depth d's children are head d-1's top-b tokens, so every node at one depth has
the same children; they are distinct and chosen without randomness ("deterministic"),
which `verify_tree` verifies with one-hot q (exact); a sampled `TreeShape` draws them
i.i.d. from head d-1's q instead. A prompt of one token has no feature yet: the first
step then proposes that token again with one-hot q (still exact, rarely accepted).
"""

from __future__ import annotations

import torch

from .._validate import check_int
from ..sampling import SamplingParams, sample
from ..trees import ROOT, Tree
from .base import ChainOrTreeDraft
from .features import FeatureDraft
from .heads import MedusaHeads
from .shapes import DynamicTree, TreeShape, as_tree_spec, grow_trees


def _check_target(target: object, n_embd: int, what: str) -> None:
    config = getattr(target, "config", None)
    if not isinstance(target, torch.nn.Module) or config is None or not hasattr(target, "lm_head"):
        raise TypeError(f"target must be a GPT-2 model (specref.models.gpt2.GPT2), got {type(target).__name__}")
    if config.n_embd != n_embd:
        raise ValueError(f"{what} read features of width {n_embd}, but the target's n_embd is {config.n_embd}: "
                         "they were built for another target")


def check_features_fit(features: object, n_embd: int, module: torch.nn.Module, what: str) -> None:
    """Raise unless the target's features have the width `module` reads and live on its device."""
    if not (isinstance(features, (tuple, list)) and features and isinstance(features[0], torch.Tensor)):
        return  # FeatureDraft.observe names what is wrong with the structure
    f, p = features[0], next(module.parameters())
    if f.dim() == 3 and f.shape[-1] != n_embd:
        raise ValueError(f"{what} read features of width {n_embd}, the target's pass gave width "
                         f"{f.shape[-1]}: the draft was built for another target")
    if f.device != p.device or f.dtype != p.dtype:
        raise ValueError(f"the target computes in {f.dtype} on {f.device} but {what} are {p.dtype} on {p.device}: "
                         "put both on one device and dtype (load_draft does)")


def _check_lengths(draft: FeatureDraft, tokens: torch.Tensor, lengths: torch.Tensor) -> torch.Tensor:  # -> t [B]
    """t = lengths - 2 per row, the newest position the target has scored; its features must be held (or t = -1)."""
    B = draft._check_begun("propose")
    if not isinstance(tokens, torch.Tensor) or tokens.dim() != 2 or tokens.shape[0] != B \
            or tokens.is_floating_point():
        raise ValueError(f"tokens must be an integer [B, L] tensor with B = {B} (from begin), "
                         f"got {getattr(tokens, 'dtype', type(tokens).__name__)} {tuple(getattr(tokens, 'shape', ()))}")
    if not isinstance(lengths, torch.Tensor) or tuple(lengths.shape) != (B,) or lengths.is_floating_point():
        raise ValueError(f"lengths must be an integer tensor of shape [B] = [{B}]")
    t = lengths.to(torch.long) - 2
    if bool((t < -1).any()) or bool((lengths > tokens.shape[1]).any()):
        raise ValueError(f"lengths must be in [1, {tokens.shape[1]}] (the buffer's width), got {lengths.tolist()}")
    held = draft.held().to(t.device)
    if bool(((t >= 0) & (held <= t)).any()):
        raise RuntimeError(f"the draft holds the target's features of {held.tolist()} positions but needs those of "
                           f"{(t + 1).tolist()}: the loop must call observe(features, starts) after every target pass")
    return t


class MedusaDraft(FeatureDraft, ChainOrTreeDraft):
    """Medusa heads as a chain or tree draft: head i's logits on the target's newest feature give draft position i + 1.

    `target` lends its frozen LM head (the heads share it) and its width;
    `heads` is a `MedusaHeads` on the target's last hidden state (`feature_layers =
    (n_layer,)`). A chain proposes at most `heads.n_heads` tokens; a tree is at most
    that deep. Its only state is the feature buffer of `FeatureDraft`.
    """

    def __init__(self, target: torch.nn.Module, heads: MedusaHeads) -> None:
        if not isinstance(heads, MedusaHeads):
            raise TypeError(f"heads must be a specref.drafts.heads.MedusaHeads, got {type(heads).__name__}")
        _check_target(target, heads.n_embd, "the Medusa heads")
        super().__init__((target.config.n_layer,))
        self.target, self.heads = target, heads
        self.vocab_size = int(target.config.vocab_size)
        self.n_heads = heads.n_heads
        self.passes = 0

    def observe(self, features: tuple[torch.Tensor, ...], starts: torch.Tensor) -> None:  # ([B, T, C],), [B]
        check_features_fit(features, self.heads.n_embd, self.heads, "the Medusa heads")
        super().observe(features, starts)

    @torch.no_grad()
    def head_logits(self, tokens: torch.Tensor, lengths: torch.Tensor, n: int) -> torch.Tensor | None:  # [B, n, V]
        """Heads 0 .. n-1 on each row's newest feature f_t (t = lengths - 2); None before any feature exists."""
        t = _check_lengths(self, tokens, lengths)
        if bool((t < 0).any()):
            return None  # a one-token prompt: nothing scored yet (all rows share the prompt length)
        (f_t,) = self.gather(t[:, None].to(self.feature_lengths.device))  # [B, 1, C]
        self.passes += 1
        return self.heads.logits(f_t, self.target.lm_head)[:, 0, :n]  # [B, n, V]: head i -> x_{t+2+i}

    @torch.no_grad()
    def propose_chain(
        self,
        tokens: torch.Tensor,  # [B, L]
        lengths: torch.Tensor,  # [B]
        k: int,
        params: SamplingParams,
        generator: torch.Generator | None = None,
    ) -> tuple[torch.Tensor, torch.Tensor]:  # drafts [B, k], q [B, k, V]
        """Draft position i + 1 from head i, all on f_t: argmax (q one-hot) or a draw from q = params.probs(logits)."""
        k = check_int("k", k, 0, "tokens to propose")
        if k > self.n_heads:
            raise ValueError(f"k={k} but this Medusa draft has {self.n_heads} heads: head i drafts position i + 1, "
                             f"so k must be <= {self.n_heads}")
        B, V = tokens.shape[0], self.vocab_size
        dtype = self.target.lm_head.weight.dtype
        if k == 0:
            _check_lengths(self, tokens, lengths)
            return tokens.new_zeros((B, 0)), torch.zeros((B, 0, V), dtype=dtype, device=tokens.device)
        logits = self.head_logits(tokens, lengths, k)  # [B, k, V]
        if logits is None:
            x = tokens[:, :1].expand(B, k).clone()  # the lone prompt token again, with one-hot q
            return x, torch.nn.functional.one_hot(x, V).to(dtype)
        if params.greedy:
            x = logits.argmax(-1)  # [B, k]
            return x, torch.nn.functional.one_hot(x, V).to(logits.dtype)
        q = params.probs_unchecked(logits)  # [B, k, V]
        return sample(q, generator), q

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
        """The Medusa tree: depth d's children are head d-1's top tokens (or draws from its q), under every node."""
        spec = as_tree_spec(spec)
        if spec.depth > self.n_heads:
            raise ValueError(f"a tree of depth {spec.depth} needs {spec.depth} Medusa heads, this draft has "
                             f"{self.n_heads}: use a tree at most {self.n_heads} deep")
        B = tokens.shape[0]
        logits = self.head_logits(tokens, lengths, spec.depth)  # [B, depth, V]
        if logits is None:  # no feature yet: one node per row, the lone prompt token (deterministic, one-hot)
            room = min(spec.depth if max_depth is None else max_depth, 1 if max_nodes is None else max_nodes)
            return [Tree((ROOT,), (int(tokens[b, 0]),)) if room > 0 else Tree((), ()) for b in range(B)]

        def draft_logits(trees: list[Tree], frontier: list[list[int]]) -> torch.Tensor:  # [B, n, V]
            node = frontier[0][0]  # every frontier node lies at one depth
            d = 1 if node == ROOT else trees[0].depths[node] + 1
            return logits[:, d - 1 : d].expand(B, len(frontier[0]), logits.shape[-1])

        return grow_trees(spec, draft_logits, B, params, generator, max_depth=max_depth, max_nodes=max_nodes)
