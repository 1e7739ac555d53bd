"""The speculative rule on a chain of drafts (the rule and its parts: `specref.rejection`).

Each draft x_i ~ q_i is accepted with probability min(1, p_i(x_i) / q_i(x_i)); at the first rejection a
replacement is drawn from residual(p_i, q_i) and the step stops; all k accepted: a bonus from p_{k+1}.
"""

from __future__ import annotations

import torch

from ._validate import check_generator
from .rejection import _on_batch, _residual, check_chain
from .sampling import _sample, check_uniforms

__all__ = ["verify_chain"]


def verify_chain(
    draft_tokens: torch.Tensor,  # [k] or [B, k]
    q: torch.Tensor,  # [k, V] or [B, k, V]: the draft distribution each draft was sampled from
    p: torch.Tensor,  # [k+1, V] or [B, k+1, V]: target distributions after context + drafts
    generator: torch.Generator | None = None,
    u: torch.Tensor | None = None,  # [k+1] or [B, k+1] uniforms in [0, 1), instead of drawing them
) -> tuple[torch.Tensor, torch.Tensor | int]:
    """One speculative step: accept drafts left to right with probability min(1, p/q).

    Returns (tokens, n_accepted): unbatched, n_accepted + 1 tokens; batched, tokens [B, k+1] padded with -1 and
    n_accepted [B]. k + 1 uniforms per row, from `generator` or given as `u` (as exact enumeration does).
    """
    k, V = check_chain(draft_tokens, q, p, probs=True)
    if u is not None:
        shape = tuple(draft_tokens.shape[:-1]) + (k + 1,)
        check_uniforms(u, shape, f"[B?, k+1] = {list(shape)} (one uniform per draft plus one)")
    else:
        check_generator(generator, p.device)
    return _on_batch(_verify_chain, draft_tokens, q, p, u, generator=generator)


def _verify_chain(
    draft_tokens: torch.Tensor,  # [B, k] long
    q: torch.Tensor,  # [B, k, V]
    p: torch.Tensor,  # [B, k+1, V]
    u: torch.Tensor | None = None,  # [B, k+1]; None: drawn from generator
    generator: torch.Generator | None = None,
    check_support: bool = True,
) -> tuple[torch.Tensor, torch.Tensor]:  # tokens [B, k+1] padded with -1, n_accepted [B]
    """`verify_chain`'s rule on batched inputs already checked (the decoding loop's). ``check_support`` refuses a
    draft token that q gives probability 0 (one read back); the loop clears it for the package's own drafts."""
    B, k = draft_tokens.shape
    dtype = torch.promote_types(p.dtype, q.dtype)
    p, q = p.to(dtype), q.to(dtype)

    px = p[:, :k].gather(-1, draft_tokens[..., None]).squeeze(-1)  # [B, k]
    qx = q.gather(-1, draft_tokens[..., None]).squeeze(-1)  # [B, k]
    if check_support and (qx <= 0).any():
        raise ValueError("q gives probability 0 to a draft token: a draft must be sampled from q (q(draft) > 0)")

    if u is None:
        u = torch.rand((B, k + 1), generator=generator, dtype=dtype, device=p.device)
    else:
        u = u.to(device=p.device, dtype=dtype)
    # u < min(1, px/qx) written without a division: u * qx < px.
    accepted = u[:, :k] * qx < px  # [B, k]
    n_accepted = accepted.long().cumprod(-1).sum(-1)  # [B] length of the accepted prefix

    # The final token: residual at the first rejection, or the bonus from p_{k+1}.
    at = n_accepted.clamp(max=max(k - 1, 0))
    rows = torch.arange(B, device=p.device)
    if k > 0:
        res = _residual(p[rows, at], q[rows, at])  # [B, V]
        final_dist = torch.where((n_accepted < k)[:, None], res, p[:, k])
    else:
        final_dist = p[:, 0]
    final = _sample(final_dist, u=u[:, k])  # [B]

    positions = torch.arange(k + 1, device=p.device)
    padded = torch.cat([draft_tokens, torch.full((B, 1), -1, device=p.device, dtype=torch.long)], -1)
    tokens = torch.where(positions < n_accepted[:, None], padded, torch.full_like(padded, -1))
    return tokens.scatter(-1, n_accepted[:, None], final[:, None]), n_accepted
