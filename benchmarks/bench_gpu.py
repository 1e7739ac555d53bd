"""The chapter's phenomenon on a GPU: a GPT-2 XL-shaped pass against the time to read its weights.

In one run, on one CUDA device:

1. the machine: memory bandwidth (a large device-to-device copy) and bf16 matmul peak (a large
   square matmul), and from them the a-priori roofline of the pass (`PassModel.roofline`,
   KV-cache reads and attention included);
2. a GPT-2 XL-shaped pass (48 x 1600, bf16, 512 cached tokens) over a grid of B x T, through
   the unchecked pass a decoding loop calls (`GPT2.step`), eager and replayed as a CUDA graph,
   each beside the weight-read time and the roofline's prediction, and a `PassModel` fitted to
   the graphed grid with its error;
3. v(k) = t(B, k + 1) / t(B, 1) against the batch, graphed, with both models' v beside it;
4. the bundled pair's greedy speculative decoding at B = 1 against graphed plain decoding, per k;
5. the same for GPT-2 XL / GPT-2 where their weights are on this machine (HF cache or --folder).

It ends with each goal of the chapter's GPU work and whether it is met. `--quick` fits in a few
minutes on an H100/H200-class GPU. Without CUDA it says so and exits 2; `--smoke` runs the same
code on tiny models on the CPU in seconds (its figures mean nothing; it checks the script runs).

    python benchmarks/bench_gpu.py [--quick] [--out results.json] [--folder DIR_WITH_gpt2-xl_AND_gpt2]
"""

from __future__ import annotations

import argparse
import inspect
import json
import statistics
import sys
import time
from dataclasses import dataclass
from datetime import datetime, timezone

import torch

from specref.decoding.chain import generate, speculative_generate
from specref.models.gpt2 import GPT2, GPT2Config
from specref.models.graphs import CapturedPasses
from specref.models.kvcache import KVCache, attended_slots
from specref.models.pair import heldout_prompts, load_pair
from specref.models.pretrained import TIMING_CONFIGS, random_gpt2, timing_pair
from specref.models.session import kept
from specref.perf.costmodel import PassModel
from specref.perf.costs import memory_bandwidth, peak_matmul_flops
from specref.perf.machine import machine_name
from specref.perf.roofline import weight_bytes
from specref.timing import sync


@dataclass(frozen=True)
class Plan:
    """What one run measures."""

    config: GPT2Config  # the model whose pass is timed
    context: int  # cached tokens before each timed pass
    batches: tuple[int, ...]
    tokens: tuple[int, ...]  # T = 1 and T = k + 1 for the k of v(k)
    repeats: int  # timed repeats per cell (the median is kept)
    inner: int  # passes back to back per repeat, between two syncs
    copy_bytes: int  # the bandwidth copy's size
    matmul_n: int  # the peak matmul's side
    pair_prompts: int
    pair_new_tokens: int
    pair_ks: tuple[int, ...]
    xl_prompts: int


QUICK = Plan(TIMING_CONFIGS["gpt2-xl"], 512, (1, 4, 16, 64, 128), (1, 2, 3, 5, 9), 5, 5, 2 << 30, 8192,
             4, 128, (2, 3, 4, 6, 8), 2)
FULL = Plan(TIMING_CONFIGS["gpt2-xl"], 512, (1, 2, 4, 8, 16, 32, 64, 128, 256), (1, 2, 3, 5, 9), 9, 8, 4 << 30,
            8192, 8, 128, (1, 2, 3, 4, 5, 6, 8), 4)
SMOKE = Plan(GPT2Config(vocab_size=512, n_positions=64, n_embd=64, n_layer=2, n_head=2), 32, (1, 2), (1, 2, 5),
             2, 2, 8 << 20, 128, 1, 8, (1, 2), 0)
GOAL_PASS, GOAL_PASS_STRETCH, GOAL_V4, GOAL_FIT, GOAL_PAIR = 3.0, 2.0, 1.15, 0.25, 2.0
XL_PROMPTS = ["def fibonacci(n):\n    \"\"\"Return the n-th Fibonacci number.\"\"\"\n    a, b = 0, 1\n",
              "import os\nimport sys\n\n\ndef main(argv):\n    parser = ",
              "class Stack:\n    def __init__(self):\n        self.items = []\n\n    def push(self, item):\n",
              "The speculative decoding algorithm drafts several tokens with a small model and"]


def _ms(seconds: float) -> str:
    return f"{seconds * 1e3:8.3f}"


@torch.no_grad()
def pass_grid(model: GPT2, plan: Plan, graphed: bool) -> dict[tuple[int, int], float]:
    """Median seconds of one pass over [B, T] new tokens after `plan.context` cached ones, per (B, T).

    Each repeat rolls the cache back to the context (untimed), then times `plan.inner` passes
    back to back between two syncs, as a decoding loop runs them (the context grows by a few
    tokens across them). The first repeat is the warm-up (and, graphed, the capture).
    """
    dev, V = model.device, model.config.vocab_size
    step = getattr(model, "step", model)  # the unchecked pass the decoding loop calls
    # Rolling back also resets the cache's host-side bound where the cache keeps one (the shapes follow it).
    bound = {"bound": plan.context} if "bound" in inspect.signature(KVCache.truncate).parameters else {}
    gen = torch.Generator().manual_seed(0)
    out: dict[tuple[int, int], float] = {}
    for B in plan.batches:
        max_len = plan.context + plan.inner * max(plan.tokens)
        cache = model.new_cache(B, max_len=max_len)
        prompt = torch.randint(0, V, (B, plan.context), generator=gen).to(dev)
        model(prompt, cache=cache, logits_to_keep=1)  # the prompt's pass is not timed: no graph for it
        cache.graphs = CapturedPasses() if graphed else None
        for T in plan.tokens:
            x = torch.randint(0, V, (B, T), generator=gen).to(dev)
            times = []
            for r in range(plan.repeats + 1):
                cache.truncate(plan.context, **bound)
                sync(dev)
                t0 = time.perf_counter()
                for _ in range(plan.inner):
                    step(x, cache)
                sync(dev)
                if r:  # repeat 0 is the warm-up
                    times.append((time.perf_counter() - t0) / plan.inner)
            out[B, T] = statistics.median(times)
        del cache
        if dev.type == "cuda":
            torch.cuda.empty_cache()
    return out


def roofline_of(model: GPT2, bandwidth: float, peak: float) -> PassModel:
    """The a-priori roofline: weights and KV reads at `bandwidth`, 2 FLOPs per weight and token at `peak`."""
    c = model.config
    bytes_per = model.dtype.itemsize
    return PassModel.roofline(n_params=model.num_parameters(), bandwidth=bandwidth, peak_flops=peak,
                              bytes_per_param=bytes_per, kv_bytes_per_token=2 * c.n_layer * c.n_embd * bytes_per,
                              attention_flops_per_token=4 * c.n_layer * c.n_embd)


def _timed(fn, dev: torch.device) -> float:
    sync(dev)
    t0 = time.perf_counter()
    fn()
    sync(dev)
    return time.perf_counter() - t0


@torch.no_grad()
def pair_speedups(target: GPT2, draft: GPT2, prompts: list[torch.Tensor], new_tokens: int,
                  ks: tuple[int, ...]) -> tuple[float, float, dict[int, tuple[float, float, bool]]]:
    """Greedy, B = 1: plain decoding's seconds (graphed, eager) and per k (speedup over graphed plain, alpha, same output).

    Eager plain decoding first (one untimed run, then timed). Then, graphed, one untimed run of every prompt with
    plain decoding and with each k, so that every shape a timed run meets is captured before the timing starts.
    """
    dev = target.device
    kept(target).enabled = False
    generate(target, prompts[0], new_tokens, temperature=0)  # the eager warm-up
    eager = sum(_timed(lambda p=p: generate(target, p, new_tokens, temperature=0), dev) for p in prompts)
    kept(target).enabled = kept(draft).enabled = True
    expected = [generate(target, p, new_tokens, temperature=0) for p in prompts]  # captures, and the reference
    for k in ks:
        for p in prompts:
            speculative_generate(target, draft, p, k=k, max_new_tokens=new_tokens, temperature=0)
    plain = sum(_timed(lambda p=p: generate(target, p, new_tokens, temperature=0), dev) for p in prompts)
    rows: dict[int, tuple[float, float, bool]] = {}
    for k in ks:
        spent, accepted, examined, same = 0.0, 0, 0, True
        for p, ref in zip(prompts, expected):
            sync(dev)
            t0 = time.perf_counter()
            out, stats = speculative_generate(target, draft, p, k=k, max_new_tokens=new_tokens, temperature=0)
            sync(dev)
            spent += time.perf_counter() - t0
            accepted, examined, same = accepted + stats.accepted, examined + stats.examined, same and torch.equal(out, ref)
        rows[k] = (plain / spent, accepted / max(examined, 1), same)
    return plain, eager, rows


def _verdict(ok: bool | None) -> str:
    return "not measured" if ok is None else ("met" if ok else "NOT met")


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--quick", action="store_true", help="a smaller grid and fewer repeats (a few minutes)")
    ap.add_argument("--smoke", action="store_true", help="tiny models on the CPU: checks the script runs")
    ap.add_argument("--folder", default=None, help="a folder with gpt2-xl/ and gpt2/ HF folders (default: HF cache)")
    ap.add_argument("--out", default=None, help="write the figures as JSON here")
    args = ap.parse_args(argv)

    if args.smoke:
        dev, plan, dtype = torch.device("cpu"), SMOKE, torch.float32
        torch.set_num_threads(1)
    elif not torch.cuda.is_available():
        print("bench_gpu.py needs a CUDA GPU (none is visible); --smoke runs its code on tiny CPU models.")
        return 2
    else:
        dev, plan, dtype = torch.device("cuda"), QUICK if args.quick else FULL, torch.bfloat16
    record: dict = {"machine": machine_name(dev), "torch": torch.__version__, "device": str(dev),
                    "date": datetime.now(timezone.utc).strftime("%Y-%m-%d"), "mode": "smoke" if args.smoke else
                    ("quick" if args.quick else "full")}
    print(f"machine: {record['machine']}, torch {torch.__version__}, device {dev}, mode {record['mode']}")

    # 1. The machine.
    bandwidth = memory_bandwidth(dev, plan.copy_bytes)
    peak = peak_matmul_flops(dev, plan.matmul_n, dtype)
    print(f"measured: bandwidth {bandwidth / 1e12:.2f} TB/s (copy of {plan.copy_bytes >> 20} MiB), "
          f"{str(dtype).removeprefix('torch.')} matmul {peak / 1e12:.1f} TFLOP/s ({plan.matmul_n}^3)")
    record.update(bandwidth=bandwidth, peak_flops=peak)

    # 2. The pass grid.
    model = random_gpt2(plan.config, dev, dtype)
    c = model.config
    read = weight_bytes(model) / bandwidth
    roof = roofline_of(model, bandwidth, peak)
    print(f"\npass of a {c.n_layer} x {c.n_embd} model ({model.num_parameters() / 1e6:,.1f} M parameters, "
          f"{str(dtype).removeprefix('torch.')}, random weights: a pass costs the same whatever they are), "
          f"{plan.context} cached tokens; weight read at the measured bandwidth {read * 1e3:.3f} ms")
    kv_row = 2 * c.n_layer * c.n_embd * model.dtype.itemsize * plan.context
    print(f"KV cache per row at {plan.context} tokens: {kv_row / 2**20:.0f} MiB (at B = {max(plan.batches)}: "
          f"{kv_row * max(plan.batches) / 2**30:.1f} GiB against {weight_bytes(model) / 2**30:.2f} GiB of weights)")
    # specref's pass attends over the cache's capacity (`KVCache.capacity`: a power of two, at most max_len), not
    # the exact context: the models below count the K/V slots the timed passes read.
    max_len = plan.context + plan.inner * max(plan.tokens)  # pass_grid's cache
    slots = attended_slots(max_len, max_len)  # the largest pass's capacity; the bucket is cut at max_len
    print(f"the timed passes attend over {slots} cache slots (the cache's capacity) after {plan.context} cached tokens")
    eager = pass_grid(model, plan, graphed=False)
    graphed = pass_grid(model, plan, graphed=True) if dev.type == "cuda" else dict(eager)
    if dev.type != "cuda":
        print("(no CUDA: nothing is captured, the 'graphed' column repeats the eager one)")
    fit = PassModel.fit([(B, T, slots, t) for (B, T), t in graphed.items()], form="auto")
    roof_err = max(abs(roof(B, T, slots) / t - 1) for (B, T), t in graphed.items())
    print("   B   T  eager ms graphed ms  graphed/read  roofline ms  fitted ms")
    for (B, T), t in graphed.items():
        print(f"{B:4d} {T:3d}  {_ms(eager[B, T])}  {_ms(t)}  {t / read:11.2f}  {_ms(roof(B, T, slots))}"
              f"    {_ms(fit(B, T, slots))}")
    print(f"fitted PassModel ({fit.form}): largest error {fit.error.max:.1%}, median {fit.error.median:.1%}; "
          f"a-priori roofline: largest error {roof_err:.1%}")
    record["grid"] = [{"batch_size": B, "n_tokens": T, "context": plan.context, "eager_s": eager[B, T],
                       "graphed_s": t, "roofline_s": float(roof(B, T, slots)),
                       "fitted_s": float(fit(B, T, slots))} for (B, T), t in graphed.items()]
    record.update(weight_read_s=read, fit=fit.as_dict(), roofline_max_error=roof_err)

    # 3. v(k) against the batch.
    ks = [T - 1 for T in plan.tokens if T > 1]
    print("\nv(k) = t(B, k + 1) / t(B, 1), graphed (roofline's / fitted model's in brackets)")
    print("   B  " + "  ".join(f"{'v(' + str(k) + ')':>18}" for k in ks))
    record["v"] = {}
    for B in plan.batches:
        cells = []
        for k in ks:
            v = graphed[B, k + 1] / graphed[B, 1]
            v_roof = roof(B, k + 1, slots) / roof(B, 1, slots)
            v_fit = fit(B, k + 1, slots) / fit(B, 1, slots)
            cells.append(f"{v:5.2f} ({v_roof:4.2f}/{v_fit:4.2f})")
            record["v"][f"{B},{k}"] = v
        print(f"{B:4d}  " + "  ".join(f"{cell:>18}" for cell in cells))
    ridge = roof.ridge_tokens(slots)
    print(f"the roofline's ridge at {slots} attended slots: {ridge:.0f} tokens per pass (B x T); KV reads "
          f"grow with B and move it, since they add memory time that more tokens per row do not")
    del model
    if dev.type == "cuda":
        torch.cuda.empty_cache()

    # 4. The bundled pair.
    target, draft, _ = load_pair(device=dev, dtype=torch.float32)
    prompts = [torch.tensor([p], device=dev) for p in heldout_prompts(plan.pair_prompts, 64)]
    plain, plain_eager, rows = pair_speedups(target, draft, prompts, plan.pair_new_tokens, plan.pair_ks)
    n = plan.pair_prompts * plan.pair_new_tokens
    print(f"\nbundled pair (float32, greedy, B = 1, {plan.pair_prompts} held-out prompts x {plan.pair_new_tokens} "
          f"tokens): plain decoding {plain / n * 1e3:.3f} ms per token graphed, {plain_eager / n * 1e3:.3f} eager")
    print(" k  alpha  speedup over graphed plain  output")
    for k, (s, a, same) in rows.items():
        print(f"{k:2d}  {a:5.3f}  {s:26.2f}  {'identical' if same else 'DIFFERS'}")
    best_k = max(rows, key=lambda k: rows[k][0])
    record["pair"] = {"plain_s": plain, "plain_eager_s": plain_eager,
                      "runs": {k: {"speedup": s, "alpha": a, "identical": same} for k, (s, a, same) in rows.items()}}
    del target, draft

    # 5. GPT-2 XL / GPT-2, where their weights are here.
    xl_best = None
    if plan.xl_prompts:
        pair = timing_pair(dev, torch.bfloat16, args.folder)
        print(f"\nGPT-2 XL / GPT-2: {pair.source}")
        if pair.tokenizer is not None:
            xl_prompts = [torch.tensor([pair.tokenizer.encode(t)], device=dev) for t in XL_PROMPTS[:plan.xl_prompts]]
            _, _, xl_rows = pair_speedups(pair.target, pair.draft, xl_prompts, 64, (2, 4, 6))
            for k, (s, a, same) in xl_rows.items():
                print(f"k = {k}: speedup {s:.2f}x over graphed plain, alpha {a:.3f} (bf16; output "
                      f"{'identical' if same else 'differs: bf16 near-ties'})")
            xl_best = max(s for s, _, _ in xl_rows.values())
            record["xl_pair"] = {k: {"speedup": s, "alpha": a} for k, (s, a, _) in xl_rows.items()}
        else:
            print("not measured: speculative speedup needs the trained weights (random drafts accept nothing)")
        del pair

    # Goals.
    t11 = graphed[1, 1] / read
    v4 = graphed[1, 5] / graphed[1, 1] if 5 in plan.tokens else None
    on_gpu = dev.type == "cuda"
    print("\ngoals (ratios in this run):")
    print(f"[{_verdict(t11 <= GOAL_PASS)}] graphed pass at B = 1, T = 1 at most {GOAL_PASS:g}x the weight-read "
          f"time: {t11:.2f}x (stretch {GOAL_PASS_STRETCH:g}x: {_verdict(t11 <= GOAL_PASS_STRETCH)})")
    print(f"[{_verdict(None if v4 is None else v4 <= GOAL_V4)}] v(4) at B = 1 at most {GOAL_V4:g}: "
          f"{'-' if v4 is None else f'{v4:.3f}'}")
    print(f"[{_verdict(fit.error.max <= GOAL_FIT)}] PassModel fitted to the grid predicts every point within "
          f"{GOAL_FIT:.0%}: largest error {fit.error.max:.1%} (a-priori roofline: {roof_err:.1%})")
    best = rows[best_k][0]
    print(f"[{_verdict(best >= GOAL_PAIR)}] bundled pair, greedy, B = 1, best k at least {GOAL_PAIR:g}x graphed "
          f"plain decoding: {best:.2f}x at k = {best_k}")
    print("[not measured] CPU: speculative at least 2x HF's assisted generation: benchmarks/bench_hf.py")
    print("[not measured] test_cuda, the timing notebooks and this --quick in one 15-minute script: "
          "benchmarks/gpu_check.sh")
    if xl_best is not None:
        print(f"(GPT-2 XL / GPT-2, no goal: best speedup {xl_best:.2f}x)")
    if not on_gpu:
        print("(smoke run on the CPU: these verdicts say nothing about a GPU)")
    record["goals"] = {"pass_over_read": t11, "v4_b1": v4, "fit_max_error": fit.error.max, "pair_best": best,
                       "pair_best_k": best_k}
    if args.out:
        with open(args.out, "w") as f:
            json.dump(record, f, indent=1, default=str)
    return 0


if __name__ == "__main__":
    sys.exit(main())
