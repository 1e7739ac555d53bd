"""A whole speculative generation, recorded step by step: what was drafted, accepted, corrected or added (chapter 5).

`record_generation` runs the real `speculative_generate` (so every draft gets exactly
the loop it always gets, hidden-state hooks included) and reads each step's `ChainStep`
through the loop's step observer (`on_step`): what was drafted, how many drafts the row
kept and the tokens it appended. Nothing in the loop or the draft is changed or copied.
Acceptance by draft position, counted from these steps, is `specref.decoding.positions`.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from .._validate import check_int
from ..drafts import Draft
from .chain import ChainStep, speculative_generate
from .loop import SpecStats


@dataclass(frozen=True)
class RecordedStep:
    """One step of one sequence: the drafts, how many the target accepted, and what the step emitted."""

    start: int  # the sequence's length when the step began (position of its first new token)
    drafts: list[int]  # the k proposed tokens (k may shrink at the end of the budget)
    n_accepted: int
    emitted: list[int]  # the accepted drafts, then the target's token

    @property
    def kind(self) -> str:
        """What the target's token was: "correction" (a draft was rejected), "bonus" (all accepted), "target" (k = 0)."""
        if not self.drafts:
            return "target"
        return "bonus" if self.n_accepted == len(self.drafts) else "correction"

    @property
    def rejected(self) -> int | None:
        """The first rejected draft (the one the correction replaced), None when none was rejected."""
        return self.drafts[self.n_accepted] if self.n_accepted < len(self.drafts) else None


@torch.no_grad()
def record_generation(
    target: torch.nn.Module,
    draft: Draft | torch.nn.Module,
    input_ids: torch.Tensor,  # [T] or [1, T]
    k: int,
    max_new_tokens: int,
    temperature: float = 0.0,
    generator: torch.Generator | None = None,
) -> tuple[torch.Tensor, list[RecordedStep], SpecStats]:  # [1, T + max_new_tokens], steps, stats
    """`speculative_generate` on one sequence, with each step's drafts, accepted count and emitted tokens.

    The steps' emitted tokens, joined, are exactly the generated continuation.
    """
    k = check_int("k", k, 1, "k drafted tokens per step")
    if not isinstance(input_ids, torch.Tensor):
        raise TypeError(f"input_ids must be a [T] or [1, T] tensor of token ids, got {type(input_ids).__name__}")
    if input_ids.dim() == 2 and input_ids.shape[0] != 1:
        raise ValueError(f"record_generation records one sequence: input_ids must be [T] or [1, T], "
                         f"got {tuple(input_ids.shape)}")
    steps: list[RecordedStep] = []
    start = input_ids.shape[-1] if input_ids.dim() else 0  # speculative_generate refuses a 0-d input

    def record(step: ChainStep) -> None:
        nonlocal start
        kept = step.kept[0]  # tokens the row appended: its accepted drafts, then the target's, cut by the budget
        steps.append(RecordedStep(start, step.drafts[0].tolist(), min(step.n_accepted[0], kept),
                                  step.out[0, :kept].tolist()))
        start += kept

    out, stats = speculative_generate(target, draft, input_ids, k=k, max_new_tokens=max_new_tokens,
                                      temperature=temperature, generator=generator, on_step=record)
    return out, steps, stats
