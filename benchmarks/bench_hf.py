"""specref against Hugging Face's assisted generation on the same pair: greedy, float32, one thread, k = 4.

The bundled pair, converted with `specref.perf.hf.to_hf` (the harness notebook 08 uses), runs on
held-out prompts three ways: specref's greedy speculative decoding with the model draft, and HF's
`generate(..., assistant_model=draft)` at a constant k = 4 with `assistant_confidence_threshold`
at its default (HF stops a draft early when the draft's own probability falls below it) and
switched off (0). Target passes are counted on both sides by wrapping the target's forward
(specref's prefill is its own pass; HF folds the prompt into its first verification), and each
configuration is timed `--repeats` times, interleaved prompt by prompt so that drift on the host
hits all three alike. Reported per configuration: target passes, tokens per step, drafts per step,
tokens per second (median over repeats of the whole prompt set) and the spread, whether its text
equals specref's, and whether scikit-learn was installed (HF adapts the threshold only then).

Goal: greedy speculative decoding >= 2x HF assisted generation at k = 4, threshold off
(tokens per second, one run).

`--floor` adds the kernel-only floor: specref's prompt set run once under `torch.profiler`, the self
CPU time of its aten ops summed (the arithmetic and the tensor bookkeeping, none of the Python around
them; the profiler's own cost per op is included, so the floor is an upper bound), beside HF's total
with the threshold off: the ratio that zero Python overhead in specref would reach.

    python benchmarks/bench_hf.py [--prompts 8] [--prompt-tokens 32] [--new-tokens 64] [--repeats 3] [--floor]
"""

from __future__ import annotations

import argparse
import copy
import statistics
from collections.abc import Callable

import torch

from specref.models.pair import heldout_prompts, load_pair
from specref.perf import hf
from specref.perf.machine import machine_name

GOAL = 2.0


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--prompts", type=int, default=8)
    ap.add_argument("--prompt-tokens", type=int, default=32)
    ap.add_argument("--new-tokens", type=int, default=64)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--k", type=int, default=4)
    ap.add_argument("--floor", action="store_true", help="also measure specref's kernel-only floor (torch.profiler)")
    args = ap.parse_args()
    missing = hf.hf_missing()
    if missing is not None:
        raise SystemExit(f"bench_hf needs transformers with assisted generation: {missing}")
    import transformers

    torch.set_num_threads(1)
    target, draft, _ = load_pair(dtype=torch.float32)
    hf_target, hf_draft = hf.to_hf(target), hf.to_hf(copy.deepcopy(draft))
    prompts = heldout_prompts(n=args.prompts, n_tokens=args.prompt_tokens)
    n, k = args.new_tokens, args.k
    configs = {
        "specref": lambda pr: hf.specref_generate(target, pr, n, draft=draft, k=k),
        "HF, threshold default": lambda pr: hf.hf_generate(hf_target, pr, n, draft=hf_draft, k=k,
                                                           confidence_threshold=None),
        "HF, threshold off": lambda pr: hf.hf_generate(hf_target, pr, n, draft=hf_draft, k=k,
                                                       confidence_threshold=0.0),
    }
    print(f"machine: {machine_name('cpu')}; torch {torch.__version__}, transformers {transformers.__version__}, "
          f"one thread, float32, greedy, k = {k}; scikit-learn installed (HF adapts its threshold): "
          f"{hf.sklearn_present()}")
    print(f"{len(prompts)} held-out prompts of {args.prompt_tokens} tokens, {n} new tokens each, "
          f"{args.repeats} timed repeats after one warm-up")
    runs = {name: [run(pr) for pr in prompts] for name, run in configs.items()}  # warm-up, and the counts
    seconds = {name: [0.0] * args.repeats for name in configs}
    for r in range(args.repeats):
        for pr in prompts:
            for name, run in configs.items():
                seconds[name][r] += run(pr).seconds
    ours = runs["specref"]
    tps = {name: len(prompts) * n / statistics.median(ts) for name, ts in seconds.items()}
    print(f"{'configuration':24s} {'passes':>7s} {'steps':>6s} {'tokens/step':>12s} {'drafts/step':>12s} "
          f"{'tokens/s':>9s} {'spread (s)':>14s}  same text as specref")
    for name, rs in runs.items():
        steps = sum(x.steps for x in rs)
        drafted = [d for x in rs for d in x.drafted]
        same = sum(torch.equal(a.new_tokens, b.new_tokens) for a, b in zip(rs, ours))
        ts = seconds[name]
        print(f"{name:24s} {sum(x.target_passes for x in rs):7d} {steps:6d} {len(prompts) * n / steps:12.2f} "
              f"{statistics.mean(drafted):12.2f} {tps[name]:9.0f} {min(ts):6.2f}-{max(ts):<6.2f}  "
              f"{same} of {len(prompts)}")
    for name in ("HF, threshold default", "HF, threshold off"):
        print(f"specref / {name}: {tps['specref'] / tps[name]:.2f}x tokens per second")
    ratio = tps["specref"] / tps["HF, threshold off"]
    print(f"goal: greedy speculative >= {GOAL:g}x HF assisted generation at k = {k}, threshold off: "
          f"{ratio:.2f}x -> {'met' if ratio >= GOAL else 'NOT met'}")
    if args.floor:
        floor = kernel_floor(lambda: [configs["specref"](pr) for pr in prompts])
        hf_total = statistics.median(seconds["HF, threshold off"])
        print(f"kernel-only floor of specref's run: {floor:.3f} s of aten self CPU time (profiled) against "
              f"{statistics.median(seconds['specref']):.3f} s of wall time; HF, threshold off: {hf_total:.3f} s; "
              f"with zero overhead specref would reach at most {hf_total / floor:.2f}x")


def kernel_floor(run: Callable[[], object]) -> float:
    """Seconds of self CPU time of the aten ops in one call of `run`, by `torch.profiler` (its cost per op included)."""
    from torch.profiler import ProfilerActivity, profile

    with profile(activities=[ProfilerActivity.CPU]) as prof:
        run()
    return sum(e.self_cpu_time_total for e in prof.key_averages() if e.key.startswith("aten::")) / 1e6


if __name__ == "__main__":
    main()
