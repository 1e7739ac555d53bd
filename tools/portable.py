"""Rerun the checked notebooks under numeric environments that change float32 results, as other CPUs do.

    python tools/portable.py -- notebooks solutions --nbval ...     # make test-portable
    python tools/portable.py --fingerprint                          # one line: the float32 fingerprint here

A learner's CPU may have other vector units than ours (AVX2 only, AVX-512, another vendor), and
MKL and ATen pick their kernels by what they find. Their float32 results then differ in the last
bits, and so does anything derived from them: a sample drawn from a float32 softmax, a near-tied
argmax. A checked notebook output must not depend on any of that.

Each environment below forces another code path on this machine. We cannot borrow a learner's CPU,
but we can make this one round like a different one. Before an environment counts, it must prove
that it really perturbs float32 results here: the fingerprint (a hash of the bundled pair's
float32 logits) under it must differ from the native one. An environment that changes nothing on
this machine is reported as such and not counted as a pass; if none perturbs, the check fails,
because it would prove nothing.
"""

from __future__ import annotations

import argparse
import hashlib
import os
import subprocess
import sys
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]

# name -> environment variables. MKL_* change MKL's BLAS kernels (matmuls); ATEN_CPU_CAPABILITY
# changes PyTorch's own vectorised kernels (softmax, layer norm, GELU); one thread changes how
# reductions are split.
ENVIRONMENTS: dict[str, dict[str, str]] = {
    "mkl-compatible": {"MKL_CBWR": "COMPATIBLE"},
    "mkl-avx2": {"MKL_ENABLE_INSTRUCTIONS": "AVX2"},
    "mkl-sse4_2": {"MKL_ENABLE_INSTRUCTIONS": "SSE4_2"},
    "aten-avx2": {"ATEN_CPU_CAPABILITY": "avx2"},
    "aten-no-simd": {"ATEN_CPU_CAPABILITY": "default"},
    "one-thread": {"OMP_NUM_THREADS": "1", "MKL_NUM_THREADS": "1"},
}


def fingerprint() -> str:
    """A hash of float32 logits of the bundled target and draft: prompt passes and one cached step."""
    import torch

    from specref import load_pair
    from specref.models.pair import heldout_prompts

    target, draft, _ = load_pair()
    ids = torch.tensor(heldout_prompts(n=4, n_tokens=48))  # [4, 48]
    h = hashlib.sha256()
    with torch.no_grad():
        for model in (target, draft):
            h.update(model(ids).numpy().tobytes())  # [4, 48, V]: matmuls over many tokens
            cache = model.new_cache(1)
            model(ids[:1, :-1], cache=cache)
            h.update(model(ids[:1, -1:], cache=cache).numpy().tobytes())  # one decode step: matrix-vector work
    return h.hexdigest()[:16]


def fingerprint_under(env: dict[str, str]) -> str:
    """The fingerprint in a fresh interpreter with `env` added (the variables act when torch loads)."""
    out = subprocess.run([sys.executable, __file__, "--fingerprint"], env={**os.environ, **env}, cwd=ROOT,
                         capture_output=True, text=True, timeout=300)
    if out.returncode != 0:
        raise RuntimeError(f"fingerprint under {env} failed:\n{out.stderr[-2000:]}")
    return out.stdout.strip()


@dataclass
class Outcome:
    name: str
    perturbs: bool
    returncode: int | None = None  # pytest's, None when not run
    tail: str = ""


def run_environment(name: str, native: str, pytest_args: list[str]) -> Outcome:
    env = ENVIRONMENTS[name]
    if fingerprint_under(env) == native:
        return Outcome(name, perturbs=False)
    cmd = [sys.executable, "-m", "pytest", "-p", "no:cacheprovider", "-q", *pytest_args]
    proc = subprocess.run(cmd, env={**os.environ, **env}, cwd=ROOT, capture_output=True, text=True)
    return Outcome(name, True, proc.returncode, (proc.stdout + proc.stderr)[-6000:])


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--fingerprint", action="store_true", help="print this process's fingerprint and exit")
    parser.add_argument("--jobs", type=int, default=2, help="environments run side by side (default 2)")
    parser.add_argument("--only", action="append", choices=sorted(ENVIRONMENTS), help="run only these")
    parser.add_argument("pytest_args", nargs="*", help="after --: what pytest runs (notebooks and nbval flags)")
    args = parser.parse_args(argv)
    if args.fingerprint:
        print(fingerprint())
        return 0
    if not args.pytest_args:
        parser.error("give pytest's arguments after --, e.g. -- notebooks solutions --nbval")
    native = fingerprint_under({})
    if fingerprint_under({}) != native:
        print("portable: the native fingerprint differs between two runs; nothing can be compared", file=sys.stderr)
        return 1
    names = args.only or list(ENVIRONMENTS)
    print(f"portable: native float32 fingerprint {native}; {len(names)} environments, {args.jobs} at a time", flush=True)
    with ThreadPoolExecutor(max_workers=max(1, args.jobs)) as pool:
        outcomes = list(pool.map(lambda n: run_environment(n, native, args.pytest_args), names))
    failed = [o for o in outcomes if o.perturbs and o.returncode != 0]
    for o in failed:
        print(f"\n---- {o.name} {ENVIRONMENTS[o.name]}: pytest exited {o.returncode} ----\n{o.tail}")
    print("\nportable: environment           perturbs float32 here   notebooks")
    for o in outcomes:
        env = " ".join(f"{k}={v}" for k, v in ENVIRONMENTS[o.name].items())
        verdict = "not run (no effect here: not counted)" if not o.perturbs else (
            "passed" if o.returncode == 0 else f"FAILED (pytest exit {o.returncode})")
        print(f"  {o.name:14s} {env:40s} {'yes' if o.perturbs else 'no':5s} {verdict}")
    counted = [o for o in outcomes if o.perturbs]
    if not counted:
        print("portable: no environment perturbs float32 results on this machine: portability NOT checked")
        return 1
    print(f"portable: {len(counted) - len(failed)} of {len(counted)} perturbing environments passed")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
