"""Confidence intervals for what the course compares, and the decision two intervals allow (chapter 5).

Two measurements are called different only when their intervals do not overlap (`apart`); otherwise
the run does not decide. Each interval respects the range of what it estimates:

- `rate_ci`: a proportion accepted / reached, Wilson's interval (inside [0, 1]).
- `tau_ci`: tokens per target pass from the tokens each step emitted, every step counted, so its
  centre is exactly emitted / steps. A percentile bootstrap of the mean: its ends are means of
  resampled steps, so they never leave [min, max] of the steps (tau >= 1 stays >= 1), which a
  t-interval of a skewed sample of mostly ones does not guarantee. Steps are resampled as
  independent draws; the steps of one generation are not quite independent.
- `ratio_ci`: tau of one run over tau of another (a gain), bootstrapping each run's steps apart.
- `mean_ci`: the two-sided Student-t interval of a mean, for a few per-prompt ratios (speedups).
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
from scipy import stats

Interval = tuple[float, float]


def _level(level: float) -> float:
    if isinstance(level, bool) or not isinstance(level, (int, float)) or not 0 < level < 1:
        raise ValueError(f"level must be a number strictly between 0 and 1, got {level!r}")
    return float(level)


def _sample(values: Sequence[float], name: str, least: int) -> np.ndarray:
    x = np.asarray(values, dtype=np.float64)
    if x.ndim != 1 or x.size < least or not np.isfinite(x).all():
        raise ValueError(f"{name} must be a 1-d sequence of at least {least} finite numbers, got shape {x.shape}")
    return x


def rate_ci(accepted: int, reached: int, level: float = 0.95) -> Interval:
    """Wilson interval of the proportion accepted / reached at `level`."""
    for name, v in (("accepted", accepted), ("reached", reached)):
        if isinstance(v, bool) or not isinstance(v, (int, np.integer)) or v < 0:
            raise ValueError(f"{name} must be an int >= 0, got {v!r}")
    if reached < 1 or accepted > reached:
        raise ValueError(f"need 0 <= accepted <= reached and reached >= 1, got {accepted} of {reached}")
    ci = stats.binomtest(int(accepted), int(reached)).proportion_ci(_level(level), method="wilson")
    return float(ci.low), float(ci.high)


def tau_ci(tokens_per_step: Sequence[int], level: float = 0.95, seed: int = 0,
           resamples: int = 9999) -> tuple[float, float, float]:
    """(tau, low, high): tau = mean tokens per step over every step, with a percentile-bootstrap interval."""
    x = _sample(tokens_per_step, "tokens_per_step", 2)
    if (x < 1).any():
        raise ValueError("every step emits at least one token: tokens_per_step must be >= 1")
    tau = float(x.mean())
    if np.all(x == x[0]):
        return tau, tau, tau  # no spread: every resample has the same mean
    res = stats.bootstrap((x,), np.mean, confidence_level=_level(level), n_resamples=resamples,
                          method="percentile", rng=np.random.default_rng(seed))
    return tau, float(res.confidence_interval.low), float(res.confidence_interval.high)


def ratio_ci(over: Sequence[int], under: Sequence[int], level: float = 0.95, seed: int = 0,
             resamples: int = 9999) -> tuple[float, float, float]:
    """(ratio, low, high): tau of `over` / tau of `under` (tokens per step), percentile bootstrap of each run's steps."""
    a, b = _sample(over, "over", 2), _sample(under, "under", 2)
    if (a < 1).any() or (b < 1).any():
        raise ValueError("every step emits at least one token: tokens per step must be >= 1")
    ratio = float(a.mean() / b.mean())
    res = stats.bootstrap((a, b), lambda x, y, axis=-1: x.mean(axis) / y.mean(axis), confidence_level=_level(level),
                          n_resamples=resamples, method="percentile", rng=np.random.default_rng(seed))
    return ratio, float(res.confidence_interval.low), float(res.confidence_interval.high)


def mean_ci(values: Sequence[float], level: float = 0.95) -> tuple[float, float, float]:
    """(mean, low, high): the two-sided Student-t interval of the mean at `level` (sample standard deviation)."""
    x = _sample(values, "values", 2)
    low, high = stats.t.interval(_level(level), x.size - 1, loc=x.mean(), scale=stats.sem(x))
    m = float(x.mean())
    return (m, m, m) if not np.isfinite(low) else (m, float(low), float(high))


def apart(x: Interval, y: Interval) -> int:
    """+1 when interval x = (low, high) lies wholly above y, -1 when wholly below, 0 when they overlap."""
    return 1 if x[0] > y[1] else -1 if x[1] < y[0] else 0
