"""Measuring a target/draft pair against the chapter's speedup formula.

Measured: alpha (accepted / examined drafts), tokens per step, wall time of plain
and speculative decoding on the same prompts, c (draft step time / target step
time) and v(k) (target time to score k+1 tokens / time to score 1), both timed
in the order decoding runs the passes. Predicted:
the chapter's S(alpha, k, c) = E / (1 + c k), which assumes v(k) = 1, and the
refined E / (v(k) + c k) that uses the measured v(k).
"""

from __future__ import annotations

import time
from dataclasses import asdict, dataclass

import torch

from .costs import forward_time, speculative_pass_times, sync
from .decode import SpecStats, generate, speculative_generate
from .theory import expected_tokens_per_step, speedup


@dataclass(frozen=True)
class PairCosts:
    """c(k) and v(k) for one pair at one context length, relative to one plain decoding step."""

    t_target: float  # seconds, a target pass scoring 1 token (plain decoding: target passes back to back)
    t_draft: dict[int, float]  # k -> seconds of one draft step, timed in the speculative pattern
    t_verify: dict[int, float]  # k -> seconds of a target pass scoring k+1 tokens, same pattern

    def c(self, k: int) -> float:
        """Draft step cost / plain target step cost."""
        return self.t_draft[k] / self.t_target

    def v(self, k: int) -> float:
        """Cost of verifying k+1 tokens / plain target step cost (the chapter assumes 1)."""
        return self.t_verify[k] / self.t_target


def measure_costs(
    target: torch.nn.Module, draft: torch.nn.Module, ks: list[int], context_len: int = 64, repeats: int = 30
) -> PairCosts:
    """Time a plain target step, and for each k a draft step and a (k+1)-token target pass, as decoding runs them."""
    t1 = forward_time(target, 1, context_len, repeats=repeats)
    t_draft, t_verify = {}, {}
    for k in ks:
        t_draft[k], t_verify[k] = speculative_pass_times(target, draft, k, context_len, repeats=repeats)
    return PairCosts(t1, t_draft, t_verify)


@dataclass(frozen=True)
class SpeculativeRun:
    """One k: what speculative decoding did, how fast, and what the formulas predicted.

    alpha is accepted / examined drafts (`theory.estimate_alpha`), the alpha of the formulas.
    """

    k: int
    alpha: float
    tokens_per_step: float
    mean_accepted: float
    c: float
    v: float
    time_plain: float
    time_speculative: float
    time_target: float
    time_draft: float
    time_overhead: float

    @property
    def speedup(self) -> float:
        return self.time_plain / self.time_speculative

    @property
    def predicted(self) -> float:
        """The chapter's S(alpha, k, c): verification assumed as cheap as one step (v = 1)."""
        return float(speedup(self.alpha, self.k, self.c))

    @property
    def refined(self) -> float:
        """E(alpha, k) / (v(k) + c k): the same formula with the measured verification cost."""
        return float(expected_tokens_per_step(self.alpha, self.k)) / (self.v + self.c * self.k)

    def as_dict(self) -> dict[str, float]:
        d = asdict(self)
        d.update(speedup=self.speedup, predicted=self.predicted, refined=self.refined)
        return d


def _timed(fn):
    t0 = time.perf_counter()
    out = fn()
    return out, time.perf_counter() - t0


@torch.no_grad()
def plain_time(
    target: torch.nn.Module, prompts: list[torch.Tensor], max_new_tokens: int, temperature: float = 0.0, seed: int = 0
) -> float:
    """Total seconds of plain decoding over the prompts (one sequence at a time)."""
    total = 0.0
    for i, ids in enumerate(prompts):
        g = torch.Generator(device=target.device).manual_seed(seed + i)
        sync(target.device)
        _, t = _timed(lambda: generate(target, ids, max_new_tokens, temperature=temperature, generator=g))
        sync(target.device)
        total += t
    return total


@torch.no_grad()
def speculative_run(
    target: torch.nn.Module,
    draft: torch.nn.Module,
    prompts: list[torch.Tensor],  # each [1, T]
    k: int,
    max_new_tokens: int,
    costs: PairCosts,
    time_plain: float,
    temperature: float = 0.0,
    seed: int = 0,
) -> SpeculativeRun:
    """Speculative decoding of every prompt with this k; pools the stats and compares with the formulas."""
    pooled = SpecStats(k=k)
    total = 0.0
    for i, ids in enumerate(prompts):
        g = torch.Generator(device=target.device).manual_seed(seed + i)
        (_, s), t = _timed(lambda: speculative_generate(target, draft, ids, k=k, max_new_tokens=max_new_tokens,
                                                         temperature=temperature, generator=g))
        total += t
        pooled.steps += s.steps
        pooled.proposed += s.proposed
        pooled.examined += s.examined
        pooled.accepted += s.accepted
        pooled.emitted += s.emitted
        pooled.time_target += s.time_target
        pooled.time_draft += s.time_draft
        pooled.time_total += s.time_total
    return SpeculativeRun(
        k=k,
        alpha=pooled.acceptance_rate,
        tokens_per_step=pooled.tokens_per_step,
        mean_accepted=pooled.mean_accepted,
        c=costs.c(k),
        v=costs.v(k),
        time_plain=time_plain,
        time_speculative=total,
        time_target=pooled.time_target,
        time_draft=pooled.time_draft,
        time_overhead=pooled.time_overhead,
    )
