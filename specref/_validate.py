"""Input checks shared by the rules: bad input raises, it never becomes a NaN."""

from __future__ import annotations

import torch


def tolerance(dtype: torch.dtype) -> float:
    """How far from 1 a probability row may sum, for this float type."""
    return 1e-9 if dtype == torch.float64 else 1e-4


def check_tensor(name: str, x: object) -> torch.Tensor:
    if not isinstance(x, torch.Tensor):
        raise TypeError(f"{name} must be a torch.Tensor, got {type(x).__name__}")
    return x


def check_probs(name: str, x: object, min_dim: int = 1) -> torch.Tensor:
    """Raise unless `x` is a float tensor of probability rows along its last dim."""
    x = check_tensor(name, x)
    if not x.is_floating_point():
        raise TypeError(f"{name} must be a floating-point tensor of probabilities, got {x.dtype}")
    if x.dim() < min_dim:
        raise ValueError(f"{name} must have at least {min_dim} dims ([..., V]), got shape {tuple(x.shape)}")
    if x.shape[-1] == 0:
        raise ValueError(f"{name} has an empty vocabulary (last dim is 0)")
    if x.numel() == 0:
        return x
    # Fast path, two reductions: NaN or inf anywhere makes a row sum NaN or inf, and
    # -inf or a negative entry makes the minimum negative. Only a failure pays for
    # the checks below, which name what is wrong.
    worst = (x.sum(-1, dtype=torch.float64) - 1).abs().max()
    if bool((worst <= tolerance(x.dtype)) & (x.min() >= 0)):  # one read back from the device
        return x
    if torch.isnan(x).any():
        raise ValueError(f"{name} contains NaN")
    if torch.isinf(x).any():
        raise ValueError(f"{name} contains inf")
    if (x < 0).any():
        raise ValueError(f"{name} has negative probabilities (min {x.min().item():.3g})")
    raise ValueError(f"{name} rows must sum to 1 along the last dim; worst row is off by {worst.item():.3g}")


def check_tokens(name: str, x: object, vocab_size: int) -> torch.Tensor:
    """Raise unless `x` is an integer tensor of ids in [0, vocab_size)."""
    x = check_tensor(name, x)
    if x.is_floating_point() or x.is_complex() or x.dtype == torch.bool:
        raise TypeError(f"{name} must be an integer tensor of token ids, got {x.dtype}")
    if x.numel():
        lo, hi = torch.stack(torch.aminmax(x)).tolist()  # one read back from the device
        if lo < 0 or hi >= vocab_size:
            raise ValueError(f"{name} holds ids outside the vocabulary [0, {vocab_size}): min {lo}, max {hi}")
    return x
