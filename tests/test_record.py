"""record_generation, notebook 05's step view and trace_step: what they record is exactly what the loop did."""

from __future__ import annotations

import pytest
import torch
from model_factory import noisy_copy, small_gpt2

from specref import PromptLookupDraft, generate, load_draft, load_pair
from specref.course.widgets import draft_steps_widget, format_steps
from specref.decoding.positions import acceptance_by_position, counts_from_histogram
from specref.decoding.record import RecordedStep, record_generation
from specref.decoding.trace import trace_step
from specref.drafts import ModelDraft
from specref.models.pair import heldout_prompts


@pytest.fixture(scope="module")
def pair():
    target, draft, tok = load_pair(dtype=torch.float64)
    return target, draft, tok


def _check_steps(steps, out, prompt_len, k, stats):
    # The steps tile the continuation, each emitting its accepted drafts then one target token.
    assert steps[0].start == prompt_len
    joined = [t for s in steps for t in s.emitted]
    assert joined == out[0, prompt_len:].tolist()
    for a, b in zip(steps, steps[1:]):
        assert b.start == a.start + len(a.emitted)
    for s in steps:
        assert s.emitted[: s.n_accepted] == s.drafts[: s.n_accepted]
        assert len(s.emitted) == s.n_accepted + 1
    assert sum(s.n_accepted for s in steps) == stats.accepted
    assert len(steps) == stats.steps
    full = [s.n_accepted for s in steps if len(s.drafts) == k]
    assert [full.count(n) for n in range(k + 1)] == stats.accepted_hist.tolist()


@pytest.mark.parametrize("kind", ["model", "prompt_lookup"])
def test_greedy_recording_tiles_the_plain_greedy_output(pair, kind):
    target, small, _ = pair
    draft = ModelDraft(small) if kind == "model" else PromptLookupDraft.for_target(target)
    ids = torch.tensor([heldout_prompts(1, 32)[0]])
    out, steps, stats = record_generation(target, draft, ids, k=3, max_new_tokens=30, temperature=0)
    assert torch.equal(out, generate(target, ids, 30, temperature=0))
    _check_steps(steps, out, 32, 3, stats)
    for s in steps:
        if s.kind == "correction":  # greedy: the target's token differs from the draft it replaced
            assert s.emitted[-1] != s.rejected
    assert {s.kind for s in steps} >= {"correction"}
    # Watching left no trace on the draft: its methods are the class's again.
    assert "propose" not in vars(draft) and "rollback" not in vars(draft)


def test_sampled_recording_matches_the_loop_and_its_seed(pair):
    target, small, _ = pair
    ids = torch.tensor(heldout_prompts(2, 24)[1])
    g = torch.Generator().manual_seed(3)
    out, steps, stats = record_generation(target, ModelDraft(small), ids, k=4, max_new_tokens=25, temperature=1.0,
                                          generator=g)
    _check_steps(steps, out, 24, 4, stats)
    assert any(s.kind == "bonus" for s in steps) and any(s.kind == "correction" for s in steps)
    # The same seed through speculative_generate gives the same text: recording changes nothing.
    from specref import speculative_generate
    again, _ = speculative_generate(target, small, ids[None], k=4, max_new_tokens=25, temperature=1.0,
                                    generator=torch.Generator().manual_seed(3))
    assert torch.equal(out, again)


def test_record_generation_rejects_bad_input(pair):
    target, small, _ = pair
    with pytest.raises(ValueError, match="one sequence"):
        record_generation(target, small, torch.zeros((2, 5), dtype=torch.long), k=2, max_new_tokens=4)
    with pytest.raises(ValueError, match="k"):
        record_generation(target, small, torch.zeros(5, dtype=torch.long), k=0, max_new_tokens=4)
    with pytest.raises(TypeError, match="input_ids"):
        record_generation(target, small, [1, 2, 3], k=2, max_new_tokens=4)


def test_format_steps_marks_each_kind_and_escapes_text():
    steps = [RecordedStep(3, [5, 6], 1, [5, 7]), RecordedStep(5, [8, 9], 2, [8, 9, 1]), RecordedStep(8, [], 0, [2])]
    text = {1: "<b>", 2: "z", 5: "a", 6: "r", 7: "c", 8: "d", 9: "e"}
    html = format_steps(steps, text.__getitem__, prompt="p&q")
    assert html.count("class='specref-accepted'") == 3
    assert html.count("class='specref-correction'") == 1 and "replaced draft &#x27;r&#x27;" in html
    assert html.count("class='specref-bonus'") == 1 and html.count("class='specref-target'") == 1
    assert "&lt;b&gt;" in html and "<b>" not in html.split("</p>", 1)[1] and "p&amp;q" in html
    assert "3 steps, 6 tokens: 2.00 tokens per target pass" in html
    with pytest.raises(ValueError, match="step 0 emitted 1 tokens but accepted 1"):
        format_steps([RecordedStep(3, [5, 6], 1, [5])], text.__getitem__)


def test_draft_steps_widget_follows_the_dropdown_and_the_k_slider(pair):
    target, small, tok = pair
    ids = torch.tensor(heldout_prompts(1, 24)[0])
    drafts = {"model": ModelDraft(small), "prompt_lookup": PromptLookupDraft.for_target(target)}
    w = draft_steps_widget(target, drafts, ids, tok, k=2, max_new_tokens=20)
    assert all(len(s.drafts) <= 2 for s in w.steps) and "specref-accepted" in w.view.value
    first = w.view.value
    w.k_slider.value = 5
    assert max(len(s.drafts) for s in w.steps) == 5 and w.view.value != first
    model_out, model_steps = w.output, [len(s.emitted) for s in w.steps]
    w.draft_dropdown.value = "prompt_lookup"
    # Another draft, the same greedy text: only the step boundaries move.
    assert torch.equal(w.output, model_out)
    assert [len(s.emitted) for s in w.steps] != model_steps


def test_the_k_slider_ends_at_the_chosen_drafts_max_k(pair):
    # MTP drafts at most one token per module: choosing it lowers k to its depth instead of raising in the view.
    target, small, tok = pair
    ids = torch.tensor(heldout_prompts(1, 24)[0])
    mtp = load_draft("mtp", target)
    assert mtp.max_k is not None and mtp.max_k < 8
    w = draft_steps_widget(target, {"model": ModelDraft(small), "mtp": mtp}, ids, tok, k=6, max_new_tokens=12)
    assert w.k_slider.max == 8 and w.k_slider.value == 6
    w.draft_dropdown.value = "mtp"
    assert w.k_slider.max == mtp.max_k and w.k_slider.value == mtp.max_k
    assert max(len(s.drafts) for s in w.steps) <= mtp.max_k
    assert torch.equal(w.output, generate(target, ids[None], 12, temperature=0))
    w.draft_dropdown.value = "model"
    assert w.k_slider.max == 8 and w.k_slider.value == mtp.max_k


def _step(drafts, n_accepted):
    return RecordedStep(0, list(drafts), n_accepted, list(drafts[:n_accepted]) + [9])


def test_acceptance_by_position_counts_the_steps_that_reach_each_position():
    steps = [_step([1, 2, 3], 0), _step([1, 2, 3], 1), _step([1, 2, 3], 3), _step([1, 2, 3], 2),
             _step([4], 1),  # k shrank at the end of the budget: reaches position 1 only
             _step([], 0)]  # no drafts: reaches nothing
    # position 1: 5 steps drafted it, 4 kept it; position 2: the 3 full steps that kept 1, 2 kept it; position 3: 2, 1
    assert acceptance_by_position(steps, 3) == [(4, 5), (2, 3), (1, 2)]
    assert acceptance_by_position(steps, 4) == [(4, 5), (2, 3), (1, 2), (0, 0)]
    assert acceptance_by_position(steps, 1) == [(4, 5)]
    assert acceptance_by_position([], 2) == [(0, 0), (0, 0)]


@pytest.mark.parametrize("kind", ["model", "medusa"])
def test_acceptance_by_position_agrees_with_the_loops_own_counts(pair, kind):
    target, small, _ = pair
    draft = ModelDraft(small) if kind == "model" else load_draft("medusa", target)
    k = 4
    _, steps, stats = record_generation(target, draft, torch.tensor(heldout_prompts(1, 32)), k, 40)
    counts = acceptance_by_position(steps, k)
    assert sum(a for a, _ in counts) == stats.accepted  # every accepted draft sits at exactly one position
    assert counts[0][1] == sum(1 for s in steps if s.drafts)
    # Over the steps that drafted all k, position i is reached by the steps that kept >= i - 1 (the loop's histogram).
    full = acceptance_by_position([s for s in steps if len(s.drafts) == k], k)
    hist = stats.accepted_hist.tolist()
    assert full == counts_from_histogram(hist)
    assert counts_from_histogram([2, 3, 5]) == [(8, 10), (5, 8)]  # by hand


def test_acceptance_by_position_rejects_bad_input():
    with pytest.raises(ValueError, match="k"):
        acceptance_by_position([_step([1], 1)], 0)
    with pytest.raises(TypeError, match="RecordedStep"):
        acceptance_by_position([(1, 2)], 2)
    with pytest.raises(TypeError, match="RecordedStep"):
        acceptance_by_position(_step([1], 1), 2)


def test_a_traced_greedy_step_emits_what_greedy_decoding_emits_and_rolls_both_caches_back():
    target = small_gpt2(vocab=64, n_embd=32, n_layer=2, seed=0, scale=20.0)
    draft = noisy_copy(target, noise=0.3, seed=1)
    prompt = torch.tensor([1, 2, 3, 4, 5])
    for k in (1, 3, 5):
        tr = trace_step(target, draft, prompt, k=k)
        n = len(tr.emitted)
        assert n == tr.n_accepted + 1 and tr.drafts[: tr.n_accepted] == tr.emitted[: tr.n_accepted]
        assert tr.emitted == generate(target, prompt[None], n, temperature=0)[0, 5:].tolist()
        assert tr.emitted[-1] == tr.p_argmax[tr.n_accepted]  # the correction or bonus is the target's argmax
        T = tr.context_len
        assert tr.target_cache_len == (T - 1, T + k, T + tr.n_accepted)  # context + accepted drafts
        assert tr.draft_cache_len == (0, T + k - 1, min(T + k - 1, T + tr.n_accepted))


@pytest.mark.parametrize("kind", ["chain", "tree", "lookahead"])
def test_on_step_sees_every_step_and_changes_nothing(kind):
    from specref import lookahead_generate, speculative_generate, tree_generate

    target = small_gpt2(vocab=64, n_embd=32, n_layer=2, seed=0, scale=20.0)
    draft = noisy_copy(target, noise=0.3, seed=1)
    prompt = torch.tensor([[1, 2, 3, 4, 5], [9, 8, 7, 6, 5]])
    run = {
        "chain": lambda **kw: speculative_generate(target, draft, prompt, k=3, max_new_tokens=20, **kw),
        "tree": lambda **kw: tree_generate(target, draft, prompt, (2, 2), max_new_tokens=20, **kw),
        "lookahead": lambda **kw: lookahead_generate(target, prompt, max_new_tokens=20, window=3, ngram=3, **kw),
    }[kind]
    plain, _ = run(temperature=1.0, generator=torch.Generator().manual_seed(5))
    records = []
    out, stats = run(temperature=1.0, generator=torch.Generator().manual_seed(5), on_step=records.append)
    assert torch.equal(out, plain)  # watching a run does not change it
    assert 0 < len(records) and sum(max(r.kept) > 0 for r in records) == len(records)
    for b in range(2):  # the steps' kept tokens, joined, are the row's continuation
        if kind == "chain":
            joined = [t for r in records for t in r.out[b, : r.kept[b]].tolist()]
        else:
            joined = [t for r in records for t in r.results[b].tokens[: r.kept[b]]]
        assert joined == out[b, 5:].tolist()
    assert sum(sum(1 for m in r.kept if m) for r in records) == stats.steps
