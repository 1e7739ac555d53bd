"""`load_draft(name, target)`: every shipped draft of chapter 5, ready for the bundled target.

Names: `model` (the bundled small GPT-2 as a `ModelDraft`), `prompt_lookup`
(`PromptLookupDraft.for_target`), and the trained head sets in `specref/assets/heads/`
(written by `tools/training/train_heads.py`): `medusa` (`MedusaDraft`), `eagle`, `eagle3`,
`eagle_notoken` (`EagleDraft`: EAGLE-1, EAGLE-3's fused features with training-time test,
and EAGLE-1 without the token one step ahead), `mtp` (`MTPDraft`). Besides the shipped ones,
`early_exit` (`SELF_DRAFTS`) is made of the target itself, nothing shipped: its first `n_layers`
blocks, its ln_f and its LM head (`SelfDraft`, self-speculation). Every draft is moved
to the target's device and dtype (a float64 copy of the target gets float64 heads). A head
set only fits the target it was trained on: its width, vocabulary, depth and a fingerprint
of its embedding are checked (`HeadsConfig.check_target`). Lookahead decoding is not a
draft here (the target drafts for itself): see `specref.decoding.lookahead`.
"""

from __future__ import annotations

import torch

from ..models.grow import GrownGPT2
from ..models.pair import assets_dir
from ..models.pretrained import load_folder
from .base import Draft
from .eagle import EagleDraft
from .early_exit import DEFAULT_LAYERS, SelfDraft
from .heads import load_bundled_heads
from .medusa import MedusaDraft
from .model import ModelDraft
from .mtp import MTPDraft

# name -> the head-set file stem in specref/assets/heads/ (None: no trained weights)
DRAFTS: dict[str, str | None] = {
    "model": None,
    "prompt_lookup": None,
    "medusa": "medusa",
    "eagle": "eagle1",
    "eagle3": "eagle3",
    "eagle_notoken": "eagle_notoken",
    "mtp": "mtp",
}

# Drafts made of the target itself (nothing shipped, nothing trained): name -> what the draft is.
SELF_DRAFTS: dict[str, str] = {
    "early_exit": "the target's first n_layers blocks, its ln_f and its LM head (SelfDraft)",
}


def load_draft(name: str, target: torch.nn.Module, *, n_layers: int | None = None) -> Draft:
    """The draft called `name` (see `DRAFTS` and `SELF_DRAFTS`), for `target`, on its device and in its dtype.

    `n_layers` is the early-exit draft's depth (default `early_exit.DEFAULT_LAYERS`); no other draft takes one.
    """
    if not isinstance(name, str):
        raise TypeError(f"name must be a str, one of {sorted(DRAFTS)} or {sorted(SELF_DRAFTS)}, "
                        f"got {type(name).__name__}")
    if name == "lookahead":
        raise ValueError("lookahead decoding is not a draft here: the target guesses its own n-grams in its own "
                         "loop; call specref.decoding.lookahead.lookahead_generate(target, ...)")
    if name not in DRAFTS and name not in SELF_DRAFTS:
        raise ValueError(f"unknown draft {name!r}: name must be one of {sorted(DRAFTS)}, "
                         f"or one of {sorted(SELF_DRAFTS)} (made of the target itself)")
    if n_layers is not None and name != "early_exit":
        raise ValueError(f"n_layers is the early-exit draft's depth; the {name!r} draft takes none")
    config = getattr(target, "config", None)
    if not isinstance(target, torch.nn.Module) or config is None or not hasattr(target, "lm_head"):
        raise TypeError(f"target must be a GPT-2 model (specref.models.gpt2.GPT2), got {type(target).__name__}")
    if name == "early_exit":  # the target's own modules: already on its device, in its dtype
        return SelfDraft(target, DEFAULT_LAYERS if n_layers is None else n_layers)
    if name == "prompt_lookup":
        # Imported here, not at the top: a kernel given specref without prompt lookup (ex05) loads the rest.
        from .prompt_lookup import PromptLookupDraft

        return PromptLookupDraft.for_target(target)
    if name == "model":
        draft = load_folder(assets_dir().joinpath("draft"), target.device, target.dtype)
        if draft.config.vocab_size != config.vocab_size:
            raise ValueError(f"the bundled draft model has vocab_size={draft.config.vocab_size}, the target "
                             f"{config.vocab_size}: it drafts only for a target with the bundled tokenizer")
        return ModelDraft(draft)
    # A grown target (specref.models.grow) hands the heads its features at the width they were trained on; they
    # borrow the embeddings and LM head of the model it grew from, which compute the same function.
    lender = target.base if isinstance(target, GrownGPT2) else target
    module, heads_config = load_bundled_heads(DRAFTS[name], target.device, target.dtype)
    heads_config.check_target(lender)
    if name == "medusa":
        return MedusaDraft(lender, module)
    if name == "mtp":
        return MTPDraft(lender, module)
    return EagleDraft(lender, module, heads_config)
