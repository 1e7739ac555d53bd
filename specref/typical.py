"""Medusa's typical acceptance (Cai et al. 2024): a LOSSY verifier, kept to show what exactness buys (nb 05, 08).

Rule: draft x_i (scored by the target's p_i) passes iff
    p_i(x_i) > min(epsilon, delta * exp(-H(p_i))),   H in nats,
and the longest prefix of passing drafts is accepted. The token after the prefix comes
from the target's p at the first failing position (the bonus position if all pass);
the paper takes it greedily (the argmax), which is the default here, and
`next_token="sample"` draws it from that p instead.

q never enters the rule, so the output is not the target's distribution: a draft
the target finds "typical enough" is always kept, where the exact rule
(`specref.chain_verify.verify_chain`) rejects it with probability 1 - p(x)/q(x) whenever
q(x) > p(x); a draft below the threshold is always dropped, however likely; and the
token after the prefix is never drawn from the residual. At temperature 0 (one-hot p, H = 0)
the rule is the greedy rule: only the argmax passes, and the argmax follows.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch

from ._validate import check_generator, check_probs, check_tensor, check_tokens
from .sampling import _sample

NEXT_TOKEN = ("argmax", "sample")


@dataclass(frozen=True)
class TypicalAcceptance:
    """LOSSY: Medusa's typical acceptance; the output no longer follows the target's distribution.

    Accept draft x_i iff p_i(x_i) > min(epsilon, delta * exp(-H(p_i))) (see `verify_chain_typical`).
    epsilon is a hard probability threshold, delta scales the entropy-dependent one:
    a confident p (low H) demands more of a draft, a flat p (high H) less.
    The defaults, 0.09 and 0.3, are the Medusa authors' code's defaults (posterior_threshold, posterior_alpha).
    """

    epsilon: float = 0.09
    delta: float = 0.3
    next_token: str = "argmax"  # the token after the accepted prefix: the paper's argmax, or "sample" from p

    def __post_init__(self) -> None:
        check_thresholds(self.epsilon, self.delta, self.next_token)

    def threshold(self, p: torch.Tensor) -> torch.Tensor:  # [..., V] -> [...]
        """min(epsilon, delta * exp(-H(p))): the probability a draft must exceed."""
        return _threshold(check_probs("p", p), self.epsilon, self.delta)

    def verify(
        self,
        draft_tokens: torch.Tensor,  # [B, k]
        p: torch.Tensor,  # [B, k+1, V]
        generator: torch.Generator | None = None,
    ) -> tuple[torch.Tensor, torch.Tensor]:  # [B, k+1], [B]
        """`verify_chain_typical` with these settings."""
        return verify_chain_typical(draft_tokens, p, self.epsilon, self.delta, generator, self.next_token)


def as_acceptance(acceptance: object) -> TypicalAcceptance | None:
    """The decoding loops' `acceptance=` argument: "exact" (None: the exact rule) or a TypicalAcceptance."""
    if isinstance(acceptance, TypicalAcceptance):
        return acceptance
    if isinstance(acceptance, str) and acceptance == "exact":
        return None
    raise ValueError(f'acceptance must be "exact" or a TypicalAcceptance(epsilon, delta) (lossy), got {acceptance!r}')


def check_thresholds(epsilon: object, delta: object, next_token: object = "argmax") -> None:
    """Raise unless 0 < epsilon <= 1, delta > 0 (finite numbers) and next_token is 'argmax' or 'sample'."""
    for name, x, allowed in (("epsilon", epsilon, "in (0, 1]"), ("delta", delta, "finite and > 0")):
        if isinstance(x, bool) or not isinstance(x, (int, float)):
            raise TypeError(f"{name} must be a number {allowed}, got {x!r}")
        if not math.isfinite(x) or x <= 0 or (name == "epsilon" and x > 1):
            raise ValueError(f"{name} must be {allowed}, got {x!r}")
    if next_token not in NEXT_TOKEN:
        raise ValueError(f"next_token must be one of {NEXT_TOKEN}, got {next_token!r}")


def _threshold(p: torch.Tensor, epsilon: float, delta: float) -> torch.Tensor:  # [..., V] -> [...]
    # 0 * log 0 counts as 0: tokens outside the support add nothing to the entropy.
    plogp = torch.where(p > 0, p * torch.log(torch.where(p > 0, p, torch.ones_like(p))), torch.zeros_like(p))
    entropy = -plogp.sum(-1)
    return torch.clamp(delta * torch.exp(-entropy), max=epsilon)


def verify_chain_typical(
    draft_tokens: torch.Tensor,  # [B, k]
    p: torch.Tensor,  # [B, k+1, V]: target distributions after context + drafts
    epsilon: float = 0.09,
    delta: float = 0.3,
    generator: torch.Generator | None = None,
    next_token: str = "argmax",
) -> tuple[torch.Tensor, torch.Tensor]:  # out [B, k+1] padded with -1, n_accepted [B]
    """LOSSY typical acceptance: keep the longest prefix with p_i(x_i) > min(epsilon, delta exp(-H(p_i))).

    Then one token from p at the stop: its argmax (the paper, default) or a sample
    (`next_token="sample"`, one uniform per row from `generator`). Same return as
    `specref.chain_verify.verify_chain` on batched input: out holds the accepted drafts,
    then that token, then -1. No q: the rule never looks at the draft's distribution.
    """
    check_thresholds(epsilon, delta, next_token)
    draft_tokens = check_tensor("draft_tokens", draft_tokens)
    p = check_probs("p", p)
    if draft_tokens.dim() != 2:
        raise ValueError(f"draft_tokens must have shape [B, k], got {tuple(draft_tokens.shape)}")
    B, k = draft_tokens.shape
    if p.dim() != 3 or tuple(p.shape[:2]) != (B, k + 1):
        raise ValueError(f"p must have shape [B, k+1, V] = [{B}, {k + 1}, V] for {k} drafts, got {tuple(p.shape)}")
    if draft_tokens.device != p.device:
        raise ValueError("draft_tokens and p must be on the same device")
    check_tokens("draft_tokens", draft_tokens, p.shape[-1])
    check_generator(generator, p.device)
    return _verify_chain_typical(draft_tokens.long(), p, epsilon, delta, generator, next_token)


def _verify_chain_typical(
    draft_tokens: torch.Tensor,  # [B, k] long
    p: torch.Tensor,  # [B, k+1, V]
    epsilon: float,
    delta: float,
    generator: torch.Generator | None,
    next_token: str,
) -> tuple[torch.Tensor, torch.Tensor]:  # [B, k+1], [B]
    """`verify_chain_typical` on checked input (the decoding loop's path)."""
    B, k = draft_tokens.shape
    px = p[:, :k].gather(-1, draft_tokens[..., None]).squeeze(-1)  # [B, k]
    passed = px > _threshold(p[:, :k], epsilon, delta)  # [B, k]
    n_accepted = passed.long().cumprod(-1).sum(-1)  # [B] length of the passing prefix
    rows = torch.arange(B, device=p.device)
    at_stop = p[rows, n_accepted]  # [B, V] the first failing position, or the bonus one
    if next_token == "argmax":
        final = at_stop.argmax(-1)
    else:
        final = _sample(at_stop, generator)
    positions = torch.arange(k + 1, device=p.device)
    padded = torch.cat([draft_tokens, torch.full((B, 1), -1, device=p.device, dtype=torch.long)], -1)
    out = torch.where(positions < n_accepted[:, None], padded, torch.full_like(padded, -1))
    return out.scatter(-1, n_accepted[:, None], final[:, None]), n_accepted
