"""One speculative step, opened up: every draft, its q and p, and what the rule decided (chapter 4).

`trace_step` runs `speculative_step`, the very step `speculative_generate` loops
over, for one sequence, and records what it did for display: the step's own record
(`ChainStep`) and the two caches' lengths before and after it.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from .._validate import check_generator, check_int
from ..drafts import ModelDraft, as_draft
from ..sampling import SamplingParams
from .chain import speculative_step
from .inputs import check_inputs, check_pair
from .loop import Sequences, SpecStats, prefill


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
    if not isinstance(input_ids, torch.Tensor) or input_ids.dim() != 1 or input_ids.numel() < 2:
        raise ValueError(f"input_ids must be a [T] tensor with T >= 2, got shape {tuple(getattr(input_ids, 'shape', ()))}")
    k = check_int("k", k, 1, "k drafted tokens per step")
    params = SamplingParams(temperature)
    ids = check_inputs(target, input_ids, k + 1, "the target")  # [1, T]
    T = ids.shape[1]
    check_generator(generator, target.device)
    drafter = as_draft(draft)
    if not isinstance(drafter, ModelDraft):
        raise TypeError(f"trace_step traces a model draft (a GPT-2-like model or a ModelDraft), "
                        f"got {type(draft).__name__}")
    check_pair(target, drafter)
    drafter.begin(1)
    cache = target.new_cache(1)
    seqs = Sequences(ids, max_new_tokens=k + 1)  # a budget for every draft and the bonus
    stats = SpecStats(k=k)
    prefill(target, ids, cache, stats)  # everything but the last token, as in speculative_generate
    t0, d0 = int(cache.lengths[0]), int(drafter.cache.lengths[0])
    step = speculative_step(target, drafter, seqs, cache, k, params, generator, stats=stats)

    x = step.drafts[0]
    k = x.shape[0]  # what was proposed
    rows = torch.arange(k, device=x.device)
    p = params.probs(step.logits[0])  # [k+1, V]
    n_acc = step.n_accepted[0]
    return StepTrace(
        context_len=T,
        drafts=x.tolist(),
        q_of_draft=step.q[0, rows, x].tolist(),
        p_of_draft=p[rows, x].tolist(),
        p_argmax=step.logits[0].argmax(-1).tolist(),
        n_accepted=n_acc,
        emitted=step.out[0, : step.kept[0]].tolist(),
        # The pass appended [last token, x_1..x_k] to the target's cache; a model draft has fed the
        # context and x_1..x_{k-1} when it proposes (it never feeds x_k: the target scores it).
        target_cache_len=(t0, t0 + k + 1, int(cache.lengths[0])),
        draft_cache_len=(d0, T + k - 1, int(drafter.cache.lengths[0])),
    )
