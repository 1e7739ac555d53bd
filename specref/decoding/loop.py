"""The one decoding loop (`decode`) and what every strategy's step shares: the stats, the token buffer, prefill.

Plain (`chain.generate`), chain, tree and lookahead decoding are strategies: each hands `decode` its step,
the room its passes write past the budget and its draft. Every target pass goes through `target_pass`, the
model's unchecked pass, with hidden states only for a draft that reads them (`Draft.feature_layers`). A chain
step reads the device back once (tests/test_host_syncs.py); the passes are timed only when asked.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from contextlib import AbstractContextManager, nullcontext
from dataclasses import dataclass, field, fields

import numpy as np
import torch

from .._validate import check_generator, check_int
from ..drafts import Draft
from ..models.gpt2 import unchecked
from ..models.kvcache import KVCache
from ..models.session import Session
from ..sampling import SamplingParams
from ..timing import sync, timed
from .inputs import check_eos, check_inputs, check_pair

__all__ = ["Sequences", "SpecStats", "decode", "prefill"]


@dataclass
class SpecStats:
    """What one speculative generation did, counted over active rows and steps."""

    k: int
    target_passes: int = 0
    draft_passes: int = 0
    steps: int = 0  # row-steps: one per active sequence per target pass
    accepted_hist: np.ndarray = field(init=False)  # [k+1] row-steps by the number of drafts accepted
    proposed: int = 0  # drafts proposed
    # [k+1] chain row-steps by the number of drafts proposed (fewer than k near the end, or when a draft declines)
    proposed_hist: np.ndarray = field(init=False)
    examined: int = 0  # drafts the rule looked at: min(accepted + 1, k) per step
    accepted: int = 0
    emitted: int = 0
    time_target: float = 0.0  # the target's passes (prefill included)
    time_draft: float = 0.0  # the draft's proposals, its own sampling included
    time_verify: float = 0.0  # the acceptance rule: logits check, p = process_logits, verify
    time_total: float = 0.0
    timing: bool = True  # whether the passes are timed: on a GPU each timer waits for the device (`resolve_timing`)

    def __post_init__(self) -> None:
        check_int("k", self.k, 0, "drafts per step")
        self.accepted_hist = np.zeros(self.k + 1, dtype=np.int64)
        self.proposed_hist = np.zeros(self.k + 1, dtype=np.int64)

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

    def count_step(self, n_acc: list[int], emitted: int, proposed: int, examined: int, hist: bool = True) -> None:
        """Add one step: n_acc holds the accepted counts of the rows that were still active."""
        self.steps += len(n_acc)
        self.proposed += proposed
        self.examined += examined
        self.accepted += sum(n_acc)
        self.emitted += emitted
        if hist:
            for n in n_acc:
                self.accepted_hist[n] += 1

    def count_proposed(self, n_drafts: int, rows: int) -> None:
        """Add `rows` row-steps that were proposed `n_drafts` drafts each (the histogram grows past k if it must)."""
        if n_drafts >= len(self.proposed_hist):  # a step asked for more than the k these stats were made for
            self.proposed_hist = np.pad(self.proposed_hist, (0, n_drafts + 1 - len(self.proposed_hist)))
        self.proposed_hist[n_drafts] += rows

    def as_dict(self) -> dict[str, float | int | list[int]]:
        """Every count and time, the rates beside them (histograms as lists)."""
        d = {f.name: getattr(self, f.name) for f in fields(SpecStats) if f.name not in ("timing", "emitted")}
        d.update(accepted_hist=self.accepted_hist.tolist(), proposed_hist=self.proposed_hist.tolist(),
                 acceptance_rate=self.acceptance_rate, mean_accepted=self.mean_accepted,
                 tokens_per_step=self.tokens_per_step, time_overhead=self.time_overhead)
        return d


class Sequences:
    """The batch being decoded: a token buffer [B, T + max_new] holding the prompt, each row's length (`lengths` on
    the device, `lengths_h` on the host: no device sync) and done flags (`done_h`, host)."""

    def __init__(self, input_ids: torch.Tensor, max_new_tokens: int) -> None:  # [B, T]
        B, T = input_ids.shape
        self.tokens = torch.zeros((B, T + max_new_tokens), dtype=torch.long, device=input_ids.device)
        self.tokens[:, :T] = input_ids
        self.lengths = torch.full((B,), T, dtype=torch.long, device=input_ids.device)  # [B]
        self.lengths_h = [T] * B
        self.done_h = [max_new_tokens == 0] * B
        self.end = T + max_new_tokens  # a row is done at this length, or after EOS

    @property
    def batch_size(self) -> int:
        return len(self.lengths_h)

    @property
    def done(self) -> bool:
        return all(self.done_h)

    def tokens_left(self) -> int:
        """The most tokens an unfinished row may still emit: what is left of the budget of the shortest such row."""
        return max((self.end - n for n, d in zip(self.lengths_h, self.done_h) if not d), default=0)

    def last_tokens(self) -> torch.Tensor:  # [B, 1]
        """Each row's last token: not yet in the target's cache, it is fed first at the next pass."""
        return self.tokens.gather(1, (self.lengths - 1)[:, None])

    def uncached(self, cache: KVCache) -> torch.Tensor:  # [B, w]
        """The tokens the target's cache lacks, fed first at the next pass: each row's last (w = 1), or the prompt."""
        w = max(self.lengths_h) - cache.bound
        return self.tokens.gather(1, (self.lengths - w)[:, None] + torch.arange(w, device=self.tokens.device))

    def commit(
        self,
        out: torch.Tensor,  # [B, W] row b: its accepted drafts, then the target's token
        n_acc: list[int],  # [B] accepted drafts per row
        eos_token_id: int | None,
        out_h: list[list[int]] | None = None,  # out as lists, if the caller has them
    ) -> tuple[list[int], torch.Tensor]:  # kept [B], n_valid [B]
        """Append out[b, :n_b] to each unfinished row, n_b = n_acc[b] + 1 cut by the budget and after EOS.

        Returns the tokens each row kept (0: already done) and n_valid [B] on the device, for the draft's rollback:
        the leading tokens of each row still what it saw (context + accepted drafts)."""
        B, W = out.shape
        width = self.tokens.shape[1]
        if eos_token_id is not None and out_h is None:
            out_h = out.tolist()
        kept, n_valid, src, dst = [0] * B, list(self.lengths_h), [], []
        for b in range(B):
            if self.done_h[b]:
                continue
            n = min(n_acc[b] + 1, self.end - self.lengths_h[b])
            if out_h is not None and eos_token_id in out_h[b][:n]:
                n = out_h[b].index(eos_token_id) + 1
                self.done_h[b] = True
            src += range(b * W, b * W + n)
            dst += range(b * width + self.lengths_h[b], b * width + self.lengths_h[b] + n)
            # The draft saw [context, x_1..x_{k-1}]; the buffer now agrees with it up to here.
            n_valid[b] += min(n_acc[b], n)
            kept[b] = n
            self.lengths_h[b] += n
            self.done_h[b] = self.done_h[b] or self.lengths_h[b] >= self.end
        # One copy to the device carries the write's indices, the new lengths and the draft's rollback.
        host = torch.tensor(src + dst + self.lengths_h + n_valid, dtype=torch.long, device=self.tokens.device)
        src_t, dst_t, self.lengths, n_valid_t = host.split([len(src), len(src), B, B])
        self.tokens.view(-1)[dst_t] = out.reshape(-1)[src_t]  # row b gets out[b, :n] at lengths[b]..
        return kept, n_valid_t

    def finish(self, eos_token_id: int | None) -> torch.Tensor:  # [B, T + max_new]
        """The buffer, each row filled with EOS after its last emitted token (rows that stopped early)."""
        if eos_token_id is None:
            return self.tokens
        pos = torch.arange(self.tokens.shape[1], device=self.tokens.device)
        return torch.where(pos[None] < self.lengths[:, None], self.tokens, torch.full_like(self.tokens, eos_token_id))


def target_pass(
    target: torch.nn.Module, feature_layers: tuple[int, ...], input_ids: torch.Tensor, **kwargs: object
) -> tuple[torch.Tensor, tuple[torch.Tensor, ...] | None]:  # logits [B, T, V], features ([B, T, C], ...) or None
    """One target pass, unchecked (`GPT2.step`), with the hidden states `feature_layers` (a draft's) or None."""
    run = unchecked(target)
    if not feature_layers:
        return run(input_ids, **kwargs), None
    out = run(input_ids, return_hidden=True, **kwargs)
    return out.logits, tuple(out.hidden_states[i] for i in feature_layers)


def prefill(target: torch.nn.Module, input_ids: torch.Tensor, cache: KVCache, stats: SpecStats,
            draft: Draft | None = None) -> None:  # [B, T]
    """Cache every prompt token but the last (each step feeds it first); a feature draft observes positions 0 .. T-2."""
    features = None
    with clock(stats, "time_target", target.device):
        if input_ids.shape[1] > 1:
            layers = () if draft is None else draft.feature_layers
            _, features = target_pass(target, layers, input_ids[:, :-1], cache=cache, logits_to_keep=1)
            stats.target_passes += 1
    if features is not None:
        draft.observe(features, torch.zeros(input_ids.shape[0], dtype=torch.long, device=input_ids.device))


StepObserver = Callable[[object], None]  # on_step(record): called with each step's record, after the step


def clock(stats: SpecStats, name: str, device: torch.device) -> AbstractContextManager[None]:
    """`timing.timed` into `stats.<name>` when the generation times its passes (`stats.timing`), else nothing."""
    return timed(stats, name, device) if stats.timing else nullcontext()


def resolve_timing(timing: bool | None, device: torch.device) -> bool:
    """Whether a generation times its passes: as asked, or (None) where a timer costs no host sync (not on CUDA)."""
    if timing is None:
        return torch.device(device).type != "cuda"
    if not isinstance(timing, bool):
        raise TypeError(f"timing must be a bool or None, got {timing!r}")
    return timing


def decode(
    target: torch.nn.Module,
    input_ids: object,  # [B, T] or [T]
    max_new_tokens: object,
    sampling: tuple[float, int | None, float | None],  # temperature, top_k, top_p: one `SamplingParams`
    generator: object,
    eos_token_id: object,
    step: Callable[..., object],  # step(seqs, cache, params=params) -> the step's record
    stats: SpecStats,
    room: int,  # cache slots a step may write past the budget: its drafts, tree or window
    draft: Draft | None = None,  # joins the run's session and begins; a feature draft observes the prompt's
    begin: Callable[[torch.Tensor], None] | None = None,  # begin(input_ids): readies a strategy's own state
    on_step: StepObserver | None = None,
    timing: bool | None = None,  # time the passes (`resolve_timing`)
    name: str = "the target",  # what the model is called in errors
    cache_prompt: bool = True,  # False: nothing is prefilled, the first step's pass reads the whole prompt
) -> torch.Tensor:  # [B, T + max_new_tokens]
    """The one generation loop behind every front door: check once, open a session, prefill, step, EOS fill.

    Every check happens here (sampling, the pair, the prompt and its budget, EOS, the generator); no pass checks
    again. The target's and the draft's (`Draft.join`) caches come from one `Session`, sized to prompt +
    max_new_tokens + room (within the window). `stats.time_total`: from the cache's allocation to the last step.
    """
    params = SamplingParams(*sampling)  # raises on bad sampling arguments
    if draft is not None:
        check_pair(target, draft)
    input_ids = check_inputs(target, input_ids, max_new_tokens, name)
    check_eos(eos_token_id, target.config.vocab_size)
    check_generator(generator, target.device)
    stats.timing = resolve_timing(timing, target.device)
    seqs = Sequences(input_ids, max_new_tokens)
    if max_new_tokens == 0:
        return seqs.tokens
    B, T = input_ids.shape
    # Sized to the run, not the window: a large batch's cache is the biggest allocation.
    n_ctx = target.config.n_positions
    n_rows = min(n_ctx, T + max_new_tokens + room)
    with Session(n_rows) as session:
        sync(target.device)
        t_start = time.perf_counter()
        cache = session.cache(target, "target", B, n_rows, n_ctx)
        if draft is not None:
            draft.join(session)
            draft.begin(B)
        if begin is not None:
            begin(input_ids)
        if cache_prompt:  # the last prompt token is fed first by the first step
            prefill(target, input_ids, cache, stats, draft)
        while not seqs.done:
            record = step(seqs, cache, params=params)
            if on_step is not None:
                on_step(record)
        sync(target.device)
        stats.time_total = time.perf_counter() - t_start
    return seqs.finish(eos_token_id)
