"""v(k) and c, measured one way everywhere: isolated passes, paired repeat by repeat, conditions printed.

    v(k) = time of one target pass over k + 1 new tokens / time of one target pass over 1 token
    c    = time of one draft pass over 1 token / time of one target pass over 1 token

Both passes of a ratio run after the same `context` cached tokens (the cache is rolled back
before each pass, as a verifier does), in the same repeat, back to back, so a machine that
slows down between repeats moves both sides of the ratio; the spread of the per-repeat ratios
is kept. What a ratio means depends on how it was measured: the thread count, the context,
the batch size, the clock and the kernel that ran (`specref.models.kernels`) are all recorded
and printed with it (`PassCosts.conditions`), so two numbers that disagree can be traced to
the conditions that differ.
"""

from __future__ import annotations

import statistics
from collections.abc import Sequence
from dataclasses import dataclass

import torch

from .._validate import as_int_tuple, check_int
from ..models.gpt2 import unchecked
from ..models.kernels import MAX_ROWS
from .costs import repeat_times

_CLOCK_NAMES = {"cpu": "this process's CPU time", "wall": "wall-clock time"}


@dataclass(frozen=True)
class PassCosts:
    """Per-repeat pass times and the ratios v(k) and c computed from them (median and range over repeats)."""

    ks: tuple[int, ...]
    one: tuple[float, ...]  # seconds of the target's pass over 1 token, per repeat
    verify: dict[int, tuple[float, ...]]  # k -> seconds of the target's pass over k + 1 tokens, per repeat
    draft: tuple[float, ...] | None  # seconds of the draft's pass over 1 token, per repeat (None: no draft)
    context: int
    batch_size: int
    threads: int
    clock: str
    kernel: str  # which kernel the target's passes ran ("compiled" or "torch", and why)

    def v_repeats(self, k: int) -> list[float]:
        """v(k) of each repeat."""
        return [t / o for t, o in zip(self.verify[k], self.one)]

    def v(self, k: int) -> float:
        """The median over repeats of v(k)."""
        return statistics.median(self.v_repeats(k))

    def v_range(self, k: int) -> tuple[float, float]:
        r = self.v_repeats(k)
        return min(r), max(r)

    def c_repeats(self) -> list[float]:
        if self.draft is None:
            raise ValueError("no draft was timed: pass a draft to measure_pass_costs for c")
        return [d / o for d, o in zip(self.draft, self.one)]

    @property
    def c(self) -> float:
        """The median over repeats of c."""
        return statistics.median(self.c_repeats())

    @property
    def c_range(self) -> tuple[float, float]:
        r = self.c_repeats()
        return min(r), max(r)

    @property
    def one_pass(self) -> float:
        """Median seconds of the target's pass over one token."""
        return statistics.median(self.one)

    def conditions(self) -> str:
        """How these ratios were measured, in one line."""
        return (f"isolated passes, batch {self.batch_size}, {self.context} cached tokens, {self.threads} torch "
                f"thread{'s' if self.threads != 1 else ''}, {_CLOCK_NAMES[self.clock]}, median of {len(self.one)} "
                f"paired repeats, target kernel: {self.kernel}")

    def table(self) -> str:
        """v(k) per k (median [range]) and c, with the conditions."""
        lines = [f"one target pass over 1 token: {self.one_pass * 1e3:.2f} ms (median)"]
        for k in self.ks:
            lo, hi = self.v_range(k)
            lines.append(f"v({k}) = {self.v(k):.2f} [{lo:.2f}, {hi:.2f}]  (a pass over {k + 1} tokens)")
        if self.draft is not None:
            lo, hi = self.c_range
            lines.append(f"c    = {self.c:.3f} [{lo:.3f}, {hi:.3f}]  (a draft pass over 1 token)")
        lines.append("measured as: " + self.conditions())
        return "\n".join(lines)


@torch.no_grad()

def timing_setup(target, draft, clock: str | None, n_max: int, what: str,
                 generator: torch.Generator | None) -> tuple[str, torch.Generator]:
    """The clock (default: CPU time on a CPU, wall time elsewhere; CPU time refused on another device), the check
    that `n_max` positions fit both models, and the generator (seed 0 when none is given)."""
    dev = target.device
    clock = clock or ("cpu" if dev.type == "cpu" else "wall")
    if clock not in _CLOCK_NAMES or (clock == "cpu" and dev.type != "cpu"):
        raise ValueError(f"clock must be one of {sorted(_CLOCK_NAMES)} ('wall' on a {dev.type}), got {clock!r}")
    for name, model in (("target", target), ("draft", draft)):
        if model is not None and n_max > model.config.n_positions:
            raise ValueError(f"{what} = {n_max} exceeds the {name}'s n_positions {model.config.n_positions}")
    return clock, generator if generator is not None else torch.Generator().manual_seed(0)

def measure_pass_costs(
    target: torch.nn.Module,
    ks: Sequence[int],
    draft: torch.nn.Module | None = None,
    context: int = 64,
    batch_size: int = 1,
    repeats: int = 5,
    clock: str | None = None,
    generator: torch.Generator | None = None,
    kernel: str | None = None,
) -> PassCosts:
    """Time the target's passes over 1 and k + 1 tokens (and the draft's over 1), `repeats` paired repeats.

    Each repeat times every pass once, in the same order, each after rolling its cache back to
    `context` tokens (token ids drawn from `generator`, default seed 0: ids barely matter to a
    pass's time). Each pass is the unchecked one a decoding loop runs. `clock` is "cpu" (the default
    on a CPU: a busy machine's waits for a core are left out; it sums all of torch's threads, so use it
    with one thread) or "wall" (the default elsewhere, and the only clock for a GPU). `kernel` names the
    target's kernel for the record (default: the few-token kernel where the target carries it and the
    passes fit it, else PyTorch's own).
    """
    ks = as_int_tuple("ks", ks)
    if not ks or min(ks) < 1:
        raise ValueError(f"ks must hold at least one k >= 1, got {list(ks)}")
    check_int("context", context, 1, "cached tokens")
    check_int("batch_size", batch_size, 1, "rows per pass")
    check_int("repeats", repeats, 1, "paired repeats")
    dev = target.device
    n_max = context + max(ks) + 1
    clock, generator = timing_setup(target, draft, clock, n_max, "context + max(ks) + 1", generator)
    ids = torch.randint(0, target.config.vocab_size, (batch_size, n_max), generator=generator).to(dev)

    caches: dict[int, object] = {}  # one cache per model, prefilled once: every pass rolls it back to `context`

    def pass_over(model: torch.nn.Module, n: int):
        if id(model) not in caches:
            caches[id(model)] = model.new_cache(batch_size, max_len=n_max)
            model(ids[:, :context], cache=caches[id(model)])
        cache, step = caches[id(model)], unchecked(model)

        def run() -> None:  # the pass a decoding loop runs: unchecked, nothing read back
            cache.truncate(context, check=False, bound=context)
            step(ids[:, context:context + n], cache=cache)
        return run

    passes = {("t", 1): pass_over(target, 1), **{("t", k + 1): pass_over(target, k + 1) for k in ks}}
    if draft is not None:
        passes[("d", 1)] = pass_over(draft, 1)
    times: dict[tuple[str, int], list[float]] = {key: [] for key in passes}
    for fn in passes.values():  # warm every path once (first calls allocate)
        fn()
    for _ in range(repeats):
        for key, fn in passes.items():
            times[key] += repeat_times(fn, dev, repeats=1, warmup=0, clock=clock)
    if kernel is None:
        kernel = _kernel_of(target, batch_size * (max(ks) + 1))
    return PassCosts(ks=ks, one=tuple(times[("t", 1)]), verify={k: tuple(times[("t", k + 1)]) for k in ks},
                     draft=None if draft is None else tuple(times[("d", 1)]), context=context,
                     batch_size=batch_size, threads=torch.get_num_threads(), clock=clock, kernel=kernel)


def _kernel_of(model: torch.nn.Module, most_rows: int) -> str:
    """Which kernel the timed passes ran: the few-token kernel serves passes of at most MAX_ROWS rows."""
    head = getattr(model, "lm_head", None)
    if head is None or "fast" not in head.__dict__:
        return "torch (PyTorch's own)"
    if most_rows <= MAX_ROWS:
        return "compiled (few-token kernel)"
    return f"compiled (few-token kernel) up to {MAX_ROWS} rows, PyTorch's own past that"
