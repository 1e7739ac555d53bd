"""Graders for the chapter 1 exercise: the roofline of one pass, by value against `specref.perf`.

A model is a dict of plain numbers: `n_params`, `bytes_per_param`, `kv_bytes_per_token` (bytes of K
and V per row and cached token, all layers) and `attention_flops_per_token` (FLOPs per new token and
cached token, all layers). A machine: `peak_flops` (FLOP/s), `bandwidth` (bytes/s), `efficiency` (the
share of the peak its matmuls reach) and `overhead_s` (seconds per pass that are neither). The
reference for every quantity is `specref.perf.costmodel.PassModel.roofline` of the same numbers (the
bytes and FLOPs are its memory and compute times times the bandwidth and the reached FLOP/s) and
`CostModel.v` for v(k).

Every answer is a closed form of a few float64 operations: the learner's and the reference's differ by
a few ulps (about 1e-15 relative), so a relative REL = 1e-9 cannot fail a correct answer, while any
wrong term (a factor of 2, a missing KV read, a sum instead of a maximum) moves the value by far more
on the cases below. Visible and hidden checks are separate functions with their own case generators;
the hidden ones draw from the grader's seed. Feedback shows the input, the learner's output and which
quantity is wrong, never the expected value.
"""

from __future__ import annotations

import math
from collections.abc import Callable

import numpy as np

from specref.perf.costmodel import CostModel, PassModel
from .report import as_float, call_learner, failure, passed
from .rules import graded

REL = 1e-9  # closed forms in float64

# The examples the exercise shows (bf16 weights and KV on GPUs; float32 on the CPU).
MODELS = {
    "7B": {"n_params": 7e9, "bytes_per_param": 2.0, "kv_bytes_per_token": 2 * 32 * 4096 * 2.0,
           "attention_flops_per_token": 4 * 32 * 4096.0},
    "70B": {"n_params": 70e9, "bytes_per_param": 2.0, "kv_bytes_per_token": 2 * 80 * 1024 * 2.0,
            "attention_flops_per_token": 4 * 80 * 8192.0},
    "bundled target": {"n_params": 2936576.0, "bytes_per_param": 4.0, "kv_bytes_per_token": 2 * 12 * 128 * 4.0,
                       "attention_flops_per_token": 4 * 12 * 128.0},
}
MACHINES = {
    "H100": {"peak_flops": 990e12, "bandwidth": 3.35e12, "efficiency": 0.4, "overhead_s": 20e-6},
    "A100": {"peak_flops": 312e12, "bandwidth": 2.0e12, "efficiency": 0.6, "overhead_s": 20e-6},
    "laptop CPU": {"peak_flops": 100e9, "bandwidth": 20e9, "efficiency": 0.8, "overhead_s": 2e-3},
}

# Answers must not call the reference of what the tasks ask for.
FORBIDDEN = ("specref.perf.costmodel", "specref.perf.costs.forward_flops", "specref.perf.costs.weight_bytes",
             "specref.perf.costs.arithmetic_intensity",
             "specref_grading.checks.roofline")
ALLOWED = ("specref_grading.checks.roofline.MODELS", "specref_grading.checks.roofline.MACHINES")


def _roofline(model: dict, machine: dict) -> PassModel:
    return PassModel.roofline(model["n_params"], machine["bandwidth"], machine["peak_flops"], model["bytes_per_param"],
                              model["kv_bytes_per_token"], model["attention_flops_per_token"],
                              machine["efficiency"], machine["overhead_s"])


def reference(model: dict, machine: dict, B: int, T: int, S: int, k: int) -> dict[str, float]:
    """Every graded quantity of one case, from specref.perf."""
    m = _roofline(model, machine)
    flops_per_s = machine["efficiency"] * machine["peak_flops"]
    return {"bytes": (m.weights + m.kv * B * S) * machine["bandwidth"],
            "flops": (m.per_token * B * T + m.attention * B * T * S) * flops_per_s,
            "ridge_point": flops_per_s / machine["bandwidth"],
            "ridge_tokens": m.ridge_tokens(S),
            "pass_time": m(B, T, S),
            "v": CostModel(m, 0.0, context=S).v(k, B)}


# -- cases ------------------------------------------------------------------------------------------


def _visible_cases() -> list[tuple[str, dict, str, dict, int, int, int, int]]:
    """(model name, model, machine name, machine, B, T, S, k): the examples, small batches to past the ridge."""
    picks = [("7B", "H100", 1, 1, 0, 4), ("7B", "H100", 8, 5, 512, 4), ("70B", "H100", 128, 5, 1024, 4),
             ("70B", "A100", 32, 3, 4096, 2), ("bundled target", "laptop CPU", 1, 8, 64, 7),
             ("bundled target", "laptop CPU", 64, 1, 192, 1), ("7B", "A100", 256, 9, 2048, 8)]
    return [(mn, MODELS[mn], hn, MACHINES[hn], B, T, S, k) for mn, hn, B, T, S, k in picks]


def _unseen_cases(seed: int, n: int = 40) -> list[tuple[str, dict, str, dict, int, int, int, int]]:
    """Made-up models and machines: any size, weight format, efficiency and overhead, drawn from `seed`."""
    rng = np.random.default_rng([seed, 101])
    cases = []
    for i in range(n):
        layers, width = int(rng.integers(2, 129)), int(2 ** rng.integers(6, 15))
        bpp = float(rng.choice([0.5, 1.0, 2.0, 4.0]))
        model = {"n_params": float(12 * layers * width**2 * rng.uniform(0.8, 1.5)), "bytes_per_param": bpp,
                 "kv_bytes_per_token": float(2 * layers * width * rng.choice([0.125, 0.25, 1.0]) * bpp),
                 "attention_flops_per_token": float(4 * layers * width)}
        machine = {"peak_flops": float(10 ** rng.uniform(11, 15.5)), "bandwidth": float(10 ** rng.uniform(10, 13)),
                   "efficiency": float(rng.uniform(0.1, 1.0)), "overhead_s": float(rng.choice([0.0, 10 ** rng.uniform(-6, -2)]))}
        B, T = int(2 ** rng.integers(0, 10)), int(rng.integers(1, 17))
        cases.append((f"model {i + 1}", model, f"machine {i + 1}", machine, B, T, int(rng.integers(0, 8193)),
                      int(rng.integers(0, 12))))
    return cases


def _inputs(mn: str, model: dict, hn: str, machine: dict, **sizes: int) -> list[str]:
    return [f"model ({mn}) = {model}", f"machine ({hn}) = {machine}", ", ".join(f"{k} = {v}" for k, v in sizes.items())]


def _compare(g: str, where: str, inputs: list[str], name: str, out: object, want: float, hint: str) -> None:
    got = as_float(out)
    if got is None:
        raise failure(g, where, inputs + [f"{name} returned {out!r}"], f"{name} returns one number.")
    if not math.isclose(got, want, rel_tol=REL):
        raise failure(g, where, inputs + [f"your {name}: {got!r}"], f"{name} is wrong here: {hint}")


# -- Task 1: bytes and FLOPs ------------------------------------------------------------------------

_BYTES = "a pass reads every weight once, and every row reads its own KV cache of S cached tokens."
_FLOPS = ("each new token (B x T of them) costs about 2 FLOPs per weight, plus attention over its S cached "
          "tokens.")


def _grade_counts(g: str, pass_bytes: Callable, pass_flops: Callable, cases: list) -> None:
    for n, (mn, model, hn, machine, B, T, S, _k) in enumerate(cases, 1):
        where, inputs = f"case {n} of {len(cases)}.", [f"model ({mn}) = {model}", f"B = {B}, T = {T}, S = {S}"]
        want = reference(model, machine, B, T, S, 1)
        _compare(g, where, inputs, "pass_bytes", call_learner(g, where, inputs, pass_bytes, dict(model), B, T, S),
                 want["bytes"], _BYTES)
        _compare(g, where, inputs, "pass_flops", call_learner(g, where, inputs, pass_flops, dict(model), B, T, S),
                 want["flops"], _FLOPS)
    passed(g, f"{len(cases)} cases against specref.perf")


@graded(1, "check_bytes_and_flops", FORBIDDEN, ALLOWED, learner_args=2)
def check_bytes_and_flops(pass_bytes: Callable, pass_flops: Callable) -> None:
    """Grade pass_bytes(model, B, T, S) and pass_flops(model, B, T, S) on the exercise's examples."""
    _grade_counts("check_bytes_and_flops", pass_bytes, pass_flops, _visible_cases())


@graded(1, "check_bytes_and_flops_unseen", FORBIDDEN, ALLOWED, learner_args=2)
def check_bytes_and_flops_unseen(pass_bytes: Callable, pass_flops: Callable, seed: int) -> None:
    """The hidden test of Task 1: made-up models drawn from `seed`."""
    _grade_counts("check_bytes_and_flops_unseen", pass_bytes, pass_flops, _unseen_cases(seed))


# -- Task 2: intensity and the ridge ----------------------------------------------------------------


def _grade_ridge(g: str, intensity: Callable, ridge_point: Callable, ridge_tokens: Callable, cases: list) -> None:
    for n, (mn, model, hn, machine, B, T, S, _k) in enumerate(cases, 1):
        where, inputs = f"case {n} of {len(cases)}.", _inputs(mn, model, hn, machine, B=B, T=T, S=S)
        want = reference(model, machine, B, T, S, 1)
        _compare(g, where, inputs, "intensity", call_learner(g, where, inputs, intensity, dict(model), B, T, S),
                 want["flops"] / want["bytes"], "FLOPs of the pass per byte it reads, both from Task 1.")
        _compare(g, where, inputs, "ridge_point", call_learner(g, where, inputs, ridge_point, dict(machine)),
                 want["ridge_point"], "the machine's FLOP/s as its matmuls reach them, per byte/s of bandwidth.")
        _compare(g, where, inputs, "ridge_tokens",
                 call_learner(g, where, inputs, ridge_tokens, dict(model), dict(machine), S),
                 want["ridge_tokens"], "the T at which one sequence's pass (B = 1, S cached tokens) spends as long "
                                       "on arithmetic as on reading memory.")
    passed(g, f"{len(cases)} cases against specref.perf")


@graded(2, "check_intensity_and_ridge", FORBIDDEN, ALLOWED, learner_args=3)
def check_intensity_and_ridge(intensity: Callable, ridge_point: Callable, ridge_tokens: Callable) -> None:
    """Grade intensity(model, B, T, S), ridge_point(machine) and ridge_tokens(model, machine, S)."""
    _grade_ridge("check_intensity_and_ridge", intensity, ridge_point, ridge_tokens, _visible_cases())


@graded(2, "check_intensity_and_ridge_unseen", FORBIDDEN, ALLOWED, learner_args=3)
def check_intensity_and_ridge_unseen(intensity: Callable, ridge_point: Callable, ridge_tokens: Callable,
                                     seed: int) -> None:
    """The hidden test of Task 2: made-up models and machines drawn from `seed`."""
    _grade_ridge("check_intensity_and_ridge_unseen", intensity, ridge_point, ridge_tokens, _unseen_cases(seed))


# -- Task 3: pass time and v(k) ---------------------------------------------------------------------


def _grade_time(g: str, pass_time: Callable, v: Callable, cases: list) -> None:
    for n, (mn, model, hn, machine, B, T, S, k) in enumerate(cases, 1):
        where, inputs = f"case {n} of {len(cases)}.", _inputs(mn, model, hn, machine, B=B, T=T, S=S, k=k)
        want = reference(model, machine, B, T, S, k)
        _compare(g, where, inputs, "pass_time",
                 call_learner(g, where, inputs, pass_time, dict(model), dict(machine), B, T, S), want["pass_time"],
                 "memory traffic and arithmetic overlap: the slower of the two sets the time, and the overhead "
                 "comes on top.")
        _compare(g, where, inputs, "v", call_learner(g, where, inputs, v, dict(model), dict(machine), k, B, S),
                 want["v"],
                 "v(k) is a verification pass over k + 1 tokens per row against a plain step over 1, at batch B.")
    passed(g, f"{len(cases)} cases against specref.perf")


@graded(3, "check_pass_time_and_v", FORBIDDEN, ALLOWED, learner_args=2)
def check_pass_time_and_v(pass_time: Callable, v: Callable) -> None:
    """Grade pass_time(model, machine, B, T, S) and v(model, machine, k, B, S)."""
    _grade_time("check_pass_time_and_v", pass_time, v, _visible_cases())


@graded(3, "check_pass_time_and_v_unseen", FORBIDDEN, ALLOWED, learner_args=2)
def check_pass_time_and_v_unseen(pass_time: Callable, v: Callable, seed: int) -> None:
    """The hidden test of Task 3: made-up models and machines drawn from `seed`."""
    _grade_time("check_pass_time_and_v_unseen", pass_time, v, _unseen_cases(seed))
