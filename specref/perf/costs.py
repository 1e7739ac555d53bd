"""What a forward pass costs in time: timing with a warm KV cache, and the machine's peak FLOP/s and bandwidth.

The roofline arithmetic of a pass (its bytes of weights, its FLOPs, their ratio) is in `specref.perf.roofline`.
"""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable

import torch

from .._validate import check_int
from ..timing import sync


def repeat_times(
    fn: Callable[[], object], device: torch.device | str, repeats: int = 20, warmup: int = 3, clock: str = "wall"
) -> list[float]:
    """Seconds of each of `repeats` calls of fn(), after `warmup` untimed calls.

    clock="wall" is elapsed time; clock="cpu" is this process's CPU time (all its threads):
    on a CPU shared with other jobs it leaves out the time the process waited for a core,
    so it stays stable where wall time swings (with one torch thread, cpu = wall on an idle machine).
    """
    check_int("repeats", repeats, 1, "timed calls", wrong_type=ValueError)
    if clock not in _CLOCKS:
        raise ValueError(f"clock must be one of {sorted(_CLOCKS)}, got {clock!r}")
    now = _CLOCKS[clock]
    for _ in range(warmup):
        fn()
    times = []
    for _ in range(repeats):
        sync(device)
        t0 = now()
        fn()
        sync(device)
        times.append(now() - t0)
    return times


_CLOCKS = {"wall": time.perf_counter, "cpu": time.process_time}


def median_time(fn: Callable[[], object], device: torch.device | str, repeats: int = 20, warmup: int = 3) -> float:
    """Median wall time of fn() in seconds (median: robust to a busy machine's outliers)."""
    return statistics.median(repeat_times(fn, device, repeats, warmup))


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
    return statistics.median(pass_times(model, n_new, context_len, batch_size, repeats, generator))


@torch.no_grad()
def pass_times(
    model: torch.nn.Module, n_new: int | list[int], context_len: int = 64, batch_size: int = 1, repeats: int = 20,
    generator: torch.Generator | None = None, max_len: int | None = None, clock: str = "wall", warmup: int = 3,
) -> list[float] | dict[int, list[float]]:
    """Seconds of each repeat of one pass over [batch_size, n_new] new tokens after a warm cache of context_len.

    A list of n_new gives {n_new: times} from one cache, prefilled once (a large batch's
    prompt pass costs more than the passes timed after it). `max_len` is the cache's
    allocated length (default n_positions, the whole window; decoding allocates only prompt + new
    tokens (+ k)): it matters, because
    attention reads a slice of each row's slots and a longer allocation spreads that
    slice over more memory.
    """
    ns = n_new if isinstance(n_new, list) else [n_new]
    for name, v, what in [("n_new", n, "new tokens per pass") for n in ns] + [
            ("context_len", context_len, "tokens of context"), ("batch_size", batch_size, "rows per pass")]:
        check_int(name, v, 1, what, wrong_type=ValueError)
    if not ns:
        raise ValueError("n_new must be an int >= 1 or a non-empty list of them")
    if context_len + max(ns) > model.config.n_positions:
        raise ValueError(f"context_len + n_new = {context_len} + {ns} exceeds n_positions={model.config.n_positions}")
    dev = model.device
    V = model.config.vocab_size
    if generator is None:
        generator = torch.Generator().manual_seed(0)  # token ids barely matter for timing; keep them fixed
    ids = torch.randint(0, V, (batch_size, context_len + max(ns)), generator=generator).to(dev)
    cache = model.new_cache(batch_size, max_len=max_len)
    model(ids[:, :context_len], cache=cache)
    out = {}
    for n in ns:
        def step(n: int = n) -> None:  # n bound now: the timer calls it within this iteration
            cache.truncate(context_len)
            model(ids[:, context_len:context_len + n], cache=cache)

        out[n] = repeat_times(step, dev, repeats=repeats, warmup=warmup, clock=clock)
    return out if isinstance(n_new, list) else out[n_new]


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


def _gen(device: torch.device | str) -> torch.Generator:
    return torch.Generator(device=device).manual_seed(0)
