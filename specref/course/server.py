"""Exercise 7's timed server: rows of a target's passes, generated from a seed.

Rule: one pass over `B` rows of `T` new tokens after `S` cached tokens per row takes
`overhead + per_token * (B * T) + kv * (B * S)` seconds (`SERVER`), times `exp(0.05 * z)` with `z` a
standard normal draw per pass: noise in proportion to the pass's own time, as on a busy machine.
The grid is batch sizes 1 to 256, 1 to 9 tokens per row, contexts 64 and 256. The grader's hidden tables
are drawn from its own seed with other coefficients; they are not here.
"""

from __future__ import annotations

import numpy as np

SERVER = (3e-3, 80e-6, 0.05e-6)  # overhead, per_token, kv (seconds)
BATCHES = (1, 2, 4, 8, 16, 32, 64, 128, 256)
TOKENS = (1, 2, 3, 5, 9)
CONTEXTS = (64, 256)
NOISE = 0.05  # sigma of the log-normal noise per pass


def noisy_rows(rng: np.random.Generator, theta, batches, tokens, contexts, sigma: float) -> np.ndarray:  # [n, 4]
    """(B, T, S, seconds) for every (B, T, S) of the grid, the time of coefficients `theta` times exp(sigma * z)."""
    theta = np.asarray(theta, dtype=np.float64)
    B, T, S = (a.ravel().astype(np.float64) for a in np.meshgrid(batches, tokens, contexts, indexing="ij"))
    t = (theta[0] + theta[1] * B * T + theta[2] * B * S) * np.exp(sigma * rng.standard_normal(B.size))
    return np.stack([B, T, S, t], 1)


def server_rows(seed: int = 0) -> list[tuple[int, int, int, float]]:
    """The exercise's measured table: (batch_size, n_tokens, context, seconds) rows of one server's passes."""
    if isinstance(seed, bool) or not isinstance(seed, int):
        raise TypeError(f"seed must be an int, got {type(seed).__name__}")
    rows = noisy_rows(np.random.default_rng(seed), SERVER, BATCHES, TOKENS, CONTEXTS, NOISE)
    return [(int(B), int(T), int(S), float(t)) for B, T, S, t in rows]
