"""How many tokens a speculative step yields, and what that buys (Leviathan et al. 2022).

If each draft is accepted independently with probability alpha, the accepted
count A has P(A >= i) = alpha^i, so E[tokens per step] = sum_{i=0..k} alpha^i
= (1 - alpha^(k+1)) / (1 - alpha). A step costs one target pass (assumed to
verify k+1 tokens for the price of one) plus k draft steps of relative cost c:
S(alpha, k, c) = E / (1 + c k).
"""

from __future__ import annotations

import numpy as np

from ._validate import check_int

Numbers = float | int | np.ndarray  # one number, or an array of them (the formulas broadcast)


def _as_real(x: Numbers, name: str, allowed: str) -> np.ndarray:
    """x as a float64 array; a TypeError naming `name` for anything but real numbers (a str is not parsed)."""
    arr = np.asarray(x)
    if arr.dtype.kind not in "iuf":
        raise TypeError(f"{name} must be a number {allowed} (or an array of them), got {x!r}")
    return arr.astype(np.float64)


def _as_alpha(alpha: Numbers) -> np.ndarray:
    a = _as_real(alpha, "alpha", "in [0, 1]")
    if np.isnan(a).any() or (a < 0).any() or (a > 1).any():
        raise ValueError(f"alpha must be in [0, 1], got {alpha!r}")
    return a


def _as_k(k: Numbers, name: str = "k") -> np.ndarray:
    kk = np.asarray(k)
    if kk.dtype.kind not in "iu" and not (kk.dtype.kind == "f" and np.all(np.mod(kk, 1) == 0)):
        raise TypeError(f"{name} must be an integer (or array of integers), got {k!r}")
    kk = kk.astype(np.int64)
    if (kk < 0).any():
        raise ValueError(f"{name} must be >= 0, got {k!r}")
    return kk


def _as_c(c: Numbers) -> np.ndarray:
    cc = _as_real(c, "c", ">= 0")
    if np.isnan(cc).any() or (cc < 0).any() or np.isinf(cc).any():
        raise ValueError(f"c must be a finite number >= 0, got {c!r}")
    return cc


def _out(x: np.ndarray) -> float | np.ndarray:
    return float(x) if x.ndim == 0 else x


def expected_tokens_per_step(alpha: Numbers, k: Numbers) -> float | np.ndarray:
    """E[tokens per step] = (1 - alpha^(k+1)) / (1 - alpha); exactly k + 1 at alpha = 1."""
    a, kk = _as_alpha(alpha), _as_k(k)
    with np.errstate(divide="ignore", invalid="ignore"):
        # expm1/log keep full precision as alpha -> 1, where the plain form cancels.
        la = np.log(a)
        e = np.expm1((kk + 1.0) * la) / np.expm1(la)  # kk + 1.0: no int64 overflow at k = 2**63 - 1
    return _out(np.where(a == 1, kk + 1.0, e))


def speedup(alpha: Numbers, k: Numbers, c: Numbers) -> float | np.ndarray:
    """S(alpha, k, c) = (1 - alpha^(k+1)) / ((1 - alpha) (1 + c k)): tokens per unit of target time."""
    cc, kk = _as_c(c), _as_k(k)
    return _out(np.asarray(expected_tokens_per_step(alpha, kk)) / (1 + cc * kk))


def optimal_k(alpha: Numbers, c: Numbers, k_max: int = 16) -> int | np.ndarray:
    """The k in 0..k_max with the largest speedup (smallest k on ties; 0 = don't speculate)."""
    if isinstance(k_max, np.integer):  # a numpy int is an int here; np.bool_ is not an np.integer
        k_max = int(k_max)
    k_max = check_int("k_max", k_max, 0, "the largest k tried", wrong_type=ValueError)
    a, cc = np.broadcast_arrays(_as_alpha(alpha), _as_c(c))
    ks = np.arange(k_max + 1).reshape((-1,) + (1,) * a.ndim)
    s = np.asarray(speedup(a[None], ks, cc[None]))
    best = np.argmax(s, axis=0)  # argmax returns the first maximum: the smallest k
    return int(best) if best.ndim == 0 else best


def estimate_alpha(n_accepted: Numbers, k: Numbers) -> float:
    """alpha from observed steps: accepted drafts / examined drafts, examined = min(A + 1, k) per step.

    Drafts after the first rejection are never examined, so dividing by all k drafts
    would bias alpha low. Under the model (each examined draft accepted independently
    with probability alpha) this ratio is the maximum-likelihood estimate.
    """
    a, kk = np.broadcast_arrays(_as_k(n_accepted, "n_accepted"), _as_k(k))
    if (a > kk).any():
        raise ValueError("n_accepted must be <= k for every step")
    examined = np.minimum(a + 1, kk).sum()
    if examined == 0:
        raise ValueError("no draft was examined (every step had k = 0): alpha is undefined")
    return float(a.sum() / examined)
