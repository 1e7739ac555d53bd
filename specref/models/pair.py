"""The bundled pair (chapter 4): target, draft and tokenizer, their training record, and held-out prompts
(code the models never saw in training).

No network is needed: everything is read from ``specref/assets`` through
``importlib.resources``, so it works from an installed package too.
"""

from __future__ import annotations

import importlib.resources
import json
from typing import Any

import torch

from .._validate import check_int
from .gpt2 import GPT2, use_small_kernel
from .grow import GrownGPT2, widen
from .kernels import KernelPath
from .pretrained import load_folder
from .tokenizer import BPETokenizer, load_tokenizer


def assets_dir() -> Any:
    """The bundled assets folder (an importlib.resources Traversable)."""
    return importlib.resources.files("specref").joinpath("assets")


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
    check_int("n", n, 1, "prompts")
    check_int("n_tokens", n_tokens, 1, "tokens per prompt")
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


def load_pair(
    device: torch.device | str | None = None,
    dtype: torch.dtype | None = None,
) -> tuple[GPT2, GPT2, BPETokenizer]:
    """The bundled ``(target, draft, tokenizer)``: two GPT-2s trained on Python source, one tokenizer.

    Both models are in eval mode, on ``device`` (default CPU) in ``dtype``
    (default float32).  See ``specref/assets/TRAINING.md`` for how they were made.
    """
    assets = assets_dir()
    needed = ["target/config.json", "target/model.safetensors", "draft/config.json",
              "draft/model.safetensors", "tokenizer.json"]
    missing = [f for f in needed if not assets.joinpath(*f.split("/")).is_file()]
    if missing:
        raise FileNotFoundError(f"the bundled assets are missing {missing} in {assets}; "
                                "run `python tools/training/train_pair.py` to create them")
    target = load_folder(assets.joinpath("target"), device, dtype)
    draft = load_folder(assets.joinpath("draft"), device, dtype)
    tokenizer = bundled_tokenizer()
    if target.config.vocab_size != draft.config.vocab_size or target.config.vocab_size != tokenizer.vocab_size:
        raise ValueError("bundled target, draft and tokenizer disagree on the vocabulary size")
    return target, draft, tokenizer


# How much wider the timing target is than the bundled one: 4 x 128 = 512 wide, 42 M parameters, 161 MiB in
# float32, far more than any CPU's cache, so every pass reads its weights from memory.
GROWTH = 4


def load_grown_pair(
    factor: int = GROWTH,
    device: torch.device | str | None = None,
    dtype: torch.dtype | None = None,
) -> tuple[GrownGPT2, GPT2, BPETokenizer, KernelPath]:
    """The pair for timing on a CPU: ``(grown target, draft, tokenizer, kernel path)``.

    The target is the bundled one grown `factor` times wider with the same function
    (`specref.models.grow.widen`): the same tokens and the same acceptance, at the cost of a
    model factor^2 times larger whose weights stream from memory on every pass, as a large
    model's do. In float32 on the CPU its passes run the few-token kernel
    (`specref.models.gpt2.use_small_kernel`) where one can be compiled; the last element says
    which kernel runs and why. The draft is the bundled draft, unchanged.
    """
    check_int("factor", factor, 1, "the growth factor")
    target, draft, tokenizer = load_pair(device, dtype)
    grown = widen(target, factor)
    return grown, draft, tokenizer, use_small_kernel(grown)


def training_record() -> dict[str, Any]:
    """The bundled pair's training record (``TRAINING.json``): corpus, sizes, perplexities, alpha."""
    return json.loads(assets_dir().joinpath("TRAINING.json").read_text())
