"""The feature hook: a draft that reads the target's hidden states gets exactly those of the tokens each row kept.

After every step of the chain and the tree loop, the features a recording draft holds must
equal one full recompute pass of the target over the row's tokens; drafts that read no
features are served as before (no hidden states asked for, no observe, the same passes).
"""

from __future__ import annotations

import pytest
import torch
from model_factory import noisy_copy, small_gpt2

from specref.decoding.chain import speculative_generate, speculative_step
from specref.decoding.loop import Sequences, SpecStats, prefill
from specref.decoding.tree import TreeSpecStats, tree_generate, tree_step
from specref.drafts import Draft, FeatureBuffer, ModelDraft, PromptLookupDraft, TreeDraft, TreeModelDraft
from specref.drafts.shapes import DynamicTree, TreeShape
from specref.sampling import SamplingParams

LAYERS = (0, 1, 2)  # the embeddings, the input of block 1, the final state after ln_f (2-layer target)


class Recorder(Draft):
    """Proposes as a model draft (chains or trees) and keeps the target's features through the hook."""

    def __init__(self, model: torch.nn.Module, layers: tuple[int, ...] = LAYERS) -> None:
        self.features = FeatureBuffer(layers)
        self.feature_layers = self.features.layers
        self.vocab_size = model.config.vocab_size
        self.chain, self.tree = ModelDraft(model), TreeModelDraft(model)
        self.observed: list[tuple[list[int], int]] = []  # (starts, T) per observe call

    @property
    def passes(self) -> int:
        return self.tree.passes

    def begin(self, batch_size: int) -> None:
        super().begin(batch_size)
        self.features.begin(batch_size, self.run_rows)
        self.chain.begin(batch_size)
        self.tree.begin(batch_size)
        self.observed = []

    def observe(self, features, starts) -> None:
        self.observed.append((starts.tolist(), features[0].shape[1]))
        self.begun("observe")
        self.features.observe(features, starts)

    def propose(self, tokens, lengths, k, params, generator=None):
        return self.chain.propose(tokens, lengths, k, params, generator)

    def propose_tree(self, tokens, lengths, spec, params, generator=None, max_depth=None, max_nodes=None):
        return self.tree.propose_tree(tokens, lengths, spec, params, generator, max_depth, max_nodes)

    def rollback(self, n_valid: torch.Tensor) -> None:
        super().rollback(n_valid)
        self.features.rollback(n_valid)
        self.chain.rollback(n_valid)
        self.tree.rollback(n_valid)


@pytest.fixture(scope="module")
def pair():
    target = small_gpt2(vocab=64, n_embd=32, n_layer=2, seed=0, scale=20.0)  # float64: exact up to 1e-10
    return target, noisy_copy(target, noise=0.3, seed=1)  # often wrong: rejections and varied row lengths


PROMPTS = {"B=1, T=1": torch.tensor([[5]]),
           "B=4": torch.randint(0, 64, (4, 6), generator=torch.Generator().manual_seed(0))}


@torch.no_grad()
def _assert_features_match_a_recompute(target, draft: Recorder, seqs: Sequences) -> None:
    held = draft.features.held().tolist()
    for b, n in enumerate(seqs.lengths_h):
        # Every token but the last has been through the target (all of them, when the budget cut the step).
        assert held[b] in (n - 1, n) and (held[b] == n - 1 or seqs.done_h[b]), (b, held[b], n)
        if held[b] == 0:
            continue
        full = target(seqs.tokens[b : b + 1, :n], return_hidden=True).hidden_states
        for j, layer in enumerate(LAYERS):
            torch.testing.assert_close(draft.features.buffers[j][b, : held[b]], full[layer][0, : held[b]],
                                       atol=1e-10, rtol=0, msg=f"row {b}, layer {layer}")


CASES = [(4, 0.0, "B=1, T=1"), (4, 1.0, "B=4"), (TreeShape((2, 2)), 1.0, "B=1, T=1"),
         (DynamicTree(8, max_depth=4, top_k=3, beam=2), 0.0, "B=4")]


@pytest.mark.parametrize("spec,temperature,prompt", CASES, ids=repr)
def test_after_every_step_the_held_features_are_the_targets_of_the_kept_tokens(pair, spec, temperature, prompt):
    target, model = pair
    prompt = PROMPTS[prompt]
    draft, params, g = Recorder(model), SamplingParams(temperature), torch.Generator().manual_seed(3)
    seqs, cache = Sequences(prompt, 16), target.new_cache(prompt.shape[0], max_len=40)
    draft.begin(prompt.shape[0])
    tree = not isinstance(spec, int)
    stats = TreeSpecStats(k=spec.depth) if tree else SpecStats(k=spec)
    prefill(target, prompt, cache, stats, draft)
    _assert_features_match_a_recompute(target, draft, seqs)
    lengths_seen, rejections = set(), 0
    while not seqs.done:
        if tree:
            step = tree_step(target, draft, seqs, cache, spec, params, g, stats=stats)
            rejections += sum(r.n_accepted < t.depth for r, t in zip(step.results, step.trees))
        else:
            step = speculative_step(target, draft, seqs, cache, spec, params, g, stats=stats)
            rejections += sum(n < step.drafts.shape[1] for n in step.n_accepted)
        lengths_seen.add(tuple(seqs.lengths_h))
        _assert_features_match_a_recompute(target, draft, seqs)
    assert rejections > 0, "nothing was rejected: rollback was never tested"
    if prompt.shape[0] > 1:
        assert any(len(set(ls)) > 1 for ls in lengths_seen), "rows never had different lengths"
    # One observe per target pass, starting at each row's last token (prefill: at 0).
    assert len(draft.observed) == stats.target_passes
    if prompt.shape[1] > 1:
        assert draft.observed[0] == ([0] * prompt.shape[0], prompt.shape[1] - 1)


class _CountingPlain(ModelDraft):
    """A plain draft that would notice being observed."""

    calls = 0

    def observe(self, features, starts) -> None:
        type(self).calls += 1
        raise AssertionError("observe called for a draft without feature_layers")


class _TreePlain(TreeModelDraft):
    def observe(self, features, starts) -> None:
        raise AssertionError("observe called for a draft without feature_layers")


def _record_hidden_flags(target):
    """Record return_hidden of every target call (a forward pre-hook); returns (flags, handle)."""
    flags: list[bool] = []
    handle = target.register_forward_pre_hook(lambda m, a, kw: flags.append(bool(kw.get("return_hidden"))),
                                              with_kwargs=True)
    return flags, handle


@pytest.mark.parametrize("tree", [False, True])
def test_plain_drafts_get_no_hidden_states_and_the_pass_count_is_unchanged(pair, tree):
    target, model = pair
    ids = PROMPTS["B=4"]
    run = ((lambda d: tree_generate(target, d, ids, TreeShape((2, 2)), max_new_tokens=12, temperature=0))
           if tree else (lambda d: speculative_generate(target, d, ids, k=3, max_new_tokens=12, temperature=0)))
    flags, handle = _record_hidden_flags(target)
    try:
        plain_out, plain_stats = run(_TreePlain(model) if tree else _CountingPlain(model))
        plain_flags = list(flags)
        flags.clear()
        feat_out, feat_stats = run(Recorder(model))
        feat_flags = list(flags)
        flags.clear()
        if not tree:
            speculative_generate(target, PromptLookupDraft.for_target(target), ids, k=3, max_new_tokens=6)
            assert flags and not any(flags), "prompt lookup's target passes asked for hidden states"
    finally:
        handle.remove()
    assert plain_flags and not any(plain_flags), "a plain draft's target passes asked for hidden states"
    assert _CountingPlain.calls == 0
    assert feat_flags and all(feat_flags), "a feature draft's target passes must return hidden states"
    # The same proposals (same draft model): the same tokens, and no extra target pass for the features.
    assert torch.equal(plain_out, feat_out)
    assert len(plain_flags) == len(feat_flags) == plain_stats.target_passes == feat_stats.target_passes


# -- bad use ------------------------------------------------------------------------------------


def test_a_draft_reading_a_layer_the_target_lacks_is_refused(pair):
    target, model = pair
    with pytest.raises(ValueError, match="built for another target"):
        speculative_generate(target, Recorder(model, layers=(3,)), PROMPTS["B=4"], k=2, max_new_tokens=3)


def test_a_draft_that_defines_propose_tree_is_a_tree_draft_and_one_that_does_not_is_not(pair):
    _, model = pair
    assert isinstance(Recorder(model), TreeDraft) and isinstance(TreeModelDraft(model), TreeDraft)
    assert not isinstance(ModelDraft(model), TreeDraft) and not isinstance(model, TreeDraft)

    class Inherited(ModelDraft, TreeDraft):  # the old spelling: a tree draft that also names TreeDraft
        def propose_tree(self, *args: object, **kwargs: object) -> list:
            return []

    class NamedOnly(TreeDraft):  # inheriting TreeDraft is ordinary inheritance
        def propose_tree(self, *args: object, **kwargs: object) -> list:
            return []

    assert isinstance(Inherited(model), TreeDraft) and issubclass(NamedOnly, TreeDraft)
    with pytest.raises(NotImplementedError, match="grows no trees"):
        ModelDraft(model).propose_tree(torch.zeros((1, 2), dtype=torch.long), torch.tensor([2]), TreeShape((2,)),
                                       SamplingParams(0.0))


@pytest.mark.parametrize("layers,error,match", [((), ValueError, "at least one"), ((1, 1), ValueError, "repeat"),
                                                ((-1,), ValueError, "indices >= 0"),
                                                ((1.0,), TypeError, "feature_layers")])
def test_bad_feature_layers_are_refused(layers, error, match):
    with pytest.raises(error, match=match):
        FeatureBuffer(layers)


def _fresh(B: int = 2) -> FeatureBuffer:
    d = FeatureBuffer((0, 2))
    d.begin(B, None)
    return d


def test_misuse_of_the_feature_buffer_gets_clear_errors(pair):
    f = torch.zeros(2, 3, 4)
    with pytest.raises(RuntimeError, match="begin"):
        Recorder(pair[1], (0, 2)).observe((f, f), torch.tensor([0, 0]))
    with pytest.raises(ValueError, match=r"n_valid must be an integer tensor of shape \[B\] with B = 2"):
        r = Recorder(pair[1], (0, 2))
        r.begin(2)
        r.rollback(torch.tensor([1]))
    d = _fresh()
    with pytest.raises(RuntimeError, match="no features"):
        d.gather(torch.zeros((2, 1), dtype=torch.long))
    with pytest.raises(ValueError, match="tuple of 2 tensors"):
        d.observe((f,), torch.tensor([0, 0]))
    with pytest.raises(ValueError, match=r"\[B, T, C\] tensor with B = 2"):
        d.observe((f[:1], f[:1]), torch.tensor([0, 0]))
    with pytest.raises(ValueError, match="must match features"):
        d.observe((f, f[..., :2]), torch.tensor([0, 0]))
    with pytest.raises(TypeError, match=r"starts must be an integer tensor of shape \[B\]"):
        d.observe((f, f), torch.tensor([0.0, 0.0]))
    with pytest.raises(ValueError, match="never leave a gap"):
        d.observe((f, f), torch.tensor([0, 1]))
    d.observe((f, 2 * f + 1), torch.tensor([0, 0]))
    with pytest.raises(ValueError, match="C=4 to"):
        d.observe((f[..., :2], f[..., :2]), torch.tensor([3, 3]))
    with pytest.raises(ValueError, match=r"positions must lie in \[0, held\)"):
        d.gather(torch.tensor([[3], [0]]))
    with pytest.raises(ValueError, match=">= 0"):
        d.rollback(torch.tensor([-1, 0]))
    # The part checks on its own, not only behind a draft's checks:
    with pytest.raises(ValueError, match=r"n_valid must be an integer tensor of shape \[B\] with B = 2"):
        d.rollback(torch.tensor([1]))  # would broadcast
    with pytest.raises(TypeError, match="n_valid must be an integer tensor"):
        d.rollback(torch.tensor([1.0, 1.0]))
    with pytest.raises(RuntimeError, match="call begin first"):
        FeatureBuffer((0,)).observe((f,), torch.tensor([0, 0]))


def test_observe_writes_rollback_truncates_and_gather_reads_the_held():
    d = _fresh()
    f = torch.arange(2 * 3 * 1, dtype=torch.float64).reshape(2, 3, 1)  # feature value = 3 b + t
    d.observe((f, -f), torch.tensor([0, 0]))
    d.rollback(torch.tensor([2, 3]))
    assert d.held().tolist() == [2, 3]
    newest = d.gather((d.held() - 1)[:, None])
    assert [x.flatten().tolist() for x in newest] == [[1.0, 5.0], [-1.0, -5.0]]
    g = torch.full((2, 2, 1), 9.0, dtype=torch.float64)
    d.observe((g, -g), torch.tensor([2, 1]))  # row 1 re-covers position 1, 2 and drops what followed
    assert d.held().tolist() == [4, 3]
    assert d.buffers[0][0, :4, 0].tolist() == [0.0, 1.0, 9.0, 9.0]
    assert d.buffers[0][1, :3, 0].tolist() == [3.0, 9.0, 9.0]
    assert f[0, :, 0].tolist() == [0.0, 1.0, 2.0], "the caller's tensor was modified"
