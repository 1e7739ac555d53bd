"""Drafts: anything that proposes k tokens with the distribution q it drew them from.

One verifier (`specref.decode.speculative_generate`) serves every draft through
this interface. A draft sees the shared token buffer and keeps whatever state
it likes (a KV cache, an n-gram index); after each verification it is told how
many leading tokens of each sequence are still the ones it saw, and forgets the rest.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from dataclasses import dataclass

import torch

from .sampling import _process_logits, process_logits, sample


@dataclass(frozen=True)
class SamplingParams:
    """The processing applied identically to p and q (see `process_logits`)."""

    temperature: float = 1.0
    top_k: int | None = None
    top_p: float | None = None

    @property
    def greedy(self) -> bool:
        return self.temperature == 0

    def __post_init__(self) -> None:
        process_logits(torch.zeros(1), self.temperature, self.top_k, self.top_p)  # raises on bad arguments

    def probs(self, logits: torch.Tensor) -> torch.Tensor:  # [..., V] -> [..., V]
        """process_logits with these settings (logits checked: NaN or +inf raise)."""
        return process_logits(logits, self.temperature, self.top_k, self.top_p)

    def probs_unchecked(self, logits: torch.Tensor) -> torch.Tensor:  # [..., V] -> [..., V]
        """The same distribution without the per-call checks, for a draft's inner loop.

        The decoding loop checks the stacked q of every step once (`decode._check_proposal`).
        """
        return _process_logits(logits, self.temperature, self.top_k, self.top_p)


class Draft(ABC):
    """The draft interface: `begin`, then alternately `propose` and `rollback`."""

    vocab_size: int

    @abstractmethod
    def begin(self, batch_size: int) -> None:
        """Start a new generation of `batch_size` sequences (forget all state)."""

    @abstractmethod
    def propose(
        self,
        tokens: torch.Tensor,  # [B, L] buffer; row b holds lengths[b] valid tokens
        lengths: torch.Tensor,  # [B]
        k: int,
        params: SamplingParams,
        generator: torch.Generator | None = None,
    ) -> tuple[torch.Tensor, torch.Tensor]:  # draft tokens [B, k], q [B, k, V]
        """Propose k tokens after each sequence, with the distribution q each was drawn from."""

    @abstractmethod
    def rollback(self, n_valid: torch.Tensor) -> None:  # [B]
        """Only the first n_valid[b] tokens of row b are still what the draft last saw."""


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
