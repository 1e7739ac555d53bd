"""The CPU kernel for a pass over a few tokens: read every weight once, whatever the token count.

A decode or verification pass multiplies a few rows ``x [M, K]`` (M = batch x new tokens) by
each weight ``W [K, N]``. The physics: the weights cost ``4 K N`` bytes to read and
``2 M K N`` flops to use, so below the CPU's ridge (M of a few rows in float32) a pass should
cost what reading its weights costs, the same for M = 1 and M = 5. PyTorch's CPU matrix
product is written for large matrices: for M of 2 to 8 it copies (packs) the weight on every
call, and a pass over 5 tokens costs about three times a pass over one.

`SmallLinear` is a kernel written for the few-row case: the weight is packed once, at load
time, into column panels ``[N / 16, K, 16]``; for each panel the kernel keeps the sums of
up to 6 rows x 16 outputs in registers and walks down K, reading each weight exactly once
from memory, with a prefetch 2 KiB ahead so that the next weights are on their way while these
are multiplied (rows past 6 re-read the panel from the cache, not from memory). Each output is
summed in the same order whatever M is, so a row's result does not depend on how many rows
share its pass.

It is plain C (GCC/clang vector extensions, no intrinsics, no torch headers), compiled once
per machine with the system's C compiler (``$CC``, else ``cc``) and cached under
``$SPECREF_CACHE`` (default ``~/.cache/specref``); where no compiler works the pass keeps
PyTorch's own kernels (`kernel_path` says which and why). ``SPECREF_KERNEL=torch`` forces the
fallback.
"""

from __future__ import annotations

import ctypes
import hashlib
import os
import platform
import shlex
import shutil
import subprocess
import sys
import tempfile
from functools import lru_cache
from pathlib import Path
from typing import NamedTuple

import torch

PANEL = 16  # output columns per panel: two 8-wide vectors
MAX_ROWS = 32  # more rows than this run through torch.addmm (a real matrix product, which torch does well)

_SOURCE = r"""
/* y[M, N] = b[N] + x[M, K] @ W, with W packed as panels [N / 16][K][16]. */
typedef float v8 __attribute__((vector_size(32), aligned(4)));
#define NB 16
#define KERNEL(R)                                                                              \
static void rows##R(const float *x, long K, const float *w, const float *b, float *y, long N) { \
    v8 a0[R], a1[R];                                                                           \
    v8 b0 = *(const v8 *)b, b1 = *(const v8 *)(b + 8);                                         \
    for (int r = 0; r < R; r++) { a0[r] = b0; a1[r] = b1; }                                    \
    for (long k = 0; k < K; k++) {                                                             \
        __builtin_prefetch(w + k * NB + 512); /* 2 KiB ahead: keep the memory busy while we multiply */ \
        v8 w0 = *(const v8 *)(w + k * NB), w1 = *(const v8 *)(w + k * NB + 8);                 \
        for (int r = 0; r < R; r++) { float s = x[r * K + k]; a0[r] += s * w0; a1[r] += s * w1; } \
    }                                                                                          \
    for (int r = 0; r < R; r++) { *(v8 *)(y + r * N) = a0[r]; *(v8 *)(y + r * N + 8) = a1[r]; } \
}
KERNEL(1) KERNEL(2) KERNEL(3) KERNEL(4) KERNEL(5) KERNEL(6)

void small_linear(const float *x, long M, long K, const float *wp, long N, const float *b, float *y) {
    for (long p = 0; p < N / NB; p++) {
        const float *w = wp + p * K * NB;
        for (long r0 = 0; r0 < M; r0 += 6) {
            long m = M - r0 < 6 ? M - r0 : 6;
            const float *xs = x + r0 * K;
            float *ys = y + r0 * N + p * NB;
            const float *bs = b + p * NB;
            switch (m) {
            case 1: rows1(xs, K, w, bs, ys, N); break;
            case 2: rows2(xs, K, w, bs, ys, N); break;
            case 3: rows3(xs, K, w, bs, ys, N); break;
            case 4: rows4(xs, K, w, bs, ys, N); break;
            case 5: rows5(xs, K, w, bs, ys, N); break;
            default: rows6(xs, K, w, bs, ys, N); break;
            }
        }
    }
}
"""


class KernelPath(NamedTuple):
    """Which kernel a CPU pass over a few tokens runs: ``"compiled"`` or ``"torch"``, and why."""

    name: str
    reason: str


def cache_dir() -> Path:
    """Where compiled kernels are kept: ``$SPECREF_CACHE``, else ``$XDG_CACHE_HOME/specref``, else ``~/.cache/specref``."""
    if os.environ.get("SPECREF_CACHE"):
        return Path(os.environ["SPECREF_CACHE"]).expanduser()
    base = os.environ.get("XDG_CACHE_HOME") or "~/.cache"
    return Path(base).expanduser() / "specref"


def _compiler() -> list[str] | None:
    """The C compiler's command ($CC may hold a wrapper and flags, e.g. "ccache gcc"), or None."""
    words = shlex.split(os.environ.get("CC") or "cc")
    path = shutil.which(words[0]) if words else None
    return None if path is None else [path, *words[1:]]


def _compile(cc: list[str], out: Path) -> str | None:
    """Compile `_SOURCE` into the shared library `out`; None on success, else the compiler's complaint."""
    out.parent.mkdir(parents=True, exist_ok=True)
    # Built beside its final name, so the rename below never crosses file systems.
    with tempfile.TemporaryDirectory(dir=out.parent) as tmp:
        src = Path(tmp) / "small_linear.c"
        src.write_text(_SOURCE)
        built = Path(tmp) / out.name
        err = ""
        # -march=native for this CPU's vector width; some compilers (or CPUs) refuse it: then the default target.
        for arch in (["-march=native"], []):
            proc = subprocess.run([*cc, "-O3", *arch, "-fPIC", "-shared", "-o", str(built), str(src)],
                                  capture_output=True, text=True, timeout=120)
            if proc.returncode == 0:
                os.replace(built, out)  # atomic: a concurrent process sees the whole library or none
                return None
            err = (proc.stderr or proc.stdout).strip().splitlines()[-1:] or ["no output"]
            err = err[0]
        return err


@lru_cache(maxsize=1)
def _library() -> tuple[ctypes.CDLL | None, KernelPath]:
    """The compiled kernel (built on first use, then cached on disk), or None and the reason it is not there."""
    if os.environ.get("SPECREF_KERNEL", "").lower() == "torch":
        return None, KernelPath("torch", "SPECREF_KERNEL=torch")
    if sys.platform == "win32":
        return None, KernelPath("torch", "no compiled kernel on Windows")
    cc = _compiler()
    if cc is None:
        return None, KernelPath("torch", "no C compiler found (set CC, or install gcc or clang)")
    try:
        version = subprocess.run([*cc, "--version"], capture_output=True, text=True, timeout=30).stdout
    except (OSError, subprocess.SubprocessError) as e:
        return None, KernelPath("torch", f"the C compiler {cc[0]} does not run: {e}")
    key = hashlib.sha256("\0".join([_SOURCE, " ".join(cc), version, platform.machine(), platform.processor(),
                                    _cpu_flags()]).encode()).hexdigest()[:16]
    try:
        path = cache_dir() / f"small_linear-{key}.so"  # an unresolvable home folder raises RuntimeError
        if not path.is_file():
            err = _compile(cc, path)
            if err is not None:
                return None, KernelPath("torch", f"the C compiler failed: {err}")
        lib = ctypes.CDLL(str(path))
    except (OSError, RuntimeError, subprocess.SubprocessError) as e:
        return None, KernelPath("torch", f"could not build or load the kernel: {e}")
    fn = lib.small_linear
    fn.restype = None
    fn.argtypes = [ctypes.c_void_p, ctypes.c_long, ctypes.c_long, ctypes.c_void_p, ctypes.c_long,
                   ctypes.c_void_p, ctypes.c_void_p]
    return lib, KernelPath("compiled", f"the few-token kernel, compiled once with {Path(cc[0]).name} and cached")


def _cpu_flags() -> str:
    """This CPU's feature flags (Linux), so a kernel built with -march=native is rebuilt on another CPU."""
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith(("flags", "Features")):
                return line
    except OSError:
        pass
    return ""


def kernel_path() -> KernelPath:
    """Which kernel `SmallLinear` runs on this machine (it compiles the kernel on first use)."""
    return _library()[1]


class SmallLinear:
    """``bias + x @ weight`` for a few rows, the weight packed once into panels; see the module's docstring.

    Built from a float32 CPU weight ``[K, N]`` (GPT-2's Conv1D layout) and bias ``[N]``, both copied.
    Calling it on a float32 CPU ``x [M, K]`` runs the compiled kernel (the caller decides for which
    M: `gpt2.use_small_kernel` serves passes of at most `MAX_ROWS` rows); it never modifies its inputs.
    The packed copy belongs to the weight and bias as they were: `fresh` says whether they are the same
    tensors, at the same addresses, not written since. A copy or a pickle of it is never fresh: a
    process that loads one runs PyTorch's kernels until the model is packed again.
    """

    def __init__(self, weight: torch.Tensor, bias: torch.Tensor | None, transposed: bool = False) -> None:
        # weight [K, N] (Conv1D), or [N, K] with transposed=True (nn.Linear, the LM head); bias [N]
        lib, path = _library()
        if lib is None:
            raise RuntimeError(f"no compiled kernel here: {path.reason}")
        for name, t in (("weight", weight), ("bias", bias)):
            if t is not None and (t.device.type != "cpu" or t.dtype != torch.float32 or t.is_inference()):
                raise ValueError(f"{name} must be a float32 CPU tensor made outside inference mode, got {t.dtype} "
                                 f"on {t.device}")
        if weight.dim() != 2:
            raise ValueError(f"weight must be a float32 CPU matrix, got shape {tuple(weight.shape)}")
        w = weight.detach().t() if transposed else weight.detach()  # [K, N]
        K, N = w.shape
        if bias is not None and tuple(bias.shape) != (N,):
            raise ValueError(f"bias must have shape [{N}], got {tuple(bias.shape)}")
        self.K, self.N = K, N
        pad = -N % PANEL  # N padded up to whole panels; the extra outputs are computed and dropped
        b = torch.zeros(N, dtype=torch.float32, device="cpu") if bias is None else bias.detach().clone()
        if pad:
            w = torch.cat([w, w.new_zeros(K, pad)], 1)
            b = torch.cat([b, b.new_zeros(pad)])
        self.packed: torch.Tensor | None = w.reshape(K, -1, PANEL).permute(1, 0, 2).contiguous()  # [N / 16, K, 16]
        self.bias = b.contiguous()
        self._stamp = (_stamp(weight), _stamp(bias))

    def fresh(self, weight: torch.Tensor, bias: torch.Tensor | None = None) -> bool:
        """Whether `weight` and `bias` are the tensors this was packed from, where they were, not written since.

        Writes through ``.data`` and ``torch.no_grad`` in-place writes bump the version and are seen; a
        write that bypasses the version counter (``vector_to_parameters`` into ``.data``) is not.
        """
        return self.packed is not None and self._stamp == (_stamp(weight), _stamp(bias))

    def serves(self, weight: torch.Tensor, bias: torch.Tensor | None, x: torch.Tensor) -> bool:  # x [M, K]
        """Whether this kernel computes ``bias + x @ weight``: at most `MAX_ROWS` float32 CPU rows, the weight and
        bias it was packed from (`fresh`), no gradient asked for; otherwise the caller runs PyTorch's kernel."""
        return (x.shape[0] <= MAX_ROWS and x.dtype == torch.float32 and x.device.type == "cpu"
                and self.fresh(weight, bias)
                and not (torch.is_grad_enabled() and (x.requires_grad or weight.requires_grad
                                                      or (bias is not None and bias.requires_grad))))

    def __getstate__(self) -> dict:
        """A copy holds no packed weights (it could be loaded where no kernel runs): it is never fresh."""
        return {**self.__dict__, "packed": None, "bias": None, "_stamp": None}

    def __call__(self, x: torch.Tensor) -> torch.Tensor:  # [M, K] float32 CPU -> [M, N]
        if self.packed is None:
            raise RuntimeError("this SmallLinear is a copy without its packed weights: pack the model again")
        if x.dtype != torch.float32 or x.device.type != "cpu" or x.dim() != 2 or x.shape[1] != self.K:
            raise ValueError(f"x must be a float32 CPU tensor [M, {self.K}], got {x.dtype} {tuple(x.shape)} on "
                             f"{x.device}")
        M = x.shape[0]
        x = x.contiguous()
        n_out = self.bias.shape[0]
        y = torch.empty(M, n_out, dtype=torch.float32, device="cpu")
        _library()[0].small_linear(x.data_ptr(), M, self.K, self.packed.data_ptr(), n_out, self.bias.data_ptr(),
                                   y.data_ptr())
        return y if n_out == self.N else y[:, : self.N].contiguous()


def _stamp(t: torch.Tensor | None) -> tuple | None:
    """What identifies a tensor's contents without reading them: the object, its storage address, its version."""
    if t is None:
        return None
    return (id(t), t.data_ptr(), t.dtype, t.device, t._version)
