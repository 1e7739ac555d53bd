"""Is this machine ready for the course? ``python -m specref`` answers in a few seconds.

Each check returns a `Check` with a status: ``ok``, ``warn`` (works, but not as
tested) or ``FAIL`` (a notebook will break). The report ends with one verdict
line and the process exits non-zero if any check failed, so scripts and CI can
use it too. The self-check runs the real accept/reject rule through an exact
enumeration of every outcome of one speculative step: a broken install or a
broken rule shows up here before it shows up in a notebook.
"""

from __future__ import annotations

import importlib
import json
import platform
import sys
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from importlib import metadata
from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from packaging.requirements import Requirement

OK, WARN, FAIL = "ok", "warn", "FAIL"
MIN_PYTHON = (3, 10)
# Packages the course needs, in the order the report lists them.
PACKAGES = ("torch", "numpy", "scipy", "matplotlib", "ipywidgets", "jupyterlab", "tokenizers", "safetensors", "tqdm")
# Checked by version only: importing JupyterLab's server takes seconds and a kernel never does it.
NOT_IMPORTED = ("jupyterlab",)
WIDGET_EXTENSION = "@jupyter-widgets/jupyterlab-manager"
SELF_CHECK_TOL = 1e-9  # two exact float64 computations of the same distribution agree far better than this
# A source checkout has the pinned versions next to the package; an installed wheel does not.
PIN_FILE = Path(__file__).resolve().parents[1] / "requirements" / "test.txt"


@dataclass(frozen=True)
class Check:
    name: str
    status: str  # OK, WARN or FAIL
    detail: str


# -- pins ------------------------------------------------------------------------------------
def read_requirements(path: Path) -> list[Requirement]:
    """The requirements in a pip requirements file, following ``-r`` includes (options skipped)."""
    from packaging.requirements import Requirement

    out: list[Requirement] = []
    for raw in Path(path).read_text().splitlines():
        line = raw.split(" #", 1)[0].strip()
        if not line or line.startswith("#"):
            continue
        if line.startswith(("-r ", "--requirement ")):
            out += read_requirements(Path(path).parent / line.split(None, 1)[1].strip())
        elif not line.startswith("-"):
            out.append(Requirement(line))
    return out


def pinned_versions(path: Path, python_version: str | None = None) -> dict[str, str]:
    """{canonical name: version} of the ``==`` pins whose markers hold for this (or the given) Python."""
    from packaging.utils import canonicalize_name

    env = None
    if python_version is not None:
        env = {"python_version": python_version, "python_full_version": python_version + ".0"}
    pins: dict[str, str] = {}
    for req in read_requirements(path):
        if req.marker is not None and not req.marker.evaluate(env):
            continue
        specs = list(req.specifier)
        if len(specs) != 1 or specs[0].operator != "==":
            raise ValueError(f"{path}: {req} is not an exact pin (one '==' specifier)")
        name = canonicalize_name(req.name)
        if name in pins:
            raise ValueError(f"{path}: {req.name} is pinned twice for Python {python_version or 'this'}")
        pins[name] = specs[0].version
    return pins


# -- checks ----------------------------------------------------------------------------------
def check_python() -> Check:
    v = sys.version_info
    detail = f"{platform.python_version()} ({sys.executable})"
    if v[:2] < MIN_PYTHON:
        return Check("python", FAIL, f"{detail}; the course needs Python {MIN_PYTHON[0]}.{MIN_PYTHON[1]}+")
    return Check("python", OK, detail)


def check_packages(pin_file: Path | None = PIN_FILE) -> list[Check]:
    """One line per package: installed version, and whether it is the tested pin."""
    pins: dict[str, str] = {}
    out: list[Check] = []
    if pin_file is not None and pin_file.is_file():
        try:
            pins = pinned_versions(pin_file)
        except Exception as e:  # a broken pin file should not hide the rest of the report
            out.append(Check("pins", WARN, f"could not read {pin_file}: {e}"))
    for name in PACKAGES:
        try:
            version = metadata.version(name)
            if name not in NOT_IMPORTED:
                importlib.import_module(name)
        except Exception as e:  # PackageNotFoundError, or an import that crashes
            out.append(Check(name, FAIL, f"cannot import ({type(e).__name__}: {e}); run `make venv`"))
            continue
        pin = pins.get(name)
        if pin is not None and version.split("+")[0] != pin:
            out.append(Check(name, WARN, f"{version}; the course is tested with {pin}"))
        else:
            out.append(Check(name, OK, version))
    return out


def check_device() -> Check:
    import torch

    if torch.cuda.is_available():
        i = torch.cuda.current_device()
        props = torch.cuda.get_device_properties(i)
        return Check("device", OK, f"CUDA: {props.name}, {props.total_memory / 2**30:.0f} GiB "
                                   f"(notebooks use it where they measure speed)")
    mps = getattr(torch.backends, "mps", None)
    if mps is not None and mps.is_available():
        return Check("device", OK, "Apple MPS available; notebooks run on the CPU")
    return Check("device", OK, f"CPU only ({torch.get_num_threads()} threads); every notebook runs on a CPU")


def check_widgets() -> Check:
    """Sliders need both the kernel side (ipywidgets) and JupyterLab's front-end extension."""
    try:
        import ipywidgets
        from jupyter_core.paths import jupyter_path
    except Exception as e:
        return Check("widgets", FAIL, f"cannot import ipywidgets/jupyter_core ({e})")
    for folder in jupyter_path("labextensions"):
        package = Path(folder) / WIDGET_EXTENSION / "package.json"
        if package.is_file():
            version = json.loads(package.read_text()).get("version", "?")
            return Check("widgets", OK, f"ipywidgets {ipywidgets.__version__}, JupyterLab extension "
                                        f"{WIDGET_EXTENSION} {version}")
    return Check("widgets", FAIL, f"JupyterLab extension {WIDGET_EXTENSION} not found (sliders would show "
                                  "as plain text); install jupyterlab_widgets in the environment that runs JupyterLab")


def check_assets() -> Check:
    """The bundled GPT-2 target/draft pair loads, shares one tokenizer, and runs a forward pass."""
    try:
        import torch

        from ..models.pair import load_pair
    except Exception as e:
        return Check("assets", FAIL, f"cannot import the model code ({type(e).__name__}: {e})")
    try:
        target, draft, tokenizer = load_pair()
    except Exception as e:
        return Check("assets", FAIL, f"bundled GPT-2 pair unusable ({type(e).__name__}: {e})")
    ids = torch.tensor([tokenizer.encode("def add(a, b):\n    return")])
    with torch.no_grad():
        logits = [m(ids) for m in (target, draft)]
    V = tokenizer.vocab_size
    if any(tuple(x.shape) != (1, ids.shape[1], V) or not torch.isfinite(x).all() for x in logits):
        return Check("assets", FAIL, "the bundled models load but a forward pass gives wrong shapes or non-finite logits")

    def size(m) -> str:
        n = sum(t.numel() for t in m.parameters())
        return f"{m.config.n_layer} layers x {m.config.n_embd}, {n / 1e6:.1f}M params"

    return Check("assets", OK, f"GPT-2 pair: target {size(target)}; draft {size(draft)}; tokenizer {V} tokens")


def self_check() -> Check:
    """Exact distribution of one speculative step (V = 4, k = 2) by enumeration vs the closed form.

    `verify_chain` is run on every cell of u-space (specref.checks.exact), the result must
    equal the proof's closed form, and the first emitted token must be distributed
    as p_1: the rule is exact. The chapter's worked case checks beta and the residual.
    """
    t0 = time.perf_counter()
    try:
        import torch

        from .. import chain_verify, rejection
        from ..checks import exact

        # The worked case: p = (0.6, 0.3, 0.1), q = (0.3, 0.6, 0.1) -> beta 0.7, residual (1, 0, 0).
        p1 = torch.tensor([0.6, 0.3, 0.1], dtype=torch.float64)
        q1 = torch.tensor([0.3, 0.6, 0.1], dtype=torch.float64)
        beta = float(rejection.acceptance_probability(p1, q1))
        res = rejection.residual(p1, q1)
        if abs(beta - 0.7) > SELF_CHECK_TOL or (res - torch.tensor([1.0, 0.0, 0.0], dtype=torch.float64)).abs().max() > SELF_CHECK_TOL:
            return Check("self-check", FAIL, f"worked case: beta = {beta:.6f} (want 0.7), residual = "
                                             f"{[round(x, 6) for x in res.tolist()]} (want [1, 0, 0])")

        g = torch.Generator().manual_seed(0)
        p = torch.rand(3, 4, generator=g, dtype=torch.float64) + 0.05
        q = torch.rand(2, 4, generator=g, dtype=torch.float64) + 0.05
        p, q = p / p.sum(-1, keepdim=True), q / q.sum(-1, keepdim=True)
        # Looked up at call time, so the check tests the rule the notebooks will call.
        got = exact.step_distribution(p, q, rule=chain_verify.verify_chain)
        want = exact.step_distribution_formula(p, q)
        err = max(abs(got.get(s, 0.0) - want.get(s, 0.0)) for s in set(got) | set(want))
        first = torch.zeros(4, dtype=torch.float64)
        for seq, w in got.items():
            first[seq[0]] += w
        err_first = float((first - p[0]).abs().max())
    except Exception as e:
        return Check("self-check", FAIL, f"the exact check crashed ({type(e).__name__}: {e})")
    seconds = time.perf_counter() - t0
    if err > SELF_CHECK_TOL or err_first > SELF_CHECK_TOL:
        return Check("self-check", FAIL, f"verify_chain is not exact: step distribution off by {err:.2e}, "
                                         f"first token off p by {err_first:.2e}")
    return Check("self-check", OK, f"one step (V=4, k=2) enumerated exactly: {len(got)} outcomes, "
                                   f"max error {max(err, err_first):.1e}, {seconds:.2f} s")


CHECKS: tuple[Callable[[], Check | list[Check]], ...] = (
    check_python, check_packages, check_device, check_widgets, check_assets, self_check,
)


def run_checks(checks: Sequence[Callable[[], Check | list[Check]]] | None = None) -> list[Check]:
    """Run `checks` (default: CHECKS, looked up now) and collect their results in order."""
    out: list[Check] = []
    for check in CHECKS if checks is None else checks:
        try:
            result = check()
        except Exception as e:  # a crashing check is a failed check, not a crashed report
            result = Check(getattr(check, "__name__", "check"), FAIL, f"crashed: {type(e).__name__}: {e}")
        out.extend(result if isinstance(result, list) else [result])
    return out


def report(checks: list[Check]) -> str:
    width = max(len(c.name) for c in checks)
    lines = ["specref readiness report", ""]
    lines += [f"  {c.status:<4}  {c.name:<{width}}  {c.detail}" for c in checks]
    failed = [c.name for c in checks if c.status == FAIL]
    lines.append("")
    if failed:
        lines.append(f"NOT READY: {', '.join(failed)} failed (see above).")
    else:
        warned = [c.name for c in checks if c.status == WARN]
        lines.append("READY" + (f" (warnings: {', '.join(warned)})" if warned else "") + ": open notebooks/01_decode_is_memory_bound.ipynb.")
    return "\n".join(lines)


def main(argv: Sequence[str] | None = None) -> int:
    import argparse

    ap = argparse.ArgumentParser(prog="python -m specref", description="Check that this machine is ready for the course.")
    ap.parse_args(argv)
    checks = run_checks()
    print(report(checks))
    return 1 if any(c.status == FAIL for c in checks) else 0
