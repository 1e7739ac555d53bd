"""Graders for the chapter 7 exercise: a load-aware k chosen from a measured cost table.

A cost table holds what a benchmark measures (benchmarks/bench_batch.py): `pass_s[B][T - 1]`,
the seconds of one target pass over B rows of T new tokens (T = 1..k_max + 1), and
`draft_s[B]`, the seconds of one draft step at batch B. With acceptance rate alpha, k drafts
per step emit E(alpha, k) = (1 - alpha^(k+1)) / (1 - alpha) tokens per row and cost
pass_s[B][k] + k draft_s[B], so the throughput of k (k = 0: plain decoding) is

    B E(alpha, k) / (pass_s[B][k] + k draft_s[B]).

The learner's `choose_k` is graded against an exhaustive search over k = 0..k_max on tables
generated here from a seed (noisy sum and roofline models, like real measurements); any k
whose throughput is within a relative 1e-9 of the best counts as best, so ties are fair.
"""

from __future__ import annotations

import copy
import math
from collections.abc import Callable

import numpy as np

from ...perf.costmodel import h100_cost_model
from ...theory import expected_tokens_per_step
from .report import _call, _fail, _passed

TIE = 1e-9  # relative: a k this close to the best throughput is as good as the best
DAY, NIGHT = 256, 8  # the chapter's question: batch 256 by day, 8 at night
BATCH_SIZES = (1, 2, 4, 8, 16, 32, 64, 128, 256)


def table_throughput(table: dict, alpha: float, k: int, batch_size: int) -> float:
    """Tokens per second over the batch at this k, from the table: B E(alpha, k) / (pass(B, k + 1) + k draft(B))."""
    B = batch_size
    step = table["pass_s"][B][k] + k * table["draft_s"][B]
    return B * float(expected_tokens_per_step(alpha, k)) / step


def best_ks(table: dict, alpha: float, batch_size: int, k_max: int) -> list[int]:
    """Every k in 0..k_max whose throughput is within TIE of the best: the exhaustive search."""
    tp = [table_throughput(table, alpha, k, batch_size) for k in range(k_max + 1)]
    top = max(tp)
    return [k for k, x in enumerate(tp) if x >= top * (1 - TIE)]


def h100_table(k_max: int = 8, batch_sizes: tuple[int, ...] = BATCH_SIZES) -> dict:
    """The chapter's 70B target on one H100 (`h100_cost_model`) as a cost table."""
    model = h100_cost_model()
    return {"pass_s": {B: [model.pass_time(B, T) for T in range(1, k_max + 2)] for B in batch_sizes},
            "draft_s": {B: model.draft_time(B) for B in batch_sizes}}


def random_table(rng: np.random.Generator, k_max: int = 8, batch_sizes: tuple[int, ...] = BATCH_SIZES) -> dict:
    """A table like a measured one: a sum or roofline pass model with a few percent of noise per entry."""
    overhead = float(rng.uniform(1e-3, 20e-3))
    per_token = float(rng.uniform(2e-6, 2e-4))
    roofline = bool(rng.integers(2))
    weights = float(rng.uniform(5e-3, 60e-3)) if roofline else 0.0
    noise = float(rng.uniform(0.0, 0.05))
    c = float(rng.uniform(0.0, 0.4))  # a draft step in plain steps

    def t(B: int, T: int) -> float:
        compute = per_token * B * T
        base = overhead + (max(weights, compute) if roofline else compute)
        return base * float(np.exp(noise * rng.standard_normal()))

    pass_s = {B: [t(B, T) for T in range(1, k_max + 2)] for B in batch_sizes}
    return {"pass_s": pass_s, "draft_s": {B: c * pass_s[B][0] for B in batch_sizes}}


def _cases(n_cases: int, seed: int) -> list[tuple[str, dict, float, int, int]]:
    """(label, table, alpha, batch size, k_max), the edge cases first."""
    rng = np.random.default_rng(seed)
    flat = {"pass_s": {B: [0.01] * 9 for B in BATCH_SIZES}, "draft_s": {B: 0.0 for B in BATCH_SIZES}}
    tie = {"pass_s": {1: [0.01, 0.015] + [1.0] * 7}, "draft_s": {1: 0.0}}  # at alpha 0.5: k = 0 and k = 1 tie
    cases = [
        ("free drafts, flat passes: the largest k", flat, 0.8, 8, 8),
        ("alpha = 0: drafts never help", h100_table(), 0.0, 8, 8),
        ("a tie between k = 0 and k = 1", tie, 0.5, 1, 8),
        ("alpha = 0, free drafts, flat passes: every k ties", flat, 0.0, 8, 8),
        ("the H100 table, batch 8", h100_table(), 0.8, 8, 8),
        ("the H100 table, batch 256", h100_table(), 0.8, 256, 8),
    ]
    while len(cases) < n_cases:
        k_max = int(rng.integers(1, 9))
        table = random_table(rng, k_max)
        alpha = float(rng.choice([0.0, rng.uniform(0.3, 0.95), rng.uniform(0.0, 0.99)]))
        B = int(rng.choice(BATCH_SIZES))
        cases.append((f"a generated table, k_max = {k_max}", table, alpha, B, k_max))
    return cases[:n_cases]


def _as_k(x: object) -> int | None:
    if isinstance(x, (bool, np.bool_)):
        return None
    if isinstance(x, (int, np.integer)):
        return int(x)
    if isinstance(x, (float, np.floating)) and float(x).is_integer():
        return int(x)
    return None


def _hint(table: dict, alpha: float, B: int, k_max: int, got: int) -> str:
    if got < 0 or got > k_max:
        return f"k must be in 0..k_max = 0..{k_max} (0 turns speculation off)."
    want = best_ks(table, alpha, B, k_max)
    no_draft = max(range(k_max + 1), key=lambda k: (B * float(expected_tokens_per_step(alpha, k))
                                                    / table["pass_s"][B][k], -k))
    flat = max(range(k_max + 1), key=lambda k: (float(expected_tokens_per_step(alpha, k))
                                                / (table["pass_s"][B][0] + k * table["draft_s"][B]), -k))
    if got == no_draft and got != flat:
        return "a step also runs k draft steps: its cost is pass(B, k + 1) + k * draft(B)."
    if got == flat and got != no_draft:
        return "verifying k drafts is a pass over T = k + 1 tokens per row: use pass_s[B][k], not pass_s[B][0]."
    if 0 in want and got > 0:
        return "here no k pays: compare every k > 0 with k = 0 (plain decoding, one pass over T = 1 token per row)."
    return ("throughput(k) = B * E(alpha, k) / (pass_s[B][k] + k * draft_s[B]), E(alpha, k) = "
            "(1 - alpha**(k + 1)) / (1 - alpha) (k + 1 when alpha = 1); take the best k of 0..k_max.")


def check_choose_k(fn: Callable[[float, int, dict, int], object], n_cases: int = 40, seed: int = 0) -> None:
    """Grade fn(alpha, batch_size, table, k_max) -> k against exhaustive search on generated tables."""
    g = "check_choose_k"
    for n, (label, table, alpha, B, k_max) in enumerate(_cases(n_cases, seed), 1):
        where = f"wrong answer on case {n} of {n_cases} ({label})."
        inputs = [f"alpha = {alpha:.4g}, batch_size = {B}, k_max = {k_max}",
                  "pass_s[B] = [" + ", ".join(f"{x:.4g}" for x in table["pass_s"][B]) + "]",
                  f"draft_s[B] = {table['draft_s'][B]:.4g}"]
        arg = copy.deepcopy(table)
        out = _call(g, where, inputs, fn, alpha, B, arg, k_max)
        if arg != table:
            raise _fail(g, where, inputs, "your function changed the table in place; read it, do not edit it.")
        k = _as_k(out)
        if k is None:
            raise _fail(g, where, inputs + [f"got {out!r}"], "return one integer k (0 = speculation off).")
        want = best_ks(table, alpha, B, k_max)
        if k not in want:
            tp = ", ".join(f"k={j}: {table_throughput(table, alpha, j, B):.5g}" for j in range(k_max + 1))
            raise _fail(g, where, inputs + [f"tokens per second: {tp}", f"expected k in {want}, got {k}"],
                        _hint(table, alpha, B, k_max, k))
    _passed(g, f"{n_cases} tables, exhaustive search, ties counted fairly")


def check_day_and_night(fn: Callable[[dict, float], object], n_cases: int = 10, seed: int = 0) -> None:
    """Grade fn(table, alpha) -> (k by day at batch 256, k at night at batch 8) on generated tables."""
    g = "check_day_and_night"
    rng = np.random.default_rng(seed + 7919)  # another stream than check_choose_k's tables
    cases = [("the H100 table", h100_table(), 0.8)]
    while len(cases) < n_cases:
        cases.append(("a generated table", random_table(rng), float(rng.uniform(0.4, 0.95))))
    for n, (label, table, alpha) in enumerate(cases[:n_cases], 1):
        where = f"wrong answer on case {n} of {n_cases} ({label})."
        inputs = [f"alpha = {alpha:.4g}"]
        arg = copy.deepcopy(table)
        out = _call(g, where, inputs, fn, arg, alpha)
        if arg != table:
            raise _fail(g, where, inputs, "your function changed the table in place.")
        if not (isinstance(out, (tuple, list)) and len(out) == 2) or _as_k(out[0]) is None or _as_k(out[1]) is None:
            raise _fail(g, where, inputs + [f"got {out!r}"], "return a pair of integers (k_day, k_night).")
        for when, B, k in (("day", DAY, _as_k(out[0])), ("night", NIGHT, _as_k(out[1]))):
            want = best_ks(table, alpha, B, len(table["pass_s"][B]) - 1)
            if k not in want:
                raise _fail(g, where, inputs + [f"{when} (batch {B}): expected k in {want}, got {k}"],
                            "by day the batch is 256 rows, at night 8: choose k for each batch size.")
    _passed(g, f"{n_cases} tables, batch {DAY} by day and {NIGHT} at night")


def speedup_at(table: dict, alpha: float, k: int, batch_size: int) -> float:
    """The predicted speedup of k over plain decoding at this batch size, from the table."""
    plain = table_throughput(table, alpha, 0, batch_size)
    return table_throughput(table, alpha, k, batch_size) / plain if math.isfinite(plain) else math.nan
