"""A draft may propose fewer than k tokens, none included: the step verifies what it got, and stays exact.

With none, the step is a plain decoding step: it draws the target's token from the same
uniform plain decoding would, so a draft that never proposes reproduces `generate` token
for token, seed for seed. With k' < k, the rule runs on the k' drafts it has.
"""

from __future__ import annotations

import pytest
import torch
from model_factory import drawn_colder, exact_first_two, sample_first_two, small_gpt2, tiny_pair

from specref.checks.montecarlo import distribution_test
from specref.decoding.chain import generate, speculative_generate
from specref.decoding.inputs import check_proposal
from specref.drafts import ModelDraft, NoDraft
from specref.sampling import SamplingParams


class Shortened(ModelDraft):
    """A model draft that keeps only the first k' = (step number mod (k + 1)) of its k drafts: k' runs 0..k."""

    steps = 0

    def begin(self, batch_size: int) -> None:
        super().begin(batch_size)
        self.steps = 0

    def propose(self, tokens, lengths, k, params, generator=None):
        x, q = super().propose(tokens, lengths, k, params, generator)
        n = self.steps % (k + 1)
        self.steps += 1
        return x[:, :n], q[:, :n]


@pytest.fixture(scope="module")
def target():
    return small_gpt2(vocab=64, n_embd=32, n_layer=2, seed=0, scale=20.0)


@pytest.mark.parametrize("temperature", [0.0, 1.0])
@pytest.mark.parametrize("batch", [1, 3])
def test_a_draft_that_never_proposes_reproduces_plain_decoding_seed_for_seed(target, temperature, batch):
    ids = torch.randint(0, 64, (batch, 5), generator=torch.Generator().manual_seed(batch))
    expected = generate(target, ids, 40, temperature=temperature, generator=torch.Generator().manual_seed(7))
    got, stats = speculative_generate(target, NoDraft(64, torch.float64), ids, k=4, max_new_tokens=40,
                                      temperature=temperature, generator=torch.Generator().manual_seed(7))
    assert torch.equal(got, expected)
    assert stats.proposed == stats.draft_passes == stats.accepted == 0
    assert stats.target_passes == 41 and stats.tokens_per_step == 1  # the prefill, then 40 one-token steps


@pytest.mark.parametrize("k", [1, 3, 6])
def test_greedy_with_shortened_proposals_equals_greedy_target(target, k):
    ids = torch.randint(0, 64, (4, 6), generator=torch.Generator().manual_seed(k))
    expected = generate(target, ids, 48, temperature=0)
    draft = Shortened(small_gpt2(vocab=64, n_embd=32, n_layer=1, seed=1, scale=20.0))
    got, stats = speculative_generate(target, draft, ids, k=k, max_new_tokens=48, temperature=0)
    assert torch.equal(got, expected)
    assert 0 < stats.proposed < k * stats.steps  # some steps drafted fewer than k


@pytest.mark.parametrize("batch", [1, 4])
def test_proposed_hist_counts_every_step_by_what_it_drafted(target, batch):
    ids = torch.randint(0, 64, (batch, 6), generator=torch.Generator().manual_seed(batch))
    draft = Shortened(small_gpt2(vocab=64, n_embd=32, n_layer=1, seed=1, scale=20.0))
    _, stats = speculative_generate(target, draft, ids, k=3, max_new_tokens=30, temperature=0)
    hist = stats.proposed_hist.tolist()
    assert sum(hist) == stats.steps and sum(j * n for j, n in enumerate(hist)) == stats.proposed
    assert all(n > 0 for n in hist), hist  # Shortened cycles through k' = 0, 1, 2, 3
    assert stats.accepted_hist.sum() == hist[3]  # acceptance by position: only the steps that drafted all k
    assert stats.as_dict()["proposed_hist"] == hist
    _, never = speculative_generate(target, NoDraft(64, torch.float32), ids, k=3, max_new_tokens=30)
    assert never.proposed_hist.tolist() == [never.steps, 0, 0, 0]


def test_proposed_hist_records_the_shrunk_last_step():
    # The target drafts for itself, so greedy accepts every draft: 7 new tokens at k = 4 are one full step
    # (4 drafts + the bonus), then a step with 2 tokens left, which drafts only 1.
    t = small_gpt2(vocab=64, n_embd=32, n_layer=2, seed=0, scale=20.0)
    _, stats = speculative_generate(t, ModelDraft(t), torch.tensor([[1, 2, 3]]), k=4, max_new_tokens=7,
                                    temperature=0)
    assert stats.proposed_hist.tolist() == [0, 1, 0, 0, 1]  # 5 tokens (k = 4), then 2 (k' = 1: one left to draft)


def test_stats_made_for_a_smaller_k_grow_their_proposal_histogram():
    from specref.decoding.loop import SpecStats
    s = SpecStats(k=1)
    s.count_proposed(3, 2)
    assert s.proposed_hist.tolist() == [0, 0, 0, 2]


N_RUNS = 30_000
PROMPT = [1, 2, 3]


def _counts(draft, seed):
    # Three tokens, so that the second step (which may draft) still has tokens left for a draft of x2.
    return sample_first_two(*draft, PROMPT, 2, SamplingParams(1.0), seed=seed, n=N_RUNS, max_new_tokens=3)


def test_sampled_first_two_tokens_follow_the_target_with_shortened_proposals():
    # Step 1 drafts 0 tokens (x1 is the target's draw), step 2 drafts 1 (x2 goes through the rule).
    target, small = tiny_pair()
    counts = _counts((target, Shortened(small)), seed=5)
    assert distribution_test(exact_first_two(target, PROMPT, SamplingParams(1.0)), counts=counts).passed


class _ShortenedColder(Shortened):
    """Negative control: shortened, and its drafts are drawn colder than the q it reports."""

    propose_colder = drawn_colder(ModelDraft.propose)

    def propose(self, tokens, lengths, k, params, generator=None):
        x, q = self.propose_colder(tokens, lengths, k, params, generator)
        n = self.steps % (k + 1)
        self.steps += 1
        return x[:, :n], q[:, :n]


def test_negative_control_a_shortened_draft_with_the_wrong_q_is_flagged():
    target, small = tiny_pair()
    counts = _counts((target, _ShortenedColder(small)), seed=5)
    assert distribution_test(exact_first_two(target, PROMPT, SamplingParams(1.0)), counts=counts).p_value < 1e-6


@pytest.mark.parametrize(
    "drafts,q,match",
    [
        (torch.zeros(2, 4, dtype=torch.long), torch.full((2, 4, 5), 0.2), r"k' <= k = 3"),  # more than k
        (torch.zeros(1, 2, dtype=torch.long), torch.full((1, 2, 5), 0.2), "B = 2"),  # another batch size
        (torch.zeros(2, 2, 1, dtype=torch.long), torch.full((2, 2, 5), 0.2), r"\[B, k'\] tensor"),  # not 2-D
        ([[0, 0], [0, 0]], torch.full((2, 2, 5), 0.2), r"\[B, k'\] tensor"),  # not a tensor
        (torch.zeros(2, 2, dtype=torch.long), torch.full((2, 3, 5), 0.2), r"\[2, 2, 5\] \(k' = the tokens"),
    ],
)
def test_a_bad_proposal_is_rejected(drafts, q, match):
    with pytest.raises(ValueError, match=match):
        check_proposal(drafts, q, 2, 3, 5, greedy=False)


def test_a_short_proposal_is_accepted_and_its_length_returned():
    assert check_proposal(torch.zeros(2, 1, dtype=torch.long), torch.full((2, 1, 5), 0.2), 2, 3, 5, False) == 1
    assert check_proposal(torch.zeros(2, 0, dtype=torch.long), None, 2, 3, 5, greedy=True) == 0


def test_no_draft_refuses_bad_arguments():
    with pytest.raises(ValueError, match="vocab_size must be >= 1"):
        NoDraft(0)
    with pytest.raises(TypeError, match="dtype must be a floating-point"):
        NoDraft(5, torch.long)
    with pytest.raises(RuntimeError, match="begin"):
        NoDraft(5).propose(torch.zeros(1, 2, dtype=torch.long), torch.tensor([2]), 1, SamplingParams(1.0))
