"""Plain vs speculative decoding on the bundled pair, k = 1..8, greedy and temperature 1.

For each k, in one run: alpha, c(k) and v(k) (time per draft pass, and per
verification = target pass + acceptance rule, as the speculative run ran them,
relative to plain decoding's time per token, its sampling included), tokens per
step, the measured speedup, the chapter's predicted S(alpha, k, c) (which
assumes v = 1), the refined prediction E / (v + c k), measured / refined, and
two shares of the speculative wall time: "rule" (the acceptance rule, part of
v) and "loop" (the loop's own bookkeeping, in no prediction).
Goals: measured / refined >= 0.9 (the loop adds little overhead beyond the
passes and the rule); best-k greedy speedup >= 1.5x on CPU; a step that proposes
nothing (`NoDraft`: every step a plain one, through the loop) costs <= 1.10x a
plain decoding token (the loop's fixed cost per step).

    python benchmarks/bench_speculative.py [--device cuda] [--prompts 8] [--new-tokens 128]
"""

from __future__ import annotations

import argparse
import time

import torch

from specref.decoding.chain import generate, speculative_generate
from specref.drafts import NoDraft
from specref.models.pair import heldout_prompts, load_pair
from specref.perf.machine import machine_name
from specref.perf.measure import plain_time, speculative_run
from specref.timing import sync


def nothing_proposed_ratio(target: torch.nn.Module, prompts: list[torch.Tensor], max_new_tokens: int,
                           temperature: float, repeats: int = 3) -> float:
    """Time of speculative decoding with `NoDraft` (plain steps through the loop) over plain decoding's.

    Interleaved prompt by prompt, `repeats` times, so that the host's drift hits both alike.
    """
    spent = {"plain": 0.0, "empty": 0.0}
    runs = {"plain": lambda ids, g: generate(target, ids, max_new_tokens, temperature=temperature, generator=g),
            "empty": lambda ids, g: speculative_generate(target, NoDraft(target.config.vocab_size, target.dtype), ids,
                                                         k=1, max_new_tokens=max_new_tokens, temperature=temperature,
                                                         generator=g)}
    for _ in range(repeats):
        for i, ids in enumerate(prompts):
            for name, run in runs.items():
                g = torch.Generator(device=target.device).manual_seed(i)
                sync(target.device)
                t0 = time.perf_counter()
                run(ids, g)
                sync(target.device)
                spent[name] += time.perf_counter() - t0
    return spent["empty"] / spent["plain"]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    ap.add_argument("--dtype", default="float32", choices=["float32", "bfloat16", "float16"])
    ap.add_argument("--prompts", type=int, default=8)
    ap.add_argument("--prompt-tokens", type=int, default=64)
    ap.add_argument("--new-tokens", type=int, default=128)
    ap.add_argument("--k", type=int, nargs="+", default=list(range(1, 9)))
    ap.add_argument("--threads", type=int, default=1,
                    help="torch CPU threads (default 1: these small models run fastest single-threaded)")
    args = ap.parse_args()
    if args.threads:
        torch.set_num_threads(args.threads)

    dtype = getattr(torch, args.dtype)
    target, draft, tokenizer = load_pair(device=args.device, dtype=dtype)
    prompts = [torch.tensor([p], device=args.device) for p in heldout_prompts(args.prompts, args.prompt_tokens)]
    print(f"machine: {machine_name(args.device)}, torch {torch.__version__}, "
          f"device {args.device}, dtype {args.dtype}, threads {torch.get_num_threads()}")
    print(f"pair: target {target.config.n_layer}x{target.config.n_embd}, draft {draft.config.n_layer}x"
          f"{draft.config.n_embd}; {args.prompts} held-out prompts of {args.prompt_tokens} tokens, "
          f"{args.new_tokens} new tokens each")
    print("c and v: time per draft pass and per verification (target pass + rule; prefill included) during")
    print("the speculative run, relative to plain decoding's time per token")

    for temperature in (0.0, 1.0):
        base = plain_time(target, prompts, args.new_tokens, temperature=temperature)
        name = "greedy" if temperature == 0 else f"temperature {temperature:g}"
        print(f"\n{name}: plain decoding {base:.2f} s ({args.prompts * args.new_tokens / base:.0f} tokens/s, "
              f"{base / (args.prompts * args.new_tokens) * 1e3:.2f} ms per token)")
        empty = nothing_proposed_ratio(target, prompts, args.new_tokens, temperature)
        print(f"steps that propose nothing (NoDraft): {empty:.3f}x plain decoding's time per token, interleaved "
              f"(goal <= 1.10x: {'met' if empty <= 1.10 else 'NOT met'})")
        print(" k  alpha  tok/step    c     v(k)  speedup  predicted  refined  measured/refined  rule  loop")
        best, runs = None, []
        for k in args.k:
            r = speculative_run(target, draft, prompts, k, args.new_tokens, base, temperature=temperature)
            runs.append(r)
            print(f"{k:2d}  {r.alpha:5.3f}  {r.tokens_per_step:8.2f}  {r.c:5.3f}  {r.v:5.2f}  {r.speedup:7.2f}"
                  f"  {r.predicted:9.2f}  {r.refined:7.2f}  {r.speedup / r.refined:16.2f}"
                  f"  {r.verify_share:4.0%}  {r.loop_share:4.0%}")
            if best is None or r.speedup > best.speedup:
                best = r
        goal = f" (goal >= 1.5x greedy: {'met' if best.speedup >= 1.5 else 'NOT met'})" if temperature == 0 else ""
        print(f"best k = {best.k}: speedup {best.speedup:.2f}x{goal}")
        ratios = [r.speedup / r.refined for r in runs]
        print(f"measured / refined: {min(ratios):.2f}-{max(ratios):.2f} (goal >= 0.9: "
              f"{'met' if min(ratios) >= 0.9 else 'NOT met'} at every k)")


if __name__ == "__main__":
    main()
