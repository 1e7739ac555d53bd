"""Exact output distributions of a sampler, by branching on every random draw.

A sampler draws its randomness through a small interface, `rng`:

    rng.uniform()          -> a number u ~ U[0, 1)
    rng.categorical(probs) -> an index i with probability probs[i]

In real use `rng` is a `specref.sampling.TorchRNG` wrapping a `torch.Generator`. `exact_distribution`
instead passes a symbolic rng: `uniform()` returns an unknown u whose comparisons
branch, `categorical` branches over every index, and a depth-first search re-runs
the function once per branch path. Summing path probabilities gives the sampler's
exact output distribution.

What a symbolic u supports: comparisons with a real number (`u < t`, `u <= t`,
`u > t`, `u >= t`, `t > u`, ...), and affine arithmetic with real numbers
before comparing (`u * q_x < p_x`, `1 - u > t`). A real number is a Python
int/float, a NumPy scalar or a one-element tensor. Repeated comparisons of one u
are consistent (u is conditioned on every branch taken), so a hand-written
inverse-CDF loop `if u < cdf[i]` is enumerated exactly too. Anything else
(float(u), u == t, u * u) raises a TypeError that says so.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Hashable, Sequence

import numpy as np
import torch

from .._validate import _fmt
from ..sampling import TorchRNG, as_distribution  # noqa: F401  (TorchRNG: the real rng, re-exported)

# --------------------------------------------------------------------------------------
# The rng interface: real (`specref.sampling.TorchRNG`) and symbolic (used by exact_distribution)
# --------------------------------------------------------------------------------------


class _Enumerator:
    """Depth-first search over the branch paths of a function of a symbolic rng.

    A path is the list of options chosen at each branch point. The function is
    re-run from the start for each path; the first `len(script)` branch points
    replay the script, later ones take their first live option. After a run the
    deepest branch point that still has an untried live option moves on to it.
    """

    def __init__(self, max_paths: int, max_draws: int) -> None:
        self.max_paths = max_paths
        self.max_draws = max_draws
        self.script: list[int] = []
        self.options: list[tuple[float, ...]] = []  # the option probabilities seen at each branch point
        self.pos = 0
        self.prob = 1.0

    def branch(self, probs: Sequence[float], what: str) -> int:
        i = self.pos
        self.pos += 1
        if i >= self.max_draws:
            raise RuntimeError(
                f"one run drew more than {self.max_draws} random decisions: does the function loop "
                "forever, or keep drawing after it should have stopped?"
            )
        probs = tuple(float(x) for x in probs)
        if i < len(self.script):
            seen = self.options[i]
            if len(seen) != len(probs) or any(abs(a - b) > 1e-12 for a, b in zip(seen, probs, strict=True)):
                raise RuntimeError(
                    f"the function is not deterministic given its rng draws: re-running it along the same "
                    f"path, random decision #{i + 1} ({what}) had options {_fmt(probs)} instead of "
                    f"{_fmt(seen)}. Draw randomness only through rng.uniform() and rng.categorical(...) "
                    "(no torch.rand, torch.multinomial, random or np.random), and keep no state between calls."
                )
            choice = self.script[i]
        else:
            choice = next(j for j, x in enumerate(probs) if x > 0)
            self.script.append(choice)
            self.options.append(probs)
        self.prob *= probs[choice]
        return choice

    def advance(self) -> bool:
        """Move to the next path; False when every path has been visited."""
        while self.script:
            i = len(self.script) - 1
            later = [j for j in range(self.script[i] + 1, len(self.options[i])) if self.options[i][j] > 0]
            if later:
                self.script[i] = later[0]
                return True
            self.script.pop()
            self.options.pop()
        return False


class _SymbolicRNG:
    """The rng handed to the function under enumeration."""

    def __init__(self, engine: _Enumerator) -> None:
        self._engine = engine

    def uniform(self) -> SymbolicUniform:
        return SymbolicUniform(_UniformState(self._engine))

    def categorical(self, probs: object) -> int:
        t = as_distribution(probs, "rng.categorical")
        return self._engine.branch((t / t.sum()).tolist(), "rng.categorical")


class _UniformState:
    """What is known about one uniform draw so far: u lies in [lo, hi), uniformly."""

    __slots__ = ("engine", "lo", "hi")

    def __init__(self, engine: _Enumerator) -> None:
        self.engine = engine
        self.lo = 0.0
        self.hi = 1.0

    def below(self, t: float) -> bool:
        """Branch on u < t; the taken side narrows [lo, hi) so later comparisons stay consistent."""
        t = min(max(t, self.lo), self.hi)
        p_below = (t - self.lo) / (self.hi - self.lo)
        if self.engine.branch((p_below, 1.0 - p_below), "a comparison of rng.uniform()") == 0:
            self.hi = t
            return True
        self.lo = t
        return False


def _real(x: object, op: str) -> float:
    """A real-number operand of a symbolic uniform, or a TypeError saying what is supported."""
    if isinstance(x, SymbolicUniform):
        raise TypeError(
            f"`{op}` between two values derived from rng.uniform() is not supported by the exact "
            "grader: compare one uniform with a number (e.g. u < min(1, p_x / q_x))"
        )
    if isinstance(x, torch.Tensor):
        if x.numel() != 1:
            raise TypeError(f"`{op}` of rng.uniform() with a tensor of shape {tuple(x.shape)}: use a single number")
        v = float(x.detach().reshape(()))
    elif isinstance(x, (bool, np.bool_)):
        raise TypeError(f"`{op}` of rng.uniform() with a bool ({x!r}): use a number")
    elif isinstance(x, (int, float, np.integer, np.floating)) or (isinstance(x, np.ndarray) and x.size == 1):
        v = float(x)
    else:
        raise TypeError(f"`{op}` of rng.uniform() with {type(x).__name__} is not supported: use a number")
    if math.isnan(v):
        raise ValueError(
            f"`{op}` compares rng.uniform() with NaN: a 0/0 somewhere? (a draft token has q(x) > 0, "
            "but p(x) / q(x) at an undrafted token, or a normalization of zero mass, gives NaN)"
        )
    return v


_SYMBOLIC_HINT = (
    "the exact grader replaces rng.uniform() by a symbolic value: it can be compared with a number "
    "(u < t, u * q_x < p_x, ...) but not converted (float(u), bool(u), torch.tensor(u)) or used "
    "in other arithmetic. Write the accept test as a comparison, e.g. "
    "`rng.uniform() < min(1.0, p_x / q_x)`, and sample distributions with rng.categorical(probs)."
)


class SymbolicUniform:
    """scale * u + shift for an unknown u ~ U[0, 1): comparing it with a number branches the enumeration."""

    __slots__ = ("_state", "_scale", "_shift")
    __array_ufunc__ = None  # make NumPy scalars defer to our reflected operators
    __hash__ = None  # type: ignore[assignment]

    def __init__(self, state: _UniformState, scale: float = 1.0, shift: float = 0.0) -> None:
        self._state = state
        self._scale = scale
        self._shift = shift

    def _compare(self, t: object, less: bool, op: str) -> bool:
        v = _real(t, op)
        a, b = self._scale, self._shift
        if a == 0:
            return (b < v) if less else (b > v)
        # a*u + b < v  <=>  u < (v - b)/a when a > 0, u > (v - b)/a when a < 0. Ties have probability 0,
        # so < and <= (and > and >=) branch the same way.
        below = self._state.below((v - b) / a)
        return below if (less == (a > 0)) else not below

    def __lt__(self, t: object) -> bool:
        return self._compare(t, True, "u < t")

    def __le__(self, t: object) -> bool:
        return self._compare(t, True, "u <= t")

    def __gt__(self, t: object) -> bool:
        return self._compare(t, False, "u > t")

    def __ge__(self, t: object) -> bool:
        return self._compare(t, False, "u >= t")

    def __eq__(self, t: object) -> bool:  # type: ignore[override]
        raise TypeError("u == t has probability 0 for a continuous uniform; compare with <, <=, > or >=")

    __ne__ = __eq__  # type: ignore[assignment]

    def _affine(self, scale: float, shift: float) -> SymbolicUniform:
        return SymbolicUniform(self._state, scale, shift)

    def __mul__(self, x: object) -> SymbolicUniform:
        v = _real(x, "u * x")
        return self._affine(self._scale * v, self._shift * v)

    __rmul__ = __mul__

    def __truediv__(self, x: object) -> SymbolicUniform:
        v = _real(x, "u / x")
        if v == 0:
            raise ZeroDivisionError("rng.uniform() divided by 0")
        return self._affine(self._scale / v, self._shift / v)

    def __add__(self, x: object) -> SymbolicUniform:
        return self._affine(self._scale, self._shift + _real(x, "u + x"))

    __radd__ = __add__

    def __sub__(self, x: object) -> SymbolicUniform:
        return self._affine(self._scale, self._shift - _real(x, "u - x"))

    def __rsub__(self, x: object) -> SymbolicUniform:
        return self._affine(-self._scale, _real(x, "x - u") - self._shift)

    def __neg__(self) -> SymbolicUniform:
        return self._affine(-self._scale, -self._shift)

    def _unsupported(self, *args: object) -> None:
        raise TypeError(_SYMBOLIC_HINT)

    __float__ = __int__ = __index__ = __bool__ = __round__ = __abs__ = _unsupported  # type: ignore[assignment]
    __rtruediv__ = __pow__ = __rpow__ = __floordiv__ = __mod__ = _unsupported  # type: ignore[assignment]
    __array__ = _unsupported  # type: ignore[assignment]

    def __repr__(self) -> str:
        st = self._state
        inner = f"u in [{st.lo:.4g}, {st.hi:.4g})"
        return (
            inner if (self._scale, self._shift) == (1.0, 0.0) else f"{self._scale:.4g} * u + {self._shift:.4g}, {inner}"
        )


def exact_distribution(
    fn: Callable[[object], Hashable],
    max_paths: int = 20_000,
    max_draws: int = 200,
) -> dict[Hashable, float]:
    """The exact distribution of fn(rng) over every path of rng draws: {outcome: probability}.

    `fn` must be deterministic given its draws and draw only through the rng it is
    given (rng.uniform(), rng.categorical(probs)); its result must be hashable.
    Zero-probability branches are not visited.
    """
    if not callable(fn):
        raise TypeError(f"fn must be callable, got {type(fn).__name__}")
    engine = _Enumerator(max_paths, max_draws)
    dist: dict[Hashable, float] = {}
    paths = 0
    while True:
        paths += 1
        if paths > max_paths:
            raise RuntimeError(
                f"more than {max_paths} random paths: does the function draw far more than it needs "
                "(e.g. a uniform or categorical at every position even after stopping)?"
            )
        engine.pos, engine.prob = 0, 1.0
        out = fn(_SymbolicRNG(engine))
        if engine.pos < len(engine.script):
            raise RuntimeError(
                "the function is not deterministic given its rng draws: along a replayed path it stopped "
                "drawing early. Draw randomness only through rng, and keep no state between calls."
            )
        try:
            dist[out] = dist.get(out, 0.0) + engine.prob
        except TypeError:
            raise TypeError(f"fn must return a hashable outcome (e.g. a tuple), got {type(out).__name__}") from None
        if not engine.advance():
            return dist
