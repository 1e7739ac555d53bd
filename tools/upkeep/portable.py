"""Rerun the unit tests and the checked notebooks under numeric environments that round like other CPUs.

    python tools/upkeep/portable.py -- notebooks solutions --nbval ...     # make test-portable
    python tools/upkeep/portable.py --fingerprint                          # one line: this process's fingerprints

A learner's CPU may have other vector units than ours (AVX2 only, AVX-512, another vendor), and
the numeric libraries pick their kernels by what they find: torch's MKL and ATen for the models,
numpy's and scipy's OpenBLAS for fits and solvers. Their float results then differ in the last
bits, and so does anything derived from them: a sample drawn from a float32 softmax, a near-tied
argmax, where an iterative solver stops. No checked result may depend on any of that.

Each environment below forces another code path on this machine. We cannot borrow a learner's CPU,
but we can make this one round like a different one. Before an environment counts, it must prove
that it really changes results here: one of two fingerprints under it must differ from the native
one, torch's (a hash of the bundled pair's float32 logits, at the thread count the tests use) or
numpy/scipy's (a least-squares fit, `nnls`, an iterative `least_squares` solve, a matrix product).
An environment that changes neither is reported "no effect here: not counted", one whose process
dies (a kernel this CPU cannot execute: forcing OpenBLAS's AVX-512 kernels on a CPU without
AVX-512 is an illegal instruction) is reported "cannot run on this CPU: not counted"; if none
counts, the check fails, because it would prove nothing.

What runs under each counted environment (the rule, stated once, in `unit_test_run`):
* the unit tests: every test in tests/ except those marked ``browser`` or ``fresh_clone`` (a
  page in Chromium, a second set-up: no numerics of ours) and ``grader`` (they grade in kernels
  whose environment specref_grading builds itself, so the variables under test never reach them;
  the solutions they grade are in the next item). tests/test_portable.py's survey of the
  environments skips itself inside one (``SPECREF_PORTABLE_ENV`` is set there);
* the notebooks and solutions, under strict nbval (the pytest arguments after ``--``).

An environment that changes only numpy/scipy's results and one that changes only torch's share a test run
(`plan_runs`): their variables act on different libraries, so the run rounds like a CPU that differs in both,
each perturbation is still under test, and the suite runs half as often. A pair whose combined fingerprints do
not differ in both parts runs apart; ``--separately`` gives every environment a run of its own.
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

ROOT = Path(__file__).resolve().parents[2]
THREADS_ENV = "SPECREF_THREADS"  # torch threads the tests use (tests/conftest.py; default 1)
UNIT_MARKERS = "not browser and not fresh_clone and not grader"
INSIDE_ENV = "SPECREF_PORTABLE_ENV"  # set to the environment's name in the processes run under it


@dataclass(frozen=True)
class Environment:
    variables: dict[str, str]
    library: str  # what it is meant to perturb: "numpy/scipy", "torch" or "threads"


# OPENBLAS_CORETYPE forces one of OpenBLAS's kernel sets (numpy and scipy each bundle an OpenBLAS
# built for many CPUs); MKL_* change MKL's BLAS kernels (torch's matmuls); ATEN_CPU_CAPABILITY
# changes PyTorch's own vectorised kernels (softmax, layer norm, GELU); thread counts change how
# reductions are split. Natively numpy's OpenBLAS runs on every core; torch runs on one thread in the
# tests and notebooks (they set it), so "one-thread" is the one-against-several comparison there is.
ENVIRONMENTS: dict[str, Environment] = {
    "openblas-haswell": Environment({"OPENBLAS_CORETYPE": "Haswell"}, "numpy/scipy"),
    "openblas-skylakex": Environment({"OPENBLAS_CORETYPE": "SkylakeX"}, "numpy/scipy"),
    "openblas-zen": Environment({"OPENBLAS_CORETYPE": "Zen"}, "numpy/scipy"),
    "openblas-sandybridge": Environment({"OPENBLAS_CORETYPE": "Sandybridge"}, "numpy/scipy"),
    "mkl-compatible": Environment({"MKL_CBWR": "COMPATIBLE"}, "torch"),
    "mkl-avx2": Environment({"MKL_ENABLE_INSTRUCTIONS": "AVX2"}, "torch"),
    "mkl-sse4_2": Environment({"MKL_ENABLE_INSTRUCTIONS": "SSE4_2"}, "torch"),
    "aten-avx2": Environment({"ATEN_CPU_CAPABILITY": "avx2"}, "torch"),
    "aten-no-simd": Environment({"ATEN_CPU_CAPABILITY": "default"}, "torch"),
    "one-thread": Environment({"OMP_NUM_THREADS": "1", "MKL_NUM_THREADS": "1", "OPENBLAS_NUM_THREADS": "1"},
                              "threads"),
}


def torch_fingerprint() -> str:
    """A hash of float32 logits of the bundled target and draft: prompt passes and one cached step."""
    import torch

    from specref import load_pair
    from specref.models.pair import heldout_prompts

    torch.set_num_threads(int(os.environ.get(THREADS_ENV, "1")))  # as tests/conftest.py does
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


def numpy_fingerprint() -> str:
    """A hash of what numpy's and scipy's BLAS and LAPACK compute: a product, lstsq, nnls, an iterative solve."""
    import numpy as np
    from scipy.optimize import least_squares, nnls

    from specref.perf.costmodel import PassModel

    rng = np.random.default_rng(0)
    A = rng.standard_normal((300, 60))  # [300, 60]
    b = rng.standard_normal(300)  # [300]
    h = hashlib.sha256()
    h.update((A @ A.T).tobytes())
    h.update(np.linalg.lstsq(A, b, rcond=None)[0].tobytes())
    h.update(nnls(np.abs(A), np.abs(b))[0].tobytes())
    h.update(least_squares(lambda x: np.tanh(A @ x) - b / 2, np.zeros(60)).x.tobytes())
    rows = [(B, T, S, (0.005 + 1e-4 * B * T + 2e-9 * B * S) * (1 + 0.05 * rng.standard_normal()))
            for B in (1, 8, 64) for T in (1, 3, 9) for S in (64, 192)]
    fitted = PassModel.fit(rows)  # both forms: nnls, then least_squares from three starts
    h.update(repr(fitted.as_dict()).encode())
    return h.hexdigest()[:16]


def fingerprint() -> str:
    return f"torch:{torch_fingerprint()} numpy:{numpy_fingerprint()}"


@dataclass(frozen=True)
class Fingerprint:
    torch: str | None
    numpy: str | None
    error: str = ""  # why there is none (the process died), else ""


def fingerprint_under(env: dict[str, str]) -> Fingerprint:
    """The fingerprints in a fresh interpreter with `env` added (the variables act when the libraries load)."""
    out = subprocess.run([sys.executable, __file__, "--fingerprint"], env={**os.environ, **env}, cwd=ROOT,
                         capture_output=True, text=True, timeout=300)
    if out.returncode != 0:
        died = f"killed by signal {-out.returncode}" if out.returncode < 0 else f"exit {out.returncode}"
        last = (out.stderr.strip().splitlines() or [""])[-1]
        return Fingerprint(None, None, f"{died}{': ' + last if last else ''}")
    parts = dict(p.split(":", 1) for p in out.stdout.split())
    return Fingerprint(parts["torch"], parts["numpy"])


def unit_test_run(extra: list[str]) -> list[str]:
    """pytest's arguments for the unit tests an environment reruns (see the module docstring)."""
    return ["tests", "-m", UNIT_MARKERS, *extra]


@dataclass
class Outcome:
    name: str
    changes: tuple[str, ...]  # the fingerprints the environment changes here: ("torch", "numpy"), or ()
    error: str = ""  # the environment cannot run here
    units: int | None = None  # pytest's exit status on the unit tests, None when not run
    notebooks: int | None = None  # and on the notebooks
    tail: str = ""
    run_with: tuple[str, ...] = ()  # the other environments whose variables were set in the same run

    @property
    def counted(self) -> bool:
        return bool(self.changes) and not self.error

    @property
    def passed(self) -> bool:
        return self.units in (0, None) and self.notebooks in (0, None)


def _pytest(args: list[str], env: dict[str, str], name: str) -> tuple[int, str]:
    cmd = [sys.executable, "-m", "pytest", "-p", "no:cacheprovider", "-q", *args]
    proc = subprocess.run(cmd, env={**os.environ, **env, INSIDE_ENV: name}, cwd=ROOT, capture_output=True, text=True)
    return proc.returncode, (proc.stdout + proc.stderr)[-6000:]


def survey(name: str, native: Fingerprint) -> Outcome:
    """What the environment changes here, without running any test."""
    fp = fingerprint_under(ENVIRONMENTS[name].variables)
    if fp.error:
        return Outcome(name, (), error=fp.error)
    return Outcome(name, tuple(part for part in ("torch", "numpy") if getattr(fp, part) != getattr(native, part)))


def variables_of(group: tuple[str, ...]) -> dict[str, str]:
    return {k: v for name in group for k, v in ENVIRONMENTS[name].variables.items()}


def plan_runs(outcomes: list[Outcome], native: Fingerprint) -> list[tuple[str, ...]]:
    """The test runs: an environment that changes only numpy/scipy shares a run with one that changes only torch.

    The two sets of variables act on different libraries, so the run perturbs both at once, as a learner's CPU
    does, and each environment's perturbation is still under test. A pair is kept only when its combined
    fingerprints differ from the native ones in both parts; otherwise each runs alone."""
    counted = [o for o in outcomes if o.counted]
    numpy_only = [o.name for o in counted if o.changes == ("numpy",)]
    torch_only = [o.name for o in counted if o.changes == ("torch",)]
    runs: list[tuple[str, ...]] = [(o.name,) for o in counted if o.name not in numpy_only + torch_only]
    for pair in zip(numpy_only, torch_only):
        fp = fingerprint_under(variables_of(pair))
        both = not fp.error and fp.torch != native.torch and fp.numpy != native.numpy
        runs.extend([pair] if both else [(name,) for name in pair])
    n = min(len(numpy_only), len(torch_only))
    runs.extend((name,) for name in numpy_only[n:] + torch_only[n:])
    return runs


def run_group(group: tuple[str, ...], notebook_args: list[str], units: bool) -> tuple[int | None, int | None, str]:
    """(unit tests' exit status, notebooks' exit status, the failing output) under the group's variables."""
    env, name = variables_of(group), "+".join(group)
    tails, unit_code, notebook_code = [], None, None
    if units:
        unit_code, tail = _pytest(unit_test_run([]), env, name)
        tails.append(tail if unit_code else "")
    if notebook_args:
        notebook_code, tail = _pytest(notebook_args, env, name)
        tails.append(tail if notebook_code else "")
    return unit_code, notebook_code, "\n".join(t for t in tails if t)


def _verdict(code: int | None) -> str:
    return "-" if code is None else "passed" if code == 0 else f"FAILED ({code})"


def report(outcomes: list[Outcome]) -> list[str]:
    lines = [f"  {'environment':21s} {'variables':58s} {'changes here':13s} {'unit tests':11s} notebooks"]
    for o in outcomes:
        env = " ".join(f"{k}={v}" for k, v in ENVIRONMENTS[o.name].variables.items())
        if o.error:
            lines.append(f"  {o.name:21s} {env:58s} {'-':13s} cannot run on this CPU ({o.error}): not counted")
        elif not o.changes:
            lines.append(f"  {o.name:21s} {env:58s} {'nothing':13s} no effect here: not counted")
        else:
            together = f"  (in one run with {', '.join(o.run_with)})" if o.run_with else ""
            lines.append(f"  {o.name:21s} {env:58s} {'+'.join(o.changes):13s} {_verdict(o.units):11s} "
                         f"{_verdict(o.notebooks)}{together}")
    return lines


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--fingerprint", action="store_true", help="print this process's fingerprints and exit")
    parser.add_argument("--jobs", type=int, default=2, help="test runs side by side (default 2)")
    parser.add_argument("--only", action="append", choices=sorted(ENVIRONMENTS), help="run only these")
    parser.add_argument("--separately", action="store_true",
                        help="one run per environment (default: a numpy/scipy one and a torch one share a run)")
    parser.add_argument("--no-unit-tests", action="store_true", help="rerun only the notebooks")
    parser.add_argument("notebook_args", nargs="*", help="after --: what pytest runs as notebooks (and nbval flags)")
    args = parser.parse_args(argv)
    if args.fingerprint:
        print(fingerprint())
        return 0
    if not args.notebook_args and args.no_unit_tests:
        parser.error("nothing to run: give the notebooks after -- or drop --no-unit-tests")
    native = fingerprint_under({})
    if native.error or fingerprint_under({}) != native:
        print(f"portable: the native fingerprints differ between two runs or fail ({native.error or 'unstable'}); "
              "nothing can be compared", file=sys.stderr)
        return 1
    names = args.only or list(ENVIRONMENTS)
    with ThreadPoolExecutor(max_workers=max(1, args.jobs)) as pool:
        outcomes = list(pool.map(lambda n: survey(n, native), names))
    runs = ([(o.name,) for o in outcomes if o.counted] if args.separately else plan_runs(outcomes, native))
    print(f"portable: native fingerprints torch {native.torch}, numpy/scipy {native.numpy}; "
          f"{len(names)} environments, {len(runs)} test runs, {args.jobs} at a time; unit tests: pytest "
          f"{' '.join(unit_test_run([]))}", flush=True)
    with ThreadPoolExecutor(max_workers=max(1, args.jobs)) as pool:
        results = list(pool.map(lambda g: run_group(g, args.notebook_args, not args.no_unit_tests), runs))
    by_name = {o.name: o for o in outcomes}
    for group, (unit_code, notebook_code, tail) in zip(runs, results):
        for name in group:
            o = by_name[name]
            o.units, o.notebooks, o.tail = unit_code, notebook_code, tail
            o.run_with = tuple(n for n in group if n != name)
    failed = [o for o in outcomes if o.counted and not o.passed]
    for group, (unit_code, notebook_code, tail) in zip(runs, results):
        if unit_code or notebook_code:
            print(f"\n---- {' + '.join(group)} {variables_of(group)}: unit tests {_verdict(unit_code)}, "
                  f"notebooks {_verdict(notebook_code)} ----\n{tail}")
    print("\nportable:")
    print("\n".join(report(outcomes)))
    counted = [o for o in outcomes if o.counted]
    if not counted:
        print("portable: no environment changes results on this machine: portability NOT checked")
        return 1
    libraries = sorted({ENVIRONMENTS[o.name].library for o in counted})
    print(f"portable: {len(counted) - len(failed)} of {len(counted)} environments that change results here passed "
          f"(they perturb {', '.join(libraries)}) in {len(runs)} test runs")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
