"""Plain and speculative decoding with a KV cache.

A speculative step: the draft proposes k tokens (keeping q); one target pass
over [last token, x_1..x_k] gives p_1..p_{k+1}; `verify_chain` keeps the
accepted prefix and adds one token (correction or bonus). Both caches are then
rolled back to the accepted prefix by moving their lengths: rejected entries
are simply overwritten later. The token the target emitted gets its K/V entry
when it is fed at the start of the next step.
"""

from __future__ import annotations

import math
import time
from dataclasses import dataclass, field

import numpy as np
import torch

from .._validate import check_probs, check_tokens
from ..drafts import Draft, as_draft
from ..rejection import _verify_chain, _verify_chain_greedy
from ..sampling import SamplingParams, sample


@dataclass
class SpecStats:
    """What one `speculative_generate` call did, counted over active rows and steps."""

    k: int
    target_passes: int = 0
    draft_passes: int = 0
    steps: int = 0  # row-steps: one per active sequence per target pass
    accepted_hist: np.ndarray = field(default_factory=lambda: np.zeros(0, dtype=np.int64))  # [k+1]
    proposed: int = 0  # drafts proposed
    examined: int = 0  # drafts the rule looked at: min(accepted + 1, k) per step
    accepted: int = 0
    emitted: int = 0
    time_target: float = 0.0  # the target's passes (prefill included)
    time_draft: float = 0.0  # the draft's proposals, its own sampling included
    time_verify: float = 0.0  # the acceptance rule: logits check, p = process_logits, verify
    time_total: float = 0.0

    @property
    def acceptance_rate(self) -> float:
        """alpha: accepted drafts / examined drafts (see `theory.estimate_alpha`)."""
        return self.accepted / max(self.examined, 1)

    @property
    def mean_accepted(self) -> float:
        """Mean number of accepted drafts per step."""
        return self.accepted / max(self.steps, 1)

    @property
    def tokens_per_step(self) -> float:
        """Tokens emitted per target pass and sequence (1 to k+1)."""
        return self.emitted / max(self.steps, 1)

    @property
    def time_overhead(self) -> float:
        """The loop's own work: wall time outside the passes and the acceptance rule (bookkeeping)."""
        return self.time_total - self.time_target - self.time_draft - self.time_verify

    def as_dict(self) -> dict[str, float | int | list[int]]:
        return {
            "k": self.k,
            "target_passes": self.target_passes,
            "draft_passes": self.draft_passes,
            "steps": self.steps,
            "accepted_hist": self.accepted_hist.tolist(),
            "proposed": self.proposed,
            "examined": self.examined,
            "accepted": self.accepted,
            "acceptance_rate": self.acceptance_rate,
            "mean_accepted": self.mean_accepted,
            "tokens_per_step": self.tokens_per_step,
            "time_target": self.time_target,
            "time_draft": self.time_draft,
            "time_verify": self.time_verify,
            "time_overhead": self.time_overhead,
            "time_total": self.time_total,
        }


def _check_common(model: torch.nn.Module, input_ids: object, max_new_tokens: object, name: str = "model") -> torch.Tensor:
    if not isinstance(input_ids, torch.Tensor):
        raise TypeError(f"input_ids must be a [B, T] torch.Tensor of token ids, got {type(input_ids).__name__}")
    if input_ids.dtype.is_floating_point or input_ids.dtype == torch.bool or input_ids.is_complex():
        raise TypeError(f"input_ids must be an integer tensor, got {input_ids.dtype}")
    if input_ids.dim() == 1:
        input_ids = input_ids[None]
    if input_ids.dim() != 2 or input_ids.shape[0] == 0:
        raise ValueError(f"input_ids must have shape [B, T] with B >= 1, got {tuple(input_ids.shape)}")
    if input_ids.shape[1] == 0:
        raise ValueError("input_ids is an empty prompt: give at least one token")
    check_tokens("input_ids", input_ids, model.config.vocab_size)
    if isinstance(max_new_tokens, bool) or not isinstance(max_new_tokens, int) or max_new_tokens < 0:
        raise ValueError(f"max_new_tokens must be an int >= 0, got {max_new_tokens!r}")
    n_ctx = model.config.n_positions
    if input_ids.shape[1] + max_new_tokens > n_ctx:
        raise ValueError(
            f"prompt ({input_ids.shape[1]} tokens) + max_new_tokens ({max_new_tokens}) exceeds "
            f"{name}'s context window n_positions={n_ctx}"
        )
    return input_ids.to(model.device, torch.long)


def _new_buffer(input_ids: torch.Tensor, max_new_tokens: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Token buffer [B, T + max_new] holding the prompt, per-row lengths [B], and done flags [B]."""
    B, T = input_ids.shape
    tokens = torch.zeros((B, T + max_new_tokens), dtype=torch.long, device=input_ids.device)
    tokens[:, :T] = input_ids
    lengths = torch.full((B,), T, dtype=torch.long, device=input_ids.device)
    return tokens, lengths, torch.zeros(B, dtype=torch.bool, device=input_ids.device)


def _prefill(target: torch.nn.Module, input_ids: torch.Tensor, cache, stats: SpecStats) -> None:  # [B, T]
    """Cache every prompt token but the last: each step feeds the last one first, then the drafts."""
    _sync(target.device)
    t0 = time.perf_counter()
    if input_ids.shape[1] > 1:
        target(input_ids[:, :-1], cache=cache, logits_to_keep=1)  # only the cache is needed
        stats.target_passes += 1
    _sync(target.device)
    stats.time_target += time.perf_counter() - t0


def _check_proposal(
    drafts: object, q: object, B: int, k: int, V: int, greedy: bool
) -> None:  # drafts [B, k], q [B, k, V]
    """A draft's proposal must be k token ids per row and, when sampling, k distributions q per row."""
    if not isinstance(drafts, torch.Tensor) or tuple(drafts.shape) != (B, k):
        raise ValueError(f"the draft must propose a [B, k] = [{B}, {k}] tensor of token ids, "
                         f"got {tuple(getattr(drafts, 'shape', ())) or type(drafts).__name__}")
    check_tokens("draft tokens", drafts, V)
    if not greedy:
        if not isinstance(q, torch.Tensor) or tuple(q.shape) != (B, k, V):
            raise ValueError(f"the draft must return q of shape [B, k, V] = [{B}, {k}, {V}], "
                             f"got {tuple(getattr(q, 'shape', ())) or type(q).__name__}")
        check_probs("the draft's q", q)


def _count(stats: SpecStats, n_acc: list[int], n_emitted: int, k_eff: int) -> None:
    """Add one step to the stats: n_acc holds the accepted counts of the rows still active."""
    stats.steps += len(n_acc)
    stats.proposed += k_eff * len(n_acc)
    stats.accepted += sum(n_acc)
    stats.examined += sum(min(n + 1, k_eff) for n in n_acc)
    stats.emitted += n_emitted
    if k_eff == stats.k:
        for n in n_acc:
            stats.accepted_hist[n] += 1


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def _finish(
    tokens: torch.Tensor,  # [B, T + max_new]
    lengths: torch.Tensor,  # [B]
    eos_token_id: int | None,
) -> torch.Tensor:
    """Fill each row after its last emitted token with EOS (rows that stopped early)."""
    pos = torch.arange(tokens.shape[1], device=tokens.device)
    if eos_token_id is None:
        return tokens
    return torch.where(pos[None] < lengths[:, None], tokens, torch.full_like(tokens, eos_token_id))


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

    A row stops after emitting `eos_token_id`; its remaining positions are filled with EOS.
    """
    params = SamplingParams(temperature, top_k, top_p)  # raises on bad sampling arguments
    input_ids = _check_common(model, input_ids, max_new_tokens)
    B, T = input_ids.shape
    tokens, lengths, done = _new_buffer(input_ids, max_new_tokens)
    if max_new_tokens == 0:
        return tokens
    cache = model.new_cache(B)
    logits = model(input_ids, cache=cache, logits_to_keep=1)[:, -1]  # [B, V]
    for i in range(max_new_tokens):
        x = logits.argmax(-1) if params.greedy else sample(params.probs(logits), generator)  # [B]
        x = torch.where(done, torch.zeros_like(x), x)
        tokens[:, T + i] = x
        lengths = lengths + (~done).long()
        if eos_token_id is not None:
            done = done | (x == eos_token_id)
        if bool(done.all()) or i == max_new_tokens - 1:
            break
        logits = model(x[:, None], cache=cache)[:, -1]
    return _finish(tokens, lengths, eos_token_id)


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
    tree: object | None = None,
) -> tuple[torch.Tensor, SpecStats]:  # [B, T + max_new_tokens], stats
    """Speculative decoding: the output distribution is exactly the target's (greedy: the same tokens).

    Each row accepts its own number of drafts per step. Exactly `max_new_tokens`
    tokens are generated per row unless it emits `eos_token_id` (nothing after EOS;
    the rest is filled with EOS). Near the end of the budget or the context
    window, k shrinks so no token is drafted that could never be emitted.

    `tree` switches to tree drafting (`specref.decoding.tree.tree_generate`, k unused):
    a static shape (tuple of branching factors or `TreeShape`) or a dynamic tree
    (int node budget or `DynamicTree`).
    """
    if tree is not None:
        from .tree import tree_generate

        return tree_generate(target, draft, input_ids, tree, max_new_tokens, temperature, top_k, top_p,
                             generator, eos_token_id)
    if isinstance(k, bool) or not isinstance(k, int):
        raise TypeError(f"k must be an int >= 1, got {k!r}")
    if k < 1:
        raise ValueError(f"k must be >= 1 (k drafted tokens per step), got {k}")
    params = SamplingParams(temperature, top_k, top_p)  # raises on bad sampling arguments
    drafter = as_draft(draft)
    if drafter.vocab_size != target.config.vocab_size:
        raise ValueError(
            f"draft and target vocabularies differ ({drafter.vocab_size} vs {target.config.vocab_size}): "
            "they must share one tokenizer"
        )
    draft_device = getattr(getattr(drafter, "model", None), "device", target.device)
    if draft_device != target.device:
        raise ValueError(f"target is on {target.device} but the draft is on {draft_device}: put both on one device")
    input_ids = _check_common(target, input_ids, max_new_tokens, "the target")
    dev = target.device
    B, T = input_ids.shape
    n_ctx = target.config.n_positions
    stats = SpecStats(k=k, accepted_hist=np.zeros(k + 1, dtype=np.int64))
    tokens, lengths, _ = _new_buffer(input_ids, max_new_tokens)
    if max_new_tokens == 0:
        return tokens, stats

    t_start = time.perf_counter()
    cache = target.new_cache(B)
    drafter.begin(B)
    _prefill(target, input_ids, cache, stats)

    # Per-row lengths and done flags live on the host: the loop needs them as ints
    # every step, and one list beats a dozen tiny tensor ops (and device syncs).
    end = T + max_new_tokens
    lengths_h, done_h = [T] * B, [False] * B  # `lengths` holds the same on the device
    width = tokens.shape[1]
    while not all(done_h):
        room = max(end - n for n, d in zip(lengths_h, done_h) if not d)
        # Never draft past the budget (the last token comes from the target) or the window.
        k_eff = max(0, min(k, room - 1, n_ctx - max(lengths_h)))

        _sync(dev)
        t0 = time.perf_counter()
        drafts, q = drafter.propose(tokens, lengths, k_eff, params, generator)  # [B, k_eff], [B, k_eff, V]
        _sync(dev)
        stats.time_draft += time.perf_counter() - t0
        stats.draft_passes += k_eff
        _check_proposal(drafts, q, B, k_eff, target.config.vocab_size, params.greedy)

        t0 = time.perf_counter()
        last = tokens.gather(1, (lengths - 1)[:, None])  # [B, 1]
        logits = target(torch.cat([last, drafts], 1), cache=cache)  # [B, k_eff+1, V]
        _sync(dev)
        stats.time_target += time.perf_counter() - t0
        stats.target_passes += 1

        t0 = time.perf_counter()
        # One reduction checks the logits: NaN or +inf anywhere makes the sum NaN or +inf. A -inf
        # sum (masked tokens) takes the full check, which also refuses a row that is all -inf.
        total = float(logits.sum())
        if math.isnan(total) or total == math.inf:
            raise ValueError("the target's logits contain NaN or +inf")
        if total == -math.inf:
            params.probs(logits)
        if params.greedy:
            out, n_acc = _verify_chain_greedy(drafts, logits)
        else:  # _check_proposal checked q
            out, n_acc = _verify_chain(drafts, q, params.probs_unchecked(logits), generator, None)  # [B, k_eff+1], [B]
        n_acc_h = n_acc.tolist()  # waits for the rule to finish
        stats.time_verify += time.perf_counter() - t0

        out_h = out.tolist() if eos_token_id is not None else None
        active = [b for b in range(B) if not done_h[b]]
        n_valid_h, src, dst = list(lengths_h), [], []
        for b in active:
            # How many of this step's tokens row b keeps: budget, then everything up to EOS.
            n = min(n_acc_h[b] + 1, end - lengths_h[b])
            if out_h is not None and eos_token_id in out_h[b][:n]:
                n = out_h[b].index(eos_token_id) + 1
                done_h[b] = True
            src += range(b * (k_eff + 1), b * (k_eff + 1) + n)
            dst += range(b * width + lengths_h[b], b * width + lengths_h[b] + n)
            # The draft saw [context, x_1..x_{k-1}]; the buffer now agrees with it up to here.
            n_valid_h[b] += min(n_acc_h[b], n)
            lengths_h[b] += n
            done_h[b] = done_h[b] or lengths_h[b] >= end
        _count(stats, [n_acc_h[b] for b in active], len(src), k_eff)
        # One copy to the device carries the write's indices, the new lengths and the draft's rollback.
        host = torch.tensor(src + dst + lengths_h + n_valid_h, dtype=torch.long, device=dev)
        src_t, dst_t, lengths, n_valid = host.split([len(src), len(src), B, B])
        tokens.view(-1)[dst_t] = out.reshape(-1)[src_t]  # row b gets out[b, :n] at lengths[b]..

        # Keep context + accepted drafts, drop rejected ones: 0 <= lengths - 1 < the cache's lengths.
        cache.lengths = lengths - 1  # as the model itself moves them: no check, no read back
        drafter.rollback(n_valid)

    stats.time_total = time.perf_counter() - t_start
    return _finish(tokens, lengths, eos_token_id), stats
