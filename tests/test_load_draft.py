"""load_draft: every shipped draft, ready for the bundled target, and refused for any other target.

The head sets are read from specref/assets/heads/ (tools/training/train_heads.py); a test that needs one
that is not there is skipped, saying which.
"""

from __future__ import annotations

import copy

import pytest
import torch
from model_factory import small_gpt2

from specref import load_draft
from specref.decoding.chain import generate, speculative_generate
from specref.decoding.tree import tree_generate
from specref.drafts import MedusaDraft, ModelDraft, MTPDraft, PromptLookupDraft
from specref.drafts.eagle import EagleDraft
from specref.drafts.load import DRAFTS
from specref.models.pair import assets_dir, heldout_prompts, load_pair

HEADS = {name: stem for name, stem in DRAFTS.items() if stem is not None}
CLASSES = {"model": ModelDraft, "prompt_lookup": PromptLookupDraft, "medusa": MedusaDraft, "eagle": EagleDraft,
           "eagle3": EagleDraft, "eagle_notoken": EagleDraft, "mtp": MTPDraft}


def _shipped(name: str) -> bool:
    return HEADS.get(name) is None or assets_dir().joinpath("heads", f"{HEADS[name]}.safetensors").is_file()


def _need(name: str) -> None:
    if not _shipped(name):
        pytest.skip(f"the {name!r} head set is not in specref/assets/heads/ yet (run tools/training/train_heads.py)")


@pytest.fixture(scope="module")
def target64():
    """The bundled target in float64: the k+1-token pass and the one-token pass cannot round a near-tie apart."""
    return load_pair(dtype=torch.float64)[0]


def test_the_names_are_the_courses_drafts():
    assert sorted(DRAFTS) == sorted(CLASSES)


@pytest.mark.parametrize("name", sorted(CLASSES))
def test_each_draft_loads_on_the_targets_device_and_dtype(target64, name):
    _need(name)
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


# -- the shipped heads on the bundled target: greedy output is the target's -------------------------------


@pytest.fixture(scope="module")
def heldout_greedy(target64):
    ids = torch.tensor(heldout_prompts(4, 32))
    return ids, generate(target64, ids, 16, temperature=0)


@pytest.mark.parametrize("name", ["medusa", "mtp"])
def test_shipped_heads_keep_greedy_output_exact(target64, heldout_greedy, name):
    _need(name)
    draft = load_draft(name, target64)
    k = draft.n_heads if name == "medusa" else draft.depth  # as many as the heads support
    ids, expected = heldout_greedy
    for rows in (slice(0, 1), slice(0, 4)):
        got, stats = speculative_generate(target64, draft, ids[rows], k=k, max_new_tokens=16, temperature=0)
        assert torch.equal(got, expected[rows]), f"{name}, k={k}, B={ids[rows].shape[0]}"
    assert stats.accepted > 0, "the shipped heads never agreed with the target: trained weights should"


def test_shipped_medusa_tree_keeps_greedy_output_exact(target64, heldout_greedy):
    _need("medusa")
    draft = load_draft("medusa", target64)
    ids, expected = heldout_greedy
    got, _ = tree_generate(target64, draft, ids, (3, 2, 1), max_new_tokens=16, temperature=0)
    assert torch.equal(got, expected)


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
    _need(name)
    with pytest.raises(ValueError, match="trained on a target with n_embd=128, vocab_size=4096"):
        load_draft(name, small_gpt2(vocab=4096, n_embd=64, n_layer=12, seed=0, n_positions=16))
    with pytest.raises(ValueError, match="trained on a target with n_embd=128, vocab_size=4096"):
        load_draft(name, small_gpt2(vocab=1000, n_embd=128, n_layer=12, seed=0, n_positions=16))


def test_heads_refuse_a_target_of_the_same_shape_with_other_weights(target64):
    _need("medusa")
    other = copy.deepcopy(target64)
    with torch.no_grad():
        other.transformer.wte.weight[7] += 0.01  # tied: the LM head moves with it
    with pytest.raises(ValueError, match="trained on another target"):
        load_draft("medusa", other)


def test_the_draft_model_refuses_a_target_of_another_vocabulary():
    with pytest.raises(ValueError, match="drafts only for a target with the bundled tokenizer"):
        load_draft("model", small_gpt2(vocab=1000, n_embd=16, n_layer=1, seed=0))
