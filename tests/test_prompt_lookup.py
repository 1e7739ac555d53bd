"""Prompt lookup as a draft: its proposals follow the stated rule, and speculative decoding with it stays exact
when it declines to propose (on_miss="skip"). What every draft must do (the proposal's form, greedy and sampled
output equal to the target's, proposals after a rollback) is tests/test_draft_contract.py's."""

from __future__ import annotations

import random

import pytest
import torch
from model_factory import exact_first_two, sample_first_two, small_gpt2, tiny_pair

from specref.checks.montecarlo import distribution_test
from specref.decoding.chain import generate, speculative_generate
from specref.drafts import PromptLookupDraft
from specref.models.pair import load_pair
from specref.sampling import SamplingParams


def reference(context: list[int], k: int, max_ngram: int, min_ngram: int) -> list[int]:
    """The rule, brute force: longest n first, every earlier start from the latest; then copy on from there."""
    L = len(context)
    start = L - 1  # no match: copy on from the last token, i.e. repeat it
    for n in range(max_ngram, min_ngram - 1, -1):
        # An occurrence starting at i ends at i + n - 1, which must come before the last position L - 1.
        matches = [i for i in range(L - n - 1, -1, -1) if all(context[i + t] == context[L - n + t] for t in range(n))]
        if matches:
            start = matches[0] + n
            break
    out = list(context)
    for j in range(k):
        out.append(out[start + j])  # once the context runs out, the copy reads what it has just proposed
    return out[L:]


def _propose(draft: PromptLookupDraft, rows: list[list[int]], k: int, width: int | None = None):
    """draft.propose on a zero-padded buffer holding `rows` (lengths differ); drafts as lists, and q."""
    width = max(map(len, rows)) if width is None else width
    tokens = torch.tensor([r + [0] * (width - len(r)) for r in rows])
    lengths = torch.tensor([len(r) for r in rows])
    draft.begin(len(rows))
    x, q = draft.propose(tokens, lengths, k, SamplingParams(1.0))
    return x.tolist(), q


# -- the rule ------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "context,k,expected",
    [
        ([1, 2, 3, 1, 2], 3, [3, 1, 2]),  # "1 2" was followed by 3: copy from there on
        ([1, 2, 9, 2, 4, 1, 2], 1, [9]),  # the longest suffix wins: "1 2" (-> 9), not the later "2" (-> 4)
        ([5, 6, 5, 7, 5], 2, [7, 5]),  # the latest occurrence wins: the second 5 (-> 7), not the first (-> 6)
        ([1, 2, 1, 2, 1, 2], 5, [1, 2, 1, 2, 1]),  # the match overlaps the suffix; the copy runs on with period 2
        ([1, 2, 3], 2, [3, 3]),  # nothing matches: the last token, repeated
        ([7], 3, [7, 7, 7]),  # one token: nothing earlier to look up
    ],
)
def test_worked_examples(context, k, expected):
    assert reference(context, k, 3, 1) == expected
    assert _propose(PromptLookupDraft(10), [context], k)[0] == [expected]


@pytest.mark.parametrize("max_ngram,min_ngram,k", [(3, 1, 4), (1, 1, 3), (4, 2, 6), (2, 2, 1), (3, 3, 12), (5, 1, 0)])
def test_proposals_equal_a_brute_force_reference_on_random_streams(max_ngram, min_ngram, k):
    rng = random.Random(f"{max_ngram}-{min_ngram}-{k}")
    draft = PromptLookupDraft(5, max_ngram, min_ngram)
    for _ in range(150):
        vocab = rng.choice([2, 3, 5])  # small vocabularies: matches are common, long ones too
        rows = [[rng.randrange(vocab) for _ in range(rng.randint(1, 16))] for _ in range(rng.randint(1, 4))]
        width = max(map(len, rows)) + rng.randint(0, 3)  # padding after a row must be ignored
        got, q = _propose(draft, rows, k, width)
        assert got == [reference(r, k, max_ngram, min_ngram) for r in rows], rows
        one_hot = torch.nn.functional.one_hot(torch.tensor(got, dtype=torch.long).reshape(len(rows), k), 5)
        assert q.dtype == torch.float32 and torch.equal(q, one_hot.float())


def test_propose_does_not_modify_its_inputs():
    tokens, lengths = torch.tensor([[1, 2, 1, 0], [3, 3, 3, 3]]), torch.tensor([3, 4])
    before = tokens.clone(), lengths.clone()
    draft = PromptLookupDraft(5)
    draft.begin(2)
    draft.propose(tokens, lengths, 3, SamplingParams(0.0))
    assert torch.equal(tokens, before[0]) and torch.equal(lengths, before[1])


def test_for_target_takes_the_targets_vocabulary_and_dtype():
    target = small_gpt2(vocab=11, n_embd=8, n_layer=1, seed=0)  # float64
    draft = PromptLookupDraft.for_target(target, max_ngram=2)
    assert (draft.vocab_size, draft.dtype, draft.max_ngram, draft.min_ngram) == (11, torch.float64, 2, 1)
    assert _propose(draft, [[1, 2, 1]], 2)[1].dtype == torch.float64


# -- on_miss="skip": nothing proposed when no row matches ---------------------------------------------


def test_skip_proposes_nothing_when_no_row_matches():
    draft = PromptLookupDraft(10, on_miss="skip")
    x, q = _propose(draft, [[1, 2, 3], [4, 5]], 3)
    assert x == [[], []] and tuple(q.shape) == (2, 0, 10)


def test_skip_proposes_in_every_row_when_one_row_matches():
    # Row 0 matches ("1 2" -> 3); row 1 misses and repeats its last token, as "repeat" would.
    rows = [[1, 2, 3, 1, 2], [4, 5]]
    skip, _ = _propose(PromptLookupDraft(10, on_miss="skip"), rows, 3)
    assert skip == _propose(PromptLookupDraft(10), rows, 3)[0] == [[3, 1, 2], [5, 5, 5]]


def test_skip_counts_a_miss_by_min_ngram():
    # "2" occurred before (-> 9), but no earlier "3 2": a miss at min_ngram = 2, a match at 1.
    rows = [[2, 9, 3, 2]]
    assert _propose(PromptLookupDraft(10, min_ngram=1, on_miss="skip"), rows, 2)[0] == [[9, 3]]
    assert _propose(PromptLookupDraft(10, min_ngram=2, on_miss="skip"), rows, 2)[0] == [[]]


# -- speculative decoding with it is exact -----------------------------------------------------------


@pytest.fixture(scope="module")
def target():
    return small_gpt2(vocab=64, n_embd=32, n_layer=2, seed=0, scale=20.0)


@pytest.fixture(scope="module")
def greedy_runs(target):
    """Plain greedy continuations of one B=1 and one B=4 batch of prompts (computed once)."""
    g = torch.Generator().manual_seed(0)
    batches = [torch.tensor([[1, 2, 3, 1, 2]]), torch.randint(0, 64, (4, 6), generator=g)]
    return [(ids, generate(target, ids, 80, temperature=0)) for ids in batches]


@pytest.mark.parametrize("k", range(1, 9))
def test_greedy_speculative_with_skip_equals_greedy_target(target, greedy_runs, k):
    # min_ngram = 2 misses often on these streams, so steps that propose and steps that skip both run.
    draft = PromptLookupDraft.for_target(target, min_ngram=2, on_miss="skip")
    for ids, expected in greedy_runs:
        got, stats = speculative_generate(target, draft, ids, k=k, max_new_tokens=80, temperature=0)
        assert torch.equal(got, expected), f"B={ids.shape[0]}, k={k}"
        assert 0 < stats.proposed < k * stats.steps, f"B={ids.shape[0]}: every step proposed, or none did"


@pytest.fixture(scope="module")
def bundled_copy_run():
    """The bundled target (float64: the k+1-token pass and the 1-token pass must not round a near-tie apart)
    on a prompt that repeats a snippet, speculative with prompt lookup."""
    target, _, tokenizer = load_pair(dtype=torch.float64)
    snippet = "    def __init__(self, name, value):\n        self.name = name\n        self.value = value\n"
    ids = torch.tensor([tokenizer.encode(snippet * 2)])
    got, stats = speculative_generate(target, PromptLookupDraft.for_target(target), ids, k=8, max_new_tokens=32,
                                      temperature=0)
    return got, stats


def test_a_repeated_prompt_gets_many_tokens_per_step(bundled_copy_run):
    # Text that repeats itself is where copying pays: several accepted drafts per target pass.
    _, stats = bundled_copy_run
    assert stats.tokens_per_step > 2.5, stats.as_dict()


N_RUNS = 30_000

# [1, 2, 3] misses, so the first step skips and x1 is the target's own draw; the second step
# proposes in the rows where x1 is 1, 2 or 3 (which then match) and repeats x1 in the others.
# A third token is generated so that the second step may still draft one (k shrinks near the end).
SKIP_PROMPT = [1, 2, 3]


def test_sampled_first_two_tokens_follow_the_target_with_skip():
    target, _ = tiny_pair()
    params = SamplingParams(1.0)
    draft = PromptLookupDraft.for_target(target, on_miss="skip")
    counts = sample_first_two(target, draft, SKIP_PROMPT, 2, params, seed=41, n=N_RUNS, max_new_tokens=3)
    assert distribution_test(exact_first_two(target, SKIP_PROMPT, params), counts=counts).passed


def test_negative_control_with_skip_a_q_other_than_the_drafts_is_flagged():
    target, _ = tiny_pair()
    params = SamplingParams(1.0)
    draft = _SmoothedQDraft.for_target(target, on_miss="skip")
    counts = sample_first_two(target, draft, SKIP_PROMPT, 2, params, seed=41, n=N_RUNS, max_new_tokens=3)
    assert distribution_test(exact_first_two(target, SKIP_PROMPT, params), counts=counts).p_value < 1e-6


class _SmoothedQDraft(PromptLookupDraft):
    """Negative control: proposes by lookup but reports a smoothed q, not the one-hot it proposed from."""

    def propose(self, tokens, lengths, k, params, generator=None):
        drafts, q = super().propose(tokens, lengths, k, params, generator)
        return drafts, 0.5 * q + 0.5 / self.vocab_size


# -- bad input ------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "kwargs,error,match",
    [
        (dict(vocab_size=0), ValueError, "vocab_size"),
        (dict(vocab_size=5.0), TypeError, "vocab_size"),
        (dict(max_ngram=0, min_ngram=0), ValueError, "max_ngram"),
        (dict(min_ngram=0), ValueError, "min_ngram"),
        (dict(max_ngram=2, min_ngram=3), ValueError, "max_ngram must be >= min_ngram"),
        (dict(max_ngram=2.0), TypeError, "max_ngram"),
        (dict(min_ngram=True), TypeError, "min_ngram"),
        (dict(dtype=torch.long), TypeError, "dtype"),
        (dict(on_miss="never"), ValueError, "on_miss must be 'repeat'"),
    ],
)
def test_bad_constructor_arguments_are_rejected(kwargs, error, match):
    with pytest.raises(error, match=match):
        PromptLookupDraft(**{"vocab_size": 5, **kwargs})


def _ok():
    return torch.tensor([[1, 2, 1]]), torch.tensor([3])


@pytest.mark.parametrize(
    "args,error,match",
    [
        ((*_ok(), -1), ValueError, "k must be >= 0"),
        ((*_ok(), 2.0), TypeError, "k must be an int"),
        ((torch.tensor([1, 2, 1]), torch.tensor([3]), 2), ValueError, r"tokens must be an integer tensor of shape"),
        ((torch.tensor([[1.0, 2.0]]), torch.tensor([2]), 2), TypeError, "tokens must be an integer"),
        ((torch.tensor([[1, 2], [1, 2]]), torch.tensor([2, 2]), 2), ValueError, r"B = 1 \(from begin\)"),
        ((torch.tensor([[1, 2, 1]]), torch.tensor([[3]]), 2), ValueError, r"lengths must be an integer tensor"),
        ((torch.tensor([[1, 2, 1]]), torch.tensor([4]), 2), ValueError, r"lengths must be in \[1, 3\]"),
        ((torch.tensor([[1, 2, 1]]), torch.tensor([0]), 2), ValueError, r"lengths must be in \[1, 3\]"),
        ((torch.tensor([[1, 7, 1]]), torch.tensor([3]), 2), ValueError, "outside the vocabulary"),
    ],
)
def test_bad_propose_input_is_rejected(args, error, match):
    draft = PromptLookupDraft(5)
    draft.begin(1)
    with pytest.raises(error, match=match):
        draft.propose(*args, SamplingParams(1.0))


def test_propose_and_rollback_before_begin_are_rejected():
    with pytest.raises(RuntimeError, match="begin"):
        PromptLookupDraft(5).propose(*_ok(), 2, SamplingParams(1.0))
    with pytest.raises(RuntimeError, match="begin"):
        PromptLookupDraft(5).rollback(torch.tensor([3]))


def test_a_bad_rollback_is_rejected():
    draft = PromptLookupDraft(5)
    draft.begin(2)
    with pytest.raises(ValueError, match=r"n_valid must be an integer tensor of shape \[B\] with B = 2"):
        draft.rollback(torch.tensor([3]))


