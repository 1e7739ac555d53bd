"""GPT-2-style byte-level BPE tokenizer (HF ``tokenizers``), trained on Python source.

Byte-level means every string round-trips exactly: text is first mapped to
bytes, so no input is ever "unknown".  ``<|endoftext|>`` separates documents,
as in GPT-2.
"""

from __future__ import annotations

import operator
from collections.abc import Iterable, Sequence
from pathlib import Path

from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

EOT = "<|endoftext|>"


class BPETokenizer:
    """A thin wrapper over ``tokenizers.Tokenizer`` with ``encode(text) -> list[int]`` and ``decode(ids) -> str``.

    The wrapped object is ``.tok`` (a ``tokenizers.Tokenizer``), for anything else.
    """

    def __init__(self, tok: Tokenizer) -> None:
        if not isinstance(tok, Tokenizer):
            raise TypeError(f"tok must be a tokenizers.Tokenizer, got {type(tok).__name__}")
        self.tok = tok
        eot = tok.token_to_id(EOT)
        self.eot_id: int | None = eot

    @property
    def vocab_size(self) -> int:
        return self.tok.get_vocab_size()

    def encode(self, text: str) -> list[int]:
        if not isinstance(text, str):
            raise TypeError(f"text must be a str, got {type(text).__name__}")
        return self.tok.encode(text).ids

    def encode_batch(self, texts: Sequence[str]) -> list[list[int]]:
        return [e.ids for e in self.tok.encode_batch(list(texts))]

    def decode(self, ids: Sequence[int] | Iterable[int]) -> str:
        raw = ids.tolist() if hasattr(ids, "tolist") else ids
        try:
            ids = [operator.index(i) for i in raw]  # ints only: a float id is not silently truncated
        except TypeError:
            raise TypeError(f"ids must be a sequence of integer token ids, got {ids!r}") from None
        bad = [i for i in ids if not 0 <= i < self.vocab_size]
        if bad:
            raise ValueError(f"ids must lie in [0, {self.vocab_size}), got {bad[:5]}")
        return self.tok.decode(ids, skip_special_tokens=False)

    def token_str(self, token_id: int) -> str:
        """The text of one token (for tracing a decode step token by token)."""
        return self.decode([token_id])

    def save(self, path: str | Path) -> None:
        self.tok.save(str(path))

    def __len__(self) -> int:
        return self.vocab_size

    def __repr__(self) -> str:
        return f"BPETokenizer(vocab_size={self.vocab_size})"


def new_byte_level_bpe() -> Tokenizer:
    """An untrained GPT-2-style tokenizer: ByteLevel pre-tokenizer and decoder, BPE model."""
    tok = Tokenizer(models.BPE())
    # add_prefix_space=False: a file's first token is not special-cased, as in GPT-2.
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    return tok


def train_tokenizer(texts: Iterable[str], vocab_size: int = 4096) -> BPETokenizer:
    """Train byte-level BPE on ``texts``; id 0 is ``<|endoftext|>``, then the 256 byte symbols."""
    if not isinstance(vocab_size, int) or vocab_size < 257 + 1:
        raise ValueError(f"vocab_size must be an int > 257, got {vocab_size!r}")
    tok = new_byte_level_bpe()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        special_tokens=[EOT],
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tok.train_from_iterator(texts, trainer=trainer)
    return BPETokenizer(tok)


def load_tokenizer(path: str | Path) -> BPETokenizer:
    """Load a ``tokenizer.json`` file (or a folder that contains one)."""
    path = Path(path)
    if path.is_dir():
        path = path / "tokenizer.json"
    if not path.is_file():
        raise FileNotFoundError(f"no tokenizer.json at {path}")
    return BPETokenizer(Tokenizer.from_file(str(path)))
