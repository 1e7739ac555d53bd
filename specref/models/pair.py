"""Held-out prompts for the bundled pair: code the models never saw in training."""

from __future__ import annotations

import importlib.resources
import json

from .pretrained import assets_dir
from .tokenizer import BPETokenizer, load_tokenizer


def heldout_texts() -> list[str]:
    """The bundled prompt texts (first lines of functions from held-out stdlib files)."""
    record = json.loads(assets_dir().joinpath("heldout_prompts.json").read_text())
    return [p["text"] for p in record["prompts"]]


def bundled_tokenizer() -> BPETokenizer:
    """The tokenizer the bundled pair shares."""
    with importlib.resources.as_file(assets_dir().joinpath("tokenizer.json")) as path:
        return load_tokenizer(path)


def heldout_prompts(n: int = 8, n_tokens: int = 64) -> list[list[int]]:
    """The first n prompts, each cut to its first n_tokens tokens of the bundled tokenizer."""
    texts = heldout_texts()
    if not 1 <= n <= len(texts):
        raise ValueError(f"n must be in [1, {len(texts)}], got {n}")
    tok = bundled_tokenizer()
    out = []
    for text in texts[:n]:
        ids = tok.encode(text)
        if len(ids) < n_tokens:
            raise ValueError(f"a prompt has only {len(ids)} tokens; ask for n_tokens <= {len(ids)}")
        out.append(ids[:n_tokens])
    return out
