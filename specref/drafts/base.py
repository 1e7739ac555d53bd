"""Drafts: anything that proposes k tokens with the distribution q it drew them from.

One verifier (`specref.decoding.chain.speculative_generate`) serves every draft through
this interface. A draft sees the shared token buffer and keeps whatever state
it likes (a KV cache, an n-gram index); after each verification it is told how
many leading tokens of each sequence are still the ones it saw, and forgets the rest.
"""

from __future__ import annotations

from abc import ABC, abstractmethod

import torch

from ..sampling import SamplingParams


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
