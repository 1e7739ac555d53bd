"""Vectorized Monte-Carlo sampler vs a plain per-run Python loop, on the chapter's toy.

The toy: vocabulary 6, k = 4, the first 3 tokens after start token 0. A "sample" is
one run, i.e. one 3-token sequence. The vectorized sampler (`specref.checks.montecarlo.simulate`)
does all runs at once and loops only over steps; the loop runs one speculative
generation at a time with the same chains and the same `verify_chain`. The loop is
timed on fewer runs and reported in samples/s, the same unit. Both outputs are checked
against the target's exact joint with `distribution_test` (chi-square, alpha = 1e-3).

    .venv/bin/python benchmarks/bench_montecarlo.py [--runs 40000] [--loop-runs 1000] [--device cpu] [--threads 1]
"""

from __future__ import annotations

import argparse
import time

import torch

from specref.chain_verify import verify_chain
from specref.checks.montecarlo import distribution_test, simulate
from specref.checks.toy import MarkovChain, toy_pair
from specref.perf.machine import machine_name

V, K, N_TOKENS, START = 6, 4, 3, 0


def loop_sampler(target: MarkovChain, draft: MarkovChain, runs: int, generator: torch.Generator) -> torch.Tensor:
    """One run at a time: propose, score, verify, append, until 3 tokens are out."""
    out = torch.empty((runs, N_TOKENS), dtype=torch.long)
    for r in range(runs):
        tokens = [START]
        while len(tokens) < N_TOKENS + 1:
            context = torch.tensor([[tokens[-1]]], device=target.transition.device)
            drafts, q = draft.propose(context, K, generator)
            p = target.score(context, drafts)
            emitted, _ = verify_chain(drafts[0], q[0], p[0], generator)
            tokens.extend(emitted.tolist())
        out[r] = torch.tensor(tokens[1 : N_TOKENS + 1])
    return out


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)




def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=40_000, help="runs of the vectorized sampler")
    parser.add_argument("--loop-runs", type=int, default=1_000, help="runs of the per-run loop (extrapolated)")
    parser.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    parser.add_argument(
        "--threads", type=int, default=1, help="torch intra-op threads; 0 keeps torch's default (see benchmarks/README.md)"
    )
    parser.add_argument("--repeats", type=int, default=5, help="timed repeats of the vectorized sampler (best is kept)")
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()
    if args.threads:
        torch.set_num_threads(args.threads)
    device = torch.device(args.device)

    target_cpu, draft_cpu = toy_pair(torch.Generator().manual_seed(args.seed), vocab_size=V)
    target, draft = (MarkovChain(c.transition.to(device)) for c in (target_cpu, draft_cpu))
    expected = target_cpu.joint(START, N_TOKENS)

    def gen(offset: int) -> torch.Generator:
        return torch.Generator(device=device).manual_seed(args.seed + offset)

    simulate(target, draft, START, K, N_TOKENS, 1000, gen(1))  # warm-up (allocator, kernels)
    best = float("inf")
    for i in range(args.repeats):
        _sync(device)
        t0 = time.perf_counter()
        sim = simulate(target, draft, START, K, N_TOKENS, args.runs, gen(2 + i))
        _sync(device)
        best = min(best, time.perf_counter() - t0)
    vec_rate = args.runs / best
    vec_test = distribution_test(expected, samples=sim.tokens.cpu())

    loop_sampler(target, draft, 10, gen(100))  # warm-up
    _sync(device)
    t0 = time.perf_counter()
    loop_tokens = loop_sampler(target, draft, args.loop_runs, gen(101))
    _sync(device)
    loop_time = time.perf_counter() - t0
    loop_rate = args.loop_runs / loop_time
    loop_test = distribution_test(expected, samples=loop_tokens)

    gpu = f" ({torch.cuda.get_device_name(device)})" if device.type == "cuda" else ""
    threads = torch.get_num_threads()
    print(f"machine: {machine_name(device)}, {threads} torch threads, torch {torch.__version__}, device {device}{gpu}")
    print(f"toy: V={V}, k={K}, first {N_TOKENS} tokens from start token {START}")
    print(f"vectorized: {args.runs} runs in {best * 1e3:.1f} ms (best of {args.repeats}) -> {vec_rate:,.0f} samples/s")
    print(f"  check vs exact joint: {vec_test}")
    print(f"loop:       {args.loop_runs} runs in {loop_time:.2f} s -> {loop_rate:,.0f} samples/s "
          f"(extrapolated to {args.runs} runs: {args.runs / loop_rate:.1f} s)")
    print(f"  check vs exact joint: {loop_test}")
    print(f"speedup: {vec_rate / loop_rate:,.0f}x")


if __name__ == "__main__":
    main()
