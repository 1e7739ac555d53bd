"""Graders for exercise 5: prompt-lookup drafting, written by the learner as a function.

The learner writes lookup_proposal(context, k, max_ngram, min_ngram) -> k token ids
(the rule of `specref.drafts.prompt_lookup`). It is graded three ways: its proposals
against the reference `lookup` on random token streams; greedy losslessness when the
grader wraps it in a draft and runs it through the verifier (`speculative_generate`
equals `generate`); and its tokens per target pass on the copy-heavy edit workload,
next to the reference `PromptLookupDraft`'s. No wall-clock timing: passes are counted.
"""

from __future__ import annotations

import random
from collections.abc import Callable
from functools import cache

import numpy as np
import torch

from ...decoding.chain import generate, speculative_generate
from ...drafts import Draft, PromptLookupDraft
from ...drafts.prompt_lookup import lookup
from ...models.pair import heldout_prompts, load_pair
from ...models.workloads import edit_prompts
from ...sampling import SamplingParams
from .report import _call, _fail, _passed

Proposal = Callable[[list[int], int, int, int], object]


def _as_proposal(out: object, k: int) -> list[int] | None:
    """The learner's answer as k plain ints, or None when it is not k integers (no subclass survives int())."""
    if isinstance(out, torch.Tensor):
        if out.is_floating_point() or out.is_complex() or out.dtype == torch.bool or out.dim() != 1:
            return None
        out = out.tolist()
    if not isinstance(out, (list, tuple)) or len(out) != k:
        return None
    items = []
    for t in out:
        if isinstance(t, torch.Tensor) and t.numel() == 1 and not t.is_floating_point() and t.dtype != torch.bool:
            t = t.item()
        if isinstance(t, (bool, np.bool_)) or not isinstance(t, (int, np.integer)):
            return None
        items.append(int(t))
    return items


def _cases(n_cases: int, seed: int) -> list[tuple[list[int], int, int, int]]:
    """(context, k, max_ngram, min_ngram): the worked examples, then random streams over small vocabularies."""
    cases = [
        ([1, 2, 3, 1, 2], 3, 3, 1),  # "1 2" was followed by 3
        ([1, 2, 9, 2, 4, 1, 2], 1, 3, 1),  # the longest suffix wins
        ([5, 6, 5, 7, 5], 2, 3, 1),  # the latest occurrence wins
        ([1, 2, 1, 2, 1, 2], 5, 3, 1),  # the match overlaps the suffix; the copy runs on
        ([1, 2, 3], 2, 3, 1),  # no match: repeat the last token
        ([7], 3, 3, 1),  # one token
        ([4, 4, 1, 4], 2, 2, 2),  # min_ngram = 2: the single 4 does not count
    ]
    rng = random.Random(seed)
    while len(cases) < n_cases:
        vocab = rng.choice([2, 3, 4, 6])
        context = [rng.randrange(vocab) for _ in range(rng.randint(1, 24))]
        max_ngram = rng.randint(1, 4)
        cases.append((context, rng.randint(0, 9), max_ngram, rng.randint(1, max_ngram)))
    return cases[:n_cases]


def _proposal_hint(context: list[int], k: int, max_ngram: int, min_ngram: int, got: list[int]) -> str:
    earliest = _variant(context, k, max_ngram, min_ngram, latest=False)
    shortest = _variant(context, k, max_ngram, min_ngram, longest_first=False)
    if got == earliest:
        return "that copies after the EARLIEST occurrence; use the latest one (the start closest to the end)."
    if got == shortest:
        return "that tries the shortest n-gram first; try n = max_ngram first, down to min_ngram."
    return ("find the latest start i < L - n with context[i:i+n] == context[L-n:], longest n first; propose "
            "context[s], context[s+1], ... with s = i + n, wrapping to s again when the context runs out "
            "(no match: s = L - 1).")


def _variant(context: list[int], k: int, max_ngram: int, min_ngram: int, latest: bool = True,
             longest_first: bool = True) -> list[int]:
    """The usual mistakes, for hints: the earliest occurrence, or the shortest n-gram first."""
    L = len(context)
    s = L - 1
    ns = range(min(max_ngram, L - 1), min_ngram - 1, -1)
    for n in (ns if longest_first else reversed(ns)):
        starts = range(L - n - 1, -1, -1) if latest else range(0, L - n)
        i = next((i for i in starts if context[i : i + n] == context[L - n :]), None)
        if i is not None:
            s = i + n
            break
    return [context[s + j % (L - s)] for j in range(k)]


def check_proposals(fn: Proposal, n_cases: int = 150, seed: int = 0) -> None:
    """Grade lookup_proposal(context, k, max_ngram, min_ngram) against the reference on random token streams."""
    g = "check_proposals"
    for n, (context, k, max_ngram, min_ngram) in enumerate(_cases(n_cases, seed), 1):
        where = f"wrong answer on case {n} of {n_cases}."
        inputs = [f"context = {context}", f"k = {k}, max_ngram = {max_ngram}, min_ngram = {min_ngram}"]
        arg = list(context)
        out = _call(g, where, inputs, fn, arg, k, max_ngram, min_ngram)
        if arg != context:
            raise _fail(g, where, inputs, "your function changed `context` in place; build a new list instead.")
        got = _as_proposal(out, k)
        if got is None:
            raise _fail(g, where, inputs + [f"got {out!r}"], f"return a list of {k} token ids (ints).")
        want = lookup(context, k, max_ngram, min_ngram)
        if got != want:
            raise _fail(g, where, inputs + [f"expected {want}", f"got      {got}"],
                        _proposal_hint(context, k, max_ngram, min_ngram, got))
    _passed(g, f"{n_cases} token streams, proposals equal the reference")


class _LearnerDraft(Draft):
    """The grader's adapter: the learner's function as a `Draft` (one-hot q, stateless like PromptLookupDraft)."""

    def __init__(self, fn: Proposal, vocab_size: int, dtype: torch.dtype, max_ngram: int = 3, min_ngram: int = 1):
        self.fn, self.vocab_size, self.dtype = fn, vocab_size, dtype
        self.max_ngram, self.min_ngram = max_ngram, min_ngram
        self.calls: list[tuple[list[int], int, list[int]]] = []  # (context, k, proposal) of the first calls

    def begin(self, batch_size: int) -> None:
        self.batch_size = batch_size

    def propose(self, tokens: torch.Tensor, lengths: torch.Tensor, k: int, params: SamplingParams,
                generator: torch.Generator | None = None) -> tuple[torch.Tensor, torch.Tensor]:
        rows = []
        for row, n in zip(tokens.tolist(), lengths.tolist()):
            context = row[:n]
            out = self.fn(list(context), k, self.max_ngram, self.min_ngram)
            got = _as_proposal(out, k)
            if got is None or not all(0 <= x < self.vocab_size for x in got):
                raise _BadProposal(context, k, out)
            if len(self.calls) < 3:
                self.calls.append((context, k, got))
            rows.append(got)
        x = torch.tensor(rows, dtype=torch.long, device=tokens.device).reshape(len(rows), k)
        return x, torch.nn.functional.one_hot(x, self.vocab_size).to(self.dtype)

    def rollback(self, n_valid: torch.Tensor) -> None:
        pass  # stateless: each proposal reads the rolled-back buffer afresh


class _BadProposal(Exception):
    def __init__(self, context: list[int], k: int, out: object):
        super().__init__(f"for a context ending {context[-6:]} and k = {k}, your function returned {out!r}")


@cache
def _pair64():
    target, _, _ = load_pair(dtype=torch.float64)  # float64: the k+1-token pass and the 1-token pass agree on argmax
    return target


@cache
def _pair32():
    target, _, _ = load_pair()
    return target


def _run_draft(g: str, where: str, draft: Draft, target, ids: torch.Tensor, **kw):
    try:
        return speculative_generate(target, draft, ids, **kw)
    except _BadProposal as e:
        raise _fail(g, where, [str(e)], "return exactly k token ids, each in the vocabulary.") from None
    except NotImplementedError:
        raise
    except Exception as e:  # noqa: BLE001 - the learner's code ran inside the loop
        raise _fail(g, where, [f"speculative decoding with your draft raised {type(e).__name__}: {e}"]) from e


def check_lossless(fn: Proposal, ks: tuple[int, ...] = (3,), max_new_tokens: int = 24, first_prompt: int = 0) -> None:
    """Greedy speculative decoding with the learner's proposals equals the target's greedy output."""
    g = "check_lossless"
    target = _pair64()
    batches = [torch.tensor(heldout_prompts(first_prompt + 2, 40)[first_prompt:]),  # B = 2, ordinary code
               torch.tensor([edit_prompts(1, seed=first_prompt)[0]])]  # B = 1, the copy workload
    for ids in batches:
        expected = generate(target, ids, max_new_tokens, temperature=0)
        for k in ks:
            where = f"greedy output differs (B = {ids.shape[0]}, k = {k}, {max_new_tokens} new tokens)."
            draft = _LearnerDraft(fn, target.config.vocab_size, target.dtype)
            got, _ = _run_draft(g, where, draft, target, ids, k=k, max_new_tokens=max_new_tokens, temperature=0)
            if not torch.equal(got, expected):
                raise _fail(g, where, [f"expected {expected[:, ids.shape[1]:].tolist()}",
                                       f"got      {got[:, ids.shape[1]:].tolist()}"],
                            "the verifier keeps greedy output exact for any proposal, so check that your function "
                            "returns plain ints and does not depend on anything but its arguments.")
    _passed(g, f"greedy output equals the target's for k in {list(ks)}, B = 1 and 2")


def tokens_per_pass(draft: Draft, prompts: list[list[int]], k: int, max_new_tokens: int) -> float:
    """Tokens emitted per target pass, greedy, over prompts run one at a time (bundled target, float32)."""
    target = _pair32()
    emitted = steps = 0
    for p in prompts:
        _, stats = speculative_generate(target, draft, torch.tensor([p]), k=k, max_new_tokens=max_new_tokens,
                                        temperature=0)
        emitted, steps = emitted + stats.emitted, steps + stats.steps
    return emitted / steps


@cache
def _reference_tokens_per_pass(n_prompts: int, k: int, max_new_tokens: int, seed: int) -> float:
    """The reference PromptLookupDraft's figure (computed once per setting and process)."""
    draft = PromptLookupDraft.for_target(_pair32())
    return tokens_per_pass(draft, edit_prompts(n_prompts, seed=seed), k, max_new_tokens)


def check_tokens_per_pass(fn: Proposal, n_prompts: int = 3, k: int = 8, max_new_tokens: int = 32, seed: int = 0,
                          margin: float = 0.9) -> None:
    """On the edit workload, the learner's draft gets at least `margin` x the reference's tokens per target pass."""
    g = "check_tokens_per_pass"
    target = _pair32()
    prompts = edit_prompts(n_prompts, seed=seed)
    where = f"too few tokens per target pass on the edit workload ({n_prompts} prompts, k = {k}, greedy)."
    draft = _LearnerDraft(fn, target.config.vocab_size, target.dtype)
    try:
        got = tokens_per_pass(draft, prompts, k, max_new_tokens)
    except _BadProposal as e:
        raise _fail(g, where, [str(e)], "return exactly k token ids, each in the vocabulary.") from None
    except NotImplementedError:
        raise
    except Exception as e:  # noqa: BLE001
        raise _fail(g, where, [f"speculative decoding with your draft raised {type(e).__name__}: {e}"]) from e
    want = _reference_tokens_per_pass(n_prompts, k, max_new_tokens, seed)
    if not got >= margin * want:
        raise _fail(g, where, [f"reference PromptLookupDraft: {want:.2f} tokens per pass", f"yours: {got:.2f}"],
                    "copying what followed the latest match of the longest suffix is what makes lookup pay here.")
    _passed(g, f"tokens per target pass on the edit workload at least {margin} x the reference's")
