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

# A chain verification rule: rule(draft_tokens [B, k], q [B, k, V], p [B, k+1, V], generator=None, u=None)
# -> (tokens [B, k+1], n_accepted [B]), like `verify_chain`; the checks take one (or a broken one) as input.
ChainRule = Callable[..., tuple[torch.Tensor, torch.Tensor]]


def acceptance_probability(
    p: torch.Tensor,  # [..., V]
    q: torch.Tensor,  # [..., V]
) -> torch.Tensor:  # [...]
    """beta = sum_x min(p(x), q(x)) = 1 - TV(p, q): the chance a draft x ~ q is accepted."""
    _check_pair(p, q)
    return torch.minimum(p, q).sum(-1)


def residual(
    p: torch.Tensor,  # [..., V]
    q: torch.Tensor,  # [..., V]
) -> torch.Tensor:  # [..., V]
    """The distribution sampled after a rejection: max(0, p - q) normalized.

    When p == q it has zero mass and is never sampled (a rejection has probability 0): p itself is
    returned, so the result is always a distribution and no NaN leaks into a batch.
    """
    _check_pair(p, q)
    return residual_unchecked(p, q)


def residual_unchecked(p: torch.Tensor, q: torch.Tensor) -> torch.Tensor:
    """`residual` without its input checks: for p and q that were already checked (the rules' hot paths)."""
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
        raise ValueError(
            f"p must have shape {'[B, k+1, V]' if batched else '[k+1, V]'} = "
            f"{list(lead + (k + 1,))} + [V] for {k} drafts, got {tuple(p.shape)}"
        )
    V = p.shape[-1]
    if V == 0:
        raise ValueError("p has an empty vocabulary (last dim is 0)")
    if q is not None:
        q = check_probs("q", q, min_dim=2)
        if tuple(q.shape) != lead + (k, V):
            raise ValueError(
                f"q must have shape {'[B, k, V]' if batched else '[k, V]'} = {list(lead + (k, V))} "
                f"(one draft distribution per draft, same vocabulary as p), got {tuple(q.shape)}"
            )
        if q.device != p.device or draft_tokens.device != p.device:
            raise ValueError("draft_tokens, q and p must be on the same device")
    check_tokens("draft_tokens", draft_tokens, V)
    return k, V


def _unbatch(tokens: torch.Tensor, n_accepted: torch.Tensor, batched: bool) -> tuple[torch.Tensor, torch.Tensor | int]:
    """Batched results as they are; for one unbatched row, its tokens without padding and an int."""
    if batched:
        return tokens, n_accepted
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
    batched = draft_tokens.dim() == 2
    if not batched:
        draft_tokens, p = draft_tokens[None], p[None]
    tokens, n_accepted = verify_chain_greedy_unchecked(draft_tokens.long(), p)
    return _unbatch(tokens, n_accepted, batched)


def verify_chain_greedy_unchecked(
    draft_tokens: torch.Tensor,  # [B, k] long
    p: torch.Tensor,  # [B, k+1, V] probabilities or logits
) -> tuple[torch.Tensor, torch.Tensor]:  # tokens [B, k+1] padded with -1, n_accepted [B]
    """`verify_chain_greedy`'s rule on batched, checked inputs (the decoding loop)."""
    k = draft_tokens.shape[1]
    best = p.argmax(-1)  # [B, k+1]
    n_accepted = (draft_tokens == best[:, :k]).long().cumprod(-1).sum(-1)  # [B]
    positions = torch.arange(k + 1, device=p.device)
    # Accepted drafts equal the argmax, so the tokens are the argmax up to position n_accepted (correction or bonus).
    return torch.where(positions <= n_accepted[:, None], best, torch.full_like(best, -1)), n_accepted

