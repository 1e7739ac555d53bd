"""Graders for the notebook-04 exercises: greedy chain verification on the GPT-2 pair.

Each check compares the learner's function with specref's reference and raises
AssertionError with the failing input, the expected and the received output,
and a hint. The end-to-end check demands token-for-token equality with the
target's own greedy decoding, and that the learner really speculated (one
target pass per step, not per token).
"""

from __future__ import annotations

from collections.abc import Callable

import torch

from ...decoding.chain import generate, speculative_generate
from ...rejection import verify_chain_greedy


def _cases(n: int, seed: int) -> list[tuple[list[int], torch.Tensor]]:
    """Random (drafts, logits) pairs where the drafts match the argmax for a random prefix."""
    g = torch.Generator().manual_seed(seed)
    cases = []
    for i in range(n):
        k = 1 + i % 8
        V = int(torch.randint(3, 40, (1,), generator=g))
        logits = torch.randn(k + 1, V, generator=g, dtype=torch.float64)
        best = logits.argmax(-1)
        n_match = int(torch.randint(0, k + 1, (1,), generator=g))  # reject at each depth, or accept all
        drafts = best[:k].clone()
        for j in range(n_match, k):
            wrong = int(torch.randint(0, V - 1, (1,), generator=g))
            drafts[j] = wrong if wrong < best[j] else wrong + 1  # any token but the argmax
        cases.append((drafts.tolist(), logits))
    return cases


def check_greedy_verify(fn: Callable[[list[int], torch.Tensor], list[int]], n_cases: int = 300) -> None:
    """fn(draft_tokens, target_logits [k+1, V]) must return the emitted tokens of the greedy rule."""
    for drafts, logits in _cases(n_cases, seed=4):
        expected, n_acc = verify_chain_greedy(torch.tensor(drafts), logits)
        got = fn(list(drafts), logits.clone())
        got = [int(t) for t in (got.tolist() if isinstance(got, torch.Tensor) else got)]
        if got != expected.tolist():
            k = len(drafts)
            hint = (
                "after a mismatch, emit the target's argmax at that position and stop"
                if n_acc < k
                else "all drafts matched: add the bonus token, the argmax of the last row (position k)"
            )
            raise AssertionError(
                f"greedy_verify is wrong for k={k}:\n  drafts         {drafts}\n"
                f"  target argmax  {logits.argmax(-1).tolist()}\n"
                f"  expected       {expected.tolist()}\n  got            {got}\nhint: {hint}"
            )


def check_greedy_speculative(
    fn: Callable[[torch.nn.Module, torch.nn.Module, list[int], int, int], list[int]],
    target: torch.nn.Module,
    draft: torch.nn.Module,
    prompts: list[list[int]],
    ks: tuple[int, ...] = (1, 3, 5),
    max_new_tokens: int = 24,
) -> None:
    """fn(target, draft, prompt, k, max_new_tokens) must equal the target's greedy output, speculatively."""
    for prompt in prompts:
        ids = torch.tensor([prompt], device=target.device)
        expected = generate(target, ids, max_new_tokens, temperature=0)[0, len(prompt) :].tolist()
        for k in ks:
            calls: list[int] = []
            handle = target.register_forward_hook(lambda *_: calls.append(1))
            try:
                got = fn(target, draft, list(prompt), k, max_new_tokens)
            finally:
                handle.remove()
            got = [int(t) for t in (got.tolist() if isinstance(got, torch.Tensor) else got)]
            if got != expected:
                first = next((i for i, (a, b) in enumerate(zip(got, expected)) if a != b), min(len(got), len(expected)))
                raise AssertionError(
                    f"k={k}: the output differs from the target's greedy decoding at new token {first}\n"
                    f"  expected {expected}\n  got      {got}\n"
                    "hint: return exactly max_new_tokens new tokens (not the prompt); after each step append the "
                    "accepted drafts and the target's token, and never more than the budget"
                )
            _, stats = speculative_generate(target, draft, ids, k=k, max_new_tokens=max_new_tokens, temperature=0)
            steps = stats.target_passes - 1  # the reference also runs one prefill pass
            if len(calls) > steps + 1:
                raise AssertionError(
                    f"k={k}: your decoder called the target {len(calls)} times for {max_new_tokens} tokens; "
                    f"speculative decoding needs about {steps} (one pass per step, scoring all k drafts at once)"
                )
