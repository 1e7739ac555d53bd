"""load_draft: every shipped draft, ready for the bundled target, and refused for any other target.

The head sets are read from specref/assets/heads/ (tools/training/train_heads.py); every one of them is
part of the course, so a lost file fails. What every draft must do once loaded (greedy output equal to the
target's, on the bundled and the grown target) is tests/test_draft_contract.py's.
"""

from __future__ import annotations

import copy

import pytest
import torch
from model_factory import small_gpt2

from specref import load_draft
from specref.drafts import MedusaDraft, ModelDraft, MTPDraft, PromptLookupDraft
from specref.drafts.eagle import EagleDraft
from specref.drafts.load import DRAFTS
from specref.models.pair import assets_dir, load_pair

HEADS = {name: stem for name, stem in DRAFTS.items() if stem is not None}
CLASSES = {"model": ModelDraft, "prompt_lookup": PromptLookupDraft, "medusa": MedusaDraft, "eagle": EagleDraft,
           "eagle3": EagleDraft, "eagle_notoken": EagleDraft, "mtp": MTPDraft}


@pytest.fixture(scope="module")
def target64():
    """The bundled target in float64: the k+1-token pass and the one-token pass cannot round a near-tie apart."""
    return load_pair(dtype=torch.float64)[0]


def test_the_names_are_the_courses_drafts():
    assert sorted(DRAFTS) == sorted(CLASSES)


def test_every_head_set_is_shipped():
    missing = [f"{stem}.safetensors" for stem in HEADS.values()
               if not assets_dir().joinpath("heads", f"{stem}.safetensors").is_file()]
    assert not missing, f"specref/assets/heads/ has lost {missing} (tools/training/train_heads.py writes them)"


@pytest.mark.parametrize("name", sorted(CLASSES))
def test_each_draft_loads_on_the_targets_device_and_dtype(target64, name):
    draft = load_draft(name, target64)
    assert type(draft) is CLASSES[name]
    assert draft.vocab_size == target64.config.vocab_size
    module = {"model": lambda d: d.model, "medusa": lambda d: d.heads, "mtp": lambda d: d.modules[0],
              "eagle": lambda d: d.layer, "eagle3": lambda d: d.layer, "eagle_notoken": lambda d: d.layer}.get(name)
    if module is not None:
        p = next(module(draft).parameters())
        assert (p.dtype, p.device) == (torch.float64, target64.device)
    if name == "prompt_lookup":
        assert draft.dtype == torch.float64


# -- bad input -----------------------------------------------------------------------------------


def test_an_unknown_name_lists_the_drafts():
    target = small_gpt2(vocab=16, n_embd=8, n_layer=1, seed=0)
    with pytest.raises(ValueError, match=r"unknown draft 'hydra'.*\['eagle', 'eagle3', 'eagle_notoken', 'medusa', "
                                         r"'model', 'mtp', 'prompt_lookup'\]"):
        load_draft("hydra", target)
    with pytest.raises(TypeError, match="name must be a str"):
        load_draft(3, target)
    with pytest.raises(TypeError, match="target must be a GPT-2 model"):
        load_draft("medusa", "the bundled target")


def test_lookahead_is_not_a_draft():
    with pytest.raises(ValueError, match="lookahead decoding is not a draft here.*lookahead_generate"):
        load_draft("lookahead", small_gpt2(vocab=16, n_embd=8, n_layer=1, seed=0))


@pytest.mark.parametrize("name", sorted(HEADS))
def test_heads_refuse_a_target_of_another_shape(name):
    with pytest.raises(ValueError, match="trained on a target with n_embd=128, vocab_size=4096"):
        load_draft(name, small_gpt2(vocab=4096, n_embd=64, n_layer=12, seed=0, n_positions=16))
    with pytest.raises(ValueError, match="trained on a target with n_embd=128, vocab_size=4096"):
        load_draft(name, small_gpt2(vocab=1000, n_embd=128, n_layer=12, seed=0, n_positions=16))


def test_heads_refuse_a_target_of_the_same_shape_with_other_weights(target64):
    other = copy.deepcopy(target64)
    with torch.no_grad():
        other.transformer.wte.weight[7] += 0.01  # tied: the LM head moves with it
    with pytest.raises(ValueError, match="trained on another target"):
        load_draft("medusa", other)


def test_the_draft_model_refuses_a_target_of_another_vocabulary():
    with pytest.raises(ValueError, match="drafts only for a target with the bundled tokenizer"):
        load_draft("model", small_gpt2(vocab=1000, n_embd=16, n_layer=1, seed=0))
