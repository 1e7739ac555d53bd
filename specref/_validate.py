"""Input checks shared by the rules: bad input raises, it never becomes a NaN."""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
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


def check_rows(name: str, x: object, batch_size: int, dims: str = "[B]") -> torch.Tensor:
    """Raise unless `x` is an integer tensor of shape `dims` ("[B]" or "[B, W]") with B = batch_size (from begin)."""
    x = check_tensor(name, x)
    if x.is_floating_point() or x.is_complex() or x.dtype == torch.bool:
        raise TypeError(f"{name} must be an integer tensor of shape {dims}, got {x.dtype}")
    if x.dim() != dims.count(",") + 1 or x.shape[0] != batch_size:
        raise ValueError(f"{name} must be an integer tensor of shape {dims} with B = {batch_size} (from begin), "
                         f"got {tuple(x.shape)}")
    return x


def check_gpt2(target: object) -> torch.nn.Module:
    """target as given; TypeError unless it is a GPT-2 model (a Module with config, lm_head and transformer)."""
    if not isinstance(target, torch.nn.Module) or getattr(target, "config", None) is None \
            or not hasattr(target, "lm_head") or not hasattr(target, "transformer"):
        raise TypeError(f"target must be a GPT-2 model (specref.models.gpt2.GPT2), got {type(target).__name__}")
    return target


def check_int(name: str, x: object, minimum: int, what: str, wrong_type: type[Exception] = TypeError) -> int:
    """x as an int >= minimum (`what` says what it counts); `wrong_type` (TypeError) for a non-int or a bool,
    else ValueError. The one "an int but not a bool" check: a bool is an int to Python, never a count here."""
    if isinstance(x, bool) or not isinstance(x, int):
        raise wrong_type(f"{name} must be an int >= {minimum}, got {x!r}")
    if x < minimum:
        raise ValueError(f"{name} must be >= {minimum} ({what}), got {x}")
    return x


def check_generator(generator: object, device: torch.device | str | None = None) -> torch.Generator | None:
    """generator as given: None or a torch.Generator, on `device` (where it must draw) when that is given."""
    if generator is None:
        return None
    if not isinstance(generator, torch.Generator):
        raise TypeError(f"generator must be a torch.Generator or None, got {type(generator).__name__}")
    if device is not None:
        want, have = torch.device(device), generator.device
        if want.type != have.type or (want.index is not None and have.index is not None and want.index != have.index):
            raise ValueError(f"generator is on {have} but must draw on {want}: "
                             f"use torch.Generator(device={str(want)!r})")
    return generator


def as_int_tuple(name: str, x: object) -> tuple[int, ...]:
    """A sequence of ints or a 1-D integer tensor as a tuple of ints; TypeError/ValueError naming `name`."""
    if isinstance(x, torch.Tensor):
        if x.is_floating_point() or x.is_complex() or x.dtype == torch.bool:
            raise TypeError(f"{name} must hold integers, got dtype {x.dtype}")
        if x.dim() != 1:
            raise ValueError(f"{name} must be 1-D ([N]), got shape {tuple(x.shape)}")
        return tuple(int(v) for v in x.tolist())
    if isinstance(x, (str, bytes)) or not isinstance(x, Sequence):
        raise TypeError(f"{name} must be a sequence of ints or a 1-D integer tensor, got {type(x).__name__}")
    out = []
    for v in x:
        if isinstance(v, (bool, np.bool_)) or not isinstance(v, (int, np.integer)):
            raise TypeError(f"{name} must hold ints, got {v!r}")
        out.append(int(v))
    return tuple(out)


def _fmt(x: object, digits: int = 4) -> str:
    """Short, readable numbers for messages: nested lists rounded to `digits` significant figures."""
    if isinstance(x, torch.Tensor):
        x = x.detach().cpu().tolist()
    elif isinstance(x, np.ndarray):
        x = x.tolist()
    if isinstance(x, (list, tuple)):
        return "[" + ", ".join(_fmt(v, digits) for v in x) + "]"
    if isinstance(x, bool):
        return str(x)
    if isinstance(x, (int, np.integer)):
        return str(int(x))
    if isinstance(x, (float, np.floating)):
        v = float(x)
        if v == 0:
            return "0"
        return f"{v:.{digits}g}"
    return repr(x)
