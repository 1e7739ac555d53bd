"""Chain vs static vs dynamic draft trees on the bundled pair: tokens per target pass and speedup.

For each configuration, one run over the same held-out prompts (greedy, then
temperature 1): tokens verified per target pass (k for a chain, the node count
for a tree), tokens emitted per target pass, draft passes per target pass, wall
time, and the speedup over plain decoding of the same prompts. Greedy outputs are
checked token for token against plain greedy decoding.

    python benchmarks/bench_tree.py [--device cuda] [--prompts 8] [--new-tokens 128] [--threads 1]
"""

from __future__ import annotations

import argparse
import time

import torch

from specref.decoding.chain import generate, speculative_generate
from specref.decoding.tree import tree_generate
from specref.drafts.shapes import DynamicTree, TreeShape
from specref.models.pair import heldout_prompts, load_pair
from specref.perf.machine import machine_name
from specref.timing import sync

CONFIGS: list[tuple[str, dict]] = [
    ("chain k=2", {"k": 2}),
    ("chain k=4", {"k": 4}),
    ("chain k=6", {"k": 6}),
    ("tree (2,2) top-k", {"tree": TreeShape((2, 2))}),
    ("tree (2,1,1,1) top-k", {"tree": TreeShape((2, 1, 1, 1))}),
    ("tree (3,2,1) top-k", {"tree": TreeShape((3, 2, 1))}),
    ("tree (2,2) sampled", {"tree": TreeShape((2, 2), sampled=True)}),
    ("dynamic 6 nodes", {"tree": DynamicTree(6, max_depth=6, top_k=3, beam=3)}),
    ("dynamic 10 nodes", {"tree": DynamicTree(10, max_depth=6, top_k=3, beam=3)}),
    ("dynamic 16 nodes", {"tree": DynamicTree(16, max_depth=8, top_k=4, beam=4)}),
]




def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    ap.add_argument("--prompts", type=int, default=8)
    ap.add_argument("--prompt-tokens", type=int, default=64)
    ap.add_argument("--new-tokens", type=int, default=128)
    ap.add_argument("--threads", type=int, default=1, help="torch CPU threads (0: torch's default)")
    ap.add_argument("--temperatures", type=float, nargs="+", default=[0.0, 1.0])
    args = ap.parse_args()
    if args.threads:
        torch.set_num_threads(args.threads)
    dev = torch.device(args.device)

    target, draft, _ = load_pair(device=dev)
    prompts = [torch.tensor([p], device=dev) for p in heldout_prompts(args.prompts, args.prompt_tokens)]
    machine = machine_name(dev)
    print(f"machine: {machine}; torch {torch.__version__}; device {dev}; threads {torch.get_num_threads()}")
    print(f"pair: target {target.config.n_layer}x{target.config.n_embd}, draft {draft.config.n_layer}"
          f"x{draft.config.n_embd} (layers x width), float32; {args.prompts} held-out prompts of {args.prompt_tokens} "
          f"tokens, {args.new_tokens} new tokens each; one run per configuration")

    with torch.no_grad():
        speculative_generate(target, draft, prompts[0], k=2, max_new_tokens=8, temperature=0)  # warm-up
        for temperature in args.temperatures:
            plain_out, plain_t = [], 0.0
            for i, ids in enumerate(prompts):
                g = torch.Generator(device=dev).manual_seed(i)
                sync(dev)
                t0 = time.perf_counter()
                plain_out.append(generate(target, ids, args.new_tokens, temperature=temperature, generator=g))
                sync(dev)
                plain_t += time.perf_counter() - t0
            name = "greedy" if temperature == 0 else f"temperature {temperature:g}"
            n_tok = args.prompts * args.new_tokens
            print(f"\n{name}: plain decoding {plain_t:.2f} s ({n_tok / plain_t:.0f} tokens/s), "
                  f"1.00 tokens per target pass")
            print(f"{'configuration':22s} {'verified/pass':>13s} {'tokens/pass':>11s} {'draft passes/pass':>17s} "
                  f"{'time s':>7s} {'speedup':>7s}  greedy output")
            for label, kw in CONFIGS:
                if temperature == 0 and isinstance(kw.get("tree"), TreeShape) and kw["tree"].sampled:
                    continue  # sampled children only make sense when sampling
                steps = nodes = emitted = passes = draft_passes = 0
                total = 0.0
                same = True
                for i, ids in enumerate(prompts):
                    g = torch.Generator(device=dev).manual_seed(1000 + i)
                    sync(dev)
                    t0 = time.perf_counter()
                    decode = tree_generate if "tree" in kw else speculative_generate
                    out, s = decode(target, draft, ids, max_new_tokens=args.new_tokens,
                                    temperature=temperature, generator=g, **kw)
                    sync(dev)
                    total += time.perf_counter() - t0
                    steps += s.steps
                    nodes += s.proposed
                    emitted += s.emitted
                    passes += s.target_passes
                    draft_passes += s.draft_passes
                    same = same and torch.equal(out, plain_out[i])
                check = ("identical" if same else "DIFFERS") if temperature == 0 else "-"
                print(f"{label:22s} {nodes / steps:13.2f} {emitted / steps:11.2f} {draft_passes / steps:17.2f} "
                      f"{total:7.2f} {plain_t / total:6.2f}x  {check}")


if __name__ == "__main__":
    main()
