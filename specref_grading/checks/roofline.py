"""Graders for the chapter 1 exercise: what one pass reads and computes, counted from the model object.

Task 1: `pass_bytes(model, B, T, S)` and `pass_flops(model, B, T, S)` of a specref GPT2 model. The
learner reads the model (its parameters and their dtypes, its blocks, its config); the task's text says
what is counted in words, never as a formula:

* bytes: every parameter once, at its own dtype's size (a tied matrix is one parameter), and the KV
  cache: per layer, per row and per cached token, one key and one value of `n_embd` numbers each, in
  the dtype of that layer's `attn.c_attn.weight`;
* FLOPs: 2 (a multiply and an add) per weight of every matrix a new token's activations are multiplied
  by, the output layer included (embedding lookups, biases and layer norms not counted), and attention:
  in every layer each new token scores every position it attends to (the S cached tokens of its row,
  and the new tokens up to itself) with a dot product over `n_embd` numbers and adds that position's
  value vector (`n_embd` multiply-adds).

Task 2: `memory_bound_batch(model, machine, k, S)`: the largest batch size at which a verification pass
over k + 1 tokens per row, S cached tokens per row, is memory-bound by the roofline (its arithmetic at
`efficiency x peak_flops` takes no longer than reading its bytes at `bandwidth`); None where it is
memory-bound at every batch size (the KV cache grows with the batch as fast as the arithmetic does), 0
where not even at batch 1.

Every graded value is an integer (bytes, FLOPs, a batch size): they are compared exactly, by value (a whole
float such as 12.0 is the integer 12). The reference
counts are computed here from the model's own parameters and config, with integers only. For Task 2 the
real-valued boundary batch is a ratio of floats; cases whose boundary lies within 1e-6 of an integer are
never drawn, so any correct order of float64 arithmetic gives the same integer. Feedback shows the input
(the model's shape and dtypes) and the learner's output, never the expected value.
"""

from __future__ import annotations

import math
from collections.abc import Callable

import numpy as np
import torch

from specref.models.gpt2 import GPT2, GPT2Config
from specref.models.pair import load_pair
from specref.perf.machine import MACHINES

from .report import as_float, as_int, call_learner, derived_seed, failure, passed
from .rules import graded

# The machines the exercise names live in specref (a learner's copy has them): `specref.perf.machine.MACHINES`.

# Answers must not call what computes the counts for them (the machine's measurements stay allowed: Task 3 uses them).
FORBIDDEN = ("specref.perf.costmodel", "specref.perf.roofline", "specref.perf.draft_costs", "specref.perf.live",
             "specref_grading.checks.roofline")
ALLOWED = ("specref.perf.machine.MACHINES",)  # given on purpose; the kernel's specref has it

_BOUNDARY_GAP = 1e-6  # Task 2's cases keep their real-valued boundary this far from an integer


# -- the reference counts (integers) ----------------------------------------------------------------


def _matmul_weights(model: GPT2) -> int:
    """Weights a new token's activations are multiplied by: the blocks' four matrices and the output layer."""
    per_block = sum(b.attn.c_attn.weight.numel() + b.attn.c_proj.weight.numel() + b.mlp.c_fc.weight.numel()
                    + b.mlp.c_proj.weight.numel() for b in model.transformer.h)
    return per_block + model.lm_head.weight.numel()


def reference_bytes(model: GPT2, B: int, T: int, S: int) -> int:
    weights = sum(p.numel() * p.element_size() for p in model.parameters())  # parameters() yields a tied one once
    kv_per_token = sum(2 * model.config.n_embd * b.attn.c_attn.weight.element_size() for b in model.transformer.h)
    return weights + kv_per_token * B * S


def reference_flops(model: GPT2, B: int, T: int, S: int) -> int:
    attended = T * S + T * (T + 1) // 2  # new token i (1..T) attends to S cached tokens and i new ones
    attention = 4 * model.config.n_embd * model.config.n_layer * attended  # a score and a value, 2 FLOPs each
    return B * (2 * _matmul_weights(model) * T + attention)


def boundary_batch(model: GPT2, machine: dict, k: int, S: int) -> float:
    """The real B where a pass over k + 1 tokens per row stops being memory-bound (inf: never; may be < 1)."""
    T = k + 1
    weights_s = reference_bytes(model, 1, T, 0) / machine["bandwidth"]  # S = 0: the weights alone
    kv_row_s = (reference_bytes(model, 1, T, S) - reference_bytes(model, 1, T, 0)) / machine["bandwidth"]
    flops_row_s = reference_flops(model, 1, T, S) / (machine["efficiency"] * machine["peak_flops"])
    return math.inf if flops_row_s <= kv_row_s else weights_s / (flops_row_s - kv_row_s)


def reference_batch(model: GPT2, machine: dict, k: int, S: int) -> int | None:
    b = boundary_batch(model, machine, k, S)
    return None if math.isinf(b) else math.floor(b)


# -- the models graded on ---------------------------------------------------------------------------


def _describe(model: GPT2) -> str:
    cfg = model.config
    dtypes = sorted({str(p.dtype).removeprefix("torch.") for p in model.parameters()})
    tied = model.lm_head.weight is model.transformer.wte.weight
    return (f"GPT2 with n_layer = {cfg.n_layer}, n_embd = {cfg.n_embd}, n_head = {cfg.n_head}, "
            f"n_inner = {cfg.n_inner}, vocab_size = {cfg.vocab_size}, n_positions = {cfg.n_positions}; "
            f"parameter dtypes {dtypes}; output layer {'tied to' if tied else 'apart from'} the token embedding")


def _build(cfg: GPT2Config, dtype: torch.dtype, mixed: bool = False, untie: bool = False) -> GPT2:
    """A model of that shape: `dtype` everywhere, or (mixed) matrices in `dtype`, layer norms and biases float32."""
    torch.manual_seed(0)  # the values do not matter (nothing is run); seeded so the model is the same each time
    model = GPT2(cfg)
    if untie:
        model.lm_head.weight = torch.nn.Parameter(model.transformer.wte.weight.detach().clone())
    model = model.to(dtype)
    if mixed:
        for m in model.modules():
            if isinstance(m, torch.nn.LayerNorm):
                m.float()
            b = getattr(m, "bias", None)
            if isinstance(b, torch.nn.Parameter):
                m.bias = torch.nn.Parameter(b.detach().float())
    return model.eval()


def _bundled(dtype: torch.dtype) -> GPT2:
    target, _, _ = load_pair(dtype=dtype)
    return target


def _visible_models() -> list[GPT2]:
    small = GPT2Config(vocab_size=96, n_positions=64, n_embd=32, n_layer=3, n_head=4, n_inner=80)
    return [_bundled(torch.float32), _bundled(torch.bfloat16), _build(small, torch.float16, mixed=True, untie=True)]


def _visible_count_cases() -> list[tuple[GPT2, int, int, int]]:
    f32, bf16, mixed = _visible_models()
    return [(f32, 1, 1, 0), (f32, 1, 5, 64), (bf16, 8, 5, 192), (bf16, 32, 1, 100), (mixed, 4, 3, 17),
            (mixed, 1, 9, 0)]


def _unseen_models(seed: int, n: int) -> list[GPT2]:
    rng = np.random.default_rng(derived_seed(seed, "roofline models"))
    models = []
    for i in range(n):
        n_head = int(rng.choice([1, 2, 4]))
        n_embd = n_head * int(rng.integers(2, 9)) * 4
        n_inner = None if rng.random() < 0.5 else int(rng.integers(1, 6)) * n_embd // 2 + int(rng.integers(1, 9))
        cfg = GPT2Config(vocab_size=int(rng.integers(20, 300)), n_positions=int(rng.integers(16, 200)),
                         n_embd=n_embd, n_layer=int(rng.integers(1, 5)), n_head=n_head, n_inner=n_inner)
        dtype = [torch.float32, torch.bfloat16, torch.float16, torch.float64][i % 4]
        models.append(_build(cfg, dtype, mixed=bool(rng.random() < 0.4), untie=bool(rng.random() < 0.4)))
    return models


def _unseen_count_cases(seed: int) -> list[tuple[GPT2, int, int, int]]:
    rng = np.random.default_rng(derived_seed(seed, "roofline sizes"))
    return [(m, int(2 ** rng.integers(0, 9)), int(rng.integers(1, 12)), int(rng.integers(0, 3000)))
            for m in _unseen_models(seed, 8) for _ in range(2)]


# -- Task 1: bytes and FLOPs ------------------------------------------------------------------------

_BYTES = ("a pass reads every parameter once, at its own dtype's size (a tied matrix is one parameter), and every "
          "row's KV cache: each layer keeps a key and a value of n_embd numbers per cached token, in the dtype of "
          "that layer's attention weights.")
_FLOPS = ("every new token (B x T of them) costs 2 FLOPs per weight of each matrix it is multiplied by (the output "
          "layer too; lookups, biases and layer norms not), and in every layer attention to each position it sees: "
          "the S cached tokens and the new tokens up to itself.")


def _exact(g: str, where: str, inputs: list[str], name: str, out: object, want: int, hint: str) -> None:
    """A count is judged by its value (`as_int`: 12.0 is 12); anything that is not one number fails."""
    if as_int(out) is None and as_float(out) is None:
        raise failure(g, where, inputs + [f"{name} returned {out!r}"], f"{name} returns one number (a count).")
    if as_int(out) != want:
        raise failure(g, where, inputs + [f"your {name}: {out!r}"], f"{name} is wrong here: {hint}")


def _grade_counts(g: str, pass_bytes: Callable, pass_flops: Callable, cases: list) -> None:
    for n, (model, B, T, S) in enumerate(cases, 1):
        where, inputs = f"case {n} of {len(cases)}.", [f"model: {_describe(model)}", f"B = {B}, T = {T}, S = {S}"]
        want_b, want_f = reference_bytes(model, B, T, S), reference_flops(model, B, T, S)
        _exact(g, where, inputs, "pass_bytes", call_learner(g, where, inputs, pass_bytes, model, B, T, S), want_b,
               _BYTES)
        _exact(g, where, inputs, "pass_flops", call_learner(g, where, inputs, pass_flops, model, B, T, S), want_f,
               _FLOPS)
    passed(g, f"{len(cases)} cases, counted exactly")


@graded(1, "check_bytes_and_flops", FORBIDDEN, ALLOWED, learner_args=2)
def check_bytes_and_flops(pass_bytes: Callable, pass_flops: Callable) -> None:
    """Grade pass_bytes(model, B, T, S) and pass_flops(model, B, T, S) on the bundled target and a small model."""
    _grade_counts("check_bytes_and_flops", pass_bytes, pass_flops, _visible_count_cases())


@graded(1, "check_bytes_and_flops_unseen", FORBIDDEN, ALLOWED, learner_args=2)
def check_bytes_and_flops_unseen(pass_bytes: Callable, pass_flops: Callable, seed: int) -> None:
    """The hidden test of Task 1: models of other shapes and dtypes, drawn from `seed`."""
    _grade_counts("check_bytes_and_flops_unseen", pass_bytes, pass_flops, _unseen_count_cases(seed))


# -- Task 2: the largest memory-bound batch ---------------------------------------------------------


def _clear(b: float) -> bool:
    """A boundary far enough from an integer that float64 rounding cannot move its floor (or none at all)."""
    return math.isinf(b) or (b < 5000 and abs(b - round(b)) > _BOUNDARY_GAP * max(1.0, b))


def _visible_batch_cases() -> list[tuple[GPT2, str, dict, int, int]]:
    f32, bf16, mixed = _visible_models()
    picks = [(bf16, "H100", 4, 0), (bf16, "H100", 4, 128), (bf16, "A100", 1, 64), (f32, "laptop CPU", 4, 64),
             (mixed, "H100", 2, 256), (mixed, "laptop CPU", 8, 32), (bf16, "H100", 4, 1024)]
    return [(m, hn, MACHINES[hn], k, S) for m, hn, k, S in picks if _clear(boundary_batch(m, MACHINES[hn], k, S))]


def _unseen_batch_cases(seed: int) -> list[tuple[GPT2, str, dict, int, int]]:
    rng = np.random.default_rng(derived_seed(seed, "roofline machines"))
    cases, models = [], _unseen_models(seed, 6)
    while len(cases) < 18:
        model = models[len(cases) % len(models)]
        machine = {"peak_flops": float(10 ** rng.uniform(11, 15.3)), "bandwidth": float(10 ** rng.uniform(10, 12.7)),
                   "efficiency": float(rng.uniform(0.1, 1.0))}
        k, S = int(rng.integers(0, 9)), int(rng.choice([0, int(rng.integers(1, 64)), int(rng.integers(64, 4096))]))
        b = boundary_batch(model, machine, k, S)
        if _clear(b) and (math.isinf(b) or b >= 1 or rng.random() < 0.2):  # mostly a boundary inside 1..5000
            cases.append((model, f"machine {len(cases) + 1}", machine, k, S))
    return cases


def _grade_batch(g: str, memory_bound_batch: Callable, cases: list) -> None:
    kinds = set()
    for n, (model, hn, machine, k, S) in enumerate(cases, 1):
        where = f"case {n} of {len(cases)}."
        inputs = [f"model: {_describe(model)}", f"machine ({hn}) = {machine}", f"k = {k}, S = {S}"]
        want = reference_batch(model, machine, k, S)
        out = call_learner(g, where, inputs, memory_bound_batch, model, dict(machine), k, S)
        kinds.add(want is None)
        ok = out is None if want is None else as_int(out) == want  # a whole float is the same batch size
        if not ok:
            raise failure(g, where, inputs + [f"your memory_bound_batch: {out!r}"],
                          "the largest B whose pass over B x (k + 1) tokens spends no longer on arithmetic (at the "
                          "FLOP/s the machine reaches) than on reading its bytes, KV cache included; None if that "
                          "holds at every B, 0 if at none.")
    passed(g, f"{len(cases)} cases, the batch size exactly")


@graded(2, "check_memory_bound_batch", FORBIDDEN, ALLOWED)
def check_memory_bound_batch(memory_bound_batch: Callable) -> None:
    """Grade memory_bound_batch(model, machine, k, S) on the exercise's machines."""
    _grade_batch("check_memory_bound_batch", memory_bound_batch, _visible_batch_cases())


@graded(2, "check_memory_bound_batch_unseen", FORBIDDEN, ALLOWED)
def check_memory_bound_batch_unseen(memory_bound_batch: Callable, seed: int) -> None:
    """The hidden test of Task 2: made-up machines and models, drawn from `seed`."""
    _grade_batch("check_memory_bound_batch_unseen", memory_bound_batch, _unseen_batch_cases(seed))
