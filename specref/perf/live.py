"""This machine, timed live: pass times over B x T with their spread, decoding runs repeated, and the model's view.

Timings belong to the machine they ran on, so nothing here is stored: a grid of target
passes is timed in a few seconds (`time_passes`), `PassModel.fit` turns it into a cost
model, and `time_decoding` times plain and speculative decoding of the same batches,
repeat by repeat, with the counted facts of the speculative runs (alpha, tokens per
step) beside the times. Every timing keeps its repeats, so the spread is always shown.
`pass_rows` turns the course's one v(k) and c measurement (`measure_pass_costs`), taken at
several batch sizes, into the rows `PassModel.fit` reads.

Two rules of the pass's cost decide where speculation stops paying:

    break_even_tokens = (overhead + weights) / (per_token + attention * S)

the tokens per pass whose arithmetic costs as much as the pass's fixed part (`break_even_tokens`).
While a pass scores far fewer tokens than that, scoring k + 1 per row instead of one costs
little more than one plain step (v near 1). On a GPU's roofline with no overhead it is the
ridge, where compute catches up with reading the weights; on a CPU running a small model the
fixed part is the per-call overhead and the model's weights are no floor at all.

    speedup = E(alpha, k) / (v(k, B) + c(B) k)

the chapter's formula, with v and c read off a `CostModel` at batch size B (`speedup_row`).
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import torch
from scipy.optimize import brentq

from .._validate import as_int_tuple, check_int
from ..decoding.chain import generate, speculative_generate
from ..theory import expected_tokens_per_step
from .costmodel import CostModel, PassModel, batch_steps
from .costs import pass_times, repeat_times
from .verify_cost import PassCosts


@dataclass(frozen=True)
class Repeats:
    """Seconds of each repeat of one measurement: its median, its range and its spread."""

    times: tuple[float, ...]

    def __post_init__(self) -> None:
        if not self.times:
            raise ValueError("times must hold at least one repeat")
        for t in self.times:
            if isinstance(t, bool) or not isinstance(t, (int, float)) or not (math.isfinite(t) and t > 0):
                raise ValueError(f"every time must be a finite number of seconds > 0, got {t!r}")

    @property
    def median(self) -> float:
        return statistics.median(self.times)

    @property
    def low(self) -> float:
        return min(self.times)

    @property
    def high(self) -> float:
        return max(self.times)

    @property
    def spread(self) -> float:
        """(high - low) / median: how far apart the repeats landed."""
        return (self.high - self.low) / self.median


def time_passes(
    model: torch.nn.Module, batch_sizes: Sequence[int], n_tokens: Sequence[int], context: int, repeats: int = 3,
    clock: str = "cpu", max_len: int | None = None, warmup: int = 1,
) -> list[dict]:
    """One row per (B, T): a target pass over [B, T] new tokens after `context` cached ones, timed `repeats` times.

    Rows hold batch_size, n_tokens, context, seconds (the median: what `PassModel.fit`
    reads), low and high. `clock` is "cpu" (this process's CPU time: a busy machine's
    waits for a core left out) or "wall"; on a GPU use "wall". `max_len` is the cache's
    allocation (decoding allocates prompt + new tokens + k).
    """
    Bs, Ts = as_int_tuple("batch_sizes", batch_sizes), as_int_tuple("n_tokens", n_tokens)
    if not Bs or not Ts:
        raise ValueError("batch_sizes and n_tokens must each hold at least one value")
    check_int("repeats", repeats, 1, "timed passes per cell")
    rows = []
    for B in Bs:
        times = pass_times(model, list(Ts), context, B, repeats, max_len=max_len, clock=clock, warmup=warmup)
        for T in Ts:
            r = Repeats(tuple(times[T]))
            rows.append(dict(batch_size=B, n_tokens=T, context=context, seconds=r.median, low=r.low, high=r.high))
    return rows


def break_even_tokens(model: PassModel, context: int = 0) -> float:
    """Tokens per pass whose arithmetic costs as much as the pass's fixed part; inf if tokens cost nothing.

    (overhead + weights) / (per_token + attention * context): the KV-cache reads, which grow
    with rows and not with tokens, are left out. For a roofline with no overhead this is
    `ridge_tokens(0)`, the point where a pass turns from memory-bound to compute-bound.
    """
    if not isinstance(model, PassModel):
        raise TypeError(f"model must be a PassModel, got {type(model).__name__}")
    context = check_int("context", context, 0, "cached tokens")
    slope = model.per_token + model.attention * context
    return math.inf if slope == 0 else (model.overhead + model.weights) / slope


def pass_rows(costs: Sequence[PassCosts]) -> tuple[list[dict], list[dict]]:
    """The rows `PassModel.fit` reads, from `measure_pass_costs` run at several batch sizes: (target, draft).

    Target rows: (B, 1) and (B, k + 1) for every k measured; draft rows: (B, 1), where a draft
    was timed (else an empty list). Each row holds batch_size, n_tokens, context, seconds (the
    median over the repeats), low and high, as `time_passes` gives them. All must share one context.
    """
    if isinstance(costs, PassCosts) or not isinstance(costs, Sequence) or not costs:
        raise TypeError("costs must be a non-empty list of PassCosts (one per batch size)")
    if not all(isinstance(c, PassCosts) for c in costs):
        raise TypeError(f"every item must be a PassCosts, got {[type(c).__name__ for c in costs]}")
    if len({c.context for c in costs}) != 1:
        raise ValueError(f"every measurement must share one context, got {sorted({c.context for c in costs})}")

    def row(B: int, T: int, S: int, times: Sequence[float]) -> dict:
        r = Repeats(tuple(times))
        return dict(batch_size=B, n_tokens=T, context=S, seconds=r.median, low=r.low, high=r.high)

    target = [row(c.batch_size, 1, c.context, c.one) for c in costs]
    target += [row(c.batch_size, k + 1, c.context, c.verify[k]) for c in costs for k in c.ks]
    draft = [row(c.batch_size, 1, c.context, c.draft) for c in costs if c.draft is not None]
    return sorted(target, key=lambda r: (r["batch_size"], r["n_tokens"])), draft


def speedup_row(model: CostModel, alpha: float, k: int, batch_size: int) -> dict[str, float]:
    """The chapter's formula at one batch size: tokens per pass, E, v, c, and speedup = E / (v + c k).

    v = verification over B x (k + 1) tokens in plain steps, c = one draft step in plain
    steps, both read off the cost model at this batch size (steady state: every row alike).
    """
    if not isinstance(model, CostModel):
        raise TypeError(f"model must be a CostModel, got {type(model).__name__}")
    k, B = check_int("k", k, 1, "drafts per step"), check_int("batch_size", batch_size, 1, "rows")
    E = float(expected_tokens_per_step(alpha, k))  # raises on an alpha outside [0, 1]
    v, c = model.v(k, B), model.c(B)
    return {"batch_size": B, "k": k, "tokens_per_pass": B * (k + 1), "E": E, "v": v, "c": c,
            "speedup": model.predict_speedup(alpha, k, B)}


def error_margin(predicted: Sequence[float], measured: Sequence[float]) -> float:
    """The model's largest relative error on the measured points, max |predicted / measured - 1|.

    A policy that switches speculation on only where the predicted speedup beats 1 + this
    margin would not have lost against plain decoding on any of these points.
    """
    pred, meas = [float(x) for x in predicted], [float(x) for x in measured]
    if not pred or len(pred) != len(meas):
        raise ValueError(f"predicted and measured must be non-empty and of one length, got {len(pred)} and {len(meas)}")
    if not all(math.isfinite(x) and x > 0 for x in pred + meas):
        raise ValueError("every predicted and measured speedup must be a finite number > 0")
    return max(abs(p / m - 1) for p, m in zip(pred, meas))


@dataclass(frozen=True)
class DecodingTiming:
    """Plain and speculative decoding of the same batches, repeat by repeat, and what the speculative runs counted.

    `plain` and `speculative` hold one time per repeat (each the sum over the batches);
    repeat i of each ran back to back, so `speedups` pairs them. alpha (accepted / examined
    drafts) and tokens_per_step are counted, not timed. `outside_passes` is the share of the
    speculative runs' own wall time spent outside the target's and the draft's passes: the
    acceptance rule and the loop's bookkeeping, which a model of passes alone leaves out.
    """

    batch_size: int
    batches: int  # batches of batch_size rows, decoded one after another in each repeat
    k: int
    new_tokens: int
    plain: Repeats
    speculative: Repeats
    alpha: float
    tokens_per_step: float
    steps: int  # verification passes of one repeat, all batches (counted; the prompt's pass left out)
    outside_passes: float

    @property
    def tokens(self) -> int:
        """New tokens one repeat decodes: batches x batch_size x new_tokens."""
        return self.batches * self.batch_size * self.new_tokens

    @property
    def speedups(self) -> tuple[float, ...]:
        """Plain time / speculative time, repeat by repeat."""
        return tuple(p / s for p, s in zip(self.plain.times, self.speculative.times))

    @property
    def speedup(self) -> float:
        """The median of the paired speedups."""
        return statistics.median(self.speedups)


@torch.no_grad()
def time_decoding(
    target: torch.nn.Module, draft: torch.nn.Module, batches: Sequence[torch.Tensor], k: int, new_tokens: int,
    repeats: int = 3, clock: str = "cpu", temperature: float = 0.0, seed: int = 0,
) -> DecodingTiming:
    """Time plain and speculative decoding of each batch ([B, P] token ids, run one after another), interleaved.

    Each repeat decodes every batch plainly, then speculatively, so a change in the
    machine's load falls on both. A short untimed run of each comes first (warm-up). Every
    batch must have the same batch size B. Sampled runs (temperature > 0) draw from a
    generator seeded with `seed` + the batch's index, the same in every repeat.
    """
    if isinstance(batches, torch.Tensor) or not isinstance(batches, Sequence) or not batches:
        raise TypeError("batches must be a non-empty list of [B, P] token-id tensors")
    for x in batches:
        if not isinstance(x, torch.Tensor) or x.dim() != 2:
            raise ValueError(f"each batch must be a [B, P] tensor, got {getattr(x, 'shape', type(x).__name__)}")
    B = batches[0].shape[0]
    if any(x.shape[0] != B for x in batches):
        raise ValueError(f"every batch must hold the same number of rows, got {[x.shape[0] for x in batches]}")
    k, n = check_int("k", k, 1, "drafts per step"), check_int("new_tokens", new_tokens, 1, "tokens per row")
    check_int("repeats", repeats, 1, "timed runs")
    dev = target.device

    def gen(i: int) -> torch.Generator | None:
        return None if temperature == 0 else torch.Generator(device=dev).manual_seed(seed + i)

    def plain(m: int) -> None:
        for i, x in enumerate(batches):
            generate(target, x, m, temperature=temperature, generator=gen(i))

    stats = []

    def spec(m: int) -> None:
        for i, x in enumerate(batches):
            stats.append(speculative_generate(target, draft, x, k=k, max_new_tokens=m, temperature=temperature,
                                              generator=gen(i), timing=True)[1])  # the share outside the passes

    plain(min(n, 4))  # warm-up: the allocator, the kernels, the code paths
    spec(min(n, 4))
    stats.clear()
    times: dict[str, list[float]] = {"plain": [], "spec": []}
    for _ in range(repeats):
        times["plain"] += repeat_times(lambda: plain(n), dev, repeats=1, warmup=0, clock=clock)
        times["spec"] += repeat_times(lambda: spec(n), dev, repeats=1, warmup=0, clock=clock)
    first = stats[:len(batches)]  # one repeat's counts (every repeat decodes the same tokens)
    examined, steps = sum(s.examined for s in first), sum(s.steps for s in first)
    passes = sum(s.target_passes - (x.shape[1] > 1) for s, x in zip(first, batches))  # prefill: one pass if P > 1
    total = sum(s.time_total for s in stats)
    outside = total - sum(s.time_target + s.time_draft for s in stats)
    return DecodingTiming(
        batch_size=B, batches=len(batches), k=k, new_tokens=n, plain=Repeats(tuple(times["plain"])),
        speculative=Repeats(tuple(times["spec"])), alpha=sum(s.accepted for s in first) / max(examined, 1),
        tokens_per_step=sum(s.emitted for s in first) / max(steps, 1), steps=int(passes),
        outside_passes=max(outside, 0.0) / total)


def predicted_speedup(
    model: CostModel, run: DecodingTiming, prompt_len: int, batch_size: int | None = None
) -> float:
    """Plain / speculative time of `run` as `model` predicts it from the passes the run counted.

    Per batch, plain decoding is the prompt's pass and new_tokens - 1 one-token steps;
    speculative decoding is the prompt's pass on the target and on the draft, and the run's
    counted verification steps (`run.steps`, all batches) each cost `model.step_time(k, B)`.
    Every pass is priced at the model's context (a fit at one context extrapolates to no other).
    Only counts come from the run, never its times.

    `batch_size` prices the same counted passes at another batch size B (default: the run's):
    the prediction for B rows that all accept alike, such as B copies of one prompt, which count
    the steps one copy counts (a batch of different prompts counts more, since it waits for its
    slowest row: `batch_steps`).
    """
    if not isinstance(model, CostModel):
        raise TypeError(f"model must be a CostModel, got {type(model).__name__}")
    if not isinstance(run, DecodingTiming):
        raise TypeError(f"run must be a DecodingTiming, got {type(run).__name__}")
    P, S = check_int("prompt_len", prompt_len, 1, "prompt tokens"), model.context
    B = run.batch_size if batch_size is None else check_int("batch_size", batch_size, 1, "rows")
    prompt = model.target(B, P, S)
    draft_prompt = model.draft(B, P, S) if isinstance(model.draft, PassModel) else model.draft * prompt
    plain = run.batches * (prompt + (run.new_tokens - 1) * model.plain_time(B))
    speculative = run.batches * (prompt + draft_prompt) + run.steps * model.step_time(run.k, B)
    return plain / speculative


def alpha_spread(alpha: float, k: int, batch_size: int, new_tokens: int, steps: float) -> float:
    """The rows' spread of alpha (a Beta's standard deviation) under which `batch_steps` equals the counted steps.

    A batch runs until its slowest row is done, and rows differ in alpha, so a large batch
    counts more steps than rows alike would need. 0 when alike rows already need as many;
    the largest spread a Beta of mean alpha allows (times 0.99) when even that needs fewer.
    """
    a = float(alpha)
    k, B = check_int("k", k, 1, "drafts per step"), check_int("batch_size", batch_size, 1, "rows")
    n = check_int("new_tokens", new_tokens, 1, "tokens per row")
    if isinstance(steps, bool) or not isinstance(steps, (int, float)) or not 1 <= steps <= n:
        raise ValueError(f"steps must be a number in [1, new_tokens = {n}] (steps per batch), got {steps!r}")
    if not 0 < a < 1:
        return 0.0
    top = 0.99 * math.sqrt(a * (1 - a))
    gap = lambda sd: batch_steps(a, k, B, n, sd) - steps  # noqa: E731  (rises with the spread)
    if gap(0.0) >= 0:
        return 0.0
    if gap(top) <= 0:
        return top
    return float(brentq(gap, 0.0, top, xtol=1e-6))


def first_loss(speedup: Callable[[int], float], b_max: int = 256) -> int | None:
    """The smallest batch size B <= b_max with speedup(B) < 1, or None: powers of two first, then bisection.

    speedup(B) is evaluated about 2 log2(b_max) times instead of b_max, for models whose
    every evaluation is costly (`CostModel.run_speedup` with a spread of alpha). It assumes
    the speedup falls with B between the last power of two that gains and the first that
    loses, as E / (v + c k) does wherever v and c do not fall with the batch.
    """
    b_max = check_int("b_max", b_max, 1, "the largest batch size")
    lo, hi = 0, 1  # speedup(lo) >= 1 (lo = 0: no batch yet), speedup(hi) is the next to try
    while True:
        hi = min(hi, b_max)
        if speedup(hi) < 1:
            break
        if hi == b_max:
            return None
        lo, hi = hi, 2 * hi
    while hi - lo > 1:
        mid = (lo + hi) // 2
        lo, hi = (lo, mid) if speedup(mid) < 1 else (mid, hi)
    return hi
