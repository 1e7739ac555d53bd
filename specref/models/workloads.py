"""Prompt workloads for the bundled target (nb 05, 08): ordinary code, an "apply an edit" task, and a quote.

`heldout_prompts` (in `pair`) is the ordinary-code workload: the start of a held-out
function, continued freely. `edit_prompts` is the copy-heavy one. Rule: a prompt holds
a held-out snippet (whole lines of a held-out text, at most `n_tokens` tokens), then a
marker line naming the edit, then the start of the same snippet re-emitted with one
identifier renamed, from its start to the first word after the first renamed line. The continuation that
fits is the rest of the edited snippet, which is mostly a copy of text already in the
prompt: the workload where copying drafts (prompt lookup) would pay with a target that copies.
Every prompt leaves at least `EDIT_ROOM` positions of the target's 256-token window free.
`repeat_tokens` and `copy_agreement` measure whether a target copies at all (nb 05,
benchmarks/target_copies.py).

`quote_prompts` is the copy workload for a target that copies only what it would write anyway (the
bundled one: its argmax continues an exact repeat of a held-out snippet at about half the positions).
Rule: a passage is an opening of a held-out text followed by the target's own greedy continuation of
it; the prompt is the passage, a blank line, and the opening again: a reply that starts quoting its
context. `span_continuations` counts how much of a continuation copies the prompt.
"""

from __future__ import annotations

import keyword
import random
import re
from dataclasses import dataclass

import torch

from .._validate import check_int
from .pair import bundled_tokenizer, heldout_texts

N_POSITIONS = 256  # the bundled target's context window
EDIT_ROOM = 64  # new tokens every edit prompt leaves room for
MARKER = "\n\n# {old} -> {new}\n"
_IDENTIFIER = re.compile(r"\b[A-Za-z_][A-Za-z0-9_]*\b")
_SKIP = set(keyword.kwlist) | {"self", "cls", "None", "True", "False"}


@dataclass(frozen=True)
class EditPrompt:
    """One "apply an edit" prompt: its tokens, and the text it was built from."""

    tokens: list[int]  # snippet + marker + head
    snippet: str  # the held-out text it copies (whole lines)
    edited: str  # the snippet with `old` renamed to `new`: what a faithful continuation re-emits
    head: str  # the start of `edited` already in the prompt
    old: str
    new: str
    source: int  # index of the held-out text (`specref.models.pair.heldout_texts`)


def edit_cases(n: int = 8, n_tokens: int = 64, seed: int = 0) -> list[EditPrompt]:
    """n edit prompts from distinct held-out texts, chosen and edited by `seed` (same seed, same prompts).

    n_tokens caps the snippet (48 to 160 tokens); prompts are at most N_POSITIONS - EDIT_ROOM tokens.
    Texts with no identifier that occurs twice are skipped.
    """
    texts = heldout_texts()
    n = check_int("n", n, 1, "prompts")
    n_tokens = check_int("n_tokens", n_tokens, 48, "the snippet's length in tokens")
    if n_tokens > 160:
        raise ValueError(f"n_tokens must be <= 160, so snippet, marker and head fit with {EDIT_ROOM} tokens to spare; "
                         f"got {n_tokens}")
    seed = check_int("seed", seed, 0, "the workload's seed")
    rng = random.Random(seed)
    tok = bundled_tokenizer()
    out: list[EditPrompt] = []
    for source in rng.sample(range(len(texts)), len(texts)):
        case = _edit_case(texts[source], source, n_tokens, rng, tok)
        if case is not None:
            out.append(case)
        if len(out) == n:
            return out
    raise ValueError(f"only {len(out)} held-out texts make edit prompts at n_tokens={n_tokens}; ask for n <= {len(out)}")


def edit_prompts(n: int = 8, n_tokens: int = 64, seed: int = 0) -> list[list[int]]:
    """The token lists of `edit_cases(n, n_tokens, seed)`: the copy-heavy workload."""
    return [case.tokens for case in edit_cases(n, n_tokens, seed)]


def _edit_case(text: str, source: int, n_tokens: int, rng: random.Random, tok) -> EditPrompt | None:
    lines = text.splitlines(keepends=True)
    # The longest run of whole lines within n_tokens; the last line of a held-out text may be cut mid-word.
    snippet = ""
    for line in lines[:-1]:
        if len(tok.encode(snippet + line)) > n_tokens:
            break
        snippet += line
    if snippet.count("\n") < 3:
        return None
    counts: dict[str, int] = {}
    for name in _IDENTIFIER.findall(snippet):
        if name not in _SKIP and len(name) >= 2:
            counts[name] = counts.get(name, 0) + 1
    candidates = sorted(name for name, c in counts.items() if c >= 2)
    if not candidates:
        return None
    old = rng.choice(candidates)
    new = f"new_{old}"
    edited = re.sub(rf"\b{re.escape(old)}\b", new, snippet)
    # The head runs past the first renamed line into the next one, up to its first word: the copy has begun,
    # and the cut is mid-line (a cut right after a newline would split "\n" from the indent that follows it).
    line_end = edited.find("\n", edited.index(new)) + 1
    word = re.compile(r"\s*\S+").match(edited, line_end) if line_end else None
    if word is None:
        return None
    head = edited[: word.end()]
    if len(edited) - len(head) < 40:  # too little left to copy
        return None
    tokens = tok.encode(snippet + MARKER.format(old=old, new=new) + head)
    if len(tokens) > N_POSITIONS - EDIT_ROOM:
        return None
    return EditPrompt(tokens, snippet, edited, head, old, new, source)


QUOTE_SEPARATOR = "\n\n"  # between the quoted passage and the reply that starts quoting it


@dataclass(frozen=True)
class QuotePrompt:
    """One "reply quoting its context" prompt: passage, separator, then the passage's opening again."""

    tokens: list[int]  # passage + separator + opening
    passage: list[int]  # opening + the target's greedy continuation of it: the text the reply quotes
    opening: list[int]  # the first n_opening tokens of a held-out text
    source: int  # index of the held-out text (`specref.models.pair.heldout_texts`)


@torch.no_grad()
def _greedy(target, ids: torch.Tensor, n_new: int) -> torch.Tensor:  # [B, L] -> [B, L + n_new]
    """The target's greedy continuation with its KV cache (this floor has no decoding loop to call)."""
    cache = target.new_cache(ids.shape[0], max_len=ids.shape[1] + n_new)
    x = target(ids, cache=cache)[:, -1].argmax(-1, keepdim=True)  # [B, 1]
    out = [ids, x]
    for _ in range(n_new - 1):
        x = target(x, cache=cache)[:, -1].argmax(-1, keepdim=True)
        out.append(x)
    return torch.cat(out, dim=1)


def quote_cases(target, n: int = 8, n_opening: int = 32, n_passage: int = 96, seed: int = 0) -> list[QuotePrompt]:
    """n quote prompts for `target`, from distinct held-out texts chosen by `seed` (same target and seed, same prompts).

    The passage is the first n_opening tokens of a held-out text (16 to 64) and n_passage (32 to 128) tokens of
    the target's greedy continuation; the prompt is passage + QUOTE_SEPARATOR + opening, and leaves at least
    EDIT_ROOM positions of the window free. Greedy ties are broken by the target's own arithmetic: use float64
    for prompts that are the same on every CPU.
    """
    n = check_int("n", n, 1, "prompts")
    n_opening = check_int("n_opening", n_opening, 16, "the opening's length in tokens")
    n_passage = check_int("n_passage", n_passage, 32, "the passage's generated tokens")
    if n_opening > 64 or n_passage > 128:
        raise ValueError(f"n_opening must be <= 64 and n_passage <= 128, got {n_opening} and {n_passage}")
    seed = check_int("seed", seed, 0, "the workload's seed")
    tok = bundled_tokenizer()
    sep = tok.encode(QUOTE_SEPARATOR)
    if 2 * n_opening + n_passage + len(sep) + EDIT_ROOM > N_POSITIONS:
        raise ValueError(f"2 * n_opening + n_passage must be <= {N_POSITIONS - EDIT_ROOM - len(sep)}, "
                         f"so the prompt leaves {EDIT_ROOM} positions free; got {2 * n_opening + n_passage}")
    texts = heldout_texts()
    sources = [i for i in random.Random(seed).sample(range(len(texts)), len(texts))
               if len(tok.encode(texts[i])) >= n_opening][:n]
    if len(sources) < n:
        raise ValueError(f"only {len(sources)} held-out texts have {n_opening} tokens; ask for n <= {len(sources)}")
    openings = [tok.encode(texts[i])[:n_opening] for i in sources]
    device = next(target.parameters()).device
    passages = _greedy(target, torch.tensor(openings, device=device), n_passage).tolist()  # [n, n_opening + n_passage]
    return [QuotePrompt(p + sep + o, p, o, i) for p, o, i in zip(passages, openings, sources)]


def quote_prompts(target, n: int = 8, n_opening: int = 32, n_passage: int = 96, seed: int = 0) -> list[list[int]]:
    """The token lists of `quote_cases(target, n, n_opening, n_passage, seed)`: the copy workload a target copies."""
    return [case.tokens for case in quote_cases(target, n, n_opening, n_passage, seed)]


def span_continuations(prompt: list[int], output: list[int], n: int = 2) -> tuple[int, int]:
    """(tokens of output that continue a span of prompt, len(output)).

    Output token j continues a span when the n tokens before it (in prompt + output) followed by it occur as
    n + 1 consecutive tokens of the prompt: a lookup of those n tokens in the prompt could have proposed it.
    """
    n = check_int("n", n, 1, "the span's length before the continued token")
    grams = {tuple(prompt[i : i + n + 1]) for i in range(len(prompt) - n)}
    context = list(prompt)
    hits = 0
    for t in output:
        hits += tuple(context[len(context) - n :] + [t]) in grams
        context.append(t)
    return hits, len(output)


def repeat_tokens(case: EditPrompt) -> tuple[list[int], int]:  # tokens [L], start
    """The snippet, a newline and the snippet again, as tokens, and where its copy starts: a third into the repeat.

    The cut is made in tokens (a cut in the text right after a newline would split a "\\n    " token).
    """
    tok = bundled_tokenizer()
    tokens = tok.encode(case.snippet + "\n" + case.snippet)
    return tokens, len(tokens) - 2 * len(tok.encode(case.snippet)) // 3


def copy_agreement(target, tokens: list[int], start: int) -> tuple[int, int]:
    """Teacher forced: (positions j >= start where the target's argmax after tokens[:j] is tokens[j], positions).

    On a copy, this is how often greedy verification can keep a drafter's proposal of the copy.
    """
    start = check_int("start", start, 1, "the first scored position (a prompt of at least one token)")
    if start >= len(tokens):
        raise ValueError(f"start must be < len(tokens) = {len(tokens)}, got {start}")
    ids = torch.tensor([tokens], device=target.device)  # [1, L]
    with torch.no_grad():
        guess = target(ids).argmax(-1)[0, start - 1 : -1]  # [L - start]: the target's token after each prefix
    return int((guess == ids[0, start:]).sum()), len(tokens) - start
