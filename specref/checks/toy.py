"""Markov-chain "language models": the chapter's toy target and draft.

A first-order chain is a [V, V] transition matrix whose row y is the next-token
distribution after token y. It is small enough to know everything exactly: the
joint of the first n tokens is a product of transition entries (chain rule), so
speculative generation on chains can be checked against the target exactly
(`specref.checks.exact`) and by sampling (`specref.checks.montecarlo`).

Chains have their own small draft/target interface, for the toy sampler
(`specref.checks.montecarlo.simulate`) and the notebooks' examples:
`draft.propose(context, k, generator) -> (tokens [B, k], q [B, k, V])` and
`target.score(context, draft_tokens) -> p [B, k+1, V]`.
This is not the `specref.drafts.Draft` protocol the decoding loop talks to: a chain
is stateless (no begin/rollback), reads the context itself rather than a token
buffer with per-row lengths, and its q is already processed (see `processed`).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch

from .._validate import check_int, check_probs, check_tensor, check_tokens
from ..sampling import process_logits, sample


@dataclass(frozen=True, eq=False)
class MarkovChain:
    """A first-order Markov chain over V tokens: P(next = x | last = y) = transition[y, x]."""

    transition: torch.Tensor  # [V, V] float64, rows sum to 1

    def __post_init__(self) -> None:
        t = check_probs("transition", self.transition, min_dim=2)
        if t.dim() != 2 or t.shape[0] != t.shape[1]:
            raise ValueError(f"transition must be a square [V, V] matrix, got shape {tuple(t.shape)}")
        # A private float64 copy: the chain never aliases (or mutates) the caller's tensor.
        object.__setattr__(self, "transition", t.detach().to(torch.float64).clone())

    @property
    def vocab_size(self) -> int:
        return self.transition.shape[0]

    def probs(self, context: torch.Tensor) -> torch.Tensor:  # [..., T] long -> [..., V]
        """The next-token distribution after each context: the row of its last token."""
        context = check_tokens("context", context, self.vocab_size)
        if context.dim() < 1 or context.shape[-1] == 0:
            raise ValueError(f"context must have shape [..., T] with T >= 1, got {tuple(context.shape)}")
        return self.transition[context[..., -1].long()]

    def processed(self, temperature: float = 1.0, top_k: int | None = None, top_p: float | None = None) -> MarkovChain:
        """The chain whose rows are process_logits(log transition): the distributions decoding samples."""
        return MarkovChain(process_logits(torch.log(self.transition), temperature, top_k, top_p))

    def propose(
        self,
        context: torch.Tensor,  # [B, T] long
        k: int,
        generator: torch.Generator | None = None,
    ) -> tuple[torch.Tensor, torch.Tensor]:  # tokens [B, k], q [B, k, V]
        """Draft k tokens autoregressively after each row's context; q[b, i] is what x_i was drawn from.

        The toy interface (see the module docstring), not `specref.drafts.Draft.propose`.
        """
        k = check_int("k", k, 0, "drafted tokens per step")
        q_i = self.probs(_check_context(context))  # [B, V]
        tokens, qs = [], []
        for _ in range(k):
            x = sample(q_i, generator)  # [B]
            tokens.append(x)
            qs.append(q_i)
            q_i = self.transition[x]
        B, V = q_i.shape
        if k == 0:
            dev = self.transition.device
            empty_q = torch.zeros((B, 0, V), dtype=torch.float64, device=dev)
            return torch.zeros((B, 0), dtype=torch.long, device=dev), empty_q
        return torch.stack(tokens, 1), torch.stack(qs, 1)

    def score(
        self,
        context: torch.Tensor,  # [B, T] long
        draft_tokens: torch.Tensor,  # [B, k] long
    ) -> torch.Tensor:  # p [B, k+1, V]
        """One "forward pass" over context + drafts: the distribution after each prefix.

        Row i is the distribution of the token after context + draft_tokens[:, :i],
        so rows 0..k-1 score the drafts and row k is the bonus distribution.
        """
        context = _check_context(context)
        draft_tokens = check_tokens("draft_tokens", draft_tokens, self.vocab_size)
        if draft_tokens.dim() != 2 or draft_tokens.shape[0] != context.shape[0]:
            raise ValueError(
                f"draft_tokens must have shape [B, k] with B = {context.shape[0]} (context's batch), "
                f"got {tuple(draft_tokens.shape)}"
            )
        self.probs(context)  # validates the context ids
        prev = torch.cat([context[:, -1:].long(), draft_tokens.long()], 1)  # [B, k+1]
        return self.transition[prev]

    def marginals(self, start_token: int, n: int) -> torch.Tensor:  # [n, V]
        """Row i: the distribution of the (i+1)-th token after `start_token` (matrix powers)."""
        _check_start(start_token, self.vocab_size)
        n = _check_n(n)
        rows = []
        dist = torch.zeros(self.vocab_size, dtype=torch.float64, device=self.transition.device)
        dist[start_token] = 1.0
        for _ in range(n):
            dist = dist @ self.transition
            rows.append(dist)
        return torch.stack(rows) if rows else dist.new_zeros((0, self.vocab_size))

    def joint(self, start_token: int, n: int) -> torch.Tensor:  # [V] * n
        """P(x_1..x_n | start) = prod_i transition[x_{i-1}, x_i] (chain rule), as a [V]*n tensor."""
        _check_start(start_token, self.vocab_size)
        n = _check_n(n)
        check_cells(self.vocab_size**n, f"the joint of n={n} tokens over V={self.vocab_size}")
        out = torch.ones((), dtype=torch.float64, device=self.transition.device)
        if n > 0:
            out = self.transition[start_token]  # [V]
        for _ in range(n - 1):
            # out[..., y, x] = out[..., y] * transition[y, x]: extend every prefix ending in y by x.
            out = out[..., None] * self.transition
        return out


MAX_CELLS = 2**26  # the most outcomes an exact enumeration builds: V^n joint cells, V^k x 2^k draft patterns


def check_cells(cells: int, what: str) -> None:
    """Raise a ValueError (not an allocation failure or a hang) when an exact table would hold > MAX_CELLS cells."""
    if cells > MAX_CELLS:
        raise ValueError(f"{what} has {cells:.3g} outcomes, more than exact enumeration builds ({MAX_CELLS}): "
                         "use a smaller vocabulary, k or n")


def _check_context(context: object) -> torch.Tensor:
    context = check_tensor("context", context)
    if context.dim() != 2 or context.shape[1] == 0:
        raise ValueError(f"context must have shape [B, T] with T >= 1, got {tuple(context.shape)}")
    return context


def _check_start(start_token: object, vocab_size: int) -> None:
    check_int("start_token", start_token, 0, "a token id")
    if start_token >= vocab_size:
        raise ValueError(f"start_token must be in [0, {vocab_size}), got {start_token}")


def _check_n(n: object) -> int:
    return check_int("n", n, 0, "number of tokens")


def random_chain(vocab_size: int, sharpness: float, generator: torch.Generator) -> MarkovChain:
    """A chain whose rows are softmax(sharpness * standard normal): larger sharpness, peakier rows."""
    check_int("vocab_size", vocab_size, 1, "tokens in the vocabulary", wrong_type=ValueError)
    if not isinstance(sharpness, (int, float)) or isinstance(sharpness, bool) or not 0 <= sharpness < math.inf:
        raise ValueError(f"sharpness must be a finite number >= 0, got {sharpness!r}")
    if not isinstance(generator, torch.Generator):
        raise TypeError(f"generator must be a torch.Generator, got {type(generator).__name__}")
    logits = sharpness * torch.randn((vocab_size, vocab_size), generator=generator, dtype=torch.float64)
    if not bool(torch.isfinite(logits).all()):
        raise ValueError(f"sharpness={sharpness!r} is too large: sharpness x N(0, 1) overflows float64")
    return MarkovChain(torch.softmax(logits, -1))


def mixture(a: MarkovChain, b: MarkovChain, weight: float) -> MarkovChain:
    """Row-wise weight * a + (1 - weight) * b: a draft that is "mostly the target plus noise"."""
    if not isinstance(a, MarkovChain) or not isinstance(b, MarkovChain):
        raise TypeError("a and b must be MarkovChain objects")
    if a.vocab_size != b.vocab_size:
        raise ValueError(f"a and b must share one vocabulary, got {a.vocab_size} and {b.vocab_size}")
    if isinstance(weight, bool) or not isinstance(weight, (int, float)) or not 0 <= weight <= 1:
        raise ValueError(f"weight must be a number in [0, 1], got {weight!r}")
    return MarkovChain(weight * a.transition + (1 - weight) * b.transition)


def toy_pair(
    generator: torch.Generator,
    vocab_size: int = 6,
    sharpness: float = 2.0,
    draft_weight: float = 0.7,
) -> tuple[MarkovChain, MarkovChain]:
    """The chapter's toy: a random target chain and a draft mixing it with an unrelated chain."""
    target = random_chain(vocab_size, sharpness, generator)
    noise = random_chain(vocab_size, sharpness, generator)
    return target, mixture(target, noise, draft_weight)


@dataclass(frozen=True, eq=False)
class MisreportedDraft:
    """A deliberately broken draft (negative controls): samples from one chain, reports another's q.

    This is the "q not processed like p" bug: e.g. tokens drawn at temperature 1 while
    the verifier is handed q at temperature 0.7, or an argmax (greedy) draft scored with
    its softmax. The rule is exact only when q is the distribution the draft sampled.
    """

    sampled: MarkovChain  # what the tokens are really drawn from
    reported: MarkovChain  # whose q is handed to the verifier

    def __post_init__(self) -> None:
        if self.sampled.vocab_size != self.reported.vocab_size:
            raise ValueError("sampled and reported must share one vocabulary")

    @property
    def vocab_size(self) -> int:
        return self.sampled.vocab_size

    def propose(
        self,
        context: torch.Tensor,  # [B, T] long
        k: int,
        generator: torch.Generator | None = None,
    ) -> tuple[torch.Tensor, torch.Tensor]:  # tokens [B, k], q [B, k, V] (the wrong q)
        tokens, _ = self.sampled.propose(context, k, generator)
        return tokens, self.reported.score(context, tokens)[:, :k]
