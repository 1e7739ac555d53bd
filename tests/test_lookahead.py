"""Lookahead decoding: the paper's mask, one pass equal to separate passes, exact greedy and sampled output."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from model_factory import TINY_VOCAB, exact_first_two, small_gpt2, tiny_pair

from specref.checks.montecarlo import distribution_test
from specref.decoding import lookahead as la
from specref.decoding.chain import generate
from specref.decoding.lookahead import (
    LookaheadState,
    LookaheadStats,
    candidate_trie,
    lookahead_generate,
    lookahead_layout,
    lookahead_step,
)
from specref.decoding.loop import Sequences, prefill
from specref.models.pair import heldout_prompts, load_pair
from specref.sampling import SamplingParams, sample
from specref.trees import Tree, TreeResult, verify_tree_greedy


@pytest.fixture(scope="module")
def target():
    return small_gpt2(vocab=64, n_embd=32, n_layer=2, seed=0, scale=20.0)  # float64


# -- the mask ------------------------------------------------------------------------------------


def _cell(m: int, i: int, W: int) -> int:
    """Index of window cell (level m, column i) in the pass: after the root, level-major."""
    return 1 + (m - 1) * W + i


@pytest.mark.parametrize("W,N", [(1, 2), (4, 2), (3, 3), (5, 4), (2, 6)])
def test_window_mask_and_positions_follow_the_paper(W, N):
    # Cell (m, i) sees the root, level 1's columns 0..i and its own column's levels 2..m, nothing else;
    # it sits at position root + m + i. The trie after it sees only the root and its ancestors.
    trie = Tree([-1, -1, 0], [7, 8, 9])
    mask, pos = lookahead_layout(trie, 10, W, N)
    L = W * (N - 1)
    assert mask.shape == (1 + L + 3, 1 + L + 3) and pos.shape == (1 + L + 3,)
    expected = torch.zeros_like(mask)
    expected[:, 0] = True
    for m in range(1, N):
        for i in range(W):
            row = _cell(m, i, W)
            assert pos[row] == 10 + m + i
            expected[row, [_cell(1, j, W) for j in range(i + 1)]] = True
            expected[row, [_cell(k, i, W) for k in range(2, m + 1)]] = True
    t0 = 1 + L
    expected[t0:, t0:] = torch.tensor([[1, 0, 0], [0, 1, 0], [1, 0, 1]], dtype=torch.bool)
    assert torch.equal(mask, expected)
    assert pos[0] == 10 and pos[t0:].tolist() == [11, 11, 12]


def test_the_mask_of_figure_5_for_w_3_n_3():
    # Written out by hand: [root, L1[0], L1[1], L1[2], L2[0], L2[1], L2[2]].
    mask, pos = lookahead_layout(Tree((), ()), 0, 3, 3)
    assert mask.int().tolist() == [
        [1, 0, 0, 0, 0, 0, 0],
        [1, 1, 0, 0, 0, 0, 0],
        [1, 1, 1, 0, 0, 0, 0],
        [1, 1, 1, 1, 0, 0, 0],
        [1, 1, 0, 0, 1, 0, 0],
        [1, 1, 1, 0, 0, 1, 0],
        [1, 1, 1, 1, 0, 0, 1],
    ]
    assert pos.tolist() == [0, 1, 2, 3, 2, 3, 4]


def test_candidates_merge_into_a_breadth_first_trie_cut_to_depth_and_nodes():
    t = candidate_trie([(5, 6, 7), (5, 8, 1), (2, 3, 4)], max_depth=2, max_nodes=10)
    assert (t.parents, t.tokens) == ((-1, -1, 0, 0, 1), (5, 2, 6, 8, 3))
    t = candidate_trie([(5, 6, 7), (5, 8, 1), (2, 3, 4)], max_depth=3, max_nodes=4)
    assert sorted(t.path_tokens(i) for i in range(t.n_nodes) if not t.children(i)) == [[5, 6, 7], [5, 8]]
    assert candidate_trie([(1, 2)], max_depth=0, max_nodes=5).n_nodes == 0
    with pytest.raises(ValueError, match="max_nodes must be >= 0"):
        candidate_trie([(1, 2)], max_depth=2, max_nodes=-1)
    with pytest.raises(TypeError, match="max_depth"):
        candidate_trie([(1, 2)], max_depth=2.0, max_nodes=5)


def test_the_window_shifts_and_fills_the_pool_with_its_columns_ngrams():
    state = LookaheadState(2, 3, 2)  # W = 2 columns, N - 1 = 2 levels, G = 2 continuations per key
    state.begin(torch.tensor([[1, 2, 3, 4]]))
    assert state.levels[0] == [[1, 2], [3, 4]]  # from the prompt, level-major
    state.advance(0, [5, 6])  # level 2 is still the prompt's, not a model output: no n-grams yet
    assert state.levels[0] == [[3, 4], [5, 6]] and state.pool_size() == 0
    state.advance(0, [7, 8])  # column i: (L1[i], L2[i], new[i])
    assert state.levels[0] == [[5, 6], [7, 8]]
    assert state.candidates(0, 3) == [(5, 7)] and state.candidates(0, 4) == [(6, 8)]
    state.add(0, 3, (9, 9))
    state.add(0, 3, (1, 1))  # a third continuation of 3: the oldest goes
    assert state.candidates(0, 3) == [(1, 1), (9, 9)]
    state.add(0, 3, (9, 9))  # seen again: the most recent now
    assert state.candidates(0, 3) == [(9, 9), (1, 1)]
    prompt = LookaheadState(2, 3, 2)
    prompt.begin(torch.tensor([[1, 2, 3, 1, 2, 4]]), pool_from_prompt=True)
    assert prompt.candidates(0, 1) == [(2, 4), (2, 3)] and prompt.candidates(0, 2) == [(3, 1)]  # every full 3-gram


# -- one pass equals separate passes ----------------------------------------------------------------


@torch.no_grad()
def test_one_pass_gives_each_branch_the_logits_of_its_own_chain(target):
    # Rows of different lengths; every trie node equals its candidate run as a chain, every window cell
    # equals the chain the paper's mask gives it (root, level 1 up to its column, its column's levels).
    W, N, G = 3, 4, 3
    ids = torch.tensor([[1, 2, 3, 1, 2, 3, 1, 2], [9, 8, 9, 8, 9, 8, 9, 8]])
    seqs = Sequences(ids, 30)
    seqs.commit(torch.tensor([[3, 1, 2, 3], [9, 0, 0, 0]]), [3, 0], None)  # lengths 12 and 9; both roots are pool keys
    cache = target.new_cache(2)
    target(seqs.tokens[:, :11], cache=cache)
    cache.truncate(seqs.lengths - 1)
    state = LookaheadState(W, N, G)
    state.begin(ids, pool_from_prompt=True)
    checked_trie = checked_window = 0
    for _ in range(4):
        contexts = [seqs.tokens[b, : seqs.lengths_h[b]].tolist() for b in range(2)]
        step = lookahead_step(target, state, seqs, cache, SamplingParams(0.0))
        chains, rows = [], []  # each pass entry's own chain, and where the one pass put it
        for b in range(2):
            lv = step.windows[b]
            assert lv is not None
            chains.append(contexts[b])
            rows.append((b, 0))
            for m in range(1, N):
                for i in range(W):
                    chains.append(contexts[b] + lv[0][: i + 1] + [lv[k - 1][i] for k in range(2, m + 1)])
                    rows.append((b, _cell(m, i, W)))
                    checked_window += 1
            for j in range(step.tries[b].n_nodes):
                chains.append(contexts[b] + step.tries[b].path_tokens(j))
                rows.append((b, 1 + W * (N - 1) + j))
                checked_trie += 1
        # Separate causal passes, batched: padding after a chain's end cannot reach its last token.
        width = max(map(len, chains))
        out = target(torch.tensor([c + [0] * (width - len(c)) for c in chains]))
        want = out[torch.arange(len(chains)), torch.tensor([len(c) - 1 for c in chains])]
        got = torch.stack([step.logits[b, r] for b, r in rows])
        torch.testing.assert_close(got, want, atol=1e-10, rtol=0)
    assert checked_trie >= 6 and checked_window == 4 * 2 * W * (N - 1)


@torch.no_grad()
def test_the_cache_keeps_only_context_and_the_accepted_path(target):
    ids = torch.tensor([[1, 2, 3, 1, 2, 3, 1, 2]] * 2)
    seqs, cache = Sequences(ids, 20), target.new_cache(2)
    prefill(target, ids, cache, LookaheadStats(k=2))
    state = LookaheadState(4, 3, 4)
    state.begin(ids, pool_from_prompt=True)
    accepted = 0
    for _ in range(5):
        step = lookahead_step(target, state, seqs, cache, SamplingParams(0.0))
        accepted += sum(r.n_accepted for r in step.results)
        assert cache.lengths.tolist() == [n - 1 for n in seqs.lengths_h]
        nxt = target(seqs.last_tokens(), cache=cache.clone())[:, -1]  # what the cache gives the next token
        for b in range(2):
            fresh = target(seqs.tokens[b : b + 1, : seqs.lengths_h[b]])[0, -1]
            torch.testing.assert_close(nxt[b], fresh, atol=1e-10, rtol=0)
    assert accepted > 0, "no candidate was accepted: the kept path was never longer than the root"


# -- greedy is exact -------------------------------------------------------------------------------------


SETTINGS = [(1, 2, 1, False), (3, 3, 2, True), (5, 4, 5, False), (4, 5, 3, True), (2, 3, 6, True)]


@pytest.fixture(scope="module")
def greedy_runs(target):
    g = torch.Generator().manual_seed(0)
    batches = [torch.tensor([[1, 2, 3, 4, 1, 2, 3]]), torch.randint(0, 64, (4, 6), generator=g)]
    return [(ids, generate(target, ids, 40, temperature=0)) for ids in batches]


@pytest.mark.parametrize("W,N,G,pool", SETTINGS)
def test_greedy_lookahead_equals_greedy_decoding(target, greedy_runs, W, N, G, pool):
    accepted = 0
    for ids, expected in greedy_runs:
        got, stats = lookahead_generate(target, ids, 40, W, N, G, temperature=0, pool_from_prompt=pool)
        assert torch.equal(got, expected), f"B={ids.shape[0]}, W={W}, N={N}, G={G}, pool={pool}"
        assert stats.emitted == ids.shape[0] * 40
        accepted += stats.accepted
    assert accepted > 0, "no candidate was ever accepted: only the no-match path ran"


@torch.no_grad()
def test_greedy_rows_of_different_prompt_lengths_each_equal_greedy_decoding(target):
    # Prompts of 3, 5, 8 and 11 tokens in one buffer (each row's extra prompt tokens committed first);
    # every row then decodes to the buffer's end, so each gets its own number of new tokens.
    lengths = [3, 5, 8, 11]
    ids = torch.randint(0, 64, (4, 11), generator=torch.Generator().manual_seed(2))
    seqs = Sequences(ids[:, :3], 45)
    seqs.commit(ids[:, 3:], [n - 4 for n in lengths], None)
    assert seqs.lengths_h == lengths
    cache = target.new_cache(4)
    target(seqs.tokens[:, :10], cache=cache)
    cache.truncate(seqs.lengths - 1)
    state = LookaheadState(4, 3, 4)
    state.begin(ids)
    stats = LookaheadStats(k=2)
    while not seqs.done:
        lookahead_step(target, state, seqs, cache, SamplingParams(0.0), stats=stats)
    for b, n in enumerate(lengths):
        expected = generate(target, ids[b : b + 1, :n], seqs.end - n, temperature=0)[0]
        assert torch.equal(seqs.tokens[b], expected), f"row {b} (prompt of {n} tokens)"
    assert stats.accepted > 0


def test_generates_exactly_max_new_tokens(target):
    ids = torch.tensor([[1, 2, 3, 1, 2]])
    for n in [0, 1, 2, 5, 17]:
        out, stats = lookahead_generate(target, ids, n, 3, 3, 3, temperature=0, pool_from_prompt=True)
        assert out.shape == (1, 5 + n) and stats.emitted == n
        assert torch.equal(out, generate(target, ids, n, temperature=0))


def test_nothing_is_emitted_after_eos(target):
    ids = torch.randint(0, 64, (4, 5), generator=torch.Generator().manual_seed(7))
    greedy = generate(target, ids, 50, temperature=0)[:, 5:]

    def stops(eos: int) -> list[int]:  # tokens each row emits when `eos` ends it
        return [int((row == eos).nonzero()[0]) + 1 if (row == eos).any() else 50 for row in greedy]

    # An EOS token that ends the rows at different steps, one of them early.
    eos = next(int(x) for x in greedy[0, 5:] if len(set(stops(int(x)))) > 2)
    expected = generate(target, ids, 50, temperature=0, eos_token_id=eos)
    got, stats = lookahead_generate(target, ids, 50, 4, 3, 4, temperature=0, eos_token_id=eos)
    assert torch.equal(got, expected)
    assert stats.emitted == sum(stops(eos))


def test_the_window_is_left_out_at_the_end_of_the_context_window():
    model = small_gpt2(vocab=64, n_embd=32, n_layer=2, seed=0, scale=20.0, n_positions=40)
    ids = torch.tensor([[1, 2, 3, 4, 5, 6, 7] * 4] * 2)  # 28 tokens + 12 new = the whole window
    expected = generate(model, ids, 12, temperature=0)
    got, stats = lookahead_generate(model, ids, 12, 5, 4, 5, temperature=0, pool_from_prompt=True)
    assert torch.equal(got, expected)
    assert stats.accepted > 0
    assert stats.lookahead_tokens < stats.steps * 5 * 3, "every pass held the window: the end was never reached"


# -- the pool works, and the cost is counted -----------------------------------------------------------------


@torch.no_grad()
def test_processed_tokens_are_what_the_mask_holds(target):
    W, N, G = 4, 3, 3
    ids = torch.tensor([[5, 6, 7, 5, 6, 7, 5], [1, 1, 2, 1, 1, 2, 1]])
    seqs, cache = Sequences(ids, 40), target.new_cache(2)
    stats = LookaheadStats(k=N - 1)
    prefill(target, ids, cache, stats)
    state = LookaheadState(W, N, G)
    state.begin(ids)
    total = 0
    while not seqs.done:
        step = lookahead_step(target, state, seqs, cache, SamplingParams(0.0), stats=stats)
        for b in range(2):
            if step.kept[b]:
                n = step.tries[b].n_nodes
                assert n <= G * (N - 1)
                assert step.processed[b] == 1 + W * (N - 1) + n  # root + window + trie: the row's mask
                assert step.logits.shape[1] == max(step.processed)
                total += step.processed[b]
    assert stats.processed == total and stats.lookahead_tokens == stats.steps * W * (N - 1)
    assert stats.processed_per_step == pytest.approx(total / stats.steps)


@pytest.fixture(scope="module")
def bundled():
    target, _, tokenizer = load_pair(dtype=torch.float64)  # float64: a many-token pass must not round a near-tie apart
    return target, tokenizer


def test_a_repetitive_prompt_gets_more_than_one_token_per_pass(bundled):
    target, tokenizer = bundled
    snippet = "    def __init__(self, name, value):\n        self.name = name\n        self.value = value\n"
    ids = torch.tensor([tokenizer.encode(snippet * 2)])
    expected = generate(target, ids, 32, temperature=0)
    got, stats = lookahead_generate(target, ids, 32, 5, 4, 5, temperature=0)  # the pool only from the window
    assert torch.equal(got, expected)
    assert stats.tokens_per_step > 1.3 and stats.pool_ngrams > 0, stats.as_dict()
    assert stats.processed_per_step > 1 + 5 * 3  # the price: the window alone is W (N - 1) = 15 tokens


def test_report_tokens_per_pass_on_the_bundled_target(bundled, capsys):
    # Printed, not asserted beyond exactness: the benchmark chooses W, N, G from these.
    target, _ = bundled
    ids = torch.tensor(heldout_prompts(2, 48))
    expected = generate(target, ids, 32, temperature=0)
    with capsys.disabled():
        print()
        for W, N, G in [(3, 3, 3), (5, 4, 5)]:
            got, s = lookahead_generate(target, ids, 32, W, N, G, temperature=0)
            assert torch.equal(got, expected)
            print(f"lookahead W={W} N={N} G={G}: {s.tokens_per_step:.2f} tokens/pass, "
                  f"{s.processed_per_step:.1f} tokens processed/pass (held-out prompts, greedy)")


# -- sampling is exact ------------------------------------------------------------------------------------------


N_RUNS = 1000  # the exact rule must pass and the broken one fail, both at this sample size


def _prompt_with_argmax_candidate(target) -> list[int]:
    """[r, c, r] where c, which the prompt's pool proposes after r, is the target's argmax there with p(c) < 0.8."""
    with torch.no_grad():
        for r in range(TINY_VOCAB):
            for c in range(TINY_VOCAB):
                p = torch.softmax(target(torch.tensor([[r, c, r]]))[0, -1], -1)
                if int(p.argmax()) == c and 0.3 < float(p[c]) < 0.8:
                    return [r, c, r]
    raise AssertionError("no prompt found")


def _sample_first_two(target, prompt, W, N, G, params, seed):  # [V, V] counts, stats
    ids = torch.tensor([prompt] * N_RUNS)
    out, stats = lookahead_generate(target, ids, 2, W, N, G, temperature=params.temperature, top_k=params.top_k,
                                    generator=torch.Generator().manual_seed(seed), pool_from_prompt=True)
    pairs = out[:, len(prompt):].numpy()
    counts = np.bincount(pairs[:, 0] * TINY_VOCAB + pairs[:, 1], minlength=TINY_VOCAB**2)
    return counts.reshape(TINY_VOCAB, TINY_VOCAB), stats


@pytest.mark.parametrize("W,N,G,params", [(2, 2, 2, SamplingParams(1.0)), (1, 3, 2, SamplingParams(0.8, top_k=4))],
                         ids=["W2N2G2-t1", "W1N3G2-t0.8-top4"])
def test_sampled_first_two_tokens_follow_the_target(W, N, G, params):
    target, _ = tiny_pair()
    prompt = _prompt_with_argmax_candidate(target)
    counts, stats = _sample_first_two(target, prompt, W, N, G, params, seed=5)
    assert 0 < stats.accepted < N_RUNS, "the candidate must be accepted sometimes and rejected sometimes"
    assert distribution_test(exact_first_two(target, prompt, params), counts=counts).passed


def test_negative_control_accepting_candidates_greedily_while_sampling_is_flagged(monkeypatch):
    def greedy_accept(tree, p, generator=None):  # follow the argmax path, then sample: not the target's distribution
        walk = verify_tree_greedy(tree, p)
        last = walk.path[-1] + 1 if walk.path else 0
        final = int(sample(p[last], generator))
        return TreeResult(walk.tokens[:-1] + [final], walk.path, walk.trials)

    monkeypatch.setattr(la, "verify_tree", greedy_accept)
    target, _ = tiny_pair()
    prompt = _prompt_with_argmax_candidate(target)
    params = SamplingParams(1.0)
    counts, _ = _sample_first_two(target, prompt, 2, 2, 2, params, seed=5)
    result = distribution_test(exact_first_two(target, prompt, params), counts=counts)
    assert not result.passed and result.p_value < 1e-6


def test_seeded_sampling_reproduces_and_inputs_are_not_modified(target):
    ids = torch.tensor([[1, 2, 3, 1, 2]])
    before = ids.clone()
    runs = [lookahead_generate(target, ids, 20, 3, 3, 3, temperature=1.0, pool_from_prompt=True,
                               generator=torch.Generator().manual_seed(3))[0] for _ in range(2)]
    assert torch.equal(runs[0], runs[1]) and torch.equal(ids, before)


# -- bad input ----------------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "kwargs,error,match",
    [
        (dict(window=0), ValueError, "window must be >= 1"),
        (dict(window=2.0), TypeError, "window"),
        (dict(ngram=1), ValueError, "ngram must be >= 2"),
        (dict(ngram=True), TypeError, "ngram"),
        (dict(guesses=0), ValueError, "guesses must be >= 1"),
        (dict(guesses=None), TypeError, "guesses"),
        (dict(window=100), ValueError, r"window=100, ngram=4, guesses=5: one pass would hold"),
        (dict(ngram=60), ValueError, r"ngram=60.*n_positions=256"),
        (dict(pool_from_prompt=1), TypeError, "pool_from_prompt"),
        (dict(max_new_tokens=300), ValueError, "n_positions"),
        (dict(temperature=-1.0), ValueError, "temperature"),
    ],
)
def test_bad_arguments_are_rejected(target, kwargs, error, match):
    args = {"max_new_tokens": 8, "window": 5, "ngram": 4, "guesses": 5, "temperature": 0.0, **kwargs}
    with pytest.raises(error, match=match):
        lookahead_generate(target, torch.tensor([[1, 2, 3]]), **args)


def test_layout_refuses_what_is_not_a_tree():
    with pytest.raises(TypeError, match="trie"):
        lookahead_layout([1, 2], 0, 3, 3)
    with pytest.raises(ValueError, match="window"):
        lookahead_layout(Tree((), ()), 0, 0, 3)


def test_a_batch_reaches_the_end_of_the_window_when_its_rows_finish_at_different_steps():
    # Rows that finish early give their cache back (lengths 0); the cache's host bound must then follow the rows
    # still running, or the last steps ask for more slots than the window holds.
    m = small_gpt2(vocab=6, n_embd=16, n_layer=1, seed=0, n_positions=64, scale=3.0)
    for seed in range(8):
        ids = torch.randint(0, 6, (4, 8), generator=torch.Generator().manual_seed(seed))
        out, _ = lookahead_generate(m, ids, max_new_tokens=56, window=3, ngram=3, guesses=3, temperature=1.0,
                                    generator=torch.Generator().manual_seed(seed))
        assert out.shape == (4, 64)
