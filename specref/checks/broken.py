"""Broken drafts, targets and rules: negative controls, each a bug real implementations have shipped.

Each one breaks a contract that makes speculative decoding exact: the drafts are samples of
the q the draft reports (`MisreportedModelDraft`, `ArgmaxSoftmaxDraft`, `UnprocessedQModelDraft`),
the target's cache holds only the accepted text (`StaleCacheTarget`), the rule leaves its
inputs alone (`verify_inplace_residual`) and accepts a prefix (`verify_count_not_prefix`).
`specref.checks.pitfalls` holds the check that catches each one. A check that passes the
real thing but cannot flag these proves nothing.
"""

from __future__ import annotations

import torch

from ..drafts import ModelDraft
from ..rejection import _check_chain, residual, verify_chain
from ..sampling import SamplingParams, sample
from .montecarlo import _uniforms, _with_final


class _SampledDraft(ModelDraft):
    """A broken ModelDraft whose bug is on the sampling path: it refuses greedy decoding, which never reads q."""

    def propose(
        self,
        tokens: torch.Tensor,  # [B, L]
        lengths: torch.Tensor,  # [B]
        k: int,
        params: SamplingParams,
        generator: torch.Generator | None = None,
    ) -> tuple[torch.Tensor, torch.Tensor]:  # [B, k], [B, k, V]
        if params.greedy:
            raise ValueError(f"{type(self).__name__} breaks sampling: use a temperature > 0")
        return super().propose(tokens, lengths, k, params, generator)


class MisreportedModelDraft(_SampledDraft):
    """Samples its drafts at temperature T / 2 but reports q at temperature T: q not processed like p.

    softmax(l / (T/2)) ** (1/2), renormalised, is softmax(l / T): the q a correct draft would report.
    """

    def _draw(
        self, logits: torch.Tensor, params: SamplingParams, generator: torch.Generator | None
    ) -> tuple[torch.Tensor, torch.Tensor]:  # [B, V] -> x [B], q [B, V]
        colder = SamplingParams(params.temperature / 2, params.top_k, params.top_p)
        x, q_sampled = super()._draw(logits, colder, generator)
        q = q_sampled.sqrt()
        return x, q / q.sum(-1, keepdim=True)  # the bug: x was drawn from q_sampled


class ArgmaxSoftmaxDraft(_SampledDraft):
    """BROKEN: drafts the argmax of the processed logits but reports their softmax as q.

    A draft that takes its argmax proposed x with probability 1, so the q that makes the
    rule exact is onehot(x); min(1, p(x) / softmax(x)) corrects for a sampling that never
    happened. (At temperature 0 the loop verifies greedily and never reads q: no bug there.)
    """

    def _draw(
        self, logits: torch.Tensor, params: SamplingParams, generator: torch.Generator | None
    ) -> tuple[torch.Tensor, torch.Tensor]:  # [B, V] -> x [B], q [B, V]
        q = params.probs_unchecked(logits)
        return q.argmax(-1), q  # the bug: a sample of onehot(argmax), reported as a sample of q


class StaleCacheTarget(torch.nn.Module):
    """BROKEN: a target whose KV cache is never rolled back after a rejection.

    Wraps a model; before every cached pass it moves the cache's lengths back up to
    everything written so far, so the K/V of rejected drafts stay in the context and
    later tokens sit at shifted positions. Its caches hold n_positions slots (the stale
    entries need the room). A correct loop's greedy output then differs from the target's.
    """

    def __init__(self, model: torch.nn.Module) -> None:
        super().__init__()
        self.model = model
        self.config = model.config
        self._written: dict[int, torch.Tensor | None] = {}  # id(cache) -> every slot written so far

    @property
    def device(self) -> torch.device:
        return self.model.device

    @property
    def dtype(self) -> torch.dtype:
        return self.model.dtype

    def new_cache(self, batch_size: int, max_len: int | None = None, device=None, dtype=None):
        cache = self.model.new_cache(batch_size, None, device, dtype)
        self._written[id(cache)] = None  # a fresh cache: nothing of a dead cache that had this id is stale here
        return cache

    def forward(self, input_ids: torch.Tensor, cache=None, *args: object, **kwargs: object):
        if cache is None:
            return self.model(input_ids, None, *args, **kwargs)
        written = self._written.get(id(cache))
        if written is not None:
            cache.lengths = torch.maximum(cache.lengths, written)  # the bug: the rollback is undone
        out = self.model(input_ids, cache, *args, **kwargs)
        self._written[id(cache)] = cache.lengths.clone()
        return out


# Broken chain rules (same signature as `specref.rejection.verify_chain` on batched input).


def verify_inplace_residual(
    draft_tokens: torch.Tensor,  # [B, k]
    q: torch.Tensor,  # [B, k, V]
    p: torch.Tensor,  # [B, k+1, V]
    generator: torch.Generator | None = None,
    u: torch.Tensor | None = None,  # [B, k+1]
) -> tuple[torch.Tensor, torch.Tensor]:
    """BROKEN: emits what `verify_chain` emits, but writes the residual into p in place (to save a buffer).

    The first call is right; whoever reads p again (a second sample from the same pass, a
    shared prefix's logits, a tree's siblings) reads the residual where p was.
    """
    tokens, n_acc = verify_chain(draft_tokens, q, p, generator, u)
    k = draft_tokens.shape[-1]
    rejected = torch.nonzero(n_acc < k).squeeze(-1)  # [R]
    if rejected.numel():
        at = n_acc[rejected]
        p[rejected, at] = residual(p[rejected, at], q[rejected, at])  # the bug: p is the caller's tensor
    return tokens, n_acc


def verify_count_not_prefix(
    draft_tokens: torch.Tensor,  # [B, k]
    q: torch.Tensor,  # [B, k, V]
    p: torch.Tensor,  # [B, k+1, V]
    generator: torch.Generator | None = None,
    u: torch.Tensor | None = None,  # [B, k+1]
) -> tuple[torch.Tensor, torch.Tensor]:
    """BROKEN: n_accepted counts every draft that passed its test, not the leading run of passes.

    accepted = [yes, no, yes] gives 2, so the rejected x_2 is emitted and the final token
    comes from position 2. The right count is accepted.cumprod(-1).sum(-1).
    """
    k, _ = _check_chain(draft_tokens, q, p, probs=True)
    B = draft_tokens.shape[0]
    u = _uniforms(draft_tokens, p, generator, u)
    d = draft_tokens.long()
    px = p[:, :k].gather(-1, d[..., None]).squeeze(-1)  # [B, k]
    qx = q.gather(-1, d[..., None]).squeeze(-1)  # [B, k]
    n_acc = (u[:, :k] * qx < px).long().sum(-1)  # [B] the bug: sum, not the length of the prefix
    rows = torch.arange(B, device=p.device)
    at = n_acc.clamp(max=max(k - 1, 0))
    if k > 0:
        final_dist = torch.where((n_acc < k)[:, None], residual(p[rows, at], q[rows, at]), p[:, k])
    else:
        final_dist = p[:, 0]
    final = sample(final_dist, u=u[:, k])
    positions = torch.arange(k + 1, device=p.device)
    padded = torch.cat([d, torch.full((B, 1), -1, device=p.device, dtype=torch.long)], -1)
    tokens = torch.where(positions < n_acc[:, None], padded, torch.full_like(padded, -1))
    return _with_final(tokens, n_acc, final), n_acc


class UnprocessedQModelDraft(_SampledDraft):
    """BROKEN: samples its drafts from the processed distribution (temperature, top-k, top-p) but reports q raw.

    q = softmax(logits) while the drafts came from process_logits(logits): q not processed like p.
    """

    def _draw(
        self, logits: torch.Tensor, params: SamplingParams, generator: torch.Generator | None
    ) -> tuple[torch.Tensor, torch.Tensor]:  # [B, V] -> x [B], q [B, V]
        x = sample(params.probs_unchecked(logits), generator)
        return x, torch.softmax(logits, -1)  # the bug: not the distribution x was drawn from
