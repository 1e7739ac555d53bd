"""Monte-Carlo check of speculative decoding: many runs at once, and a goodness-of-fit test.

`simulate` runs N independent speculative generations on toy chains in lockstep:
one batched draft proposal, one batched target score and one batched
`verify_chain` per step, each row accepting its own number of drafts. The only
Python loop is over steps. `distribution_test` then asks whether the tokens look
like draws from the target's exact distribution, with a chi-square test and a
total-variation bound that both depend on the sample size.

A verification method is only as good as its power: the same test must flag the
deliberately broken rules of `specref.checks.broken` (negative controls).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np
import scipy.stats
import torch

from .._validate import check_int
from ..chain_verify import verify_chain
from ..rejection import ChainRule
from .broken import (  # noqa: F401 - the broken chain rules, importable from here as before
    BROKEN_RULES,
    verify_always_accept,
    verify_bonus_off_by_one,
    verify_skip_residual,
)
from .toy import MarkovChain, MisreportedDraft

ALPHA = 1e-3
"""Default significance level: a correct rule fails a fixed-seed test with probability about 2 * ALPHA."""

MIN_EXPECTED = 5.0
"""Cells expected to hold fewer samples than this are pooled before the chi-square test."""


@dataclass(frozen=True)
class Simulation:
    """N speculative generations of n tokens, with what every step did.

    Steps run in lockstep; a run that already has n tokens keeps stepping (its extra
    tokens are dropped) and is marked inactive for that step.
    """

    tokens: torch.Tensor  # [N, n] the first n emitted tokens of each run
    context: torch.Tensor  # [S, N] the last token before each step
    step_tokens: torch.Tensor  # [S, N, k+1] what each step emitted, padded with -1
    n_accepted: torch.Tensor  # [S, N] accepted drafts per step
    active: torch.Tensor  # [S, N] bool: the run still needed tokens at this step

    @property
    def k(self) -> int:
        return self.step_tokens.shape[-1] - 1

    def accepted_histogram(self) -> torch.Tensor:  # [k+1]
        """How many active steps accepted 0, 1, ..., k drafts."""
        return torch.bincount(self.n_accepted[self.active], minlength=self.k + 1)

    def tokens_per_step(self) -> float:
        """Mean tokens emitted per active step (accepted drafts + 1)."""
        return float((self.n_accepted[self.active] + 1).double().mean())


def simulate(
    target: MarkovChain,
    draft: MarkovChain | MisreportedDraft,
    start_token: int,
    k: int,
    n: int,
    runs: int,
    generator: torch.Generator,
    rule: ChainRule = verify_chain,
) -> Simulation:
    """Generate the first n tokens after `start_token` in `runs` independent speculative runs.

    Each step: draft.propose k tokens and q, target.score them (p), then `rule`
    (default `verify_chain`, batched, per-row acceptance). The toy chains are first
    order, so the context handed to them is just each run's last token.
    """
    if not isinstance(target, MarkovChain):
        raise TypeError(f"target must be a MarkovChain, got {type(target).__name__}")
    if not hasattr(draft, "propose") or not hasattr(draft, "vocab_size"):
        raise TypeError(f"draft must have propose(context, k, generator) and vocab_size, got {type(draft).__name__}")
    V = target.vocab_size
    if draft.vocab_size != V:
        raise ValueError(f"target and draft must share one vocabulary, got {V} and {draft.vocab_size}")
    for name, value, low, what in (("k", k, 0, "draft tokens per step"), ("n", n, 1, "tokens per run"),
                                   ("runs", runs, 1, "independent runs")):
        check_int(name, value, low, what, wrong_type=ValueError)
    check_int("start_token", start_token, 0, "a token id", wrong_type=ValueError)
    if start_token >= V:
        raise ValueError(f"start_token must be an int in [0, {V}), got {start_token!r}")
    if not isinstance(generator, torch.Generator):
        raise TypeError(f"generator must be a torch.Generator, got {type(generator).__name__}")

    device = target.transition.device
    N = runs
    width = n + k + 1  # room for a step that starts at n - 1 and emits k + 1 tokens
    out = torch.full((N, width + 1), -1, dtype=torch.long, device=device)  # last column: scratch
    last = torch.full((N,), start_token, dtype=torch.long, device=device)
    emitted = torch.zeros(N, dtype=torch.long, device=device)
    offsets = torch.arange(k + 1, device=device)
    record: dict[str, list[torch.Tensor]] = {"context": [], "step_tokens": [], "n_accepted": [], "active": []}
    while bool((emitted < n).any()):
        context = last[:, None]  # [N, 1]
        drafts, q = draft.propose(context, k, generator)  # [N, k], [N, k, V]
        p = target.score(context, drafts)  # [N, k+1, V]
        tokens, n_acc = rule(drafts, q, p, generator)  # [N, k+1], [N]
        active = emitted < n
        keep = (offsets <= n_acc[:, None]) & active[:, None]
        pos = torch.where(keep, emitted[:, None] + offsets, torch.full_like(tokens, width))
        out.scatter_(1, pos, tokens)
        record["context"].append(last)
        record["step_tokens"].append(tokens)
        record["n_accepted"].append(n_acc)
        record["active"].append(active)
        last = tokens.gather(1, n_acc[:, None]).squeeze(1)
        emitted = emitted + n_acc + 1
    return Simulation(out[:, :n], **{key: torch.stack(v) for key, v in record.items()})


# The goodness-of-fit test.


@dataclass(frozen=True)
class DistributionTest:
    """Chi-square goodness of fit plus a total-variation check; `passed` is the verdict."""

    statistic: float  # chi-square statistic after pooling small cells
    dof: int
    p_value: float
    critical: float  # the statistic's (1 - alpha) quantile: statistic > critical fails
    tv: float  # total variation between the observed frequencies and the expected distribution
    tv_bound: float  # the largest TV a correct sampler exceeds with probability < alpha
    samples: int
    impossible: int  # samples on cells of probability 0
    alpha: float

    @property
    def passed(self) -> bool:
        return self.impossible == 0 and self.p_value >= self.alpha and self.tv <= self.tv_bound

    def __str__(self) -> str:
        verdict = "pass" if self.passed else "FAIL"
        return (
            f"{verdict}: chi2 = {self.statistic:.1f} (dof {self.dof}, critical {self.critical:.1f}), "
            f"p = {self.p_value:.3g}, TV = {self.tv:.4f} (bound {self.tv_bound:.4f}), "
            f"N = {self.samples}, impossible = {self.impossible}"
        )


def tv_bound(cells: int, samples: int, alpha: float) -> float:
    """The union bound sqrt((cells ln 2 + ln(1 / alpha)) / (2 samples)) on the TV of an empirical distribution.

    Rule: the TV between `samples` draws from a distribution with `cells` outcomes of positive
    probability and that distribution exceeds it with probability below `alpha`, whatever the
    distribution (the Bretagnolle-Huber-Carol inequality, a union over the 2^cells events).
    """
    check_int("cells", cells, 1, "outcomes of positive probability")
    check_int("samples", samples, 1, "samples")
    if isinstance(alpha, bool) or not isinstance(alpha, (int, float)) or not 0 < alpha < 1:
        raise ValueError(f"alpha must be in (0, 1), got {alpha!r}")
    return math.sqrt((cells * math.log(2) + math.log(1 / alpha)) / (2 * samples))


def _pool(observed: np.ndarray, expected: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Merge the cells expected to hold < MIN_EXPECTED samples into one, growing it until it holds enough."""
    order = np.argsort(expected, kind="stable")
    e, o = expected[order], observed[order]
    small = int(np.searchsorted(e, MIN_EXPECTED, side="left"))  # e[:small] < MIN_EXPECTED
    cut = small
    while cut > 0 and cut < len(e) and e[:cut].sum() < MIN_EXPECTED:
        cut += 1  # the pool is still too small: add the smallest big cell
    if cut == 0:
        return o, e
    return np.concatenate([[o[:cut].sum()], o[cut:]]), np.concatenate([[e[:cut].sum()], e[cut:]])


def stratified_test(
    expected: torch.Tensor | np.ndarray,  # [G, m] one distribution per stratum (row)
    counts: torch.Tensor | np.ndarray,  # [G, m] observed counts
    alpha: float = ALPHA,
) -> DistributionTest:
    """Test G conditional distributions at once (e.g. the next token given the previous one).

    Chi-square: each row is tested against its own expected distribution with its
    own total (scipy.stats.chisquare after pooling cells expected to hold < 5);
    the statistics and degrees of freedom add up across rows. Zero-probability
    cells must stay empty: a sample there fails the test outright.
    TV: the count-weighted mean of the rows' TVs must not exceed the count-weighted
    mean of the rows' `tv_bound(m_g, N_g, alpha / G)` (m_g = cells of positive
    probability, N_g = the row's samples).
    """
    e = np.asarray(expected.detach().cpu() if isinstance(expected, torch.Tensor) else expected, dtype=np.float64)
    o = np.asarray(counts.detach().cpu() if isinstance(counts, torch.Tensor) else counts, dtype=np.float64)
    if e.ndim != 2 or o.shape != e.shape:
        raise ValueError(f"expected and counts must both be [G, m], got {e.shape} and {o.shape}")
    if not np.isfinite(e).all() or (e < 0).any() or np.abs(e.sum(1) - 1).max() > 1e-6:
        raise ValueError("expected must hold probability rows (finite, >= 0, each summing to 1)")
    if not np.isfinite(o).all() or (o < 0).any() or (o != np.round(o)).any():
        raise ValueError("counts must hold non-negative integers")
    if isinstance(alpha, bool) or not isinstance(alpha, (int, float)) or not 0 < alpha < 1:
        raise ValueError(f"alpha must be in (0, 1), got {alpha!r}")
    e = e / e.sum(1, keepdims=True)
    totals = o.sum(1)
    strata = totals > 0
    G = int(strata.sum())
    if G == 0:
        raise ValueError("counts holds no samples")
    impossible = int(o[e == 0].sum())
    statistic, dof, tv_sum, bound_sum = 0.0, 0, 0.0, 0.0
    for g in np.nonzero(strata)[0]:
        N_g = totals[g]
        tv_sum += 0.5 * np.abs(o[g] - N_g * e[g]).sum()
        m_g = int((e[g] > 0).sum())
        bound_sum += N_g * tv_bound(m_g, int(N_g), alpha / G)
        support = e[g] > 0
        # Samples on impossible cells already fail the test; the chi-square looks at the support.
        obs, exp = _pool(o[g][support], o[g][support].sum() * e[g][support])
        if len(obs) >= 2:
            statistic += float(scipy.stats.chisquare(obs, exp).statistic)
            dof += len(obs) - 1
    N = int(totals.sum())
    if dof == 0:
        p_value, critical = 1.0, math.inf
    else:
        p_value = float(scipy.stats.chi2.sf(statistic, dof))
        critical = float(scipy.stats.chi2.isf(alpha, dof))
    if impossible:
        statistic, p_value = math.inf, 0.0
    return DistributionTest(
        statistic=statistic,
        dof=dof,
        p_value=p_value,
        critical=critical,
        tv=float(tv_sum / N),
        tv_bound=float(bound_sum / N),
        samples=N,
        impossible=impossible,
        alpha=float(alpha),
    )


def counts_of(
    samples: torch.Tensor,  # [N] cell ids, or [N, d] coordinates into a [V_1, ..., V_d] table
    shape: tuple[int, ...],
) -> torch.Tensor:  # shape
    """Histogram of samples over the cells of a table of the given shape."""
    samples = torch.as_tensor(samples)
    if samples.is_floating_point():
        raise TypeError(f"samples must be integer cell ids, got {samples.dtype}")
    if samples.dim() == 1:
        samples = samples[:, None]
    if samples.dim() != 2 or samples.shape[1] != len(shape):
        raise ValueError(
            f"samples must be [N] or [N, {len(shape)}] for a table of shape {shape}, got {tuple(samples.shape)}"
        )
    sizes = torch.tensor(shape, device=samples.device)
    if samples.numel() and ((samples < 0).any() or (samples >= sizes).any()):
        raise ValueError(f"samples hold ids outside the table of shape {shape}")
    strides = torch.tensor([math.prod(shape[i + 1 :]) for i in range(len(shape))], device=samples.device)
    flat = (samples.long() * strides).sum(1)
    return torch.bincount(flat, minlength=math.prod(shape)).reshape(shape)


def distribution_test(
    expected: torch.Tensor | np.ndarray,  # [V_1, ..., V_d] a distribution over cells
    *,
    counts: torch.Tensor | np.ndarray | None = None,  # same shape as expected
    samples: torch.Tensor | None = None,  # [N] or [N, d] cell coordinates
    alpha: float = ALPHA,
) -> DistributionTest:
    """Do these samples (or counts) come from `expected`? Chi-square and TV; see `stratified_test`.

    Give exactly one of `counts` and `samples`. Verdict: pass iff no sample hit a
    zero-probability cell, the chi-square p-value is >= alpha and the TV is within
    `tv_bound(m, N, alpha)` (m = cells of positive probability).
    """
    e = torch.as_tensor(expected, dtype=torch.float64)
    if (counts is None) == (samples is None):
        raise ValueError("give exactly one of counts and samples")
    if samples is not None:
        counts = counts_of(samples, tuple(e.shape))
    c = torch.as_tensor(counts)
    if tuple(c.shape) != tuple(e.shape):
        raise ValueError(f"counts must have the shape of expected {tuple(e.shape)}, got {tuple(c.shape)}")
    return stratified_test(e.reshape(1, -1), c.reshape(1, -1), alpha)
