"""Where a draft agrees with its target, by kind of text: code, comments, docstrings, prose (nb 08).

`source_labels` marks every character of a Python snippet as "code", "comment" or
"docstring" with the standard library's `tokenize` (a docstring is a string that is a
statement of its own; a snippet cut inside one, which `tokenize` cannot finish, is a
docstring from its opening quotes to the end). `token_labels` gives each BPE token the
label of its first non-blank character. `acceptance_along` scores a text teacher-forced:
at every position, beta = sum_x min(p(x), q(x)), the probability that one draft from q
is accepted there (`specref.rejection.acceptance_probability`), and whether the two argmaxes
agree (greedy acceptance). `acceptance_by_kind` gathers both over many texts by label, with `PROSE`, a
paragraph of English written for the course (not Python, not a text the bundled pair can have seen), as "prose".
"""

from __future__ import annotations

import io
import tokenize
from collections import defaultdict
from collections.abc import Callable, Sequence

import torch

from ..rejection import acceptance_probability
from ..sampling import SamplingParams

LABELS = ("code", "comment", "docstring")
PROSE = " ".join("""
Early on a winter morning the baker lights the oven and lets it warm while the dough rests under a cloth. The
bakery is quiet at that hour. Flour hangs in the air, the radio plays softly, and the first customers will not
arrive for another two hours. She shapes the loaves by hand, folding each one twice and turning it until the
surface is smooth and tight. Her grandfather taught her this when she was a child, standing on a wooden box to
reach the table, and she still counts the folds under her breath the way he did. When the oven is hot enough she
slides the loaves in on a long paddle, throws a cup of water onto the floor of the oven and closes the door
quickly, so that the steam stays inside and the crust can rise before it hardens. Twenty minutes later the smell
reaches the street. A man walking his dog stops at the window, reads the sign on the door, and decides to come
back later. By the time the sun is up the shelves are full, the coffee machine is running, and the baker sits
down for the first time, tired but content, with a slice of warm bread and a little butter. Tomorrow she will do
it all again, and the day after that, because people in the village expect their bread, and because she would
not know what else to do with her mornings.
""".split())
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


def acceptance_by_kind(
    target: torch.nn.Module,
    draft: torch.nn.Module,
    texts: Sequence[str],
    encode: Callable[[str], list[int]],
    decode: Callable[[int], str],
    params: SamplingParams,
    prose: str | None = None,
    window: int = 128,
) -> tuple[dict[str, list[float]], dict[str, list[bool]]]:
    """`acceptance_along` over Python `texts`, each position labelled by the token it predicts (`token_labels`),
    and over `prose` in windows of `window` tokens under "prose": (beta by label, greedy agreement by label)."""
    if window < 1:
        raise ValueError(f"window must be >= 1 token, got {window}")
    beta_by: dict[str, list[float]] = defaultdict(list)
    agree_by: dict[str, list[bool]] = defaultdict(list)
    for text in texts:
        ids = encode(text)
        kinds = token_labels(text, ids, decode)
        beta, agree = acceptance_along(target, draft, ids, params)
        for kind, b, a in zip(kinds[1:], beta.tolist(), agree.tolist()):  # position i predicts token i + 1
            beta_by[kind].append(b)
            agree_by[kind].append(a)
    if prose is not None:
        ids = encode(prose)
        for start in range(0, len(ids) - 1, window):
            beta, agree = acceptance_along(target, draft, ids[start:start + window + 1], params)
            beta_by["prose"] += beta.tolist()
            agree_by["prose"] += agree.tolist()
    return dict(beta_by), dict(agree_by)
