"""Measuring a target/draft pair against the chapter's speedup formula.

One plain decoding run and one speculative run per k on the same prompts give
everything: alpha (accepted / examined drafts), tokens per step, the speedup,
and the costs as decoding ran them, relative to one plain step (plain decoding's
time per token, its sampling included): c(k) = time per draft pass (the draft's
sampling included), v(k) = time per verification (the target's pass over k + 1
tokens plus the acceptance rule). The chapter's S(alpha, k, c) = E / (1 + c k)
assumes v(k) = 1; the refined E / (v(k) + c k) uses the measured v(k). The
refined prediction counts the passes and the rule, so measured / refined is
about their share of the time, times tokens per step / E: what it misses is
the loop's own bookkeeping.
"""

from __future__ import annotations

import time
from dataclasses import asdict, dataclass

import torch

from .._validate import check_int
from ..decoding.chain import generate, speculative_generate
from ..decoding.loop import SpecStats
from ..theory import expected_tokens_per_step, speedup
from ..timing import sync


@dataclass(frozen=True)
class SpeculativeRun:
    """One k: what speculative decoding did, how fast, and what the formulas predicted.

    alpha is accepted / examined drafts (`theory.estimate_alpha`), the alpha of the formulas.
    Times are totals in seconds over all prompts.
    """

    k: int
    alpha: float
    tokens_per_step: float
    mean_accepted: float
    c: float  # time per draft pass / time per plain decoding step
    v: float  # time per verification (target pass + rule; prefill included) / time per plain decoding step
    time_plain: float
    time_speculative: float
    time_target: float
    time_draft: float
    time_verify: float
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

    @property
    def verify_share(self) -> float:
        """Share of the speculative wall time spent in the acceptance rule (counted in v)."""
        return self.time_verify / self.time_speculative

    @property
    def loop_share(self) -> float:
        """Share of the speculative wall time outside the passes and the rule: the loop's bookkeeping."""
        return self.time_overhead / self.time_speculative

    def as_dict(self) -> dict[str, float]:
        d = asdict(self)
        d.update(speedup=self.speedup, predicted=self.predicted, refined=self.refined,
                 verify_share=self.verify_share, loop_share=self.loop_share)
        return d


def _timed(fn):
    t0 = time.perf_counter()
    out = fn()
    return out, time.perf_counter() - t0


def _check_prompts(prompts: object, max_new_tokens: object) -> None:
    if not isinstance(prompts, (list, tuple)) or not prompts:
        raise ValueError("prompts must be a non-empty list of [1, T] token-id tensors")
    for ids in prompts:
        if not isinstance(ids, torch.Tensor) or ids.dim() != 2 or ids.shape[0] != 1:
            raise ValueError(f"each prompt must be a [1, T] tensor, got {getattr(ids, 'shape', type(ids).__name__)}")
    check_int("max_new_tokens", max_new_tokens, 1, "tokens to generate per prompt", wrong_type=ValueError)


@torch.no_grad()
def plain_time(
    target: torch.nn.Module, prompts: list[torch.Tensor], max_new_tokens: int, temperature: float = 0.0, seed: int = 0
) -> float:
    """Total seconds of plain decoding over the prompts (one sequence at a time)."""
    _check_prompts(prompts, max_new_tokens)
    total = 0.0
    for i, ids in enumerate(prompts):
        g = torch.Generator(device=target.device).manual_seed(seed + i)
        sync(target.device)
        _, t = _timed(lambda ids=ids, g=g: generate(target, ids, max_new_tokens, temperature=temperature, generator=g))
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
    time_plain: float,
    temperature: float = 0.0,
    seed: int = 0,
) -> SpeculativeRun:
    """Speculative decoding of every prompt with this k; pools the stats and compares with the formulas.

    `time_plain` is `plain_time` on the same prompts and settings; its time per token is the unit of c and v.
    """
    _check_prompts(prompts, max_new_tokens)
    if not isinstance(time_plain, (int, float)) or isinstance(time_plain, bool) or not time_plain > 0:
        raise ValueError(f"time_plain must be a positive number of seconds (from plain_time), got {time_plain!r}")
    pooled = SpecStats(k=k)
    total = 0.0
    for i, ids in enumerate(prompts):
        g = torch.Generator(device=target.device).manual_seed(seed + i)
        (_, s), t = _timed(lambda ids=ids, g=g: speculative_generate(target, draft, ids, k=k, max_new_tokens=max_new_tokens,
                                                         temperature=temperature, generator=g,
                                                         timing=True))  # c and v need the passes' times
        total += t
        for name in ("target_passes", "draft_passes", "steps", "proposed", "examined", "accepted", "emitted",
                     "time_target", "time_draft", "time_verify", "time_total"):
            setattr(pooled, name, getattr(pooled, name) + getattr(s, name))
    t_step = time_plain / (len(prompts) * max_new_tokens)
    return SpeculativeRun(
        k=k,
        alpha=pooled.acceptance_rate,
        tokens_per_step=pooled.tokens_per_step,
        mean_accepted=pooled.mean_accepted,
        c=pooled.time_draft / max(pooled.draft_passes, 1) / t_step,
        v=(pooled.time_target + pooled.time_verify) / max(pooled.target_passes, 1) / t_step,
        time_plain=time_plain,
        time_speculative=total,
        time_target=pooled.time_target,
        time_draft=pooled.time_draft,
        time_verify=pooled.time_verify,
        time_overhead=pooled.time_overhead,
    )
