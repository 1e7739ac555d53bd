"""Speculation under load: pass times over batch x tokens, throughput per (batch, k), a cost model and its k policy.

1. One target pass with a warm KV cache, for every batch B and new tokens per row T,
   at two context lengths: median and spread ((max - min) / median) of the repeats.
   The same for one draft pass (T = 1, 2: a draft step feeds one or two tokens).
2. Plain and speculative decoding of B held-out prompts at once, for k in 0, 1, 2, 4, 8,
   greedy and at temperature 1: tokens per second over the whole batch (wall time of the
   whole call, its cache allocation and prompt pass included), the speedup per (B, k)
   and the crossover B*(k), the smallest B where the speedup drops below 1.
3. The cost model. The target's `PassModel` is fitted to the grid (both forms; the better
   is kept, both errors printed). Decoding also spends time outside the target's passes:
   the draft's steps cost more than its isolated passes (its sampling, a first wider
   pass, caches evicted by the other model), the acceptance rule and bookkeeping grow
   with B x (k + 1), and a verification pass inside decoding is slower than alone (the
   draft evicts the target's weights; rows attend over the longest row). Those three
   come from the speculative runs' own SpecStats (never from their total times or from
   the plain runs), so the `CostModel` per temperature is: the grid's target passes
   (x verify_factor when verifying) + the in-loop draft step + the rule. A batch waits for
   its slowest row, so a run takes `batch_steps` steps, more than new_tokens / E.
   Printed: the predicted / measured speedup per run (also with grid passes only, and
   with decoding's own step counts), and the k that `choose_k` picks at each B with the
   throughput that k measured.

Goals (printed as met / NOT met): predicted / measured speedup within 0.85-1.15 over the
grid; the policy's throughput >= the best fixed k's at every B within noise (the larger
spread of the two runs' repeats) and >= 0.95x plain at every B.

One torch thread by default: with torch's default (one per core) a shared 2-core machine
spends most of a pass in OpenMP barriers (measured at B = 1: 12 ms per pass with one thread,
330 ms with two, under load). Results go to a JSON file a notebook can read
(`CostModel.from_dict(results["cost_models"]["greedy"])` rebuilds the fit).

    python benchmarks/bench_batch.py [--device cuda] [--quick] [--out FILE] [--repeats 7] [--run-repeats 3]
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import time
from dataclasses import replace
from pathlib import Path

import torch

from specref import generate, load_pair, speculative_generate
from specref.models.pair import heldout_prompts, heldout_texts
from specref.perf.costmodel import CostModel, PassModel, batch_steps, choose_k, crossover_batch
from specref.perf.costs import pass_times

ROOT = Path(__file__).resolve().parents[1]
FULL = dict(batch_sizes=[1, 2, 4, 8, 16, 32, 64, 128, 256], tokens=list(range(1, 10)), contexts=[64, 192],
            ks=[0, 1, 2, 4, 8], prompt_tokens=32, new_tokens=64)
QUICK = dict(batch_sizes=[1, 2, 4], tokens=[1, 2], contexts=[8, 16], ks=[0, 1, 2], prompt_tokens=8, new_tokens=6)
NOISE_FLOOR = 0.02  # "within noise" is never stricter than 2 %
STAT_SUMS = ("accepted", "examined", "emitted", "steps", "target_passes", "draft_passes", "time_target", "time_draft",
             "time_verify", "time_overhead")  # SpecStats fields summed over a run's repeats


def spread(times: list[float]) -> float:
    """(max - min) / median of the repeats."""
    return (max(times) - min(times)) / statistics.median(times)


def cache_len(model, context: int, run_len: int, slack: int) -> int:
    """The cache decoding allocates for a run that reaches `context`: its own length + k, else the window."""
    return min(model.config.n_positions, max(run_len, context + slack))


def time_passes(model, name: str, batch_sizes, tokens, contexts, repeats: int, clock: str, run_len: int,
                slack: int) -> list[dict]:
    rows = []
    for S in contexts:
        max_len = cache_len(model, S, run_len, slack)
        for B in batch_sizes:
            for T, ts in pass_times(model, list(tokens), S, B, repeats=repeats, clock=clock, warmup=1,
                                    max_len=max_len).items():
                rows.append(dict(model=name, batch_size=B, n_tokens=T, context=S, median_s=statistics.median(ts),
                                 min_s=min(ts), max_s=max(ts), spread=spread(ts), times_s=ts))
    return rows


def print_passes(rows: list[dict], tokens) -> None:
    print("   S     B  " + "".join(f"  T={T:<6d}" for T in tokens) + "  spread (max)")
    for S in sorted({r["context"] for r in rows}):
        for B in sorted({r["batch_size"] for r in rows}):
            sel = [r for r in rows if r["context"] == S and r["batch_size"] == B]
            print(f"{S:4d}  {B:4d}  " + "".join(f"{r['median_s'] * 1e3:8.2f}  " for r in sel)
                  + f"  {max(r['spread'] for r in sel):5.0%}")


def prompts_for(B: int, P: int, device) -> torch.Tensor:
    """B rows of held-out prompts of P tokens, cycling through the bundled ones."""
    n = len(heldout_texts())
    ps = heldout_prompts(n, P)
    return torch.tensor([ps[i % n] for i in range(B)], device=device)


def decode(target, draft, ids, k: int, n: int, temperature: float, seed: int):
    """One run: (wall s, cpu s, stats or None). k = 0 is plain decoding."""
    g = torch.Generator(device=ids.device).manual_seed(seed)
    c0, t0 = time.process_time(), time.perf_counter()
    if k == 0:
        generate(target, ids, n, temperature=temperature, generator=g)
        stats = None
    else:
        _, stats = speculative_generate(target, draft, ids, k=k, max_new_tokens=n, temperature=temperature,
                                        generator=g)
    if ids.is_cuda:
        torch.cuda.synchronize(ids.device)
    return time.perf_counter() - t0, time.process_time() - c0, stats


def time_runs(target, draft, batch_sizes, ks, P: int, n: int, repeats: int, clock: str) -> list[dict]:
    out = []
    for temperature in (0.0, 1.0):
        for B in batch_sizes:
            ids = prompts_for(B, P, target.device)
            decode(target, draft, ids, 0, 2, temperature, 0)  # warm-up at this shape
            acc = {k: dict(wall=[], cpu=[], **dict.fromkeys(STAT_SUMS, 0)) for k in ks}
            for rep in range(repeats):  # interleaved, so drift over time hits every k alike
                for k in ks:
                    wall, cpu, s = decode(target, draft, ids, k, n, temperature, seed=rep)
                    a = acc[k]
                    a["wall"].append(wall)
                    a["cpu"].append(cpu)
                    if s is not None:
                        for f in STAT_SUMS:
                            a[f] += getattr(s, f)
            for k in ks:
                a = acc[k]
                ts = a["wall"] if clock == "wall" else a["cpu"]
                t = statistics.median(ts)
                out.append(dict(temperature=temperature, batch_size=B, k=k, run_repeats=repeats, seconds=t,
                                spread=spread(ts),
                                times_s=ts, wall_s=a["wall"], cpu_s=a["cpu"], tokens_per_s=B * n / t,
                                alpha=a["accepted"] / a["examined"] if a["examined"] else None,
                                tokens_per_step=a["emitted"] / a["steps"] if a["steps"] else 1.0,
                                **{f: a[f] for f in STAT_SUMS}))
    return out


def in_loop_model(grid_model: CostModel, runs: list[dict], P: int) -> CostModel:
    """The grid's target passes, with the draft step, the rule and the verification as decoding measured them.

    From the speculative runs' SpecStats (never from their total times or the plain runs):
    draft seconds per draft pass (its sampling and first, wider pass included); the
    acceptance rule plus bookkeeping per step, as a function of B x (k + 1); and
    verify_factor, the median ratio of a verification pass in decoding to the grid's.
    """
    spec = [r for r in runs if r["k"] > 0]
    S = grid_model.context
    steps = [max(r["target_passes"] - r["run_repeats"], 1) for r in spec]
    draft = PassModel.fit([(r["batch_size"], 1, S, r["time_draft"] / r["draft_passes"]) for r in spec])
    loop = PassModel.fit([(r["batch_size"], r["k"] + 1, S, (r["time_verify"] + r["time_overhead"]) / m)
                          for r, m in zip(spec, steps)])
    factor = statistics.median(
        (r["time_target"] - r["run_repeats"] * grid_model.target(r["batch_size"], P, 0)) / m
        / grid_model.pass_time(r["batch_size"], r["k"] + 1) for r, m in zip(spec, steps))
    return CostModel(grid_model.target, draft, S, loop, verify_factor=max(factor, 0.5))  # a floor for tiny runs


def analyse(runs: list[dict], grid_model: CostModel, ks, P: int, n: int) -> tuple[dict, list[dict], dict]:
    """Speedups and predictions per run (added in place), crossovers, the policy per (temperature, B), the models."""
    crossover, policy, models = {}, [], {}
    for temperature in sorted({r["temperature"] for r in runs}):
        sel = [r for r in runs if r["temperature"] == temperature]
        name = "greedy" if temperature == 0 else f"temperature {temperature:g}"
        model = models[name] = in_loop_model(grid_model, sel, P)
        by = {(r["batch_size"], r["k"]): r for r in sel}
        pooled = [r for r in sel if r["k"] > 0]
        alpha = sum(r["accepted"] for r in pooled) / max(sum(r["examined"] for r in pooled), 1)
        crossover[name] = {"alpha": alpha, "measured": {}, "predicted": {}}
        for r in sel:
            plain = by[(r["batch_size"], 0)]
            r["speedup"] = plain["seconds"] / r["seconds"]
            a = r["alpha"] if r["alpha"] is not None else alpha
            B, k = r["batch_size"], r["k"]
            for key, m in (("predicted", model), ("predicted_grid_only", grid_model)):
                r[key] = m.predict_time(a, 0, B, P, n) / m.predict_time(a, k, B, P, n)
            r["predicted_over_measured"] = r["predicted"] / r["speedup"]
            r["grid_only_over_measured"] = r["predicted_grid_only"] / r["speedup"]
            if k:  # steps: the model's (slowest of B independent rows) and decoding's; the costs alone, given its steps
                r["model_steps"] = batch_steps(a, k, B, n)
                r["measured_steps"] = (r["target_passes"] - r["run_repeats"]) / r["run_repeats"]
                spec = (model.predict_time(a, k, B, P, n) + (r["measured_steps"] - r["model_steps"])
                        * replace(model, context=P + n // 2).step_time(k, B))
                r["costs_only_over_measured"] = model.predict_time(a, 0, B, P, n) / spec / r["speedup"]
                # the target's verification pass inside decoding (its prompt pass taken out, as the grid predicts it)
                verify = (r["time_target"] / r["run_repeats"] - model.target(B, P, 0)) / r["measured_steps"]
                r["verify_in_loop_over_grid"] = verify / replace(model, context=P + n // 2).pass_time(B, k + 1)
        batch_sizes = sorted({r["batch_size"] for r in sel})
        for k in ks:
            if k == 0:
                continue
            below = [B for B in batch_sizes if by[(B, k)]["speedup"] < 1]
            crossover[name]["measured"][k] = below[0] if below else None
            crossover[name]["predicted"][k] = crossover_batch(alpha, k, model)
        for B in batch_sizes:
            k_pol = choose_k(alpha, B, model, ks=ks)
            best = max(ks, key=lambda k: by[(B, k)]["tokens_per_s"])
            pol, top, plain = by[(B, k_pol)], by[(B, best)], by[(B, 0)]
            noise = max(pol["spread"], top["spread"], NOISE_FLOOR)
            policy.append(dict(temperature=temperature, batch_size=B, alpha=alpha, k=k_pol,
                               tokens_per_s=pol["tokens_per_s"], best_k=best, best_tokens_per_s=top["tokens_per_s"],
                               plain_tokens_per_s=plain["tokens_per_s"], noise=noise,
                               vs_best=pol["tokens_per_s"] / top["tokens_per_s"],
                               vs_plain=pol["tokens_per_s"] / plain["tokens_per_s"]))
    return crossover, policy, models


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    ap.add_argument("--dtype", default="float32", choices=["float32", "bfloat16", "float16"])
    ap.add_argument("--threads", type=int, default=1, help="torch CPU threads (default 1; 0 keeps torch's default)")
    ap.add_argument("--quick", action="store_true", help="a tiny grid (seconds), for tests; writes only with --out")
    ap.add_argument("--out", default=None, help="results JSON (default benchmarks/results/batch_<device>.json)")
    ap.add_argument("--repeats", type=int, default=None, help="repeats per pass (default 7; quick 2)")
    ap.add_argument("--run-repeats", type=int, default=None, help="repeats per decoding run (default 3; quick 1)")
    ap.add_argument("--batch-sizes", type=int, nargs="+", default=None)
    ap.add_argument("--k", type=int, nargs="+", default=None, help="k values; 0 (plain) is always added")
    ap.add_argument("--clock", default="wall", choices=["wall", "cpu"],
                    help="cpu: process CPU time for the passes and runs, steadier on a shared CPU (needs --threads 1 "
                         "and --device cpu); SpecStats' in-loop times stay wall time, so use it to explore only")
    args = ap.parse_args()
    t_start = time.perf_counter()
    grid = dict(QUICK if args.quick else FULL)
    if args.batch_sizes:
        grid["batch_sizes"] = sorted(set(args.batch_sizes))
    if args.k:
        grid["ks"] = sorted(set(args.k) | {0})
    repeats = args.repeats or (2 if args.quick else 7)
    run_repeats = args.run_repeats or (1 if args.quick else 3)
    if args.clock == "cpu" and (args.threads != 1 or args.device != "cpu"):
        ap.error("--clock cpu counts every thread's time: use it with --threads 1 on --device cpu")
    if args.threads:
        torch.set_num_threads(args.threads)

    target, draft, _ = load_pair(device=args.device, dtype=getattr(torch, args.dtype))
    P, n = grid["prompt_tokens"], grid["new_tokens"]
    load0 = os.getloadavg()[0] if hasattr(os, "getloadavg") else None
    print(f"machine: {platform.processor() or platform.machine()}, {os.cpu_count()} cores, torch {torch.__version__}, "
          f"device {args.device}, dtype {args.dtype}, threads {torch.get_num_threads()}, clock {args.clock}, "
          f"load average {load0}")
    print(f"pair: target {target.config.n_layer}x{target.config.n_embd}, draft {draft.config.n_layer}x"
          f"{draft.config.n_embd}; target caches as decoding allocates them (prompt + new tokens + k slots, "
          f"context + {max(grid['ks']) + max(grid['tokens'])} past the run), draft caches of the full window")

    print(f"\n1. one target pass, ms (median of {repeats}), rows B, columns T; S = cached tokens")
    run_len, slack = P + n + max(grid["ks"]), max(grid["ks"]) + max(grid["tokens"])
    passes = time_passes(target, "target", grid["batch_sizes"], grid["tokens"], grid["contexts"], repeats, args.clock,
                         run_len, slack)
    print_passes(passes, grid["tokens"])
    print("one draft pass, ms")
    draft_passes = time_passes(draft, "draft", grid["batch_sizes"], [1, 2], grid["contexts"], repeats, args.clock,
                               draft.config.n_positions, 0)  # ModelDraft.begin allocates the full window
    print_passes(draft_passes, [1, 2])

    target_fit = PassModel.fit(passes)
    draft_fit = PassModel.fit(draft_passes)
    model = CostModel(target_fit, draft_fit, context=P + n // 2)
    for name, m in (("target", target_fit), ("draft", draft_fit)):
        other = ", ".join(f"{f}: median {e.median:.1%}, max {e.max:.1%}" for f, e in m.alternatives.items())
        print(f"{name} fit ({m.form}): overhead {m.overhead * 1e3:.3f} ms, weights {m.weights * 1e3:.3f} ms, "
              f"kv {m.kv * 1e9:.2f} ns/(row x cached token), {m.per_token * 1e6:.2f} us/token, "
              f"attention {m.attention * 1e9:.3f} ns/(token x cached token); relative error median "
              f"{m.error.median:.1%}, max {m.error.max:.1%} (the other form, {other})")

    print(f"\n2. decoding {n} new tokens after {P}-token prompts, {run_repeats} repeat(s) per run")
    runs = time_runs(target, draft, grid["batch_sizes"], grid["ks"], P, n, run_repeats, args.clock)
    crossover, policy, models = analyse(runs, model, grid["ks"], P, n)
    for name, m in models.items():
        print(f"{name}, measured in the loop: draft step {m.draft_time(1) * 1e3:.2f} ms at B = 1, "
              f"{m.draft_time(grid['batch_sizes'][-1]) * 1e3:.2f} ms at B = {grid['batch_sizes'][-1]} (grid: "
              f"{model.draft_time(1) * 1e3:.2f}, {model.draft_time(grid['batch_sizes'][-1]) * 1e3:.2f}); "
              f"rule + bookkeeping per step {m.loop_time(1, 2) * 1e3:.2f} ms at B x (k+1) = 1 x 2; "
              f"verification pass / grid {m.verify_factor:.2f} (median)")
    for name, cross in crossover.items():
        temperature = 0.0 if name == "greedy" else 1.0
        print(f"\n{name} (pooled alpha {cross['alpha']:.3f}): tokens/s over the batch; speedup and "
              f"predicted/measured per k")
        print("   B     plain  " + "".join(f"   k={k}: tok/s speedup pred/meas" for k in grid["ks"][1:]))
        for B in grid["batch_sizes"]:
            by = {r["k"]: r for r in runs if r["temperature"] == temperature and r["batch_size"] == B}
            print(f"{B:4d}  {by[0]['tokens_per_s']:8.0f}  " + "".join(
                f"   {by[k]['tokens_per_s']:10.0f} {by[k]['speedup']:6.2f}x {by[k]['predicted_over_measured']:8.2f}"
                for k in grid["ks"][1:]))
        B_max = grid["batch_sizes"][-1]
        big = [r for r in runs if r["temperature"] == temperature and r["k"] and r["batch_size"] == B_max]
        print(f"steps per run at B = {grid['batch_sizes'][-1]}, measured / model (slowest of B independent rows): "
              + ", ".join(f"k={r['k']}: {r['measured_steps']:.1f} / {r['model_steps']:.1f}" for r in big))
        print(f"target verification pass inside decoding / grid model at B = {B_max}: "
              + ", ".join(f"k={r['k']}: {r['verify_in_loop_over_grid']:.2f}" for r in big))
        print("crossover B*(k), the first B with speedup < 1: "
              + ", ".join(f"k={k}: measured {cross['measured'][k]}, model {cross['predicted'][k]}"
                          for k in grid["ks"][1:]))
        print("policy choose_k:  B   k  tok/s   best fixed k  tok/s   vs best  vs plain")
        for p in policy:
            if p["temperature"] == temperature:
                print(f"               {p['batch_size']:4d}  {p['k']:2d}  {p['tokens_per_s']:6.0f}   "
                      f"{p['best_k']:12d}  {p['best_tokens_per_s']:6.0f}   {p['vs_best']:7.2f}  {p['vs_plain']:8.2f}")

    ratios = [r["predicted_over_measured"] for r in runs if r["k"] > 0]
    grid_only = [r["grid_only_over_measured"] for r in runs if r["k"] > 0]
    print(f"\npredicted (grid passes only: isolated draft passes, no rule or loop) / measured: "
          f"{min(grid_only):.2f}-{max(grid_only):.2f}")
    goals = {
        "predicted/measured speedup within 0.85-1.15 at every (B, k)": bool(0.85 <= min(ratios) <= max(ratios) <= 1.15),
        "policy >= best fixed k at every B (within noise)": bool(all(p["vs_best"] >= 1 - p["noise"] for p in policy)),
        "policy >= 0.95x plain at every B": bool(all(p["vs_plain"] >= 0.95 for p in policy)),
    }
    costs_only = [r["costs_only_over_measured"] for r in runs if r["k"] > 0]
    print(f"predicted (grid target passes, draft and loop as measured in decoding) / measured: "
          f"{min(ratios):.2f}-{max(ratios):.2f}; with decoding's own step counts: "
          f"{min(costs_only):.2f}-{max(costs_only):.2f}")
    for goal, met in goals.items():
        print(f"goal {goal}: {'met' if met else 'NOT met'}")
    wall = time.perf_counter() - t_start
    print(f"wall clock: {wall:.0f} s")

    out = args.out or (None if args.quick else str(ROOT / "benchmarks" / "results" / f"batch_{args.device}.json"))
    if out:
        results = dict(
            meta=dict(machine=platform.processor() or platform.machine(), cores=os.cpu_count(),
                      torch=torch.__version__, device=args.device, dtype=args.dtype, threads=torch.get_num_threads(),
                      clock=args.clock, repeats=repeats, run_repeats=run_repeats, quick=args.quick,
                      prompt_tokens=P, new_tokens=n, contexts=grid["contexts"], ks=grid["ks"],
                      batch_sizes=grid["batch_sizes"], tokens=grid["tokens"],
                      cache_len={str(S): cache_len(target, S, run_len, slack) for S in grid["contexts"]},
                      load_average=[load0, os.getloadavg()[0] if hasattr(os, "getloadavg") else None],
                      date=time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()), wall_s=wall),
            passes=passes, draft_passes=draft_passes, grid_model=model.as_dict(),
            cost_models={name: m.as_dict() for name, m in models.items()}, runs=runs,
            crossover={name: {key: ({str(k): v for k, v in val.items()} if isinstance(val, dict) else val)
                              for key, val in cross.items()} for name, cross in crossover.items()},
            policy=policy, goals=goals)
        Path(out).parent.mkdir(parents=True, exist_ok=True)
        Path(out).write_text(json.dumps(results, indent=1, default=lambda x: x.item()) + "\n")
        print(f"results: {out}")


if __name__ == "__main__":
    main()
