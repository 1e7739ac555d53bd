"""Where a draft agrees with its target, by kind of text: code, comments, docstrings, prose (nb 08).

`source_labels` marks every character of a Python snippet as "code", "comment" or
"docstring" with the standard library's `tokenize` (a docstring is a string that is a
statement of its own; a snippet cut inside one, which `tokenize` cannot finish, is a
docstring from its opening quotes to the end). `token_labels` gives each BPE token the
label of its first non-blank character. `acceptance_along` scores a text teacher-forced:
at every position, beta = sum_x min(p(x), q(x)), the probability that one draft from q
is accepted there (`specref.rejection.acceptance_probability`), and whether the two argmaxes
agree (greedy acceptance).
"""

from __future__ import annotations

import io
import tokenize
from collections.abc import Sequence

import torch

from ..rejection import acceptance_probability
from ..sampling import SamplingParams

LABELS = ("code", "comment", "docstring")
_SKIP = {tokenize.NL, tokenize.NEWLINE, tokenize.INDENT, tokenize.DEDENT, tokenize.COMMENT, tokenize.ENCODING}


def _offsets(text: str) -> list[int]:
    starts, total = [], 0
    for line in text.splitlines(keepends=True):
        starts.append(total)
        total += len(line)
    return starts + [total]


def source_labels(text: str) -> list[str]:
    """One label per character of a Python snippet: "code", "comment" or "docstring"."""
    if not isinstance(text, str):
        raise TypeError(f"text must be a str, got {type(text).__name__}")
    labels = ["code"] * len(text)
    starts = _offsets(text)
    at = lambda pos: starts[pos[0] - 1] + pos[1] if pos[0] - 1 < len(starts) else len(text)  # noqa: E731
    statement_start = True  # the next significant token begins a statement
    try:
        for tok in tokenize.generate_tokens(io.StringIO(text).readline):
            if tok.type == tokenize.COMMENT:
                labels[at(tok.start):at(tok.end)] = ["comment"] * (at(tok.end) - at(tok.start))
            elif tok.type == tokenize.STRING and statement_start:
                labels[at(tok.start):at(tok.end)] = ["docstring"] * (at(tok.end) - at(tok.start))
            if tok.type in (tokenize.NEWLINE, tokenize.INDENT, tokenize.DEDENT):
                statement_start = True
            elif tok.type not in _SKIP:
                statement_start = False
    except tokenize.TokenError as e:  # the snippet ends inside a bracket or a string
        start = at(e.args[1]) if len(e.args) > 1 and isinstance(e.args[1], tuple) else len(text)
        rest = text[start:].lstrip()
        if statement_start and rest[:3] in ('"""', "'''"):
            labels[start:] = ["docstring"] * (len(text) - start)
    except (IndentationError, SyntaxError):
        pass  # a snippet cut mid-block: what was read keeps its labels, the rest stays code
    return labels


def token_labels(text: str, ids: Sequence[int], decode) -> list[str]:
    """The label of each token's first non-blank character (blank tokens: their first character).

    `decode(id) -> str` must give the token's text; the pieces must add up to `text`.
    """
    chars = source_labels(text)
    pieces = [decode(i) for i in ids]
    if "".join(pieces) != text:
        raise ValueError("the tokens' pieces do not add up to the text (a character split across tokens?)")
    out, pos = [], 0
    for piece in pieces:
        blank = len(piece) - len(piece.lstrip())
        first = pos + (blank if blank < len(piece) else 0)
        out.append(chars[first] if first < len(chars) else "code")
        pos += len(piece)
    return out


@torch.no_grad()
def acceptance_along(
    target: torch.nn.Module,
    draft: torch.nn.Module,
    ids: Sequence[int],
    params: SamplingParams,
) -> tuple[torch.Tensor, torch.Tensor]:  # [T-1] beta, [T-1] bool
    """Teacher-forced along a text: beta at each position 1..T-1 (a draft from q accepted) and argmax agreement."""
    if not isinstance(params, SamplingParams):
        raise TypeError(f"params must be a specref.sampling.SamplingParams (the processing of p and q), "
                        f"got {type(params).__name__}")
    if len(ids) < 2:
        raise ValueError(f"ids must hold at least 2 tokens, got {len(ids)}")
    x = torch.tensor([list(ids)], device=target.device)
    lt, ld = target(x)[0, :-1], draft(x)[0, :-1]  # [T-1, V] each: the next token after each prefix
    if params.greedy:
        beta = (lt.argmax(-1) == ld.argmax(-1)).to(lt.dtype)
    else:
        beta = acceptance_probability(params.probs(lt), params.probs(ld))
    return beta, lt.argmax(-1) == ld.argmax(-1)
