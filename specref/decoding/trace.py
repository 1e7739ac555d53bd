"""One speculative step, opened up: every draft, its q and p, and what the rule decided.

`trace_step` runs exactly the pieces `speculative_generate` runs (the draft's
`propose`, one target pass, `verify_chain` or `verify_chain_greedy`, the cache
truncation) for one sequence, and records them for display.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from ..drafts import ModelDraft
from ..sampling import SamplingParams
from ..rejection import verify_chain, verify_chain_greedy


@dataclass
class StepTrace:
    """What happened in one step. Per-draft lists have length k; p_argmax has k + 1."""

    context_len: int
    drafts: list[int]
    q_of_draft: list[float]  # q_i(x_i)
    p_of_draft: list[float]  # p_i(x_i)
    p_argmax: list[int]  # the target's choice at each of the k+1 positions
    n_accepted: int
    emitted: list[int]  # accepted drafts, then the correction or bonus token
    target_cache_len: tuple[int, int, int]  # before the pass, after it, after rollback
    draft_cache_len: tuple[int, int, int]  # before propose, after it, after rollback

    @property
    def bonus(self) -> bool:
        """True when all drafts were accepted and the last token is the bonus from p_{k+1}."""
        return self.n_accepted == len(self.drafts)


@torch.no_grad()
def trace_step(
    target: torch.nn.Module,
    draft: torch.nn.Module,
    input_ids: torch.Tensor,  # [T]
    k: int,
    temperature: float = 0.0,
    generator: torch.Generator | None = None,
) -> StepTrace:
    """Run one speculative step after `input_ids` and record every decision."""
    if input_ids.dim() != 1 or input_ids.numel() < 2:
        raise ValueError(f"input_ids must be a [T] tensor with T >= 2, got shape {tuple(input_ids.shape)}")
    params = SamplingParams(temperature)
    ids = input_ids[None].to(target.device)  # [1, T]
    T = ids.shape[1]
    lengths = torch.tensor([T], device=ids.device)

    drafter = ModelDraft(draft)
    drafter.begin(1)
    d0 = int(drafter.cache.lengths[0])
    drafts, q = drafter.propose(ids, lengths, k, params, generator)  # [1, k], [1, k, V]
    d1 = int(drafter.cache.lengths[0])

    cache = target.new_cache(1)
    target(ids[:, :-1], cache=cache)  # everything but the last token, as in speculative_generate
    t0 = int(cache.lengths[0])
    logits = target(torch.cat([ids[:, -1:], drafts], 1), cache=cache)  # [1, k+1, V]
    t1 = int(cache.lengths[0])
    p = params.probs(logits)
    if params.greedy:
        out, n_acc = verify_chain_greedy(drafts[0], logits[0])
    else:
        out, n_acc = verify_chain(drafts[0], q[0], p[0], generator)
    cache.truncate(T - 1 + n_acc + 1)  # context + accepted drafts; the emitted token is fed next step
    drafter.rollback(torch.tensor([T + n_acc], device=ids.device))

    x = drafts[0]
    rows = torch.arange(k, device=x.device)
    return StepTrace(
        context_len=T,
        drafts=x.tolist(),
        q_of_draft=q[0, rows, x].tolist(),
        p_of_draft=p[0, rows, x].tolist(),
        p_argmax=logits[0].argmax(-1).tolist(),
        n_accepted=int(n_acc),
        emitted=out.tolist(),
        target_cache_len=(t0, t1, int(cache.lengths[0])),
        draft_cache_len=(d0, d1, int(drafter.cache.lengths[0])),
    )
