"""specref.perf.domains.acceptance_by_kind and PROSE: acceptance gathered by kind of text (notebook 08)."""

from __future__ import annotations

import ast

import pytest
import torch

from specref.perf.domains import PROSE, acceptance_along, acceptance_by_kind, token_labels
from specref.sampling import SamplingParams

SNIPPET = 'def f(x):\n    """Twice x."""\n    return 2 * x  # a comment\n'


class _Fixed(torch.nn.Module):
    """Logits that depend only on the position: a model whose every output is known in advance."""

    def __init__(self, logits: torch.Tensor):
        super().__init__()
        self.logits = logits  # [L, V]
        self.device = torch.device("cpu")

    def forward(self, x: torch.Tensor) -> torch.Tensor:  # [1, T] -> [1, T, V]
        return self.logits[None, : x.shape[1]]


def _chars(text: str) -> list[int]:  # one token per character: ids are code points
    return [ord(ch) for ch in text]


def _pair(length: int) -> tuple[_Fixed, _Fixed]:
    g = torch.Generator().manual_seed(0)
    shape = (length, 200)
    return (_Fixed(torch.randn(shape, dtype=torch.float64, generator=g)),
            _Fixed(torch.randn(shape, dtype=torch.float64, generator=g)))


def test_every_position_lands_under_the_label_of_the_token_it_predicts() -> None:
    prose = "plain words " * 30  # 360 characters: three windows of 128
    target, draft = _pair(400)
    params = SamplingParams(1.0)
    beta_by, agree_by = acceptance_by_kind(target, draft, [SNIPPET], _chars, chr, params, prose=prose, window=128)
    kinds = token_labels(SNIPPET, _chars(SNIPPET), chr)[1:]
    beta, agree = acceptance_along(target, draft, _chars(SNIPPET), params)
    for kind in ("code", "comment", "docstring"):
        want = [b for k, b in zip(kinds, beta.tolist()) if k == kind]
        assert want and beta_by[kind] == want
        assert agree_by[kind] == [a for k, a in zip(kinds, agree.tolist()) if k == kind]
    # The prose in windows: every position but the first scored once, each window restarting the context.
    assert len(beta_by["prose"]) == len(prose) - 1 == len(agree_by["prose"])
    first, _ = acceptance_along(target, draft, _chars(prose)[:129], params)
    assert beta_by["prose"][:128] == first.tolist()
    assert set(beta_by) == {"code", "comment", "docstring", "prose"}
    assert "prose" not in acceptance_by_kind(target, draft, [SNIPPET], _chars, chr, params)[0]
    with pytest.raises(ValueError, match="window must be >= 1"):
        acceptance_by_kind(target, draft, [SNIPPET], _chars, chr, params, prose=prose, window=0)


def test_the_prose_is_english_and_not_python() -> None:
    words = PROSE.split()
    assert len(words) > 200 and PROSE == " ".join(words)  # one paragraph, single spaces
    with pytest.raises(SyntaxError):
        ast.parse(PROSE)
