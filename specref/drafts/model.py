"""A smaller language model as the draft: k autoregressive steps with its own KV cache."""

from __future__ import annotations

import torch

from ..sampling import SamplingParams, sample
from .base import Draft


class ModelDraft(Draft):
    """A smaller language model as draft: k autoregressive steps with its own KV cache.

    The cache holds the first `fed[b]` tokens of each row. Tokens not yet fed (the
    target's correction, or the last accepted draft) are fed at the next `propose`;
    rows needing fewer re-feed their last cached tokens, which rewrites identical
    K/V and keeps the batch rectangular without padding tokens.
    """

    def __init__(self, model: torch.nn.Module) -> None:
        self.model = model
        self.vocab_size = int(model.config.vocab_size)
        self.cache = None
        self.fed: torch.Tensor | None = None  # [B]

    def begin(self, batch_size: int) -> None:
        self.cache = self.model.new_cache(batch_size)
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
        B, V = tokens.shape[0], self.vocab_size
        dev = tokens.device
        if k == 0:
            return tokens.new_zeros((B, 0)), torch.zeros((B, 0, V), device=dev)
        width = int((lengths - self.fed).max().clamp(min=1))
        start = lengths - width  # [B]
        self.cache.truncate(start)
        chunk = tokens.gather(1, start[:, None] + torch.arange(width, device=dev))  # [B, width]
        logits = self.model(chunk, cache=self.cache, logits_to_keep=1)[:, -1]  # [B, V]
        drafts, qs = [], []
        for i in range(k):
            if params.greedy:  # q is one-hot on the argmax; build it once, after the loop
                x = logits.argmax(-1)
            else:
                q = params.probs_unchecked(logits)
                x = sample(q, generator)
                qs.append(q)
            drafts.append(x)
            if i < k - 1:  # the last draft is never fed: the target scores it
                logits = self.model(x[:, None], cache=self.cache)[:, -1]
        self.fed = lengths + (k - 1)
        x = torch.stack(drafts, 1)  # [B, k]
        if params.greedy:
            return x, torch.nn.functional.one_hot(x, V).to(logits.dtype)
        return x, torch.stack(qs, 1)

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
