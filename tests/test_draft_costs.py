"""specref.perf.draft_costs: what a draft costs to have, and its step on a modelled GPU, computed from the objects."""

from __future__ import annotations

import pytest
import torch

from specref import load_pair, speculative_generate
from specref.drafts import NoDraft
from specref.drafts.load import load_draft
from specref.models.pair import heldout_prompts
from specref.perf.costmodel import H100_BANDWIDTH
from specref.perf.draft_costs import (
    Pass,
    ServingShape,
    gpu_step_cost,
    gpu_verify_cost,
    kv_bytes_per_token,
    own_parameters,
    step_passes,
)


@pytest.fixture(scope="module")
def target():
    return load_pair()[0]


@pytest.fixture(scope="module")
def drafts(target):
    ids = torch.tensor([heldout_prompts(1, 16)[0]])
    out = {}
    for name in ("model", "prompt_lookup", "medusa", "eagle", "eagle3", "mtp"):
        d = load_draft(name, target)
        speculative_generate(target, d, ids, k=2, max_new_tokens=4, temperature=0)  # allocates the caches
        out[name] = d
    return out


def test_own_parameters_count_the_draft_modules_and_leave_out_what_the_target_lends(target, drafts):
    heads = drafts["medusa"].heads
    assert own_parameters(drafts["medusa"], target) == heads.weight.numel() + heads.bias.numel()
    small = drafts["model"].model
    assert own_parameters(drafts["model"], target) == sum(p.numel() for p in small.parameters())  # tied head once
    assert own_parameters(drafts["eagle"], target) == sum(p.numel() for p in drafts["eagle"].layer.parameters())
    assert own_parameters(drafts["prompt_lookup"], target) == 0


def test_kv_bytes_per_token_is_two_times_layers_times_width_times_element_size(target, drafts):
    C, size = target.config.n_embd, torch.tensor([], dtype=target.dtype).element_size()
    assert kv_bytes_per_token(drafts["model"]) == 2 * drafts["model"].model.config.n_layer * C * size
    assert kv_bytes_per_token(drafts["eagle"]) == 2 * 1 * C * size
    assert kv_bytes_per_token(drafts["mtp"]) == 2 * drafts["mtp"].depth * C * size
    assert kv_bytes_per_token(drafts["medusa"]) == 0 == kv_bytes_per_token(drafts["prompt_lookup"])


def test_step_passes_follow_each_drafts_rule(target, drafts):
    assert step_passes(drafts["prompt_lookup"], target, 4) == []
    assert step_passes(NoDraft(target.config.vocab_size), target, 3) == []
    model = step_passes(drafts["model"], target, 3)
    assert len(model) == 3 and all(p.tokens == 1 and not p.target_head for p in model)
    assert tuple(drafts["model"].model.transformer.wpe.weight.shape) not in model[0].shapes  # a lookup, not a read
    (medusa,) = step_passes(drafts["medusa"], target, 3)  # one pass, heads 1..3 on one feature
    assert medusa.tokens == 3 and medusa.target_head and medusa.shapes[0] == (3, target.config.n_embd, target.config.n_embd)
    eagle3 = step_passes(drafts["eagle3"], target, 3)
    assert len(eagle3[0].shapes) > len(eagle3[1].shapes) == len(eagle3[2].shapes)  # the fusing layer: first pass only
    mtp = step_passes(drafts["mtp"], target, 2)
    assert len(mtp) == 2 and all(p.target_head for p in mtp)


def test_step_passes_rejects_a_k_the_draft_cannot_draft_and_unknown_drafts(target, drafts):
    with pytest.raises(ValueError, match="at most 3"):
        step_passes(drafts["mtp"], target, 4)
    with pytest.raises(ValueError, match="k"):
        step_passes(drafts["model"], target, 0)
    with pytest.raises(TypeError, match="Draft"):
        step_passes(object(), target, 2)
    with pytest.raises(TypeError, match="GPT-2"):
        step_passes(drafts["model"], torch.nn.Linear(2, 2), 2)


def test_serving_shape_scales_width_and_vocabulary_and_counts_a_7b_target(target):
    shape = ServingShape()
    C, V = target.config.n_embd, target.config.vocab_size
    assert shape.scaled((V, C), target) == 32_000 * 4096
    assert shape.scaled((C, 4 * C), target) == 4096 * 4 * 4096
    assert shape.scaled((7,), target) == 7
    n = shape.target_params(target)
    block = 12 * 4096**2 + 13 * 4096  # GPT-2 block: 12 C^2 weights, 13 C of biases and norms
    assert n == 32 * block + 2 * 4096 + 32_000 * 4096
    assert 6.5e9 < n < 6.7e9


def test_gpu_verify_cost_is_one_below_the_ridge_and_grows_like_the_tokens_above_it(target):
    shape = ServingShape()
    ridge = shape.roofline(shape.target_params(target)).ridge_tokens()
    assert gpu_verify_cost(target, 1) == 1.0 == gpu_verify_cost(target, int(ridge))
    assert gpu_verify_cost(target, 4 * ridge) == pytest.approx(4.0)
    assert gpu_verify_cost(target, 200, ServingShape(efficiency=1.0)) == 1.0  # a faster chip moves the ridge out
    with pytest.raises(ValueError, match="n_tokens"):
        gpu_verify_cost(target, 0)


def test_gpu_step_cost_is_bytes_read_over_a_target_pass(target, drafts):
    shape = ServingShape()
    plain = shape.target_params(target)
    head = shape.head_params(target)
    eagle = gpu_step_cost(drafts["eagle"], target, 4)
    assert eagle == pytest.approx(sum(shape.pass_params(p, target) for p in step_passes(drafts["eagle"], target, 4))
                                  / plain)
    assert 4 * head / plain < eagle  # the LM head is read once per drafted token
    medusa = gpu_step_cost(drafts["medusa"], target, 4)
    assert medusa == pytest.approx((4 * 4096**2 + 4 * 4096 + head) / plain)  # the head once for all k vectors
    assert gpu_step_cost(drafts["prompt_lookup"], target, 4) == 0.0
    assert medusa < 0.05 < 0.1 < gpu_step_cost(drafts["model"], target, 4)
    # Twice the bandwidth halves every pass: d, a ratio of two passes, does not move.
    fast = ServingShape(bandwidth=2 * H100_BANDWIDTH)
    assert gpu_step_cost(drafts["eagle"], target, 4, fast) == pytest.approx(eagle)


def test_serving_shape_rejects_bad_sizes():
    with pytest.raises(ValueError, match="n_embd"):
        ServingShape(n_embd=0)
    with pytest.raises(ValueError, match="efficiency"):
        ServingShape(efficiency=1.5)
    with pytest.raises(ValueError, match="bandwidth"):
        ServingShape(bandwidth=float("nan"))


def test_draft_params_at_serving_size_leave_out_the_shared_head(target, drafts):
    shape = ServingShape()
    assert shape.draft_params(drafts["medusa"], target) == 5 * (4096**2 + 4096)  # five heads, no LM head
    assert shape.draft_params(drafts["prompt_lookup"], target) == 0
    assert shape.pass_params(Pass(((7,),), 1, True), target) == 7 + shape.head_params(target)  # 7: not a width
