"""Turning logits into the distribution we sample from, and sampling it (chapter 2).

The same `process_logits` must produce both `p` (target) and `q` (draft): the acceptance rule is exact
only then. `TorchRNG` is the rng protocol (uniform(), categorical(probs)) the tree rules and exercises
draw through; its symbolic twin, for exact enumeration, is `specref.checks.rng`.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np
import torch

from ._validate import _fmt, check_generator, check_int, check_probs, check_tensor, tolerance

__all__ = ["SamplingParams", "TorchRNG", "process_logits", "sample"]


def process_logits(logits: torch.Tensor, temperature: float = 1.0, top_k: int | None = None,
                   top_p: float | None = None) -> torch.Tensor:  # [..., V] -> [..., V]
    """Temperature, then top-k, then top-p, then softmax: the distribution decoding samples.

    temperature == 0 means greedy: a one-hot vector on the argmax (first index on ties).
    top_k keeps the k largest logits (ties with the k-th are kept too, so the result
    does not depend on sort order). top_p keeps the smallest set of most likely tokens
    whose mass reaches top_p (always at least one token). -inf logits are allowed
    (masked tokens); NaN and +inf are not. Computes in float32 (float64 stays float64).
    """
    logits = check_tensor("logits", logits)
    if not logits.is_floating_point():
        raise TypeError(f"logits must be a floating-point tensor, got {logits.dtype}")
    if logits.dim() < 1 or logits.shape[-1] == 0:
        raise ValueError(f"logits must have shape [..., V] with V >= 1, got {tuple(logits.shape)}")
    if isinstance(temperature, bool) or not isinstance(temperature, (int, float)):
        raise TypeError(f"temperature must be a number >= 0, got {temperature!r}")
    if not math.isfinite(temperature) or temperature < 0:
        raise ValueError(f"temperature must be a finite number >= 0, got {temperature}")
    if top_k is not None:
        check_int("top_k", top_k, 1, "tokens kept; or None to disable")
    if top_p is not None:
        if isinstance(top_p, bool) or not isinstance(top_p, (int, float)):
            raise TypeError(f"top_p must be a number in (0, 1] or None, got {top_p!r}")
        if not (0 < top_p <= 1):
            raise ValueError(f"top_p must be in (0, 1] (or None to disable), got {top_p}")
    if torch.isnan(logits).any():
        raise ValueError("logits contain NaN")
    if torch.isposinf(logits).any():
        raise ValueError("logits contain +inf")
    if torch.isneginf(logits).all(-1).any():
        raise ValueError("logits have a row where every token is -inf (nothing can be sampled)")

    return _process_logits(logits, temperature, top_k, top_p)


def _process_logits(logits: torch.Tensor, temperature: float, top_k: int | None,
                    top_p: float | None) -> torch.Tensor:  # [..., V] -> [..., V]
    """`process_logits` without its input checks: for arguments already checked (`SamplingParams.probs_unchecked`)."""
    x = logits.to(torch.float64 if logits.dtype == torch.float64 else torch.float32)
    if temperature == 0:
        # Greedy is the limit temperature -> 0: all mass on the argmax.
        return torch.nn.functional.one_hot(x.argmax(-1), x.shape[-1]).to(x.dtype)
    if temperature < 1:
        # Shifting each row's max to 0 keeps a small temperature from overflowing to inf (softmax: NaN).
        x = x - x.amax(-1, keepdim=True)
    # A temperature below float32's smallest normal number loses precision or rounds to 0: divide in float64.
    x = (x.double() / temperature).to(x.dtype) if temperature < torch.finfo(x.dtype).tiny else x / temperature
    neg_inf = torch.tensor(float("-inf"), dtype=x.dtype, device=x.device)
    if top_k is not None and top_k < x.shape[-1]:
        kth = torch.topk(x, top_k, dim=-1).values[..., -1:]
        x = torch.where(x < kth, neg_inf, x)
    if top_p is not None and top_p < 1:
        probs = torch.softmax(x, dim=-1)
        sorted_probs, order = torch.sort(probs, dim=-1, descending=True)
        # A token is kept while the mass strictly before it is < top_p (the most likely always is).
        before = torch.cumsum(sorted_probs, dim=-1) - sorted_probs
        keep_sorted = before < top_p
        keep_sorted[..., 0] = True  # a top_p below the dtype's smallest number would round to 0 and keep none
        keep = torch.zeros_like(keep_sorted).scatter(-1, order, keep_sorted)
        x = torch.where(keep, x, neg_inf)
    return torch.softmax(x, dim=-1)


def sample(probs: torch.Tensor, generator: torch.Generator | None = None,
           u: torch.Tensor | None = None) -> torch.Tensor:  # [..., V], u [...] -> [...] long
    """Draw one token per row by inverse CDF: the first index whose cumulative mass exceeds u.

    Zero-probability tokens are never returned. One uniform per row, from `generator` or given as `u`.
    """
    probs = check_probs("probs", probs)
    if u is None:
        check_generator(generator, probs.device)
    else:
        check_uniforms(u, tuple(probs.shape[:-1]), f"{list(probs.shape[:-1])} (one uniform per row of probs)")
    return _sample(probs, generator, u)


def check_uniforms(u: object, shape: tuple[int, ...], expected: str) -> None:
    """Raise unless `u` is a float tensor of `shape` (`expected` describes it) holding uniforms in [0, 1)."""
    u = check_tensor("u", u)
    if not u.is_floating_point():
        raise TypeError(f"u must be a floating-point tensor of uniforms, got {u.dtype}")
    if tuple(u.shape) != shape:
        raise ValueError(f"u must have shape {expected}, got {tuple(u.shape)}")
    if u.numel() and not bool(((u >= 0) & (u < 1)).all()):
        raise ValueError("u must hold uniforms in [0, 1) (no NaN)")


def _sample(probs: torch.Tensor, generator: torch.Generator | None = None,
            u: torch.Tensor | None = None) -> torch.Tensor:  # [..., V], u [...] -> [...] long
    """`sample` on inputs already checked (the rules' and drafts' hot paths)."""
    if u is None:
        u = torch.rand(probs.shape[:-1], generator=generator, dtype=probs.dtype, device=probs.device)
    cdf = torch.cumsum(probs, dim=-1)
    # Scaling u by the total keeps the draw inside the support even when rounding
    # leaves the last CDF entry slightly below 1.
    target = (u.to(cdf.dtype) * cdf[..., -1]).unsqueeze(-1)
    idx = torch.searchsorted(cdf.contiguous(), target.contiguous(), right=True).squeeze(-1)
    return idx.clamp_(max=probs.shape[-1] - 1)


@dataclass(frozen=True)
class SamplingParams:
    """The processing applied identically to p and q (see `process_logits`)."""

    temperature: float = 1.0
    top_k: int | None = None
    top_p: float | None = None

    @property
    def greedy(self) -> bool:
        return self.temperature == 0

    def __post_init__(self) -> None:
        process_logits(torch.zeros(1), self.temperature, self.top_k, self.top_p)  # raises on bad arguments

    def probs(self, logits: torch.Tensor) -> torch.Tensor:  # [..., V] -> [..., V]
        """process_logits with these settings (logits checked: NaN or +inf raise)."""
        return process_logits(logits, self.temperature, self.top_k, self.top_p)

    def probs_unchecked(self, logits: torch.Tensor) -> torch.Tensor:  # [..., V] -> [..., V]
        """The same distribution without the per-call checks (the decoding loop checks once)."""
        return _process_logits(logits, self.temperature, self.top_k, self.top_p)


_PROB_SUM_TOL = 1e-6  # how far from 1 a distribution handed to rng.categorical may sum (float64)


def as_distribution(probs: object, who: str = "probs") -> torch.Tensor:  # [V] -> [V] float64 on the CPU
    """A 1-D probability vector as float64, or a ValueError/TypeError that says what is wrong."""
    if isinstance(probs, torch.Tensor):
        tol = max(_PROB_SUM_TOL, tolerance(probs.dtype))
        t = probs.detach().to("cpu", torch.float64)
    elif isinstance(probs, (np.ndarray, list, tuple)):
        tol = _PROB_SUM_TOL
        try:
            t = torch.as_tensor(np.asarray(probs, dtype=np.float64))
        except (TypeError, ValueError) as e:
            raise TypeError(f"{who} needs a 1-D vector of probabilities; could not read {probs!r} ({e})") from None
    else:
        raise TypeError(f"{who} needs a 1-D tensor (or list) of probabilities, got {type(probs).__name__}")
    if t.dim() != 1 or t.numel() == 0:
        raise ValueError(f"{who} needs a 1-D vector of probabilities [V], got shape {tuple(t.shape)}")
    if not torch.isfinite(t).all():
        raise ValueError(f"{who} got non-finite probabilities {_fmt(t)}: a division by zero? "
                         "(e.g. normalizing a residual whose mass is 0)")
    if (t < 0).any():
        raise ValueError(f"{who} got negative probabilities {_fmt(t)}: probabilities must be >= 0 "
                         "(the residual is max(0, p - q), clamped before normalizing)")
    total = float(t.sum())
    if abs(total - 1) > tol:
        raise ValueError(f"{who} got probabilities {_fmt(t)} that sum to {total:.6g}, not 1: normalize them first")
    return t


class TorchRNG:
    """The rng protocol on a real generator: uniform() -> u ~ U[0, 1), categorical(probs) -> i w.p. probs[i].

    One float64 uniform per call, from `generator` (None: torch's default); exact enumeration passes a symbolic rng.
    """

    def __init__(self, generator: torch.Generator | None) -> None:
        self.generator = check_generator(generator)
        self.device = generator.device if generator is not None else torch.device("cpu")

    def uniform(self) -> float:
        """u ~ U[0, 1)."""
        return float(torch.rand((), generator=self.generator, dtype=torch.float64, device=self.device))

    def categorical(self, probs: object) -> int:  # [V]
        """An index i drawn with probability probs[i] (probs: [V], summing to 1)."""
        t = as_distribution(probs, "rng.categorical")
        u = torch.rand((), generator=self.generator, dtype=torch.float64, device=self.device)
        return int(_sample(t, u=u.cpu()))  # t was checked by as_distribution


def as_rng(generator: torch.Generator | None, rng: object | None) -> object:
    """The rng a rule draws through: `rng` if given (anything with uniform() and categorical()), else a TorchRNG."""
    if rng is not None:
        if generator is not None:
            raise ValueError("give a generator or an rng, not both")
        if not (hasattr(rng, "uniform") and hasattr(rng, "categorical")):
            raise TypeError("rng must have uniform() and categorical(probs) methods")
        return rng
    return TorchRNG(generator)

