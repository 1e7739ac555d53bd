"""Small random GPT-2 models for tests: sharp enough to avoid argmax ties, cheap enough for CPU."""

from __future__ import annotations

import copy

import torch

from specref.models.gpt2 import GPT2, GPT2Config


def small_gpt2(vocab: int, n_embd: int, n_layer: int, seed: int, n_positions: int = 256, scale: float = 1.0,
               dtype: torch.dtype = torch.float64) -> GPT2:
    torch.manual_seed(seed)  # tests may seed the global RNG; library code never does
    m = GPT2(GPT2Config(vocab_size=vocab, n_positions=n_positions, n_embd=n_embd, n_layer=n_layer, n_head=2))
    with torch.no_grad():
        for p in m.parameters():  # larger weights: sharper, more varied logits than GPT-2's init
            p.mul_(scale)
    return m.to(dtype).eval()


def noisy_copy(model: GPT2, noise: float, seed: int) -> GPT2:
    """A draft that agrees with the target often but not always."""
    g = torch.Generator().manual_seed(seed)
    d = copy.deepcopy(model)
    with torch.no_grad():
        for p in d.parameters():
            p.add_(noise * p.std() * torch.randn(p.shape, generator=g, dtype=p.dtype))
    return d
