"""Acceptance against training steps: a draft trained live, counted after each number of steps (chapter 5).

`acceptance_counts` runs greedy speculative decoding of a draft over fixed prompts and counts,
over every row-step: the tokens it emitted (tau is their mean, `tau_ci`) and, at each draft
position i, how many steps reached i (drafted at least i tokens and kept drafts 1 .. i-1) and
how many of those accepted draft i (`rate_ci`). Counted facts: the same prompts, target and
weights give the same counts on any machine (in float64).

`training_curve` trains Medusa heads on the frozen target (`specref.drafts.train.MedusaTrainer`)
and counts them after 0, N1, N2, ... steps; seconds of training are reported beside, as what this
machine made of it (a timed fact, not a checked one).
"""

from __future__ import annotations

import copy
from collections.abc import Sequence
from dataclasses import dataclass

import torch

from .._validate import check_gpt2, check_int
from ..decoding.chain import ChainStep, speculative_generate
from ..drafts.base import Draft
from ..drafts.medusa import MedusaDraft
from ..drafts.train import MedusaTrainer
from .intervals import Interval, rate_ci, tau_ci


@dataclass(frozen=True)
class AcceptanceCounts:
    """What one greedy run of a draft counted: tokens per row-step, (accepted, reached) per draft position."""

    k: int
    tokens_per_step: tuple[int, ...]  # one entry per row-step
    by_position: tuple[tuple[int, int], ...]  # [(accepted, reached)] at positions 1..k

    @property
    def tau(self) -> float:
        """Tokens per target pass: emitted tokens over row-steps."""
        return sum(self.tokens_per_step) / len(self.tokens_per_step)

    def tau_interval(self, level: float = 0.95) -> tuple[float, float, float]:
        """(tau, low, high), the bootstrap interval of `tau_ci`."""
        return tau_ci(self.tokens_per_step, level)

    def position_intervals(self, level: float = 0.95) -> list[Interval | None]:
        """Wilson's interval of accepted / reached at each position (None where no step reached it)."""
        return [rate_ci(a, r, level) if r else None for a, r in self.by_position]


def acceptance_counts(
    target: torch.nn.Module,
    draft: Draft,
    prompts: torch.Tensor,  # [B, T] token ids
    k: int,
    max_new_tokens: int,
) -> AcceptanceCounts:
    """Greedy speculative decoding of `prompts` with `draft`, k drafts per step: the counts (module docstring)."""
    target = check_gpt2(target)
    if not isinstance(draft, Draft):
        raise TypeError(f"draft must be a specref Draft, got {type(draft).__name__}")
    k = check_int("k", k, 1, "drafts per step")
    per_step: list[int] = []
    counts = [[0, 0] for _ in range(k)]

    def count(step: ChainStep) -> None:
        proposed = step.drafts.shape[1]
        for n_acc, kept in zip(step.n_accepted, step.kept):
            if not kept:  # a finished row takes no part in the step
                continue
            per_step.append(kept)
            for i in range(1, min(proposed, k) + 1):
                if n_acc < i - 1:
                    break
                counts[i - 1][1] += 1
                counts[i - 1][0] += n_acc >= i

    speculative_generate(target, draft, prompts, k=k, max_new_tokens=max_new_tokens, temperature=0.0,
                         on_step=count)
    return AcceptanceCounts(k, tuple(per_step), tuple((a, r) for a, r in counts))


@dataclass(frozen=True)
class CurvePoint:
    """The heads after `steps` training steps: their counts, the mean loss of the last steps, seconds so far."""

    steps: int
    counts: AcceptanceCounts
    loss: float | None  # mean training loss over the last (up to) 20 steps; None at step 0
    seconds: float  # training time so far on this machine (features excluded): timed, not counted


def training_curve(
    target: torch.nn.Module,
    steps: Sequence[int],
    generator: torch.Generator,
    prompts: torch.Tensor,  # [B, T] the fixed evaluation prompts (held out from training)
    k: int = 3,
    max_new_tokens: int = 48,
    eval_target: torch.nn.Module | None = None,
    **options: object,
) -> tuple[list[CurvePoint], MedusaTrainer]:
    """Train Medusa heads on the frozen `target` and count them after each of `steps` (increasing, from 0).

    Training runs on `target` (float32 is fastest); the counts on `eval_target` (default a float64
    copy of it, so that the counts do not depend on the machine's rounding). `options` go to
    `MedusaTrainer` (n_heads, n_windows, ctx, rows, lr, warmup); n_heads defaults to k.
    Returns the points and the trainer (its heads and record).
    """
    target = check_gpt2(target)
    k = check_int("k", k, 1, "drafts per step")
    marks = [check_int("steps", s, 0, "training steps") for s in steps]
    if not marks or any(b <= a for a, b in zip(marks, marks[1:])):
        raise ValueError(f"steps must be a non-empty increasing sequence of step counts, got {list(steps)}")
    if eval_target is None:
        eval_target = copy.deepcopy(target).to(torch.float64)
    options.setdefault("n_heads", k)
    trainer = MedusaTrainer(target, generator, **options)
    if k > trainer.heads.n_heads:
        raise ValueError(f"k={k} but the trainer has {trainer.heads.n_heads} heads: k must be <= n_heads")
    points = []
    for mark in marks:
        record = trainer.train(mark - trainer.record.steps)
        heads = trainer.heads_copy(eval_target.dtype, eval_target.device)
        counts = acceptance_counts(eval_target, MedusaDraft(eval_target, heads), prompts, k, max_new_tokens)
        last = record.losses[-20:]
        points.append(CurvePoint(mark, counts, sum(last) / len(last) if last else None, record.seconds))
    return points, trainer
