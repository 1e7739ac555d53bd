"""Bad input to the public API gets a clear ValueError/TypeError naming the argument: never a NaN, a hang,
garbage, or a bare error from deep inside; and loading a model leaves the global RNG alone.

Each test here is a case found by fuzzing the API: a call that a missing or weakened check lets through.
"""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch
from model_factory import small_gpt2

from specref import (
    CostModel,
    PassModel,
    TreeShape,
    batch_steps,
    choose_k,
    estimate_alpha,
    expected_tokens_per_step,
    generate,
    generation_distribution,
    h100_worked_example,
    load_draft,
    load_pair,
    lookahead_generate,
    process_logits,
    random_chain,
    sample,
    speculative_generate,
    speedup,
    step_distribution,
    tree_generate,
    verify_chain,
)
from specref._validate import check_generator
from specref.checks.pitfalls import tv_distance
from specref.checks.toy import MarkovChain
from specref.decoding.lookahead import lookahead_layout
from specref.decoding.loop import SpecStats
from specref.decoding.trace import trace_step
from specref.decoding.tree import score_tree
from specref.drafts import ModelDraft, PromptLookupDraft, grow_trees
from specref.drafts.heads import load_bundled_heads
from specref.drafts.prompt_lookup import lookup
from specref.models.pair import bundled_tokenizer, heldout_prompts
from specref.sampling import SamplingParams
from specref.trees import Tree, stack_tree_masks

F64 = torch.float64
V = 11


@pytest.fixture(scope="module")
def pair():
    """A small float32 target and draft over 11 tokens (float32: where a tiny temperature used to overflow)."""
    target = small_gpt2(vocab=V, n_embd=16, n_layer=1, seed=1, n_positions=32, dtype=torch.float32)
    draft = small_gpt2(vocab=V, n_embd=16, n_layer=1, seed=2, n_positions=32, dtype=torch.float32)
    return target, draft


IDS = torch.tensor([[1, 2, 3, 4]])


def _gen() -> torch.Generator:
    return torch.Generator().manual_seed(0)


# -- process_logits: a legal temperature or top_p never gives NaN -----------------------------------


@pytest.mark.parametrize("logits, temperature, top_p", [
    (torch.tensor([3e38, 0.0]), 0.1, None),  # finite float32 logits / 0.1 overflow to inf
    (torch.tensor([1e308, -1e308], dtype=F64), 0.5, None),
    (torch.tensor([[0.3, 2.0, -1.0], [1.0, 0.5, 0.0]]), 1e-300, None),  # 1e-300 rounds to 0 in float32
    (torch.tensor([[0.3, 2.0, -1.0], [1.0, 0.5, 0.0]]), 1e-45, None),
    (torch.tensor([[0.3, 2.0, -1.0], [1.0, 0.5, 0.0]]), 1.0, 1e-50),  # top_p rounds to 0 in float32
])
def test_tiny_temperature_huge_logits_or_tiny_top_p_give_the_argmax_not_nan(logits, temperature, top_p):
    probs = process_logits(logits, temperature=temperature, top_p=top_p)
    assert torch.isfinite(probs).all()
    assert torch.equal(probs, process_logits(logits, temperature=0))


def test_decoding_at_a_tiny_temperature_is_greedy_decoding(pair):
    target, draft = pair
    greedy = generate(target, IDS, 6, temperature=0)
    assert torch.equal(generate(target, IDS, 6, temperature=1e-40, generator=_gen()), greedy)
    out, _ = speculative_generate(target, draft, IDS, k=3, max_new_tokens=6, temperature=1e-40, generator=_gen())
    assert torch.equal(out, greedy)


# -- sample: its probabilities, uniforms and generator are checked ------------------------------------


P2 = torch.tensor([0.5, 0.5], dtype=F64)


@pytest.mark.parametrize("kwargs, error, match", [
    ({"probs": torch.tensor([math.nan, 1.0])}, ValueError, "probs contains NaN"),
    ({"probs": torch.tensor([-0.5, 1.5])}, ValueError, "probs has negative"),
    ({"probs": torch.tensor([0.2, 0.2])}, ValueError, "probs rows must sum to 1"),
    ({"probs": torch.tensor([0.0, 0.0])}, ValueError, "probs rows must sum to 1"),
    ({"probs": torch.tensor([0, 1])}, TypeError, "probs must be a floating-point"),
    ({"probs": torch.tensor(1.0)}, ValueError, "probs must have at least 1 dims"),
    ({"probs": torch.zeros(3, 0)}, ValueError, "probs has an empty vocabulary"),
    ({"probs": P2, "u": torch.tensor(1.5, dtype=F64)}, ValueError, "u must hold uniforms"),
    ({"probs": P2, "u": torch.tensor(math.nan, dtype=F64)}, ValueError, "u must hold uniforms"),
    ({"probs": torch.ones(3, 2) / 2, "u": torch.rand(5)}, ValueError, "u must have shape"),
    ({"probs": P2, "u": 0.3}, TypeError, "u must be a torch.Tensor"),
    ({"probs": P2, "generator": "seed"}, TypeError, "generator must be a torch.Generator"),
])
def test_sample_refuses_bad_input(kwargs, error, match):
    with pytest.raises(error, match=match):
        sample(**kwargs)


# -- generators: checked at the entry points, wrong type or device --------------------------------------


@pytest.mark.parametrize("call", [
    lambda t, d: generate(t, IDS, 3, generator="seed"),
    lambda t, d: speculative_generate(t, d, IDS, k=2, max_new_tokens=3, generator=0),
    lambda t, d: trace_step(t, d, IDS[0], 2, 1.0, generator="seed"),
    lambda t, d: verify_chain(torch.tensor([0]), torch.ones(1, 2, dtype=F64) / 2, torch.ones(2, 2, dtype=F64) / 2,
                              generator="seed"),
])
def test_a_generator_that_is_not_a_generator_is_named(pair, call):
    with pytest.raises(TypeError, match="^generator must be a torch.Generator"):
        call(*pair)


def test_check_generator_refuses_a_generator_on_another_device():
    with pytest.raises(ValueError, match="generator is on cpu but must draw on cuda"):
        check_generator(torch.Generator(), "cuda")
    assert check_generator(None, "cuda") is None


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA generator")
def test_a_cuda_generator_for_cpu_tensors_is_a_value_error(pair):
    g = torch.Generator(device="cuda")
    with pytest.raises(ValueError, match="generator is on cuda"):
        sample(P2, g)
    with pytest.raises(ValueError, match="generator is on cuda"):
        generate(pair[0], IDS, 3, generator=g)


# -- loading a model leaves the global RNG alone --------------------------------------------------------


@pytest.fixture(scope="module")
def bundled_target():
    return load_pair()[0]


@pytest.mark.parametrize("load", [
    lambda t: load_pair(),
    lambda t: load_draft("model", t),
    lambda t: load_draft("eagle", t),
    lambda t: load_draft("mtp", t),
    lambda t: load_bundled_heads("eagle1"),
])
def test_loading_weights_does_not_draw_from_the_global_rng(bundled_target, load):
    before = torch.get_rng_state()
    load(bundled_target)
    assert torch.equal(torch.get_rng_state(), before)


# -- the decoding loops: eos_token_id, the models, the draft ------------------------------------------


LOOPS = {
    "generate": lambda t, d, **kw: generate(t, IDS, 3, temperature=0, **kw),
    "speculative": lambda t, d, **kw: speculative_generate(t, d, IDS, k=2, max_new_tokens=3, temperature=0, **kw),
    "tree": lambda t, d, **kw: tree_generate(t, d, IDS, (2,), max_new_tokens=3, temperature=0, **kw),
    "lookahead": lambda t, d, **kw: lookahead_generate(t, IDS, 3, window=2, ngram=2, guesses=2, temperature=0, **kw),
}


@pytest.mark.parametrize("loop", LOOPS)
@pytest.mark.parametrize("eos, error", [("a", TypeError), (1.5, TypeError), (True, TypeError), (-1, ValueError),
                                        (V, ValueError)])
def test_eos_token_id_must_be_a_token_of_the_vocabulary(pair, loop, eos, error):
    with pytest.raises(error, match="eos_token_id"):
        LOOPS[loop](*pair, eos_token_id=eos)


@pytest.mark.parametrize("call", [
    lambda d: generate("model", IDS, 3),
    lambda d: generate(None, IDS, 3),
    lambda d: speculative_generate("target", d, IDS, k=2, max_new_tokens=3),
    lambda d: tree_generate("target", d, IDS, (2,), max_new_tokens=3),
    lambda d: lookahead_generate("target", IDS, 3),
    lambda d: ModelDraft("draft"),
    lambda d: PromptLookupDraft.for_target("target"),
])
def test_a_model_argument_that_is_not_a_model_is_a_type_error(pair, call):
    with pytest.raises(TypeError, match="model"):
        call(pair[1])


def test_trace_step_refuses_a_draft_of_another_vocabulary(pair):
    other = small_gpt2(vocab=V + 2, n_embd=16, n_layer=1, seed=2, n_positions=32, dtype=torch.float32)
    with pytest.raises(ValueError, match="vocabularies differ"):
        trace_step(pair[0], other, IDS[0], 2)


def test_model_draft_propose_refuses_a_negative_k(pair):
    draft = ModelDraft(pair[1])
    draft.begin(1)
    with pytest.raises(ValueError, match="k must be >= 0"):
        draft.propose(IDS, torch.tensor([4]), -1, SamplingParams())


@pytest.mark.parametrize("k, error", [(-1, ValueError), (2.5, TypeError)])
def test_spec_stats_refuses_a_bad_k(k, error):
    with pytest.raises(error, match="k must be"):
        SpecStats(k=k)


# -- trees and their shapes -------------------------------------------------------------------------------


def _logits(trees, frontier):
    return torch.zeros(len(trees), len(frontier[0]), 4)


@pytest.mark.parametrize("kwargs, error, match", [
    ({"batch_size": 0}, ValueError, "batch_size"),
    ({"batch_size": -1}, ValueError, "batch_size"),
    ({"batch_size": 2.0}, TypeError, "batch_size"),
    ({"batch_size": 1, "params": {"temperature": 1.0}}, TypeError, "params"),
    ({"batch_size": 1, "max_depth": 1.5}, TypeError, "max_depth"),
    ({"batch_size": 1, "max_nodes": "3"}, TypeError, "max_nodes"),
])
def test_grow_trees_refuses_bad_arguments(kwargs, error, match):
    with pytest.raises(error, match=match):
        grow_trees((2, 2), _logits, **kwargs)


def test_tree_shape_sampled_must_be_a_bool():
    with pytest.raises(TypeError, match="sampled must be a bool"):
        TreeShape((2,), sampled="yes")


@pytest.mark.parametrize("trees, starts", [([], []), ([Tree([-1], [1]), Tree([-1], [2])], [3])])
def test_stack_tree_masks_needs_one_start_per_tree(trees, starts):
    with pytest.raises(ValueError, match="one start per tree"):
        stack_tree_masks(trees, starts, with_root=True)


def test_score_tree_refuses_roots_that_are_not_token_ids(pair):
    target = pair[0]
    cache = target.new_cache(1)
    target(IDS[:, :3], cache=cache)
    with pytest.raises(TypeError, match="roots must be an integer tensor"):
        score_tree(target, cache, torch.tensor([3.0]), [Tree([-1], [1])])
    with pytest.raises(TypeError, match="roots must be a torch.Tensor"):
        score_tree(target, cache, [3], [Tree([-1], [1])])


def test_lookahead_layout_refuses_a_negative_start():
    with pytest.raises(ValueError, match="start must be >= 0"):
        lookahead_layout(Tree([-1], [1]), -3)


@pytest.mark.parametrize("args, match", [(([1, 2, 3], -1, 3, 1), "k must be"), (([1, 2, 1], 2, 3, 0), "min_ngram"),
                                         (([1, 2, 1, 2], 2, 1, 3), "max_ngram")])
def test_lookup_refuses_bad_arguments(args, match):
    with pytest.raises(ValueError, match=match):
        lookup(*args)


# -- theory and the cost model ------------------------------------------------------------------------------


@pytest.mark.parametrize("call, match", [
    (lambda: expected_tokens_per_step("0.5", 3), "alpha"),
    (lambda: expected_tokens_per_step(0.5 + 1j, 3), "alpha"),
    (lambda: speedup(0.5, 3, "0.1"), "c"),
])
def test_theory_refuses_a_string_or_complex_number(call, match):
    with pytest.raises(TypeError, match=match):
        call()


def test_expected_tokens_at_the_largest_k_does_not_overflow():
    assert expected_tokens_per_step(0.999, 2**63 - 1) == pytest.approx(1000.0)
    assert estimate_alpha([1, 2], 3) == pytest.approx(3 / 5)  # unchanged


MODEL = CostModel(PassModel(overhead=1e-3, per_token=1e-4, kv=1e-8), 0.1)


@pytest.mark.parametrize("call, error, match", [
    (lambda: MODEL.target(math.inf, 1, 0), ValueError, "finite"),
    (lambda: MODEL.target(1, 1, math.inf), ValueError, "finite"),
    (lambda: CostModel(PassModel(), 0.0), ValueError, "0 seconds"),
    (lambda: CostModel(PassModel(kv=1e-9), 0.1, context=0), ValueError, "0 seconds"),
    (lambda: MODEL.predict_speedup(np.array([0.5, 0.8]), 4, 1), TypeError, "alpha"),
    (lambda: choose_k([0.5, 0.8], 1, MODEL), TypeError, "alpha"),
    (lambda: choose_k("0.8", 1, MODEL), TypeError, "alpha"),
    (lambda: batch_steps("0.8", 4, 8, 32), TypeError, "alpha"),
    (lambda: MODEL.target.ridge_tokens(-5), ValueError, "context"),
    (lambda: PassModel.fit([{"batch_size": 1, "seconds": 1e-3}] * 5), TypeError, "n_tokens"),
    (lambda: h100_worked_example(0.8, 4, 8), TypeError, "batch_sizes"),
])
def test_cost_model_refuses_bad_input(call, error, match):
    with pytest.raises(error, match=match):
        call()


# -- models: prompts and the tokenizer -----------------------------------------------------------------------


@pytest.mark.parametrize("kwargs, error", [({"n_tokens": 0}, ValueError), ({"n_tokens": -3}, ValueError),
                                           ({"n_tokens": 4.5}, TypeError), ({"n": 2.5}, TypeError)])
def test_heldout_prompts_refuses_a_bad_count(kwargs, error):
    with pytest.raises(error, match="n_tokens" if "n_tokens" in kwargs else "n must"):
        heldout_prompts(**{"n": 2, **kwargs})


@pytest.mark.parametrize("ids", [[1.7], "abc"])
def test_decode_refuses_ids_that_are_not_integers(ids):
    with pytest.raises(TypeError, match="integer token ids"):
        bundled_tokenizer().decode(ids)


# -- checks: the toy chains and exact enumeration --------------------------------------------------------------


@pytest.mark.parametrize("sharpness", [math.inf, 1e308])
def test_random_chain_refuses_a_sharpness_that_overflows(sharpness):
    with pytest.raises(ValueError, match="sharpness"):
        random_chain(4, sharpness, _gen())


def test_exact_enumeration_refuses_a_table_it_cannot_build():
    wide = MarkovChain(torch.full((2000, 2000), 1 / 2000, dtype=F64))
    with pytest.raises(ValueError, match="outcomes"):
        wide.joint(0, 3)
    chain = random_chain(6, 1.0, _gen())
    with pytest.raises(ValueError, match="outcomes"):
        generation_distribution(chain, chain, 0, 1, 30)
    uniform = torch.full((21, 6), 1 / 6, dtype=F64)
    with pytest.raises(ValueError, match="outcomes"):
        step_distribution(uniform, uniform[:20])


def test_generation_distribution_names_a_target_that_is_not_a_chain():
    chain = random_chain(4, 1.0, _gen())
    with pytest.raises(TypeError, match="target must be a MarkovChain"):
        generation_distribution("target", chain, 0, 2, 2)


def test_tv_distance_refuses_nan():
    with pytest.raises(ValueError, match="finite"):
        tv_distance(torch.tensor([math.nan, 1.0]), torch.tensor([0.5, 0.5]))
