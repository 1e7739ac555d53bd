"""Broken drafts: negative controls that a distribution test must flag on real models.

Each one breaks the contract that makes the rule exact (the drafts are samples of the q the
draft reports) in a way that real implementations have shipped. A check that passes the real
draft but cannot flag these proves nothing.
"""

from __future__ import annotations

import torch

from ..drafts import ModelDraft
from ..sampling import SamplingParams


class MisreportedModelDraft(ModelDraft):
    """Samples its drafts at temperature T / 2 but reports q at temperature T: q not processed like p.

    softmax(l / (T/2)) ** (1/2), renormalised, is softmax(l / T): the q a correct draft would report.
    """

    @torch.no_grad()
    def propose(
        self,
        tokens: torch.Tensor,  # [B, L]
        lengths: torch.Tensor,  # [B]
        k: int,
        params: SamplingParams,
        generator: torch.Generator | None = None,
    ) -> tuple[torch.Tensor, torch.Tensor]:  # [B, k], [B, k, V]
        if params.greedy:
            raise ValueError("MisreportedModelDraft breaks sampling: use a temperature > 0")
        colder = SamplingParams(params.temperature / 2, params.top_k, params.top_p)
        drafts, q_sampled = super().propose(tokens, lengths, k, colder, generator)
        q = q_sampled.sqrt()
        return drafts, q / q.sum(-1, keepdim=True)
