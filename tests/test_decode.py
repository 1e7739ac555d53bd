"""Plain and speculative decoding on small random GPT-2 models: exactness, stats, errors."""

from __future__ import annotations

import copy
from types import SimpleNamespace

import pytest
import torch
from model_factory import exact_first_two, noisy_copy, sample_first_two, small_gpt2
from model_factory import tiny_pair as tiny_pair_models

from specref.checks.broken import MisreportedModelDraft
from specref.checks.montecarlo import distribution_test
from specref.decoding.chain import generate, speculative_generate
from specref.drafts import ModelDraft
from specref.models.gpt2 import GPT2
from specref.sampling import SamplingParams, sample


@pytest.fixture(scope="module")
def pair() -> tuple[GPT2, GPT2]:
    target = small_gpt2(vocab=64, n_embd=32, n_layer=2, seed=0, scale=20.0)
    return target, noisy_copy(target, noise=0.05, seed=1)


PROMPTS = [[1, 2, 3], [7], [10, 20, 30, 40, 50, 60, 5, 5]]


@pytest.mark.parametrize("k", range(1, 9))
def test_greedy_speculative_equals_greedy_target_batch_1(pair, k):
    target, draft = pair
    for prompt in PROMPTS:
        ids = torch.tensor([prompt])
        expected = generate(target, ids, 200, temperature=0)
        got, stats = speculative_generate(target, draft, ids, k=k, max_new_tokens=200, temperature=0)
        assert torch.equal(got, expected), f"prompt {prompt}, k={k}"
        assert 0 < stats.acceptance_rate < 1, "the draft should be partly right, so both paths run"


@pytest.mark.parametrize("k", range(1, 9))
def test_greedy_speculative_equals_greedy_target_batch_4(pair, k):
    target, draft = pair
    g = torch.Generator().manual_seed(k)
    ids = torch.randint(0, 64, (4, 6), generator=g)
    expected = generate(target, ids, 200, temperature=0)
    got, stats = speculative_generate(target, draft, ids, k=k, max_new_tokens=200, temperature=0)
    assert torch.equal(got, expected)
    # Rows accept different numbers of drafts, so per-row cache lengths really differ.
    assert (stats.accepted_hist > 0).sum() >= 2


def test_generates_exactly_max_new_tokens(pair):
    target, draft = pair
    ids = torch.tensor([[1, 2, 3]])
    for n in [0, 1, 2, 5, 17]:
        out, stats = speculative_generate(target, draft, ids, k=4, max_new_tokens=n, temperature=0)
        assert out.shape == (1, 3 + n)
        assert stats.emitted == n


def test_nothing_is_emitted_after_eos(pair):
    target, draft = pair
    ids = torch.tensor([[1, 2, 3]])
    greedy = generate(target, ids, 60, temperature=0)[0, 3:]
    eos = int(greedy[10])  # a token the greedy continuation emits at step 10
    first = int((greedy == eos).nonzero()[0])
    out, stats = speculative_generate(target, draft, ids, k=4, max_new_tokens=60, temperature=0, eos_token_id=eos)
    assert torch.equal(out[0, 3 : 3 + first + 1], greedy[: first + 1])
    assert (out[0, 3 + first :] == eos).all()
    assert stats.emitted == first + 1
    assert torch.equal(out, generate(target, ids, 60, temperature=0, eos_token_id=eos))


def test_stats_are_consistent(pair):
    target, draft = pair
    ids = torch.tensor([[4, 5, 6]] * 3)
    out, s = speculative_generate(target, draft, ids, k=3, max_new_tokens=40, temperature=0)
    assert s.emitted == 3 * 40
    assert s.accepted <= s.proposed
    assert 1 <= s.tokens_per_step <= 4
    assert s.draft_passes <= 3 * s.target_passes
    assert s.accepted_hist.sum() <= s.steps
    assert s.time_total >= s.time_target + s.time_draft + s.time_verify - 1e-9 and s.time_verify > 0


def test_seeded_sampling_reproduces(pair):
    target, draft = pair
    ids = torch.tensor([[1, 2, 3]])
    runs = [
        speculative_generate(target, draft, ids, k=4, max_new_tokens=30, generator=torch.Generator().manual_seed(5))[0]
        for _ in range(2)
    ]
    assert torch.equal(runs[0], runs[1])


def test_inputs_are_not_modified(pair):
    target, draft = pair
    ids = torch.tensor([[1, 2, 3]])
    before = ids.clone()
    speculative_generate(target, draft, ids, k=2, max_new_tokens=10, generator=torch.Generator().manual_seed(0))
    assert torch.equal(ids, before)


# -- sampling: the first two tokens follow the target's exact distribution --------------

N_RUNS = 30_000


@pytest.fixture(scope="module")
def tiny_pair() -> tuple[GPT2, GPT2]:
    return tiny_pair_models()


@pytest.mark.parametrize("k,params", [(1, SamplingParams(1.0)), (2, SamplingParams(1.0)), (3, SamplingParams(0.7, top_k=4))])
def test_sampled_first_two_tokens_follow_the_target(tiny_pair, k, params):
    target, draft = tiny_pair
    exact = exact_first_two(target, [1, 2], params)
    counts = sample_first_two(target, draft, [1, 2], k, params, seed=10 + k, n=N_RUNS)
    assert distribution_test(exact, counts=counts).passed


def test_negative_control_misprocessed_q_is_flagged(tiny_pair):
    target, draft = tiny_pair
    params = SamplingParams(1.0)
    exact = exact_first_two(target, [1, 2], params)
    counts = sample_first_two(target, MisreportedModelDraft(draft), [1, 2], 2, params, seed=21, n=N_RUNS)
    assert distribution_test(exact, counts=counts).p_value < 1e-6


def test_negative_control_always_accept_is_flagged(tiny_pair, monkeypatch):
    import specref.decoding.chain as decode

    def always_accept(draft_tokens, q, p, generator=None, u=None, check_support=True):
        B, k = draft_tokens.shape
        bonus = sample(p[:, k], generator)
        return torch.cat([draft_tokens, bonus[:, None]], 1), torch.full((B,), k)

    monkeypatch.setattr(decode, "_verify_chain", always_accept)  # the rule the decoding loop calls
    target, draft = tiny_pair
    params = SamplingParams(1.0)
    exact = exact_first_two(target, [1, 2], params)
    counts = sample_first_two(target, draft, [1, 2], 2, params, seed=22, n=N_RUNS)
    assert distribution_test(exact, counts=counts).p_value < 1e-6


# -- bad input ---------------------------------------------------------------------------


@pytest.mark.parametrize(
    "kwargs,match",
    [
        (dict(input_ids=torch.tensor([[1, 99]])), "vocabulary"),
        (dict(input_ids=torch.zeros((1, 0), dtype=torch.long)), "empty prompt"),
        (dict(input_ids=torch.ones((1, 250), dtype=torch.long), max_new_tokens=10), "context window"),
        (dict(k=0), "k must be >= 1"),
        (dict(temperature=-1.0), "temperature"),
        (dict(top_p=1.5), "top_p"),
        (dict(top_k=0), "top_k"),
        (dict(input_ids=torch.tensor([[1.0, 2.0]])), "integer"),
    ],
)
def test_bad_input_is_rejected(pair, kwargs, match):
    target, draft = pair
    args = dict(input_ids=torch.tensor([[1, 2]]), k=2, max_new_tokens=5)
    args.update(kwargs)
    with pytest.raises((ValueError, TypeError), match=match):
        speculative_generate(target, draft, **args)


def test_vocabulary_mismatch_is_rejected(pair):
    target, _ = pair
    other = small_gpt2(vocab=65, n_embd=16, n_layer=1, seed=9)
    with pytest.raises(ValueError, match="vocabularies differ"):
        speculative_generate(target, other, torch.tensor([[1, 2]]), k=2, max_new_tokens=3)


def test_models_on_different_devices_are_rejected(pair):
    target, _ = pair
    elsewhere = SimpleNamespace(config=SimpleNamespace(vocab_size=64), device=torch.device("meta"))
    with pytest.raises(ValueError, match="one device"):
        speculative_generate(target, ModelDraft(elsewhere), torch.tensor([[1, 2]]), k=2, max_new_tokens=3)


class _BrokenDraft(ModelDraft):
    """A draft whose proposal is damaged after the fact, in one of several ways."""

    def __init__(self, model, damage):
        super().__init__(model)
        self.damage = damage

    def propose(self, tokens, lengths, k, params, generator=None):
        drafts, q = super().propose(tokens, lengths, k, params, generator)
        return self.damage(drafts, q)


@pytest.mark.parametrize(
    "damage,temperature,match",
    [
        (lambda x, q: (torch.cat([x, x[:, :1]], 1), q), 0.0, r"\[B, k'\] tensor of token ids with B = 1 and k' <= k"),
        (lambda x, q: (x[:, :-1], q), 1.0, r"q of shape \[B, k', V\] = \[1, 2, 64\] \(k' = the tokens it proposed"),
        (lambda x, q: (x + 1000, q), 0.0, "outside the vocabulary"),
        (lambda x, q: (x, q[:, :, :-1]), 1.0, r"q of shape \[B, k', V\]"),
        (lambda x, q: (x, torch.full_like(q, float("nan"))), 1.0, "NaN"),
        (lambda x, q: (x, 2 * q), 1.0, "sum to 1"),
    ],
)
def test_a_damaged_proposal_is_rejected(pair, damage, temperature, match):
    # The loop checks each proposal once per step, so a Draft written by a learner fails loudly.
    target, draft = pair
    with pytest.raises(ValueError, match=match):
        speculative_generate(target, _BrokenDraft(draft, damage), torch.tensor([[1, 2]]), k=3, max_new_tokens=6,
                             temperature=temperature, generator=torch.Generator().manual_seed(0))


@pytest.mark.parametrize("temperature", [0.0, 1.0])
def test_nan_logits_from_the_target_raise(pair, temperature):
    target, draft = pair
    broken = copy.deepcopy(target)
    with torch.no_grad():
        broken.transformer.ln_f.bias.fill_(float("nan"))
    with pytest.raises(ValueError, match="NaN"):
        speculative_generate(broken, draft, torch.tensor([[1, 2]]), k=2, max_new_tokens=4, temperature=temperature,
                             generator=torch.Generator().manual_seed(0))
