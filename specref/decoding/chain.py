"""Plain and speculative decoding with a KV cache (chapter 4).

A speculative step (`speculative_step`), per row: the draft proposes k tokens (keeping q); one target pass
over [last token, x_1..x_k] gives p_1..p_{k+1}; the rule accepts drafts left to right and adds one token
(correction or bonus); both caches roll back to the accepted prefix. `speculative_generate` and `generate`
(the step with nothing drafted) run it in the one loop, `loop.decode`.
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import partial

import torch

from .._validate import check_int
from ..chain_verify import _verify_chain
from ..drafts import Draft, NoDraft, as_draft
from ..drafts.base import draw
from ..models.kvcache import KVCache
from ..rejection import _verify_chain_greedy
from ..sampling import SamplingParams
from ..typical import TypicalAcceptance, as_acceptance
from .inputs import check_logits_total, check_model, check_proposal
from .loop import Sequences, SpecStats, StepObserver, clock, decode, target_pass

__all__ = ["ChainStep", "generate", "speculative_generate", "speculative_step"]


@torch.no_grad()
def generate(
    model: torch.nn.Module,
    input_ids: torch.Tensor,  # [B, T] or [T]
    max_new_tokens: int,
    temperature: float = 1.0,
    top_k: int | None = None,
    top_p: float | None = None,
    generator: torch.Generator | None = None,
    eos_token_id: int | None = None,
) -> torch.Tensor:  # [B, T + max_new_tokens]
    """Plain autoregressive decoding: one target pass per token, sampling process_logits(logits).

    A `speculative_step` drafting nothing (`NoDraft`): N new tokens take N passes, the first over the whole prompt.
    A row stops after emitting `eos_token_id` (its remaining positions filled with EOS).
    """
    check_model(model)
    nothing = NoDraft(model.config.vocab_size)
    stats = SpecStats(k=0)
    step = partial(speculative_step, model, nothing, k=0, generator=generator, eos_token_id=eos_token_id, stats=stats)
    return decode(model, input_ids, max_new_tokens, (temperature, top_k, top_p), generator, eos_token_id, step,
                  stats, room=0, draft=nothing, timing=False, name="model", cache_prompt=False)


@dataclass(frozen=True)
class ChainStep:
    """What one `speculative_step` did (rows that were already done keep nothing)."""

    drafts: torch.Tensor  # [B, k] the proposed tokens (k: what the draft proposed, 0 included)
    q: torch.Tensor  # [B, k, V] the draft's distributions (one-hot when greedy)
    logits: torch.Tensor  # [B, k+1, V] the target's pass: row i scores the token after x_1..x_i
    out: torch.Tensor  # [B, k+1] accepted drafts, then the correction or bonus (later entries unused)
    n_accepted: list[int]  # [B]
    kept: list[int]  # [B] tokens each row appended: n_accepted + 1, cut by the budget or at EOS


@torch.no_grad()
def speculative_step(
    target: torch.nn.Module,
    draft: Draft,
    seqs: Sequences,
    cache: KVCache,  # the target's: every token of each row but its last
    k: int,
    params: SamplingParams,
    generator: torch.Generator | None = None,
    eos_token_id: int | None = None,
    stats: SpecStats | None = None,
    acceptance: str | TypicalAcceptance = "exact",  # a TypicalAcceptance is LOSSY (specref.typical)
) -> ChainStep:
    """One speculative step for every unfinished row: draft k, one target pass, accept left to right, commit.

    Near the end of the budget or the window k shrinks (the last token always comes from the target); a draft
    may propose fewer, none included (then it is a plain step).
    """
    typical = as_acceptance(acceptance)
    stats = SpecStats(k=check_int("k", k, 1, "k drafted tokens per step")) if stats is None else stats
    dev, B, V = seqs.tokens.device, seqs.batch_size, target.config.vocab_size
    ask = max(0, min(k, seqs.tokens_left() - 1, target.config.n_positions - max(seqs.lengths_h)))
    # 1. Draft: up to `ask` tokens per row (the same number n in every row), with the q each was drawn from.
    with clock(stats, "time_draft", dev):
        drafts, q = draft.propose(seqs.tokens, seqs.lengths, ask, params, generator)  # [B, n], [B, n, V]
    # The values are checked only for a draft the package does not vouch for.
    n = check_proposal(drafts, q, B, ask, V, params.greedy, values=not draft.trusted)
    stats.draft_passes += n
    # 2. One target pass over [last token, x_1..x_n]: p_1..p_{n+1} (and its features, for a draft that reads them).
    # Before any pass of plain decoding the cache is empty: the pass reads the whole prompt, its last row gives p_1.
    with clock(stats, "time_target", dev):
        ids = torch.cat([seqs.uncached(cache), drafts], 1)  # [B, w+n], w = 1 once the prompt is cached
        logits, features = target_pass(target, draft.feature_layers, ids, cache=cache,
                                       logits_to_keep=n + 1)  # [B, n+1, V], features
    stats.target_passes += 1
    # 3. Accept or reject left to right, then one token from the target: a correction or the bonus.
    with clock(stats, "time_verify", dev):
        if n == 0:  # nothing proposed: the target's own token, a plain step, which reads nothing back
            out, n_acc = draw(logits[:, 0], params, generator)[0][:, None], [0] * B
        else:
            if typical is not None:  # LOSSY: q is ignored
                out, n_acc = typical.verify(drafts, params.probs_unchecked(logits), generator)
            elif params.greedy:
                out, n_acc = _verify_chain_greedy(drafts, logits)  # [B, n+1], [B]
            else:  # check_proposal checked q
                out, n_acc = _verify_chain(drafts, q, params.probs_unchecked(logits), generator=generator,
                                           check_support=not draft.trusted)
            n_acc, total = _read_back(n_acc, logits)  # the step's one read back: waits for the rule to finish
            check_logits_total(total, logits, params)
    # 4. Commit the kept tokens; roll both caches back to context + accepted drafts.
    if features is not None:  # the pass covered positions lengths - 1 ..; rollback keeps the accepted ones
        draft.observe(features, seqs.lengths - 1)
    kept, n_valid = seqs.commit(out, n_acc, eos_token_id)
    _count(stats, n_acc, kept, n)
    cache.set(seqs.lengths - 1, max(seqs.lengths_h) - 1)  # every token but the last; the host knows the longest
    draft.rollback(n_valid)
    return ChainStep(drafts, q, logits, out, n_acc, kept)


def _read_back(n_acc: torch.Tensor, logits: torch.Tensor) -> tuple[list[int], float]:  # [B], [B, T, V]
    """The accepted counts and the logits' total (`check_logits_total`), in one read back from the device."""
    total = logits.sum(dtype=torch.float32)  # float16 logits would overflow a sum in their own dtype
    host = torch.cat([n_acc.to(torch.float64), total.to(torch.float64)[None]]).tolist()
    return [int(n) for n in host[:-1]], host[-1]


def _count(stats: SpecStats, n_acc: list[int], kept: list[int], k: int) -> None:
    """Count a chain step over the rows it served (kept > 0): k proposed, min(accepted + 1, k) examined."""
    active = [n for n, m in zip(n_acc, kept) if m]
    examined = sum(min(n + 1, k) for n in active)
    stats.count_step(active, sum(kept), k * len(active), examined, hist=k == stats.k)  # a shrunk k: no histogram
    stats.count_proposed(k, len(active))  # every served row-step, a shrunk or declined proposal included


@torch.no_grad()
def speculative_generate(
    target: torch.nn.Module,
    draft: Draft | torch.nn.Module,
    input_ids: torch.Tensor,  # [B, T] or [T]
    k: int = 4,
    max_new_tokens: int = 64,
    temperature: float = 1.0,
    top_k: int | None = None,
    top_p: float | None = None,
    generator: torch.Generator | None = None,
    eos_token_id: int | None = None,
    acceptance: str | TypicalAcceptance = "exact",
    on_step: StepObserver | None = None,
    timing: bool | None = None,
) -> tuple[torch.Tensor, SpecStats]:  # [B, T + max_new_tokens], stats
    """Speculative decoding: the output distribution is exactly the target's (greedy: the same tokens).

    Each row accepts its own number of drafts per step and gets `max_new_tokens` tokens, or stops after
    `eos_token_id` (the rest filled with EOS). `acceptance=TypicalAcceptance(...)` (Medusa's) is LOSSY. `on_step`
    sees each `ChainStep`; `timing` times draft, target and rule (`SpecStats.time_*`; None: off CUDA).
    """
    typical = as_acceptance(acceptance)
    stats = SpecStats(k=check_int("k", k, 1, "k drafted tokens per step"))
    drafter = as_draft(draft)
    step = partial(speculative_step, target, drafter, k=k, generator=generator, eos_token_id=eos_token_id,
                   stats=stats, acceptance=typical or "exact")
    # Rows write up to k drafts past the longest's budget (k shrinks only with what the shortest has left).
    out = decode(target, input_ids, max_new_tokens, (temperature, top_k, top_p), generator, eos_token_id, step,
                 stats, room=k, draft=drafter, on_step=on_step, timing=timing)
    return out, stats
