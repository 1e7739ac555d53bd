"""The chapter's speedup on a CPU: the grown target (weights that stream from memory) with the bundled draft.

Four sections, each in one run on this machine (ratios hold within the run; to compare days or hosts,
rerun both sides):

1. kernels: the grown target's linear layers (12 blocks, its LM head) over T = 1..16 rows, through
   each kernel path a standard install can run: PyTorch's default (``addmm`` on GPT-2's [in, out]
   weights), ``F.linear`` on [out, in] weights, the transposed product ``W^T x^T``, oneDNN with
   prepacked weights where this torch has it, and the compiled few-token kernel
   (`specref.models.kernels`). ``--threads 2`` adds PyTorch's default with two threads;
   ``--compile`` adds torch.compile (Inductor) on one block, with its compile time.
2. pass costs: v(k) and c by `measure_pass_costs` (the course's one measurement) for the grown
   target with its kernel, the grown target on PyTorch's kernels, and the bundled target.
3. decoding: plain against speculative decoding of held-out prompts on the grown target, k = 1..6,
   greedy and at temperature 1, repeats interleaved, the median speedup and its range; EAGLE at k = 2..6.
4. the batch crossover: pass times over B x T fitted by the cost model (`PassModel`), the batch at
   which the model says speculation stops paying, against the batch at which live decoding stops
   paying (B = 1, 2, 3, 4, 6, 8).

Every figure is on this process's CPU clock (one torch thread), but the two-thread and compile rows (wall clock).

Goals (float32, one thread): live greedy best-k speedup >= 2.0x (stretch 2.5x); sampled (temperature 1)
>= 1.6x; EAGLE >= 2.5x; v(4) <= 1.5; the measured crossover batch within one grid step of the model's.

    .venv/bin/python benchmarks/bench_cpu.py [--prompts 4] [--new-tokens 96] [--repeats 3] [--quick]
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import sys
import time
from collections.abc import Callable

import torch
import torch.nn.functional as F

from specref import generate, load_draft, speculative_generate
from specref.models.gpt2 import GPT2
from specref.models.grow import widen
from specref.models.kernels import SmallLinear, kernel_path
from specref.models.pair import GROWTH, heldout_prompts, load_grown_pair
from specref.perf.costmodel import CostModel, PassModel
from specref.perf.live import predicted_speedup, time_decoding, time_passes
from specref.perf.machine import machine_name
from specref.perf.verify_cost import measure_pass_costs

GRID = (1, 2, 3, 4, 6, 8)  # batch sizes of the crossover section


def verdict(ok: bool) -> str:
    return "met" if ok else "NOT met"


def cpu_flags() -> str:
    try:
        flags = next(line for line in open("/proc/cpuinfo") if line.startswith("flags")).split()
    except (OSError, StopIteration):
        return "?"
    return " ".join(f for f in ("avx2", "fma", "avx512f", "avx512_bf16", "amx_tile") if f in flags)


# Every figure is timed on this process's CPU clock (one torch thread: the time it ran, its memory stalls included,
# not the time it waited for a core on a shared machine), but the two-thread row, which must be wall-clock time.
def median_time(fn: Callable[[], object], repeats: int, clock: Callable[[], float] = time.process_time) -> float:
    fn()
    times = []
    for _ in range(repeats):
        t0 = clock()
        fn()
        times.append(clock() - t0)
    return statistics.median(times)


# -- 1. kernels ---------------------------------------------------------------------------------------
def linear_layers(model: GPT2) -> list[tuple[torch.Tensor, torch.Tensor]]:
    """(weight [in, out], bias [out]) of every linear layer a pass runs, the LM head last."""
    out = []
    for block in model.transformer.h:
        for conv in (block.attn.c_attn, block.attn.c_proj, block.mlp.c_fc, block.mlp.c_proj):
            out.append((conv.weight.detach(), conv.bias.detach()))
    head = model.lm_head.weight.detach()
    out.append((head.t(), torch.zeros(head.shape[0])))
    return out


def kernel_paths(layers: list[tuple[torch.Tensor, torch.Tensor]]) -> dict[str, Callable[[torch.Tensor], None]]:
    """name -> a function running every layer on rows x (each layer reads the first `in` columns of x)."""
    conv = [(w.contiguous(), b) for w, b in layers]
    out_in = [(w.t().contiguous(), b) for w, b in layers]

    paths = {
        "torch addmm, W [in, out] (default)": lambda x: [torch.addmm(b, x[:, : w.shape[0]], w) for w, b in conv],
        "torch F.linear, W [out, in]": lambda x: [F.linear(x[:, : w.shape[1]], w, b) for w, b in out_in],
        "torch W^T x^T": lambda x: [torch.mm(w, x[:, : w.shape[1]].t()) for w, b in out_in],
    }
    try:
        packed = [(torch.ops.mkldnn._reorder_linear_weight(w, None), w.shape, b) for w, b in out_in]  # [out, in]
        paths["oneDNN, prepacked W"] = lambda x: [
            torch.ops.mkldnn._linear_pointwise(x[:, : s[1]], pw, b, "none", [None], "") for pw, s, b in packed]
        paths["oneDNN, prepacked W"](torch.zeros(1, 4 * layers[0][0].shape[0]))
    except (AttributeError, RuntimeError, TypeError) as e:
        print(f"  (oneDNN prepacked weights: not available in this torch: {type(e).__name__})")
        paths.pop("oneDNN, prepacked W", None)
    if kernel_path().name == "compiled":
        small = [(SmallLinear(w, b), w.shape[0]) for w, b in conv]
        paths["compiled few-token kernel"] = lambda x: [lin(x[:, :k].contiguous()) for lin, k in small]
    return paths


def section_kernels(grown: GPT2, repeats: int, threads2: bool, compile_: bool) -> dict:
    print("\n== 1. kernel paths: the grown target's linear layers over T rows ==")
    layers = linear_layers(grown)
    width = max(w.shape[0] for w, _ in layers)
    mb = sum(w.numel() for w, _ in layers) * 4 / 2**20
    Ts = (1, 2, 3, 4, 5, 6, 8, 16)
    xs = {T: torch.randn(T, width, generator=torch.Generator().manual_seed(T)) for T in Ts}
    print(f"  {len(layers)} layers, {mb:.0f} MiB of float32 weights; ms at T = 1, then time(T) / time(1)")
    print(f"  {'path':38s} {'T=1 ms':>7s} {'GB/s':>5s}  " + " ".join(f"{'T=' + str(T):>5s}" for T in Ts[1:]))
    results = {}
    paths = kernel_paths(layers)
    for name, fn in paths.items():
        t = {T: median_time(lambda T=T, fn=fn: fn(xs[T]), repeats) for T in Ts}
        results[name] = {T: t[T] for T in Ts}
        print(f"  {name:38s} {t[1] * 1e3:7.2f} {mb / 1024 / t[1]:5.1f}  " +
              " ".join(f"{t[T] / t[1]:5.2f}" for T in Ts[1:]))
    if threads2:
        torch.set_num_threads(2)
        fn = paths["torch addmm, W [in, out] (default)"]
        t = {T: median_time(lambda T=T: fn(xs[T]), repeats, time.perf_counter) for T in Ts}
        torch.set_num_threads(1)
        results["torch addmm, 2 threads"] = t
        print(f"  {'torch addmm, 2 threads':38s} {t[1] * 1e3:7.2f} {mb / 1024 / t[1]:5.1f}  " +
              " ".join(f"{t[T] / t[1]:5.2f}" for T in Ts[1:]))
    if compile_:
        section_compile(grown, xs)
    return results


def section_compile(grown: GPT2, xs: dict[int, torch.Tensor]) -> None:
    """torch.compile (Inductor) on one block's four linear layers: compile time and ratios."""
    block = grown.transformer.h[0]
    convs = [block.attn.c_attn, block.attn.c_proj, block.mlp.c_fc, block.mlp.c_proj]

    def layers(x):
        return [torch.addmm(c.bias, x[:, : c.weight.shape[0]], c.weight) for c in convs]

    t0 = time.perf_counter()
    try:
        fn = torch.compile(layers, dynamic=False)
        for T in (1, 2, 5):
            fn(xs[T])
    except Exception as e:  # noqa: BLE001 (any compiler failure is a finding to print)
        print(f"  torch.compile: failed ({type(e).__name__}: {str(e)[:100]})")
        return
    built = time.perf_counter() - t0
    t = {T: median_time(lambda T=T: fn(xs[T]), 7, time.perf_counter) for T in (1, 2, 5)}
    print(f"  torch.compile, one block: compiled in {built:.0f} s for 3 shapes; T=2 {t[2] / t[1]:.2f}, "
          f"T=5 {t[5] / t[1]:.2f}")


# -- 2. pass costs --------------------------------------------------------------------------------------
def section_costs(grown: GPT2, draft: GPT2, repeats: int) -> dict:
    print("\n== 2. v(k) and c: isolated passes (measure_pass_costs) ==")
    ks = (1, 2, 3, 4, 5, 6, 7)
    plain_grown = widen(grown.base, grown.factor)  # the same model on PyTorch's kernels
    out = {}
    for name, model in (("grown target, its kernel", grown), ("grown target, PyTorch's kernels", plain_grown),
                        ("bundled target", grown.base)):
        costs = measure_pass_costs(model, ks, draft=draft, repeats=repeats)
        print(f"  {name}: one-token pass {costs.one_pass * 1e3:.2f} ms, c = {costs.c:.3f}; v(k) for k = 1..7: " +
              " ".join(f"{costs.v(k):.2f}" for k in ks))
        out[name] = {"one_pass_ms": costs.one_pass * 1e3, "c": costs.c, "v": {k: costs.v(k) for k in ks},
                     "v4_range": costs.v_range(4)}
        print(f"    measured as: {costs.conditions()}")
    v4 = out["grown target, its kernel"]["v"][4]
    print(f"  goal v(4) <= 1.5 (grown target, batch 1): {v4:.2f} [{out['grown target, its kernel']['v4_range'][0]:.2f}, "
          f"{out['grown target, its kernel']['v4_range'][1]:.2f}], {verdict(v4 <= 1.5)}")
    out["goal_v4"] = v4 <= 1.5
    return out


# -- 3. decoding ----------------------------------------------------------------------------------------
def speedups(target: GPT2, drafts: dict, prompts: list[torch.Tensor], ks: tuple[int, ...], n: int,
             temperature: float, repeats: int) -> dict:
    """(draft name, k) -> (per-repeat speedups, tokens per step): each repeat times plain decoding once, then every
    draft at every k, so a change in the machine's load falls on the plain run and the speculative runs it divides."""
    def gen(i):
        return None if temperature == 0 else torch.Generator().manual_seed(i)

    def plain():
        for i, x in enumerate(prompts):
            generate(target, x, n, temperature=temperature, generator=gen(i))

    def spec(draft, k):
        steps = emitted = 0
        for i, x in enumerate(prompts):
            _, s = speculative_generate(target, draft, x, k=k, max_new_tokens=n, temperature=temperature,
                                        generator=gen(i))
            steps, emitted = steps + s.steps, emitted + s.emitted
        return emitted / max(steps, 1)

    out: dict = {(name, k): ([], 0.0) for name in drafts for k in ks}
    for _ in range(repeats):
        t0 = time.process_time()
        plain()
        t_plain = time.process_time() - t0
        for name, draft in drafts.items():
            for k in ks:
                t0 = time.process_time()
                tau = spec(draft, k)
                out[(name, k)][0].append(t_plain / (time.process_time() - t0))
                out[(name, k)] = (out[(name, k)][0], tau)
    return out


def section_decoding(grown: GPT2, draft: GPT2, prompts: list[torch.Tensor], n: int, repeats: int,
                     ks: tuple[int, ...] = (1, 2, 3, 4, 5, 6)) -> dict:
    print(f"\n== 3. live decoding on the grown target: {len(prompts)} prompts x {n} new tokens, "
          f"{repeats} interleaved repeats (each: plain, then every draft and k), CPU clock ==")
    for x in prompts[:1]:  # warm-up
        generate(grown, x, 8, temperature=0.0)
        speculative_generate(grown, draft, x, k=4, max_new_tokens=8, temperature=0.0)
    eagles = {name: load_draft(name, grown) for name in ("eagle", "eagle3")}
    runs = {"greedy": speedups(grown, {"model": draft, **eagles}, prompts, ks, n, 0.0, repeats),
            "temperature 1": speedups(grown, {"model": draft}, prompts, ks, n, 1.0, repeats)}
    out: dict = {}
    for label, table in runs.items():
        for (name, k), (s, tau) in table.items():
            row = (statistics.median(s), min(s), max(s), tau)
            key = label if name == "model" else name
            out.setdefault(key, {})[k] = row
            print(f"  {name:6s} {label:13s} k={k}: tokens/step {tau:.2f}, speedup {row[0]:.2f}x "
                  f"[{row[1]:.2f}, {row[2]:.2f}]")
    best = {name: max(rows.items(), key=lambda kv: kv[1][0]) for name, rows in out.items()}
    best["EAGLE (best of eagle, eagle3)"] = max(best["eagle"], best["eagle3"], key=lambda kv: kv[1][0])
    for name, goal, stretch in (("greedy", 2.0, 2.5), ("temperature 1", 1.6, None),
                                ("EAGLE (best of eagle, eagle3)", 2.5, None)):
        k, (med, lo, hi, _) = best[name]
        extra = f"; stretch {stretch}x {verdict(med >= stretch)}" if stretch else ""
        print(f"  goal {name} best-k speedup >= {goal}x: {med:.2f}x at k = {k} [{lo:.2f}, {hi:.2f}], "
              f"{verdict(med >= goal)}{extra}")
    out["best"] = {name: (k, v[0]) for name, (k, v) in best.items()}
    return out


# -- 4. the batch crossover -------------------------------------------------------------------------------
def section_crossover(grown: GPT2, draft: GPT2, n: int, repeats: int, k: int,
                      grid: tuple[int, ...] = GRID) -> dict:
    """Pass times over the grid fitted by `PassModel`; each batch's live speedup against the model's price of the
    passes that run counted (`live.predicted_speedup`: counts from the run, times only from the fit)."""
    print(f"\n== 4. the batch crossover on this CPU: k = {k}, B = {', '.join(map(str, grid))}, CPU clock ==")
    context = 64
    rows = time_passes(grown, grid, (1, k + 1), context=context, repeats=repeats)
    draft_rows = time_passes(draft, grid, (1, 2), context=context, repeats=repeats)
    model = CostModel(target=PassModel.fit(rows), draft=PassModel.fit(draft_rows), context=context)
    print(f"  fitted pass model: {model.target.form} form, median relative error {model.target.error.median:.0%}")
    texts = heldout_prompts(max(grid), context)
    predicted, measured = {}, {}
    for B in grid:
        run = time_decoding(grown, draft, [torch.tensor(texts[:B])], k, n, repeats=repeats)
        predicted[B], measured[B] = predicted_speedup(model, run, context), run.speedup
        print(f"  B = {B}: pass over {B * (k + 1):2d} rows, tokens/step {run.tokens_per_step:.2f}; model "
              f"{predicted[B]:.2f}x, measured {measured[B]:.2f}x [{min(run.speedups):.2f}, {max(run.speedups):.2f}]")

    def first_loss(values: dict[int, float]) -> int | None:
        return next((B for B in grid if values[B] < 1), None)

    pm, mm = first_loss(predicted), first_loss(measured)
    steps = None if pm is None or mm is None else abs(grid.index(pm) - grid.index(mm))
    ok = (pm is None and mm is None) or (steps is not None and steps <= 1)
    print(f"  first batch that loses: model {pm}, measured {mm} (grid {list(grid)}); goal within one grid step: "
          f"{verdict(ok)}")
    return {"predicted": predicted, "measured": measured, "model_first_loss": pm, "measured_first_loss": mm,
            "goal": ok}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--prompts", type=int, default=4)
    ap.add_argument("--new-tokens", type=int, default=96)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--two-threads", action="store_true", help="also time PyTorch's default kernel on 2 threads")
    ap.add_argument("--compile", action="store_true", help="also time torch.compile on one block (minutes)")
    ap.add_argument("--quick", action="store_true", help="a smoke run: 1 prompt, 16 tokens, 1 repeat")
    ap.add_argument("--sections", default="1234", help="which sections to run, e.g. 23")
    ap.add_argument("--json", help="write the figures to this file")
    args = ap.parse_args()
    ks, grid = (1, 2, 3, 4, 5, 6), GRID
    if args.quick:
        args.prompts, args.new_tokens, args.repeats = 1, 8, 1
        ks, grid = (2,), (1, 3)
    torch.set_num_threads(args.threads)
    load = os.getloadavg()[0]
    t0 = time.perf_counter()
    grown, draft, _, path = load_grown_pair(GROWTH)
    built = time.perf_counter() - t0
    print(f"machine: {machine_name()} ({cpu_flags()}), {os.cpu_count()} CPUs, torch {torch.__version__}, "
          f"python {platform.python_version()}, {torch.get_num_threads()} torch thread(s), float32; "
          f"load average {load:.2f} at the start")
    print(f"grown target: {GROWTH} x wider, {sum(p.numel() for p in grown.parameters()) / 1e6:.1f} M parameters, "
          f"built in {built:.1f} s; kernel path: {path.name} ({path.reason})")
    prompts = [torch.tensor([p]) for p in heldout_prompts(args.prompts, 64)]
    result: dict = {"machine": machine_name(), "flags": cpu_flags(), "torch": torch.__version__,
                    "threads": args.threads, "kernel": path.name, "load_start": load}
    with torch.no_grad():
        if "1" in args.sections:
            result["kernels"] = section_kernels(grown, 1 if args.quick else 9, args.two_threads, args.compile)
        if "2" in args.sections:
            result["costs"] = section_costs(grown, draft, 1 if args.quick else 7)
        if "3" in args.sections:
            result["decoding"] = section_decoding(grown, draft, prompts, args.new_tokens, args.repeats, ks)
        if "4" in args.sections:
            k = result["decoding"]["best"]["greedy"][0] if "decoding" in result else 4
            result["crossover"] = section_crossover(grown, draft, min(args.new_tokens, 48), args.repeats, k, grid)
    end = os.getloadavg()[0]
    print(f"\nload average {end:.2f} at the end" + ("  (a busy machine: rerun on a quiet one)" if end > 1.5 else ""))
    result["load_end"] = end
    if args.json:
        with open(args.json, "w") as f:
            json.dump(result, f, indent=1, default=str)


if __name__ == "__main__":
    sys.exit(main())
