"""What a forward pass costs: timing with a warm KV cache, and the roofline arithmetic.

A decode step multiplies every weight by a handful of token vectors. It moves
2-4 bytes per weight and does 2 FLOPs per weight per token, so its arithmetic
intensity is about tokens / bytes_per_weight FLOP/byte. Below the machine's
ridge point (peak FLOP/s divided by memory bandwidth) the step is limited by
memory (or by fixed per-call overhead), not by arithmetic: scoring a few more
tokens in the same pass is nearly free.
"""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable

import torch


def sync(device: torch.device | str) -> None:
    """Wait for queued GPU work, so a timer measures the work and not its launch."""
    if torch.device(device).type == "cuda":
        torch.cuda.synchronize(device)


def median_time(fn: Callable[[], object], device: torch.device | str, repeats: int = 20, warmup: int = 3) -> float:
    """Median wall time of fn() in seconds (median: robust to a busy machine's outliers)."""
    if repeats < 1:
        raise ValueError(f"repeats must be >= 1, got {repeats}")
    for _ in range(warmup):
        fn()
    times = []
    for _ in range(repeats):
        sync(device)
        t0 = time.perf_counter()
        fn()
        sync(device)
        times.append(time.perf_counter() - t0)
    return statistics.median(times)


@torch.no_grad()
def forward_time(
    model: torch.nn.Module,
    n_new: int,
    context_len: int = 64,
    batch_size: int = 1,
    repeats: int = 20,
    generator: torch.Generator | None = None,
) -> float:
    """Median seconds for one forward pass scoring n_new tokens after a warm cache of context_len.

    Each repeat rolls the cache back to context_len, exactly what a verifier does
    after a step, so every pass sees the same cache.
    """
    for name, v in (("n_new", n_new), ("context_len", context_len), ("batch_size", batch_size)):
        if isinstance(v, bool) or not isinstance(v, int) or v < 1:
            raise ValueError(f"{name} must be an int >= 1, got {v!r}")
    if context_len + n_new > model.config.n_positions:
        raise ValueError(f"context_len + n_new = {context_len + n_new} exceeds n_positions={model.config.n_positions}")
    dev = model.device
    V = model.config.vocab_size
    if generator is None:
        generator = torch.Generator().manual_seed(0)  # token ids barely matter for timing; keep them fixed
    ids = torch.randint(0, V, (batch_size, context_len + n_new), generator=generator).to(dev)
    cache = model.new_cache(batch_size)
    model(ids[:, :context_len], cache=cache)

    def step() -> None:
        cache.truncate(context_len)
        model(ids[:, context_len:], cache=cache)

    return median_time(step, dev, repeats=repeats)


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


def peak_matmul_flops(device: torch.device | str = "cpu", n: int = 1024, dtype: torch.dtype = torch.float32) -> float:
    """Measured FLOP/s of a large square matmul: a practical stand-in for the compute peak."""
    a = torch.randn(n, n, device=device, dtype=dtype, generator=_gen(device))
    b = torch.randn(n, n, device=device, dtype=dtype, generator=_gen(device))
    t = median_time(lambda: a @ b, device, repeats=5, warmup=2)
    return 2 * n**3 / t


def memory_bandwidth(device: torch.device | str = "cpu", n_bytes: int = 256 * 2**20) -> float:
    """Measured bytes/s of a large copy (read + write), larger than the CPU caches."""
    x = torch.empty(n_bytes // 4, device=device, dtype=torch.float32).fill_(1.0)
    y = torch.empty_like(x)
    t = median_time(lambda: y.copy_(x), device, repeats=5, warmup=1)
    return 2 * x.numel() * 4 / t


def ridge_point(device: torch.device | str = "cpu", dtype: torch.dtype = torch.float32) -> float:
    """FLOP per byte where the roofline turns: below it a kernel is memory-bound."""
    return peak_matmul_flops(device, dtype=dtype) / memory_bandwidth(device)


def _gen(device: torch.device | str) -> torch.Generator:
    return torch.Generator(device=device).manual_seed(0)
