"""The grown target computes the bundled target's function: logits, greedy tokens, hidden states, every draft.

Float64 where a decision (an argmax) is compared, so the result holds on every CPU; float32 where the
float32 model itself is the subject, against a bound derived from float32's rounding.
"""

from __future__ import annotations

import copy
import time

import pytest
import torch

from specref import generate, load_draft, speculative_generate
from specref.drafts.load import DRAFTS
from specref.models.grow import GrownGPT2, fold, widen
from specref.models.pair import heldout_prompts, load_grown_pair, load_pair


@pytest.fixture(scope="module")
def pair64():
    target, draft, _ = load_pair(dtype=torch.float64)
    return target, draft


@pytest.fixture(scope="module")
def grown64(pair64):
    return widen(pair64[0], 4)


def prompts(n: int = 4, n_tokens: int = 48) -> torch.Tensor:
    return torch.tensor(heldout_prompts(n, n_tokens))


def test_widen_has_r_times_the_width_and_r_squared_times_the_layer_weights(pair64, grown64):
    small, big = pair64[0].config, grown64.config
    assert (big.n_embd, big.n_head, big.n_layer) == (4 * small.n_embd, small.n_head, small.n_layer)
    assert not big.tie_word_embeddings
    block = sum(p.numel() for p in pair64[0].transformer.h.parameters() if p.dim() == 2)
    grown_block = sum(p.numel() for p in grown64.transformer.h.parameters() if p.dim() == 2)
    assert grown_block == 16 * block


def test_grown_logits_equal_the_bundled_logits_in_float64(pair64, grown64):
    x = prompts()
    with torch.no_grad():
        a, b = pair64[0](x), grown64(x)
    # float64 rounding of sums over a few thousand terms of size <= 15: far below 1e-9
    assert (a - b).abs().max().item() < 1e-9


def test_grown_hidden_states_fold_back_to_the_bundled_ones(pair64, grown64):
    x = prompts(2, 32)
    with torch.no_grad():
        small = pair64[0](x, return_hidden=True).hidden_states
        big = grown64(x, return_hidden=True).hidden_states
    assert len(small) == len(big)
    for s, b in zip(small, big):
        assert s.shape == b.shape  # folded to the base width
        assert torch.allclose(s, b, atol=1e-9, rtol=0)


def test_fold_is_the_mean_of_each_units_copies():
    h = torch.arange(12.0).view(1, 1, 12)  # 3 units x 4 copies, copies adjacent
    assert fold(h, 4).tolist() == [[[1.5, 5.5, 9.5]]]


def test_grown_greedy_tokens_equal_the_bundled_ones_on_the_heldout_prompts(pair64, grown64):
    x = prompts(8, 32)
    assert torch.equal(generate(grown64, x, 24, temperature=0.0), generate(pair64[0], x, 24, temperature=0.0))


def test_float32_grown_logits_stay_within_float32_rounding_of_the_bundled_ones():
    target, _, _ = load_pair()
    grown = widen(target, 4)
    x = prompts()
    with torch.no_grad():
        a, b = target(x), grown(x)
    # Each logit is a chain of sums of a few thousand float32 terms; float32's epsilon (1.2e-7) times the
    # largest logit's magnitude (~15) times the depth and width of the sums stays well below 1e-3.
    assert (a - b).abs().max().item() < 1e-3


@pytest.mark.parametrize("name", sorted(DRAFTS))
def test_every_draft_serves_the_grown_target_and_greedy_output_is_the_targets(name, grown64):
    draft = load_draft(name, grown64)
    x = prompts(2, 32)
    k = 3 if name == "mtp" else 4
    out, stats = speculative_generate(grown64, draft, x, k=k, max_new_tokens=16, temperature=0.0)
    assert torch.equal(out, generate(grown64, x, 16, temperature=0.0))
    assert stats.tokens_per_step >= 1.0


@pytest.mark.parametrize("name", ["model", "eagle", "medusa"])
def test_a_draft_accepts_the_same_on_the_grown_target_as_on_the_bundled_one(name, pair64, grown64):
    """Same function, same features (folded): the same drafts, so the same counted acceptance."""
    x = prompts(2, 32)
    _, on_small = speculative_generate(pair64[0], load_draft(name, pair64[0]), x, k=3, max_new_tokens=24,
                                       temperature=0.0)
    _, on_big = speculative_generate(grown64, load_draft(name, grown64), x, k=3, max_new_tokens=24,
                                     temperature=0.0)
    assert (on_small.accepted, on_small.emitted, on_small.steps) == (on_big.accepted, on_big.emitted, on_big.steps)


def test_widen_leaves_its_input_as_it_was(pair64):
    target = copy.deepcopy(pair64[0])
    before = {k: v.clone() for k, v in target.state_dict().items()}
    grown = widen(target, 2)
    grown.to(torch.float32)  # moving the grown model moves its own base, not the caller's model
    assert all(torch.equal(before[k], v) for k, v in target.state_dict().items())
    assert target.dtype == torch.float64 and grown.base.dtype == torch.float32


def test_widen_by_one_is_the_same_model(pair64):
    x = prompts(1, 16)
    with torch.no_grad():
        assert (widen(pair64[0], 1)(x) - pair64[0](x)).abs().max().item() < 1e-12


@pytest.mark.parametrize("r, error", [(0, ValueError), (-2, ValueError), (2.0, TypeError), (True, TypeError)])
def test_widen_refuses_a_bad_factor(pair64, r, error):
    with pytest.raises(error, match="r must be"):
        widen(pair64[0], r)


def test_widen_refuses_what_is_not_a_gpt2():
    with pytest.raises(TypeError, match="model must be a GPT2"):
        widen(torch.nn.Linear(2, 2), 2)


def test_load_grown_pair_builds_the_timing_pair_in_seconds_and_names_its_kernel():
    t0 = time.perf_counter()
    grown, draft, tok, path = load_grown_pair()
    built = time.perf_counter() - t0
    assert isinstance(grown, GrownGPT2) and grown.factor == 4
    assert grown.config.n_embd == 512 and draft.config.n_embd == 128
    assert path.name in ("compiled", "torch") and path.reason
    # The weights a pass reads: 4 bytes x 42 M parameters, far beyond any CPU cache.
    assert 150e6 < sum(p.numel() * 4 for p in grown.parameters()) < 200e6
    assert built < 120  # a sanity bound on a busy 2-core machine, not a benchmark (benchmarks/bench_cpu.py times it)


def test_a_grown_target_saves_and_loads_with_its_untied_head(pair64, grown64, tmp_path):
    from specref.models.pretrained import load_folder, save_pretrained

    save_pretrained(grown64, tmp_path)
    again = load_folder(tmp_path, "cpu", torch.float64)
    assert not again.config.tie_word_embeddings
    assert again.lm_head.weight.data_ptr() != again.transformer.wte.weight.data_ptr()
    x = prompts(1, 16)
    with torch.no_grad():
        assert torch.equal(again(x), grown64(x))
