"""The roofline arithmetic of a forward pass: the bytes of weights it reads, the FLOPs it does, their ratio.

A decode step multiplies every weight by a handful of token vectors. It moves
2-4 bytes per weight and does 2 FLOPs per weight per token, so its arithmetic
intensity is about tokens / bytes_per_weight FLOP/byte. Below the machine's
ridge point (peak FLOP/s divided by memory bandwidth) the step is limited by
memory (or by fixed per-call overhead), not by arithmetic: scoring a few more
tokens in the same pass is nearly free. The timing of a pass is in `specref.perf.costs`.
"""

from __future__ import annotations

import torch


def weight_bytes(model: torch.nn.Module) -> int:
    """Bytes of parameters a forward pass must read (tied weights counted once)."""
    return sum(p.numel() * p.element_size() for p in model.parameters())


def forward_flops(model: torch.nn.Module, n_tokens: int) -> int:
    """About 2 FLOPs per weight per token (one multiply, one add); attention is small at short context."""
    n_params = sum(p.numel() for p in model.parameters())
    return 2 * n_params * n_tokens


def arithmetic_intensity(model: torch.nn.Module, batch_size: int, n_tokens: int) -> float:
    """FLOPs per byte of weights for a pass over batch_size x n_tokens tokens."""
    return forward_flops(model, batch_size * n_tokens) / weight_bytes(model)
