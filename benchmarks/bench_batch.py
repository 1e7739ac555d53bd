"""Speculation under load: pass times over batch x tokens, throughput per (batch, k), a cost model and its k policy.

1. One target pass with a warm KV cache, for every batch B and new tokens per row T,
   at two context lengths: median and spread ((max - min) / median) of the repeats.
   The same for one draft pass (T = 1, 2: a draft step feeds one or two tokens).
2. Plain and speculative decoding of B held-out prompts at once, for k in 0, 1, 2, 4, 8,
   greedy and at temperature 1: tokens per second over the whole batch (wall time of the
   whole call, its cache allocation and prompt pass included), the speedup per (B, k)
   and the crossover B*(k), the smallest B where the speedup drops below 1.
3. The cost model. The target's `PassModel` is fitted to the grid (both forms; the better
   is kept, both errors printed). A grid timed apart from decoding misses decoding's own
   pass times by tens of percent on a shared CPU, and decoding also spends time outside
   the target's passes: the draft's step (a fixed part, its catch-up pass and q, plus k
   steps), the acceptance rule and bookkeeping (growing with B x (k + 1)), and a batch
   waits for its slowest row, whose alpha is lower than the mean. So the `CostModel` per
   temperature is fitted to the speculative runs' own SpecStats parts (never their totals,
   never the plain runs) at every other batch size (1, 4, 16, ...); the other batch sizes
   are held out and their error is printed apart. The rows' spread of alpha comes from the
   same training runs' step counts (`batch_steps(..., alpha_sd)`). Printed: the predicted /
   measured speedup per run (held out marked), the grid-only prediction, and the k that
   `choose_k(..., margin, new_tokens)` picks at each B with the throughput that k measured;
   the margin is the model's 90th-percentile error on the training runs.

`--from-json FILE` measures nothing: it refits and re-analyses a results file and prints
the same report. `--target-shape gpt2-medium` (or gpt2-large) times a random-initialised
target of that shape instead of the bundled one (random weights time like trained ones):
its weights (1.2 GB in float32) fall out of every CPU cache, the memory-bound regime where
verifying k + 1 tokens stays cheap. Its alpha against the bundled draft is near 0, so with
it read the pass grid (and `CostModel` predictions at an assumed alpha), not the runs'
speedups (benchmarks/README.md records a run on the course's machine).

Goals (printed as met / NOT met): predicted / measured speedup within 0.85-1.15 over the
grid; the policy's throughput >= the best fixed k's at every B within noise (the larger
spread of the two runs' repeats) and >= 0.95x plain at every B.

One torch thread by default: with torch's default (one per core) a shared 2-core machine
spends most of a pass in OpenMP barriers (measured at B = 1: 12 ms per pass with one thread,
330 ms with two, under load). Results go to a JSON file a notebook can read
(`CostModel.from_dict(results["cost_models"]["greedy"])` rebuilds the fit).

    python benchmarks/bench_batch.py [--device cuda] [--quick] [--out FILE] [--repeats 7] [--run-repeats 3]
                                     [--pass-seconds 0.2] [--run-seconds 3]   # more repeats where cells are short
    python benchmarks/bench_batch.py --from-json benchmarks/results/batch_cpu.json      # re-analyse only
    python benchmarks/bench_batch.py --target-shape gpt2-medium --out FILE             # the memory-bound regime
"""

from __future__ import annotations

import argparse
import json
import math
import os
import statistics
import time
from dataclasses import replace
from pathlib import Path

import numpy as np
import torch
from scipy.optimize import minimize_scalar, nnls

from specref import generate, load_pair, speculative_generate
from specref.models.gpt2 import GPT2, GPT2Config
from specref.models.pair import heldout_prompts, heldout_texts
from specref.perf.costmodel import CostModel, FitError, PassModel, batch_steps, choose_k, crossover_batch
from specref.perf.costs import pass_times
from specref.perf.machine import machine_name

ROOT = Path(__file__).resolve().parents[1]
FULL = dict(batch_sizes=[1, 2, 4, 8, 16, 32, 64, 128, 256], tokens=list(range(1, 10)), contexts=[64, 192],
            ks=[0, 1, 2, 4, 8], prompt_tokens=32, new_tokens=64)
# The quick grid times T = prompt_tokens too: the in-loop fit takes the prompt's pass out of each run's target time
# with the grid's model, and extrapolated from T <= 2 on a loaded machine it could exceed the run's whole time.
QUICK = dict(batch_sizes=[1, 2, 4], tokens=[1, 2, 8], contexts=[8, 16], ks=[0, 1, 2], prompt_tokens=8, new_tokens=6)
SHAPES = {"bundled": None, "gpt2-medium": (24, 1024, 16), "gpt2-large": (36, 1280, 20)}  # n_layer, n_embd, n_head
NOISE_FLOOR = 0.02  # "within noise" is never stricter than 2 %
STAT_SUMS = ("accepted", "examined", "emitted", "steps", "target_passes", "draft_passes", "time_target", "time_draft",
             "time_verify", "time_overhead")  # SpecStats fields summed over a run's repeats


def random_target(shape: str, like, device, dtype) -> GPT2:
    """A random-initialised target of a GPT-2 shape, with the bundled pair's vocabulary and window (seeded).

    Random weights time like trained ones (the same matmuls); at GPT-2 medium (about 300 M
    parameters, 1.2 GB in float32) the weights no longer fit any CPU cache, so a pass is
    bound by memory traffic: the regime where verification stays cheap.
    """
    n_layer, n_embd, n_head = SHAPES[shape]
    config = GPT2Config(vocab_size=like.config.vocab_size, n_positions=like.config.n_positions, n_embd=n_embd,
                        n_layer=n_layer, n_head=n_head)
    with torch.random.fork_rng(devices=[]):  # the module's initialisers use the global generator: fence it
        torch.manual_seed(0)
        model = GPT2(config)
    return model.to(device=device, dtype=dtype).eval()


def spread(times: list[float]) -> float:
    """(max - min) / median of the repeats."""
    return (max(times) - min(times)) / statistics.median(times)


def cache_len(model, context: int, run_len: int, slack: int) -> int:
    """The cache decoding allocates for a run that reaches `context`: its own length + k, else the window."""
    return min(model.config.n_positions, max(run_len, context + slack))


REPEAT_CAP = 5  # a short cell gets at most this many times the repeats asked for


def repeats_for(seconds_one: float, repeats: int, min_seconds: float, cap: int) -> int:
    """At least `repeats`, more where one repeat is short: enough for `min_seconds` in all, at most `cap`."""
    if min_seconds <= 0 or seconds_one <= 0:
        return repeats
    return max(repeats, min(cap, math.ceil(min_seconds / seconds_one)))


def time_passes(model, name: str, batch_sizes, tokens, contexts, repeats: int, clock: str, run_len: int,
                slack: int, min_seconds: float = 0.0) -> list[dict]:
    """Each (S, B, T) cell: `repeats` passes, more where a pass is short (min_seconds per cell, up to REPEAT_CAP x)."""
    rows = []
    for S in contexts:
        max_len = cache_len(model, S, run_len, slack)
        for B in batch_sizes:
            one = pass_times(model, max(tokens), S, B, repeats=1, clock=clock, warmup=1, max_len=max_len)[0]
            r = repeats_for(one, repeats, min_seconds, REPEAT_CAP * repeats)
            for T, ts in pass_times(model, list(tokens), S, B, repeats=r, clock=clock, warmup=1,
                                    max_len=max_len).items():
                rows.append(dict(model=name, batch_size=B, n_tokens=T, context=S, repeats=r,
                                 median_s=statistics.median(ts), min_s=min(ts), max_s=max(ts), spread=spread(ts),
                                 times_s=ts))
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


def time_runs(target, draft, batch_sizes, ks, P: int, n: int, repeats: int, clock: str,
              min_seconds: float = 0.0) -> list[dict]:
    """Every (temperature, B, k) run `repeats` times, more at a small B (min_seconds per k, up to REPEAT_CAP x)."""
    out = []
    for temperature in (0.0, 1.0):
        for B in batch_sizes:
            ids = prompts_for(B, P, target.device)
            decode(target, draft, ids, 0, 2, temperature, 0)  # warm-up at this shape
            one = decode(target, draft, ids, 0, n, temperature, 0)[0 if clock == "wall" else 1]
            repeats_B = repeats_for(one, repeats, min_seconds, REPEAT_CAP * repeats)
            acc = {k: dict(wall=[], cpu=[], **dict.fromkeys(STAT_SUMS, 0)) for k in ks}
            for rep in range(repeats_B):  # interleaved, so drift over time hits every k alike
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
                out.append(dict(temperature=temperature, batch_size=B, k=k, run_repeats=repeats_B, seconds=t,
                                spread=spread(ts),
                                times_s=ts, wall_s=a["wall"], cpu_s=a["cpu"], tokens_per_s=B * n / t,
                                alpha=a["accepted"] / a["examined"] if a["examined"] else None,
                                tokens_per_step=a["emitted"] / a["steps"] if a["steps"] else 1.0,
                                **{f: a[f] for f in STAT_SUMS}))
    return out


def train_batches(batch_sizes) -> list[int]:
    """The batch sizes whose runs the in-loop terms are fitted to: every other one; the rest are held out."""
    return sorted(batch_sizes)[::2]


def _max_steps(r: dict) -> float:
    """Steps of one run, the batch's (its slowest row's): target passes less the prompt's."""
    return max(r["target_passes"] / r["run_repeats"] - 1, 1.0)


def fit_draft_step(rows: list[tuple[int, int, float]]) -> tuple[PassModel, PassModel]:
    """Draft seconds per step = fixed(B) + k x per_step(B), both a + b B: (per-step model, fixed model).

    Least squares on relative error, coefficients >= 0 (columns 1, B, k, B k). The fixed
    part is the catch-up pass over what the last step accepted, and building q.
    """
    B, k, t = (np.array(x, dtype=np.float64) for x in zip(*rows))
    X = np.stack([np.ones_like(t), B, k, B * k], 1) / t[:, None]
    c, _ = nnls(X, np.ones_like(t))
    fixed, step = PassModel(overhead=c[0], per_token=c[1]), PassModel(overhead=c[2], per_token=c[3])
    err = FitError.of((c[0] + c[1] * B + k * (c[2] + c[3] * B)) / t - 1)
    return replace(step, error=err), fixed


ALPHA_SD_XATOL = 1e-3  # fit_alpha_sd's answer is known to this much (absolute), on any CPU


def fit_alpha_sd(rows: list[tuple[float, int, int, float]], n: int) -> float:
    """The rows' spread of alpha that makes `batch_steps` match the runs' step counts (alpha, k, B, steps)."""
    def loss(sd: float) -> float:
        return sum(math.log(batch_steps(a, k, B, n, min(sd, 0.99 * math.sqrt(a * (1 - a)))) / m) ** 2
                   for a, k, B, m in rows)
    return float(minimize_scalar(loss, bounds=(0.0, 0.3), method="bounded", options={"xatol": ALPHA_SD_XATOL}).x)


def in_loop_model(grid_model: CostModel, runs: list[dict], P: int, n: int, train: list[int]) -> CostModel:
    """Every cost as decoding measured it, fitted to the speculative runs at the `train` batch sizes only.

    From those runs' SpecStats (their parts, never their totals, never a plain run): the
    target's verification pass (the prompt's pass, from the grid, taken out), the draft's
    step (k steps and a fixed part), the rule and bookkeeping per step (a function of
    B x (k + 1)), and alpha_sd from their step counts. Plain decoding's step is the same
    target model at one token per row: the plain runs are predicted, never fitted.
    """
    spec = [r for r in runs if r["k"] > 0 and r["batch_size"] in train]
    S = grid_model.context
    verify = []  # (B, k + 1, S, seconds per verification pass): the run's target time less the prompt's pass
    for r in spec:
        total, prompt = r["time_target"] / r["run_repeats"], grid_model.target(r["batch_size"], P, 0)
        if not prompt < total:
            raise ValueError(f"the grid's model puts the prompt's pass at {prompt * 1e3:.1f} ms, more than the whole "
                             f"target time of the run at B = {r['batch_size']}, k = {r['k']} ({total * 1e3:.1f} ms): "
                             "the grid is too noisy to take the prompt out; measure again on a quieter machine")
        verify.append((r["batch_size"], r["k"] + 1, S, (total - prompt) / _max_steps(r)))
    target = PassModel.fit(verify)
    draft, fixed = fit_draft_step([(r["batch_size"], r["k"], r["time_draft"] / r["run_repeats"] / _max_steps(r))
                                   for r in spec])
    loop = PassModel.fit([(r["batch_size"], r["k"] + 1, S, (r["time_verify"] + r["time_overhead"])
                           / r["run_repeats"] / _max_steps(r)) for r in spec])
    sd = fit_alpha_sd([(r["alpha"], r["k"], r["batch_size"], _max_steps(r)) for r in spec], n)
    grid_draft = grid_model.draft if isinstance(grid_model.draft, PassModel) else None
    return CostModel(target, draft, S, loop, draft_fixed=fixed, alpha_sd=sd, prompt_target=grid_model.target,
                     prompt_draft=grid_draft)


def policy_margin(runs: list[dict], train: list[int]) -> float:
    """How far the model may err before the policy trusts a gain: the 90th percentile of |predicted / measured - 1|
    over the training runs (held-out runs never set it)."""
    errs = sorted(abs(r["predicted_over_measured"] - 1) for r in runs if r["k"] and r["batch_size"] in train)
    return float(np.quantile(errs, 0.9)) if errs else 0.0


def analyse(runs: list[dict], grid_model: CostModel, ks, P: int, n: int) -> tuple[dict, list[dict], dict]:
    """Speedups and predictions per run (added in place), crossovers, the policy per (temperature, B), the models."""
    crossover, policy, models = {}, [], {}
    train = train_batches({r["batch_size"] for r in runs})
    for temperature in sorted({r["temperature"] for r in runs}):
        sel = [r for r in runs if r["temperature"] == temperature]
        name = "greedy" if temperature == 0 else f"temperature {temperature:g}"
        model = models[name] = in_loop_model(grid_model, sel, P, n, train)
        by = {(r["batch_size"], r["k"]): r for r in sel}
        pooled = [r for r in sel if r["k"] > 0]
        alpha = sum(r["accepted"] for r in pooled) / max(sum(r["examined"] for r in pooled), 1)
        for r in sel:
            plain = by[(r["batch_size"], 0)]
            r["speedup"] = plain["seconds"] / r["seconds"]
            r["held_out"] = r["batch_size"] not in train
            a = r["alpha"] if r["alpha"] is not None else alpha
            B, k = r["batch_size"], r["k"]
            for key, m in (("predicted", model), ("predicted_grid_only", grid_model)):
                r[key] = m.predict_time(a, 0, B, P, n) / m.predict_time(a, k, B, P, n)
            r["predicted_over_measured"] = r["predicted"] / r["speedup"]
            r["grid_only_over_measured"] = r["predicted_grid_only"] / r["speedup"]
            if k:  # steps: the model's (slowest of B rows) and decoding's; the costs alone, given decoding's steps
                r["model_steps"] = batch_steps(a, k, B, n, model.spread_at(a))
                r["measured_steps"] = _max_steps(r)
                at = replace(model, context=P + n // 2)
                spec = model.predict_time(a, k, B, P, n) + (r["measured_steps"] - r["model_steps"]) * at.step_time(k, B)
                r["costs_only_over_measured"] = model.predict_time(a, 0, B, P, n) / spec / r["speedup"]
                verify = (r["time_target"] / r["run_repeats"] - grid_model.target(B, P, 0)) / r["measured_steps"]
                r["verify_in_loop_over_grid"] = verify / replace(grid_model, context=P + n // 2).pass_time(B, k + 1)
        margin = policy_margin(sel, train)
        crossover[name] = {"alpha": alpha, "margin": margin, "measured": {}, "predicted": {}}
        batch_sizes = sorted({r["batch_size"] for r in sel})
        for k in ks:
            if k == 0:
                continue
            below = [B for B in batch_sizes if by[(B, k)]["speedup"] < 1]
            crossover[name]["measured"][k] = below[0] if below else None
            crossover[name]["predicted"][k] = crossover_batch(alpha, k, model, new_tokens=n)
        for B in batch_sizes:
            k_pol = choose_k(alpha, B, model, ks=ks, margin=margin, new_tokens=n)
            best = max(ks, key=lambda k: by[(B, k)]["tokens_per_s"])
            pol, top, plain = by[(B, k_pol)], by[(B, best)], by[(B, 0)]
            noise = max(pol["spread"], top["spread"], NOISE_FLOOR)
            policy.append(dict(temperature=temperature, batch_size=B, alpha=alpha, margin=margin, k=k_pol,
                               k_no_margin=choose_k(alpha, B, model, ks=ks, new_tokens=n),
                               tokens_per_s=pol["tokens_per_s"], best_k=best, best_tokens_per_s=top["tokens_per_s"],
                               plain_tokens_per_s=plain["tokens_per_s"], noise=noise,
                               vs_best=pol["tokens_per_s"] / top["tokens_per_s"],
                               vs_plain=pol["tokens_per_s"] / plain["tokens_per_s"]))
    return crossover, policy, models


def describe_fit(name: str, m: PassModel) -> str:
    other = ", ".join(f"{f}: median {e.median:.1%}, max {e.max:.1%}" for f, e in m.alternatives.items())
    return (f"{name} fit ({m.form}): overhead {m.overhead * 1e3:.3f} ms, weights {m.weights * 1e3:.3f} ms, "
            f"kv {m.kv * 1e9:.2f} ns/(row x cached token), {m.per_token * 1e6:.2f} us/token, "
            f"attention {m.attention * 1e9:.3f} ns/(token x cached token); relative error median "
            f"{m.error.median:.1%}, max {m.error.max:.1%}" + (f" (the other form, {other})" if other else ""))


def _range(xs) -> str:
    xs = list(xs)
    return f"{min(xs):.2f}-{max(xs):.2f}" if xs else "none"


def _repeats(rows: list[dict], key: str, default: int) -> str:
    """The repeats the rows were measured with: one number, or the range where short cells got more."""
    rs = sorted({r.get(key, default) for r in rows})
    return f"{rs[0]}" if len(rs) == 1 else f"{rs[0]}-{rs[-1]}"


def report(results: dict) -> dict:
    """Fit the models, analyse the runs and print every table and goal; returns results with the analysis filled in."""
    meta, passes, draft_passes, runs = results["meta"], results["passes"], results["draft_passes"], results["runs"]
    P, n, ks, batch_sizes = meta["prompt_tokens"], meta["new_tokens"], meta["ks"], meta["batch_sizes"]
    print(f"\n1. one target pass, ms (median of {_repeats(passes, 'repeats', meta['repeats'])}), rows B, columns T; "
          "S = cached tokens")
    print_passes(passes, meta["tokens"])
    print("one draft pass, ms")
    print_passes(draft_passes, [1, 2])
    target_fit, draft_fit = PassModel.fit(passes), PassModel.fit(draft_passes)
    grid_model = CostModel(target_fit, draft_fit, context=P + n // 2)
    print(describe_fit("target", target_fit))
    print(describe_fit("draft", draft_fit))

    print(f"\n2. decoding {n} new tokens after {P}-token prompts, "
          f"{_repeats(runs, 'run_repeats', meta['run_repeats'])} repeat(s) per run")
    train = train_batches(batch_sizes)
    print(f"in-loop terms fitted to the speculative runs' SpecStats at B in {train}; "
          f"B in {sorted(set(batch_sizes) - set(train))} held out")
    crossover, policy, models = analyse(runs, grid_model, ks, P, n)
    B_max = batch_sizes[-1]
    for name, m in models.items():
        print(f"{name}: " + describe_fit("in-loop target pass", m.target))
        print(f"  draft step = fixed + k x step: fixed {m.draft_fixed.overhead * 1e3:.2f} ms + "
              f"{m.draft_fixed.per_token * 1e6:.1f} us/row, step {m.draft.overhead * 1e3:.2f} ms + "
              f"{m.draft.per_token * 1e6:.1f} us/row (grid's isolated draft pass at B = 1: "
              f"{grid_model.draft_time(1) * 1e3:.2f} ms, at B = {B_max}: {grid_model.draft_time(B_max) * 1e3:.2f} ms);"
              f" relative error median {m.draft.error.median:.1%}, max {m.draft.error.max:.1%}")
        print(f"  rule + bookkeeping per step {m.loop_time(1, 2) * 1e3:.2f} ms at B x (k+1) = 1 x 2, "
              f"{m.loop_time(B_max, 9) * 1e3:.2f} ms at {B_max} x 9; relative error median {m.loop.error.median:.1%}"
              f", max {m.loop.error.max:.1%}; rows' alpha spread (sd) {m.alpha_sd:.3f}")
    for name, cross in crossover.items():
        temperature = 0.0 if name == "greedy" else 1.0
        print(f"\n{name} (pooled alpha {cross['alpha']:.3f}): tokens/s over the batch; speedup and "
              f"predicted/measured per k (* held out)")
        print("   B     plain  " + "".join(f"   k={k}: tok/s speedup pred/meas" for k in ks[1:]))
        for B in batch_sizes:
            by = {r["k"]: r for r in runs if r["temperature"] == temperature and r["batch_size"] == B}
            print(f"{B:4d}{'*' if B not in train else ' '} {by[0]['tokens_per_s']:8.0f}  " + "".join(
                f"   {by[k]['tokens_per_s']:10.0f} {by[k]['speedup']:6.2f}x {by[k]['predicted_over_measured']:8.2f}"
                for k in ks[1:]))
        big = [r for r in runs if r["temperature"] == temperature and r["k"] and r["batch_size"] == B_max]
        print(f"steps per run at B = {B_max}, measured / model (slowest of B rows, alpha spread) / alike rows: "
              + ", ".join(f"k={r['k']}: {r['measured_steps']:.1f} / {r['model_steps']:.1f} / "
                          f"{batch_steps(r['alpha'], r['k'], B_max, n):.1f}" for r in big))
        print(f"target verification pass inside decoding / grid model at B = {B_max}: "
              + ", ".join(f"k={r['k']}: {r['verify_in_loop_over_grid']:.2f}" for r in big))
        print("crossover B*(k), the first B with speedup < 1: "
              + ", ".join(f"k={k}: measured {cross['measured'][k]}, model {cross['predicted'][k]}" for k in ks[1:]))
        print(f"policy choose_k (margin {cross['margin']:.2f}):  B   k  tok/s   best fixed k  tok/s   vs best"
              "  vs plain")
        for p in policy:
            if p["temperature"] == temperature:
                print(f"               {p['batch_size']:4d}  {p['k']:2d}  {p['tokens_per_s']:6.0f}   "
                      f"{p['best_k']:12d}  {p['best_tokens_per_s']:6.0f}   {p['vs_best']:7.2f}  {p['vs_plain']:8.2f}")

    spec = [r for r in runs if r["k"] > 0]
    held = [r["predicted_over_measured"] for r in spec if r["held_out"]]
    fitted = [r["predicted_over_measured"] for r in spec if not r["held_out"]]
    print(f"\npredicted (grid passes only: isolated draft passes, no rule or loop, alike rows) / measured: "
          f"{_range(r['grid_only_over_measured'] for r in spec)}")
    print(f"predicted (in-loop model) / measured: held-out B {_range(held)}, fitted B {_range(fitted)}; "
          f"with decoding's own step counts: {_range(r['costs_only_over_measured'] for r in spec)}")
    within = [0.85 <= x <= 1.15 for x in held + fitted]
    print(f"runs within 0.85-1.15: {sum(within)} of {len(within)}")
    goals = {
        "predicted/measured speedup within 0.85-1.15 at every held-out (B, k)": bool(held)
        and bool(0.85 <= min(held) <= max(held) <= 1.15),
        "predicted/measured speedup within 0.85-1.15 at every (B, k)": bool(all(within)),
        "policy >= best fixed k at every B (within noise)": bool(all(p["vs_best"] >= 1 - p["noise"] for p in policy)),
        "policy >= 0.95x plain at every B": bool(all(p["vs_plain"] >= 0.95 for p in policy)),
    }
    for goal, met in goals.items():
        print(f"goal {goal}: {'met' if met else 'NOT met'}")
    return dict(results, grid_model=grid_model.as_dict(), cost_models={k: m.as_dict() for k, m in models.items()},
                runs=runs, crossover={name: {key: ({str(k): v for k, v in val.items()} if isinstance(val, dict)
                                                   else val) for key, val in cross.items()}
                                      for name, cross in crossover.items()}, policy=policy, goals=goals)


def write(results: dict, out: str) -> None:
    Path(out).parent.mkdir(parents=True, exist_ok=True)
    Path(out).write_text(json.dumps(results, indent=1, default=lambda x: x.item()) + "\n")
    print(f"results: {out}")


def save_and_report(measured: dict, out: str | None) -> dict:
    """Write the measurements, then analyse them and write again: an analysis that fails loses no measurement.

    A failed analysis is rerun with `--from-json out` once the analysis is mended, nothing re-measured.
    """
    if out:
        write(measured, out)
    results = report(measured)
    if out:
        write(results, out)
    return results


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    ap.add_argument("--dtype", default="float32", choices=["float32", "bfloat16", "float16"])
    ap.add_argument("--threads", type=int, default=1, help="torch CPU threads (default 1; 0 keeps torch's default)")
    ap.add_argument("--quick", action="store_true", help="a tiny grid (seconds), for tests; writes only with --out")
    ap.add_argument("--out", default=None, help="results JSON (default benchmarks/results/batch_<device>.json)")
    ap.add_argument("--from-json", default=None, metavar="FILE",
                    help="measure nothing: refit and re-analyse FILE's measurements, print the report, and write "
                         "the analysis to --out (default: FILE itself; its measurements are kept as they are)")
    ap.add_argument("--target-shape", default="bundled", choices=sorted(SHAPES),
                    help="the target: the bundled one, or a random-initialised GPT-2 shape (times like a trained "
                         "one of that size; its alpha against the bundled draft is near 0, so use it for the grid "
                         "of pass times: with it the runs' speedups say nothing about a trained pair)")
    ap.add_argument("--repeats", type=int, default=None, help="repeats per pass (default 7; quick 2)")
    ap.add_argument("--run-repeats", type=int, default=None, help="repeats per decoding run (default 3; quick 1)")
    ap.add_argument("--pass-seconds", type=float, default=None,
                    help="more repeats where a pass is short: at least this many seconds per cell (default 0.2; "
                         "quick 0), at most 5 x --repeats")
    ap.add_argument("--run-seconds", type=float, default=None,
                    help="the same for decoding runs, per (B, k) (default 3; quick 0)")
    ap.add_argument("--batch-sizes", type=int, nargs="+", default=None)
    ap.add_argument("--k", type=int, nargs="+", default=None, help="k values; 0 (plain) is always added")
    ap.add_argument("--clock", default="wall", choices=["wall", "cpu"],
                    help="cpu: process CPU time for the passes and runs, steadier on a shared CPU (needs --threads 1 "
                         "and --device cpu); SpecStats' in-loop times stay wall time, so use it to explore only")
    args = ap.parse_args()
    if args.from_json:
        results = json.loads(Path(args.from_json).read_text())
        m = results["meta"]
        print(f"from {args.from_json}: measured {m['date']} on {m['machine']}, {m['cores']} cores, "
              f"torch {m['torch']}, device {m['device']}, threads {m['threads']}, wall {m['wall_s']:.0f} s; "
              f"nothing re-measured")
        write(report(results), args.out or args.from_json)
        return
    t_start = time.perf_counter()
    grid = dict(QUICK if args.quick else FULL)
    if args.batch_sizes:
        grid["batch_sizes"] = sorted(set(args.batch_sizes))
    if args.k:
        grid["ks"] = sorted(set(args.k) | {0})
    repeats = args.repeats or (2 if args.quick else 7)
    run_repeats = args.run_repeats or (1 if args.quick else 3)
    pass_s = args.pass_seconds if args.pass_seconds is not None else (0.0 if args.quick else 0.2)
    run_s = args.run_seconds if args.run_seconds is not None else (0.0 if args.quick else 3.0)
    if args.clock == "cpu" and (args.threads != 1 or args.device != "cpu"):
        ap.error("--clock cpu counts every thread's time: use it with --threads 1 on --device cpu")
    if args.threads:
        torch.set_num_threads(args.threads)

    target, draft, _ = load_pair(device=args.device, dtype=getattr(torch, args.dtype))
    if args.target_shape != "bundled":
        target = random_target(args.target_shape, target, args.device, getattr(torch, args.dtype))
    P, n = grid["prompt_tokens"], grid["new_tokens"]
    load0 = os.getloadavg()[0] if hasattr(os, "getloadavg") else None
    machine = machine_name(args.device)
    print(f"machine: {machine}, {os.cpu_count()} cores, torch {torch.__version__}, "
          f"device {args.device}, dtype {args.dtype}, threads {torch.get_num_threads()}, clock {args.clock}, "
          f"load average {load0}")
    print(f"pair: target {target.config.n_layer}x{target.config.n_embd} ({args.target_shape}), draft "
          f"{draft.config.n_layer}x{draft.config.n_embd}; target caches as decoding allocates them (prompt + new "
          f"tokens + k slots, context + {max(grid['ks']) + max(grid['tokens'])} past the run), draft caches of the "
          f"full window")
    run_len, slack = P + n + max(grid["ks"]), max(grid["ks"]) + max(grid["tokens"])
    passes = time_passes(target, "target", grid["batch_sizes"], grid["tokens"], grid["contexts"], repeats, args.clock,
                         run_len, slack, pass_s)
    draft_passes = time_passes(draft, "draft", grid["batch_sizes"], [1, 2], grid["contexts"], repeats, args.clock,
                               draft.config.n_positions, 0, pass_s)  # ModelDraft.begin allocates the full window
    runs = time_runs(target, draft, grid["batch_sizes"], grid["ks"], P, n, run_repeats, args.clock, run_s)
    wall = time.perf_counter() - t_start
    meta = dict(machine=machine, cores=os.cpu_count(),
                torch=torch.__version__, device=args.device, dtype=args.dtype, threads=torch.get_num_threads(),
                clock=args.clock, repeats=repeats, run_repeats=run_repeats, pass_seconds=pass_s,
                run_seconds=run_s, quick=args.quick,
                target_shape=args.target_shape, prompt_tokens=P, new_tokens=n, contexts=grid["contexts"],
                ks=grid["ks"], batch_sizes=grid["batch_sizes"], tokens=grid["tokens"],
                cache_len={str(S): cache_len(target, S, run_len, slack) for S in grid["contexts"]},
                load_average=[load0, os.getloadavg()[0] if hasattr(os, "getloadavg") else None],
                date=time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()), wall_s=wall)
    out = args.out or (None if args.quick else str(ROOT / "benchmarks" / "results" / f"batch_{args.device}.json"))
    save_and_report(dict(meta=meta, passes=passes, draft_passes=draft_passes, runs=runs), out)
    print(f"wall clock: {wall:.0f} s")


if __name__ == "__main__":
    main()
