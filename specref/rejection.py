"""The speculative accept/reject rule (Leviathan et al. 2022; Chen et al. 2023).

Draft x ~ q is accepted with probability min(1, p(x) / q(x)); on rejection a replacement is drawn
from the residual max(0, p - q) normalized. Then P(emit x) = min(p(x), q(x)) + (1 - beta) * residual(x)
= p(x), beta = sum_x min(p(x), q(x)): the rule is exact. Here: its parts and checks, and the greedy
(one-hot) case; `specref.chain_verify` applies it to a chain of drafts (`verify_chain`).
"""

from __future__ import annotations

from collections.abc import Callable

import torch

from ._validate import check_probs, check_tensor, check_tokens

__all__ = ["acceptance_probability", "residual", "verify_chain_greedy"]

# A chain rule like `verify_chain`: rule(draft_tokens [B, k], q [B, k, V], p [B, k+1, V], generator=None, u=None)
# -> (tokens [B, k+1], n_accepted [B]); the checks take one (or a broken one) as input.
ChainRule = Callable[..., tuple[torch.Tensor, torch.Tensor]]


def acceptance_probability(p: torch.Tensor, q: torch.Tensor) -> torch.Tensor:  # [..., V], [..., V] -> [...]
    """beta = sum_x min(p(x), q(x)) = 1 - TV(p, q): the chance a draft x ~ q is accepted."""
    _check_pair(p, q)
    return torch.minimum(p, q).sum(-1)


def residual(p: torch.Tensor, q: torch.Tensor) -> torch.Tensor:  # [..., V], [..., V] -> [..., V]
    """The distribution sampled after a rejection: max(0, p - q) normalized.

    When p == q it has zero mass and is never sampled (a rejection has probability 0): p itself is
    returned, so the result is always a distribution and no NaN leaks into a batch.
    """
    _check_pair(p, q)
    return _residual(p, q)


def _residual(p: torch.Tensor, q: torch.Tensor) -> torch.Tensor:  # [..., V], [..., V] -> [..., V]
    """`residual` on p and q already checked (the rules' hot paths)."""
    diff = (p - q).clamp(min=0)
    mass = diff.sum(-1, keepdim=True)
    empty = mass <= 0
    return torch.where(empty, p, diff / torch.where(empty, torch.ones_like(mass), mass))


def _check_pair(p: torch.Tensor, q: torch.Tensor) -> None:
    check_probs("p", p)
    check_probs("q", q)
    if p.shape != q.shape:
        raise ValueError(f"p and q must have the same shape [..., V], got {tuple(p.shape)} and {tuple(q.shape)}")


def check_chain(draft_tokens: object, q: object | None, p: object, probs: bool) -> tuple[int, int]:
    """Shapes: draft_tokens [B?, k], q [B?, k, V], p [B?, k+1, V]. Returns (k, V)."""
    p = check_probs("p", p, min_dim=2) if probs else check_tensor("p", p)
    draft_tokens = check_tensor("draft_tokens", draft_tokens)
    if draft_tokens.dim() not in (1, 2):
        raise ValueError(f"draft_tokens must have shape [k] or [B, k], got {tuple(draft_tokens.shape)}")
    batched = draft_tokens.dim() == 2
    k = draft_tokens.shape[-1]
    lead = tuple(draft_tokens.shape[:-1])
    if tuple(p.shape[:-1]) != lead + (k + 1,):
        raise ValueError(f"p must have shape {'[B, k+1, V]' if batched else '[k+1, V]'} = "
                         f"{list(lead + (k + 1,))} + [V] for {k} drafts, got {tuple(p.shape)}")
    V = p.shape[-1]
    if V == 0:
        raise ValueError("p has an empty vocabulary (last dim is 0)")
    if q is not None:
        q = check_probs("q", q, min_dim=2)
        if tuple(q.shape) != lead + (k, V):
            raise ValueError(f"q must have shape {'[B, k, V]' if batched else '[k, V]'} = {list(lead + (k, V))} "
                             f"(one draft distribution per draft, same vocabulary as p), got {tuple(q.shape)}")
        if q.device != p.device or draft_tokens.device != p.device:
            raise ValueError("draft_tokens, q and p must be on the same device")
    check_tokens("draft_tokens", draft_tokens, V)
    return k, V


def _on_batch(rule: ChainRule, draft_tokens: torch.Tensor, *tensors: torch.Tensor | None,
              **kwargs: object) -> tuple[torch.Tensor, torch.Tensor | int]:
    """`rule` on batched inputs; one unbatched row ([k]) runs as a batch of one and returns its tokens and an int."""
    if draft_tokens.dim() == 2:
        return rule(draft_tokens.long(), *tensors, **kwargs)
    tokens, n_accepted = rule(draft_tokens.long()[None], *(t if t is None else t[None] for t in tensors), **kwargs)
    n = int(n_accepted[0])
    return tokens[0, : n + 1], n


def verify_chain_greedy(
    draft_tokens: torch.Tensor,  # [k] or [B, k]
    p: torch.Tensor,  # [k+1, V] or [B, k+1, V]: target probabilities or logits
) -> tuple[torch.Tensor, torch.Tensor | int]:
    """Greedy rule: accept while the draft equals the target's argmax, then emit the argmax.

    The one-hot case of `verify_chain`; only p's argmax is used, so logits work too. Same return as `verify_chain`.
    """
    k, V = check_chain(draft_tokens, None, p, probs=False)
    if not p.is_floating_point():
        raise TypeError(f"p must be a floating-point tensor, got {p.dtype}")
    if torch.isnan(p).any():
        raise ValueError("p contains NaN")
    return _on_batch(_verify_chain_greedy, draft_tokens, p)


def _verify_chain_greedy(
    draft_tokens: torch.Tensor,  # [B, k] long
    p: torch.Tensor,  # [B, k+1, V] probabilities or logits
) -> tuple[torch.Tensor, torch.Tensor]:  # tokens [B, k+1] padded with -1, n_accepted [B]
    """`verify_chain_greedy`'s rule on batched, checked inputs (the decoding loop's)."""
    k = draft_tokens.shape[1]
    best = p.argmax(-1)  # [B, k+1]
    n_accepted = (draft_tokens == best[:, :k]).long().cumprod(-1).sum(-1)  # [B]
    positions = torch.arange(k + 1, device=p.device)
    # Accepted drafts equal the argmax, so the tokens are the argmax up to position n_accepted (correction or bonus).
    return torch.where(positions <= n_accepted[:, None], best, torch.full_like(best, -1)), n_accepted

