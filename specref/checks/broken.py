"""Broken drafts, targets and rules: negative controls, each a bug real implementations have shipped.

Each one breaks a contract that makes speculative decoding exact: the drafts are samples of
the q the draft reports (`MisreportedModelDraft`, `ArgmaxSoftmaxDraft`, `UnprocessedQModelDraft`),
the target's cache holds only the accepted text (`StaleCacheTarget`), the rule leaves its
inputs alone (`verify_inplace_residual`) and accepts a prefix (`verify_count_not_prefix`).
`specref.checks.pitfalls` holds the check that catches each one. A check that passes the
real thing but cannot flag these proves nothing.

Every broken rule lives here: the chain rules in `BROKEN_RULES` (skip the residual, accept
every draft, draw the bonus from p_k), which the Monte-Carlo and exact checks must flag, and
the tree rules in `BROKEN_TREE_RULES`, which `specref.checks.exact_trees.tree_step_error` must flag.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable

import torch

from ..chain_verify import verify_chain
from ..drafts import ModelDraft
from ..drafts.base import draw
from ..rejection import ChainRule, check_chain, residual
from ..sampling import SamplingParams, as_rng, sample
from ..trees import ROOT, Tree, TreeResult, verify_tree


class _SampledDraft(ModelDraft):
    """A ModelDraft drawing with a broken `sampler` (its bug is on the sampling path): it refuses greedy decoding,
    which never reads q."""

    def __init__(self, model: torch.nn.Module) -> None:
        super().__init__(model, sampler=self.broken_draw)  # each subclass's bug

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

    @staticmethod
    def broken_draw(logits: torch.Tensor, params: SamplingParams,  # [B, V] -> x [B], q [B, V]
                    generator: torch.Generator | None) -> tuple[torch.Tensor, torch.Tensor]:
        x, q_sampled = draw(logits, SamplingParams(params.temperature / 2, params.top_k, params.top_p), generator)
        q = q_sampled.sqrt()
        return x, q / q.sum(-1, keepdim=True)  # the bug: x was drawn from q_sampled


class ArgmaxSoftmaxDraft(_SampledDraft):
    """BROKEN: drafts the argmax of the processed logits but reports their softmax as q.

    A draft that takes its argmax proposed x with probability 1, so the q that makes the
    rule exact is onehot(x); min(1, p(x) / softmax(x)) corrects for a sampling that never
    happened. (At temperature 0 the loop verifies greedily and never reads q: no bug there.)
    """

    @staticmethod
    def broken_draw(logits: torch.Tensor, params: SamplingParams,  # [B, V] -> x [B], q [B, V]
                    generator: torch.Generator | None) -> tuple[torch.Tensor, torch.Tensor]:
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
            cache.set(torch.maximum(cache.lengths, written))  # the bug: the rollback is undone
        out = self.model(input_ids, cache, *args, **kwargs)
        self._written[id(cache)] = cache.lengths.clone()
        return out


# Broken chain rules (the signature of `specref.chain_verify.verify_chain` on batched input).


def _uniforms(
    draft_tokens: torch.Tensor, p: torch.Tensor, generator: torch.Generator | None, u: torch.Tensor | None
) -> torch.Tensor:  # [B, k+1]
    if not isinstance(draft_tokens, torch.Tensor) or draft_tokens.dim() != 2:
        raise ValueError("the broken rules take batched input: draft_tokens must be [B, k]")
    if u is not None:
        return u
    shape = tuple(draft_tokens.shape[:-1]) + (draft_tokens.shape[-1] + 1,)
    return torch.rand(shape, generator=generator, dtype=p.dtype, device=p.device)


def _with_final(tokens: torch.Tensor, n_acc: torch.Tensor, final: torch.Tensor) -> torch.Tensor:  # [B, k+1]
    """`tokens` with the token after the accepted prefix (column n_acc) replaced by `final` [B]."""
    return tokens.scatter(1, n_acc[:, None], final[:, None])


def verify_skip_residual(
    draft_tokens: torch.Tensor,  # [B, k]
    q: torch.Tensor,  # [B, k, V]
    p: torch.Tensor,  # [B, k+1, V]
    generator: torch.Generator | None = None,
    u: torch.Tensor | None = None,  # [B, k+1]
) -> tuple[torch.Tensor, torch.Tensor]:
    """BROKEN (negative control): after a rejection, sample p_a instead of the residual."""
    u = _uniforms(draft_tokens, p, generator, u)
    tokens, n_acc = verify_chain(draft_tokens, q, p, u=u)
    rows = torch.arange(draft_tokens.shape[0], device=p.device)
    return _with_final(tokens, n_acc, sample(p[rows, n_acc], u=u[:, -1])), n_acc


def verify_always_accept(
    draft_tokens: torch.Tensor,  # [B, k]
    q: torch.Tensor,  # [B, k, V]
    p: torch.Tensor,  # [B, k+1, V]
    generator: torch.Generator | None = None,
    u: torch.Tensor | None = None,  # [B, k+1]
) -> tuple[torch.Tensor, torch.Tensor]:
    """BROKEN (negative control): keep every draft, then add the bonus token from p_{k+1}."""
    k, _ = check_chain(draft_tokens, q, p, probs=True)
    u = _uniforms(draft_tokens, p, generator, u)
    bonus = sample(p[:, k], u=u[:, -1])
    tokens = torch.cat([draft_tokens.long(), bonus[:, None]], 1)
    return tokens, torch.full_like(bonus, k)


def verify_bonus_off_by_one(
    draft_tokens: torch.Tensor,  # [B, k]
    q: torch.Tensor,  # [B, k, V]
    p: torch.Tensor,  # [B, k+1, V]
    generator: torch.Generator | None = None,
    u: torch.Tensor | None = None,  # [B, k+1]
) -> tuple[torch.Tensor, torch.Tensor]:
    """BROKEN (negative control): when all k drafts pass, draw the bonus from p_k, not p_{k+1}."""
    u = _uniforms(draft_tokens, p, generator, u)
    tokens, n_acc = verify_chain(draft_tokens, q, p, u=u)
    k = draft_tokens.shape[-1]
    if k == 0:
        return tokens, n_acc
    wrong = sample(p[:, k - 1], u=u[:, -1])  # the distribution that scored the last draft
    final = torch.where(n_acc == k, wrong, tokens.gather(1, n_acc[:, None]).squeeze(1))
    return _with_final(tokens, n_acc, final), n_acc


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
    k, _ = check_chain(draft_tokens, q, p, probs=True)
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


BROKEN_RULES: dict[str, ChainRule] = {
    "skip_residual": verify_skip_residual,
    "always_accept": verify_always_accept,
    "bonus_off_by_one": verify_bonus_off_by_one,
}


class UnprocessedQModelDraft(_SampledDraft):
    """BROKEN: samples its drafts from the processed distribution (temperature, top-k, top-p) but reports q raw.

    q = softmax(logits) while the drafts came from process_logits(logits): q not processed like p.
    """

    @staticmethod
    def broken_draw(logits: torch.Tensor, params: SamplingParams,  # [B, V] -> x [B], q [B, V]
                    generator: torch.Generator | None) -> tuple[torch.Tensor, torch.Tensor]:
        x = sample(params.probs_unchecked(logits), generator)
        return x, torch.softmax(logits, -1)  # the bug: not the distribution x was drawn from


# Broken tree rules (the signature of `specref.trees.verify_tree`).


class _DeferredDraw:
    """An rng that passes uniforms through and holds back the one categorical draw (0 stands in for it)."""

    def __init__(self, source: object) -> None:
        self.source = source
        self.dist: torch.Tensor | None = None  # [V] what the rule would have drawn from

    def uniform(self) -> object:
        return self.source.uniform()

    def categorical(self, probs: torch.Tensor) -> int:  # [V]
        self.dist = probs
        return 0


def _final_from(
    tree: Tree,
    p: torch.Tensor,  # [N+1, V]
    generator: torch.Generator | None,
    rng: object | None,
    pick: Callable[[TreeResult, torch.Tensor], torch.Tensor],
) -> TreeResult:
    """`verify_tree`, except that the last token is drawn from pick(result, the distribution it would use)."""
    source = as_rng(generator, rng)
    deferred = _DeferredDraw(source)
    r = verify_tree(tree, p, rng=deferred)
    x = source.categorical(pick(r, deferred.dist))
    return TreeResult(r.tokens[:-1] + [int(x)], r.path, r.trials)


def verify_tree_skip_residual(
    tree: Tree, p: torch.Tensor, generator: torch.Generator | None = None, rng: object | None = None
) -> TreeResult:  # p: [N+1, V]
    """BROKEN (negative control): after the children of a node are rejected, sample p there, not the residual."""
    return _final_from(tree, p, generator, rng, lambda r, dist: p[(r.path[-1] + 1) if r.path else 0])


def verify_tree_bonus_off_by_one(
    tree: Tree, p: torch.Tensor, generator: torch.Generator | None = None, rng: object | None = None
) -> TreeResult:  # p: [N+1, V]
    """BROKEN (negative control): after an accepted leaf, draw the bonus from p at its parent, not after the leaf."""

    def pick(r: TreeResult, dist: torch.Tensor) -> torch.Tensor:
        if r.path and not tree.children(r.path[-1]):
            return p[tree.parents[r.path[-1]] + 1]
        return dist

    return _final_from(tree, p, generator, rng, pick)


def verify_tree_always_accept(
    tree: Tree, p: torch.Tensor, generator: torch.Generator | None = None, rng: object | None = None
) -> TreeResult:  # p: [N+1, V]
    """BROKEN (negative control): accept the first child at every node down to a leaf, then the bonus."""
    source = as_rng(generator, rng)
    node, path = ROOT, []
    while tree.children(node):
        node = tree.children(node)[0]
        path.append(node)
    x = source.categorical(p[node + 1])
    return TreeResult([tree.tokens[i] for i in path] + [int(x)], path, [])


def verify_tree_softmax_q(
    tree: Tree, p: torch.Tensor, generator: torch.Generator | None = None, rng: object | None = None
) -> TreeResult:  # p: [N+1, V]
    """BROKEN (negative control): verify top-k (deterministic) children against the draft's softmax q, not onehot."""
    if tree.mode == "deterministic" and tree.q is not None:
        tree = dataclasses.replace(tree, mode="sampled")
    return verify_tree(tree, p, generator, rng)


BROKEN_TREE_RULES: dict[str, Callable[..., TreeResult]] = {
    "skip_residual": verify_tree_skip_residual,
    "bonus_off_by_one": verify_tree_bonus_off_by_one,
    "always_accept": verify_tree_always_accept,
    "softmax_q": verify_tree_softmax_q,
}
