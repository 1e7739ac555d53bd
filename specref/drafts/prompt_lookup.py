"""Prompt lookup (n-gram) drafting: propose what followed the last time the context ended this way (chapter 5).

Rule: for n = max_ngram down to min_ngram, find the latest start i < L - n with
context[i : i+n] == context[L-n : L] (strictly earlier than the suffix: it may overlap it,
but ends before the last position); the first n that matches gives s = i + n, else s = L - 1.
Propose context[s], context[s+1], ..., and if the context ends before k tokens, start again
at s: proposal[j] = context[s + j % (L - s)]. So the copy runs on with period L - s, and no
match repeats the last token (`lookup`). `PromptLookupDraft(on_miss="skip")` instead proposes
nothing when no row of the batch matches, so the step is a plain decoding step and costs
no verification of a guess that has nothing behind it (rows that miss while another
matches still repeat their last token). q is one-hot on each proposed token, which keeps the
verifier exact at any temperature: x is accepted with probability min(1, p(x)), and
the residual is p without x, renormalized (a token p gives 0 is always rejected).
"""

from __future__ import annotations

from collections.abc import Sequence

import torch

from .._validate import check_int, check_rows
from ..sampling import SamplingParams
from .base import Draft, one_hot


def match(context: Sequence[int], max_ngram: int, min_ngram: int) -> int | None:
    """Where the copy starts: s = i + n for the longest n in max_ngram..min_ngram that matches (latest i), else None."""
    check_int("min_ngram", min_ngram, 1, "the shortest suffix looked up")
    check_int("max_ngram", max_ngram, min_ngram, "the longest suffix looked up, at least min_ngram")
    context = list(context)
    if not context:
        raise ValueError("prompt lookup needs a context of at least one token")
    L = len(context)
    for n in range(min(max_ngram, L - 1), min_ngram - 1, -1):  # longest n first; a match needs n < L
        suffix = context[L - n :]
        i = next((i for i in range(L - n - 1, -1, -1) if context[i : i + n] == suffix), None)
        if i is not None:
            return i + n
    return None


def lookup(context: Sequence[int], k: int, max_ngram: int, min_ngram: int) -> list[int]:  # [L] -> [k]
    """The k tokens prompt lookup proposes after `context` (the module docstring states the rule)."""
    check_int("k", k, 0, "tokens to propose")
    context = list(context)
    s = match(context, max_ngram, min_ngram)
    return _copy(context, len(context) - 1 if s is None else s, k)  # no match: repeat the last token


def _copy(context: list[int], s: int, k: int) -> list[int]:  # [L] -> [k]
    """context[s], context[s+1], ..., k of them, starting again at s where the context ends."""
    return [context[s + j % (len(context) - s)] for j in range(k)]


class PromptLookupDraft(Draft):
    """Prompt lookup as a draft: copy what followed the latest earlier occurrence of the context's last n tokens.

    Free (no model, no training), strong on copy-heavy text, weak on free writing.
    `on_miss`: "repeat" (the default: the rule of `lookup`, a row without a match proposes its
    last token again) or "skip" (propose nothing when no row matches).
    Stateless: a proposal is a function of the buffer alone, so `rollback` has
    nothing to forget. `dtype` is q's float type (`for_target` takes the target's).
    """

    def __init__(self, vocab_size: int, max_ngram: int = 3, min_ngram: int = 1,
                 dtype: torch.dtype = torch.float32, on_miss: str = "repeat") -> None:
        self.vocab_size = check_int("vocab_size", vocab_size, 1, "the vocabulary the drafts come from")
        if on_miss not in ("repeat", "skip"):
            raise ValueError(f"on_miss must be 'repeat' (propose the last token again) or 'skip' (propose nothing "
                             f"when no row matches), got {on_miss!r}")
        self.on_miss = on_miss
        self.max_ngram = check_int("max_ngram", max_ngram, 1, "the longest suffix looked up")
        self.min_ngram = check_int("min_ngram", min_ngram, 1, "the shortest suffix looked up")
        if max_ngram < min_ngram:
            raise ValueError(f"max_ngram must be >= min_ngram, got max_ngram={max_ngram} < min_ngram={min_ngram}")
        if not (isinstance(dtype, torch.dtype) and dtype.is_floating_point):
            raise TypeError(f"dtype must be a floating-point torch.dtype for q, got {dtype!r}")
        self.dtype = dtype

    @classmethod
    def for_target(cls, target: torch.nn.Module, max_ngram: int = 3, min_ngram: int = 1,
                   on_miss: str = "repeat") -> PromptLookupDraft:
        """A prompt lookup draft over the target's vocabulary, with q in the target's dtype."""
        if getattr(target, "config", None) is None or not hasattr(target, "dtype"):
            raise TypeError(f"target must be a GPT-2 model (specref.models.gpt2.GPT2), got {type(target).__name__}")
        return cls(int(target.config.vocab_size), max_ngram, min_ngram, target.dtype, on_miss)

    @torch.no_grad()
    def propose(
        self,
        tokens: torch.Tensor,  # [B, L] buffer; row b holds lengths[b] valid tokens
        lengths: torch.Tensor,  # [B]
        k: int,
        params: SamplingParams,  # unused: the proposal is deterministic and q one-hot, whatever the sampling
        generator: torch.Generator | None = None,  # unused, for the same reason
    ) -> tuple[torch.Tensor, torch.Tensor]:  # drafts [B, k], q [B, k, V]
        lengths = check_rows("lengths", lengths, self.begun())  # shapes here; the values on the host below
        tokens = check_rows("tokens", tokens, self.batch_size, "[B, L]")
        k = check_int("k", k, 0, "tokens to propose")
        V, dev = self.vocab_size, tokens.device
        if k == 0:
            return self.empty(tokens, self.dtype)
        # One copy to the host, the proposal's only read back: each row's length, then its buffer.
        rows = torch.cat([lengths[:, None].to(tokens.device, tokens.dtype), tokens], 1).tolist()
        if not all(1 <= row[0] <= tokens.shape[1] for row in rows):
            raise ValueError(f"lengths must be in [1, {tokens.shape[1]}] (the buffer's width), "
                             f"got {[row[0] for row in rows]}")
        contexts, starts = [], []
        for n, *row in rows:
            contexts.append(row[:n])
            starts.append(match(row[:n], self.max_ngram, self.min_ngram))
        if self.on_miss == "skip" and all(s is None for s in starts):
            k = 0  # nothing to copy in any row: the step becomes a plain decoding step
        drafts = [_copy(c, len(c) - 1 if s is None else s, k) for c, s in zip(contexts, starts)]
        if not all(0 <= x < V for d in drafts for x in d):
            raise ValueError(f"the buffer holds token ids outside the vocabulary [0, {V}), so would the drafts")
        x = torch.tensor(drafts, dtype=torch.long, device=dev).reshape(len(drafts), k)  # [B, k]
        return x, one_hot(x, V, self.dtype)
