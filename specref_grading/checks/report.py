"""What every grader shares: calling the learner's code, and failure and success messages.

Every `check_*` function raises AssertionError with the input, the expected and
the received answer and a hint, or returns None and prints one line on success.
The helpers: `call_learner` runs the learner's function and turns an exception into a
`failure` that shows the input; `passed` prints the success line; `as_float`, `as_int`,
`as_bool`, `as_items`, `as_ints` and `as_vector` read an answer or return None; `close` compares
floats; `global_rng_state` and `same_global_rng` catch a learner drawing from a global generator;
`fmt` formats numbers;
`derived_seed` seeds every generator the graders hand to learner code.

**Values, not containers.** Every check reads a learner's answer through these conversions and judges the
value it holds: 12.0 is the whole number 12, a list is as good a sequence as a tuple, a one-element tensor or
array is the number in it, a 1-D tensor or array is the sequence of its items. A bool is never a number, and an
object of the learner's own type (a proxy across the wall) is never read: the conversions return None for it.
"""

from __future__ import annotations

import hashlib
import math
import random
from collections.abc import Callable, Sequence

import numpy as np
import torch

from specref._validate import _fmt

fmt = _fmt  # graders format numbers as specref's own errors do
TOL = 1e-9  # exact checks: probabilities computed two ways in float64 agree far better than this
# --------------------------------------------------------------------------------------
# Formatting and shared helpers
# --------------------------------------------------------------------------------------


def failure(grader: str, where: str, lines: Sequence[str], hint: str | None = None) -> AssertionError:
    msg = [f"{grader}: {where}"] + [f"  {line}" for line in lines]
    if hint:
        msg.append(f"Hint: {hint}")
    return AssertionError("\n".join(msg))


def call_learner(
    grader: str, where: str, inputs: Sequence[str], fn: Callable[..., object], *args: object, hint: str | None = None
) -> object:
    """Call the learner's function; an exception becomes a failure that shows the input."""
    try:
        return fn(*args)
    except NotImplementedError:
        raise
    except Exception as e:  # noqa: BLE001 - any error of the learner's code is reported with its input
        raise failure(grader, where, list(inputs) + [f"your function raised {type(e).__name__}: {e}"], hint) from e


def derived_seed(seed: int, *labels: object) -> int:
    """A 63-bit seed for one generator: sha256 of (seed, labels), a one-way function.

    A freshly seeded generator's state holds its seed (a Mersenne Twister's first word is the seed), and
    learner code may read every generator it is handed. Seeded with derived_seed(HIDDEN_SEED, purpose, n),
    that state leads back neither to the hidden seed nor to the generator of another case or purpose.
    Deterministic: the same (seed, labels) always gives the same seed, so visible cases stay reproducible.
    """
    if isinstance(seed, bool) or not isinstance(seed, int):
        raise TypeError(f"seed must be an int, got {type(seed).__name__}")
    text = repr((seed,) + tuple(labels)).encode()
    return int.from_bytes(hashlib.sha256(text).digest()[:8], "little") >> 1


def global_rng_state() -> tuple[object, ...]:
    return (torch.random.get_rng_state(), np.random.get_state()[1].copy(), random.getstate())


def same_global_rng(a: tuple[object, ...], b: tuple[object, ...]) -> bool:
    return torch.equal(a[0], b[0]) and np.array_equal(a[1], b[1]) and a[2] == b[2]


def as_float(x: object) -> float | None:
    """A learner's scalar answer as a float, or None when it is not a single number."""
    if isinstance(x, torch.Tensor):
        return float(x.detach().reshape(())) if x.numel() == 1 else None
    if isinstance(x, (bool, np.bool_)):
        return None
    if isinstance(x, (int, float, np.integer, np.floating)) or (isinstance(x, np.ndarray) and x.size == 1):
        return float(x)
    return None


def as_int(x: object) -> int | None:
    """A learner's whole-number answer as an int, or None: an int, numpy's, a whole float (12.0 is 12), or a
    one-element tensor or array holding one; never a bool, a fraction, an infinity or a NaN."""
    if isinstance(x, torch.Tensor):
        if x.numel() != 1 or x.dtype == torch.bool or x.is_complex():
            return None
        x = x.detach().reshape(()).item()
    elif isinstance(x, np.ndarray):
        if x.size != 1 or x.dtype.kind not in "iuf":
            return None
        x = x.reshape(()).item()
    if isinstance(x, (bool, np.bool_)):
        return None
    if isinstance(x, (int, np.integer)):
        return int(x)
    if isinstance(x, (float, np.floating)) and math.isfinite(float(x)) and float(x).is_integer():
        return int(float(x))
    return None


def as_bool(x: object) -> bool | None:
    """A learner's verdict as a bool, or None: True or False, numpy's, or a one-element bool tensor or array (what
    `(a == b).all()` returns); never a number (1 is not a verdict)."""
    if isinstance(x, torch.Tensor):
        return bool(x.detach().reshape(())) if x.numel() == 1 and x.dtype == torch.bool else None
    if isinstance(x, np.ndarray):
        return bool(x.reshape(())) if x.size == 1 and x.dtype == np.bool_ else None
    return bool(x) if isinstance(x, (bool, np.bool_)) else None


def as_items(x: object, n: int | None = None) -> list[object] | None:
    """A learner's sequence answer as a list of its items, or None: a list or a tuple (either), or a tensor or
    array of at least one dimension (its rows along the first axis); None for anything else, or when `n` is
    given and the sequence does not hold exactly `n` items. A string is not a sequence of answers."""
    if isinstance(x, torch.Tensor):
        items: list[object] = list(x.detach()) if x.dim() >= 1 else []
        if x.dim() == 0:
            return None
    elif isinstance(x, np.ndarray):
        if x.ndim == 0:
            return None
        items = list(x)
    elif isinstance(x, (list, tuple)):
        items = list(x)
    else:
        return None
    return items if n is None or len(items) == n else None


def as_ints(x: object, n: int | None = None) -> list[int] | None:
    """A learner's sequence of whole numbers as a list of ints (`as_items`, then `as_int` on each), or None."""
    items = as_items(x, n)
    if items is None:
        return None
    out = [as_int(v) for v in items]
    return None if any(v is None for v in out) else out  # type: ignore[return-value]


def as_vector(x: object) -> torch.Tensor | None:
    """A learner's vector answer as a float64 tensor, or None when it cannot be read as one."""
    try:
        if isinstance(x, torch.Tensor):
            return x.detach().to("cpu", torch.float64)
        return torch.as_tensor(np.asarray(x, dtype=np.float64))
    except (TypeError, ValueError, RuntimeError):
        return None


def close(a: float, b: float, rel: float = 1e-9, abs_: float = 1e-12) -> bool:
    return math.isclose(a, b, rel_tol=rel, abs_tol=abs_)


def passed(grader: str, what: str) -> None:
    print(f"{grader}: passed ({what}).")


