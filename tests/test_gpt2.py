"""GPT-2 reference model and KV cache: equal to Hugging Face's, and exact under rollback, masks, compaction."""

import os

import pytest
import torch

from specref.models import GPT2, GPT2Config, GPT2Output, KVCache

os.environ.setdefault("HF_HUB_OFFLINE", "1")

TOL = dict(atol=1e-5, rtol=1e-5)
CFG = GPT2Config(vocab_size=101, n_positions=48, n_embd=32, n_layer=3, n_head=4, bos_token_id=0, eos_token_id=0)


def make_model(cfg: GPT2Config = CFG, seed: int = 0) -> GPT2:
    # nn.Module init draws from the global RNG; fork it so tests leave no trace.
    with torch.random.fork_rng():
        torch.manual_seed(seed)
        return GPT2(cfg).eval()


def ids(*shape: int, seed: int = 1, vocab: int = CFG.vocab_size) -> torch.Tensor:
    return torch.randint(0, vocab, shape, generator=torch.Generator().manual_seed(seed))


@pytest.fixture(scope="module")
def model() -> GPT2:
    return make_model()


def hf_model(cfg: GPT2Config, seed: int = 0):
    transformers = pytest.importorskip("transformers")
    hf_cfg = transformers.GPT2Config(**cfg.to_dict())
    hf_cfg._attn_implementation = "eager"
    with torch.random.fork_rng():
        torch.manual_seed(seed)
        return transformers.GPT2LMHeadModel(hf_cfg).eval()


# -- equality with Hugging Face -----------------------------------------------------------
def test_state_dict_keys_and_shapes_equal_hf_gpt2lmheadmodel(model):
    hf = hf_model(CFG)
    ours = {k: tuple(v.shape) for k, v in model.state_dict().items()}
    theirs = {k: tuple(v.shape) for k, v in hf.state_dict().items()
              if not k.endswith((".attn.bias", ".attn.masked_bias"))}
    assert ours == theirs


@torch.no_grad()
def test_logits_equal_hf_when_hf_loads_our_weights(model):
    hf = hf_model(CFG, seed=5)
    hf.load_state_dict(model.state_dict())
    x = ids(2, 17)
    torch.testing.assert_close(model(x), hf(x).logits, **TOL)


@torch.no_grad()
def test_logits_equal_hf_when_we_load_hf_weights():
    hf = hf_model(CFG, seed=3)
    ours = make_model(seed=9)
    ours.load_state_dict(hf.state_dict())
    x = ids(2, 17, seed=4)
    torch.testing.assert_close(ours(x), hf(x).logits, **TOL)


@torch.no_grad()
def test_hidden_states_follow_hf_convention(model):
    hf = hf_model(CFG)
    hf.load_state_dict(model.state_dict())
    x = ids(1, 9)
    out = model(x, return_hidden=True)
    assert isinstance(out, GPT2Output) and len(out.hidden_states) == CFG.n_layer + 1
    for ours, theirs in zip(out.hidden_states, hf(x, output_hidden_states=True).hidden_states, strict=True):
        torch.testing.assert_close(ours, theirs, **TOL)


@torch.no_grad()
def test_logits_to_keep_gives_the_last_positions_and_leaves_the_cache_whole(model):
    x = ids(2, 9)
    full = model(x)
    cache = model.new_cache(2)
    last = model(x, cache=cache, logits_to_keep=1)
    assert last.shape == (2, 1, CFG.vocab_size)
    torch.testing.assert_close(last, full[:, -1:], **TOL)
    torch.testing.assert_close(model(x, logits_to_keep=3), full[:, -3:], **TOL)
    # The cache holds every token, so the next token's logits equal a full recompute.
    nxt = ids(2, 1)
    torch.testing.assert_close(model(nxt, cache=cache)[:, -1], model(torch.cat([x, nxt], 1))[:, -1], **TOL)
    for bad in (-1, 1.5, True, None):
        with pytest.raises(ValueError, match="logits_to_keep"):
            model(x, logits_to_keep=bad)


@torch.no_grad()
def test_hf_style_checkpoint_keys_load_without_prefix_lm_head_or_buffers(model):
    # The hub's gpt2 files store "h.0.attn..." (no "transformer."), no lm_head, plus attn.bias buffers.
    sd = {k.removeprefix("transformer."): v for k, v in model.state_dict().items() if k != "lm_head.weight"}
    sd["h.0.attn.bias"] = torch.ones(1, 1, CFG.n_positions, CFG.n_positions)
    sd["h.0.attn.masked_bias"] = torch.tensor(-1e4)
    other = make_model(seed=7)
    other.load_state_dict(sd)
    assert other.lm_head.weight is other.transformer.wte.weight
    x = ids(1, 8)
    torch.testing.assert_close(other(x), model(x), **TOL)


def _module_by_module(model: GPT2, input_ids, cache, position_ids=None, new_mask=None):  # logits [B, T, V]
    """The pass written with every submodule's own call and the per-layer cache reads and writes, in [B, T, C]."""
    from specref.models.gpt2 import additive_mask, attention_mask_over_slots

    tr, (B, T) = model.transformer, input_ids.shape
    past = cache.lengths.clone()
    slots = past[:, None] + torch.arange(T)
    n_slots = cache.capacity(T)
    x = tr.wte(input_ids) + tr.wpe(slots if position_ids is None else position_ids)
    mask = additive_mask(attention_mask_over_slots(past, slots, n_slots, new_mask), x.dtype)
    for layer, block in enumerate(tr.h):
        attn, C = block.attn, x.shape[-1]
        q, k, v = attn.c_attn(block.ln_1(x)).split(C, dim=2)
        q, k, v = (t.view(B, T, attn.n_head, attn.head_dim).transpose(1, 2) for t in (q, k, v))
        idx = slots[:, None, :, None].expand(B, attn.n_head, T, attn.head_dim)
        cache.k[layer].scatter_(2, idx, k)
        cache.v[layer].scatter_(2, idx, v)
        y = torch.nn.functional.scaled_dot_product_attention(
            q, cache.k[layer, :, :, :n_slots], cache.v[layer, :, :, :n_slots], attn_mask=mask)
        x = x + attn.c_proj(y.transpose(1, 2).reshape(B, T, C))
        mlp = block.mlp
        x = x + mlp.c_proj(mlp.act(mlp.c_fc(block.ln_2(x))))
    cache.advance(T)
    return model.lm_head(tr.ln_f(x))


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
@torch.no_grad()
def test_a_pass_computes_bit_for_bit_what_its_modules_compute(dtype):
    """The pass runs the blocks as functions on [B * T, C] rows: the same kernels on the same operands as the
    modules called one by one, so the logits are equal exactly (any CPU), with a cache, ragged rows and a mask.
    Control: one matrix moved by one ulp is caught by the same comparison."""
    model = make_model().to(dtype)
    prompt, new = ids(2, 9, seed=3), ids(2, 3, seed=4)
    mask = torch.tensor([[True, False, False], [True, True, False], [True, False, True]])[None]  # a two-branch tree
    position_ids = torch.tensor([[9, 10, 10]])

    def both(m: GPT2) -> tuple[list[torch.Tensor], list[torch.Tensor]]:
        fast, slow = m.new_cache(2, max_len=32), m.new_cache(2, max_len=32)
        out = ([m(prompt, cache=fast)], [_module_by_module(m, prompt, slow)])
        for c in (fast, slow):
            c.truncate(torch.tensor([9, 7]))  # ragged rows: the second lost two tokens
        out[0].append(m(new, cache=fast, position_ids=position_ids, attention_mask=mask))
        out[1].append(_module_by_module(m, new, slow, position_ids, mask))
        out[0].append(m(new[:, :1], cache=fast, checked=False))  # a decode pass, causal over the cache
        out[1].append(_module_by_module(m, new[:, :1], slow))
        return out

    fast, slow = both(model)
    assert all(a.dtype == dtype and torch.equal(a, b) for a, b in zip(fast, slow))
    nudged = make_model().to(dtype)
    with torch.no_grad():  # the control: every weight of the last block's MLP input matrix up by one ulp
        w = nudged.transformer.h[-1].mlp.c_fc.weight
        w.copy_(torch.nextafter(w, torch.full_like(w, float("inf"))))
    assert not torch.equal(both(nudged)[0][0], slow[0])


def test_config_round_trips_through_hf_config_dict():
    transformers = pytest.importorskip("transformers")
    hf_dict = transformers.GPT2Config(**CFG.to_dict()).to_dict()
    assert GPT2Config.from_dict(hf_dict) == CFG


# -- the KV cache -------------------------------------------------------------------------
@torch.no_grad()
def test_token_by_token_decoding_equals_full_forward(model):
    x = ids(2, 20)
    cache = model.new_cache(2)
    steps = [model(x[:, :1], cache=cache)] + [model(x[:, i:i + 1], cache=cache) for i in range(1, 20)]
    torch.testing.assert_close(torch.cat(steps, 1), model(x), **TOL)
    assert cache.lengths.tolist() == [20, 20]


@torch.no_grad()
def test_chunked_decoding_equals_full_forward(model):
    x = ids(2, 23)
    cache = model.new_cache(2, max_len=30)
    chunks = [model(x[:, a:b], cache=cache) for a, b in ((0, 7), (7, 8), (8, 13), (13, 23))]
    torch.testing.assert_close(torch.cat(chunks, 1), model(x), **TOL)


@torch.no_grad()
def test_rollback_for_every_accept_pattern_equals_recompute(model):
    prompt, drafts = ids(1, 6, seed=2), ids(1, 5, seed=3)
    correction = torch.tensor([[42]])
    for accepted in range(6):  # reject at depth 0..5 (5 = all accepted, then a bonus token)
        cache = model.new_cache(1)
        model(prompt, cache=cache)
        verify = model(drafts, cache=cache)
        torch.testing.assert_close(verify, model(torch.cat([prompt, drafts], 1))[:, 6:], **TOL)
        cache.truncate(6 + accepted)
        got = model(correction, cache=cache)[:, -1]
        want = model(torch.cat([prompt, drafts[:, :accepted], correction], 1))[:, -1]
        torch.testing.assert_close(got, want, **TOL)
        assert cache.lengths.tolist() == [6 + accepted + 1]


@torch.no_grad()
def test_batch_with_different_lengths_equals_each_sequence_alone(model):
    lengths = [3, 5, 7]
    prompts = ids(3, 7, seed=8)
    cache = model.new_cache(3)
    model(prompts, cache=cache)
    cache.truncate(torch.tensor(lengths))  # as if the sequences had accepted different numbers of drafts
    new = ids(3, 4, seed=9)
    got = model(new, cache=cache)
    for b, n in enumerate(lengths):
        alone = model(torch.cat([prompts[b:b + 1, :n], new[b:b + 1]], 1))[:, n:]
        torch.testing.assert_close(got[b:b + 1], alone, **TOL)
    assert cache.lengths.tolist() == [7, 9, 11]


@torch.no_grad()
def test_cache_in_bfloat16_and_float16_runs_and_tracks_lengths():
    m = make_model().to(torch.bfloat16)
    cache = m.new_cache(1)
    assert cache.dtype == torch.bfloat16
    out = m(ids(1, 4), cache=cache)
    assert out.dtype == torch.bfloat16 and cache.lengths.tolist() == [4]
    cache16 = KVCache(CFG.n_layer, 1, CFG.n_head, CFG.head_dim, 8, dtype=torch.float16)
    assert cache16.k.shape == (CFG.n_layer, 1, CFG.n_head, 8, CFG.head_dim)


def test_truncate_refuses_to_grow_and_does_not_alias_its_argument(model):
    cache = model.new_cache(2)
    with torch.no_grad():
        model(ids(2, 5), cache=cache)
    new = torch.tensor([2, 4])
    cache.truncate(new)
    new[0] = 0
    assert cache.lengths.tolist() == [2, 4]
    with pytest.raises(ValueError, match="new_lengths"):
        cache.truncate(5)


# -- masks and position ids among the new tokens (tree verification) ---------------------
@torch.no_grad()
def test_custom_causal_mask_equals_default(model):
    x = ids(2, 9)
    causal = torch.ones(9, 9, dtype=torch.bool).tril()[None]
    torch.testing.assert_close(model(x, attention_mask=causal), model(x), **TOL)
    cache = model.new_cache(2)
    model(ids(2, 4, seed=5), cache=cache)
    ref = model.new_cache(2)
    model(ids(2, 4, seed=5), cache=ref)
    torch.testing.assert_close(model(x, cache=cache, attention_mask=causal.expand(2, 9, 9)),
                               model(x, cache=ref), **TOL)


def two_branches(prefix_len: int, a: torch.Tensor, b: torch.Tensor):
    """Flatten branches a [1, Ta] and b [1, Tb] after a common prefix: ids, positions, block-causal mask."""
    ta, tb = a.shape[1], b.shape[1]
    mask = torch.zeros(ta + tb, ta + tb, dtype=torch.bool)
    mask[:ta, :ta] = torch.ones(ta, ta, dtype=torch.bool).tril()
    mask[ta:, ta:] = torch.ones(tb, tb, dtype=torch.bool).tril()
    pos = torch.cat([prefix_len + torch.arange(ta), prefix_len + torch.arange(tb)])[None]
    return torch.cat([a, b], 1), pos, mask[None]


@torch.no_grad()
def test_two_branch_mask_gives_each_branch_its_chain_logits(model):
    prefix, a, b = ids(1, 5, seed=10), ids(1, 3, seed=11), ids(1, 2, seed=12)
    tree, pos, mask = two_branches(5, a, b)
    cache = model.new_cache(1)
    model(prefix, cache=cache)
    got = model(tree, cache=cache, position_ids=pos, attention_mask=mask)
    torch.testing.assert_close(got[:, :3], model(torch.cat([prefix, a], 1))[:, 5:], **TOL)
    torch.testing.assert_close(got[:, 3:], model(torch.cat([prefix, b], 1))[:, 5:], **TOL)
    assert cache.lengths.tolist() == [10]


@torch.no_grad()
def test_compact_keeps_accepted_branch_and_next_logits_equal_recompute(model):
    prefix, a, b = ids(1, 5, seed=10), ids(1, 3, seed=11), ids(1, 2, seed=12)
    tree, pos, mask = two_branches(5, a, b)
    cache = model.new_cache(1)
    model(prefix, cache=cache)
    model(tree, cache=cache, position_ids=pos, attention_mask=mask)
    cache.compact([list(range(5)) + [8, 9]])  # keep the prefix and branch b (slots 8, 9)
    assert cache.lengths.tolist() == [7]
    nxt = torch.tensor([[7]])
    torch.testing.assert_close(model(nxt, cache=cache)[:, -1],
                               model(torch.cat([prefix, b, nxt], 1))[:, -1], **TOL)


@torch.no_grad()
def test_inputs_are_not_modified(model):
    x, pos = ids(1, 4), torch.arange(4)[None]
    mask = torch.ones(4, 4, dtype=torch.bool).tril()[None]
    x0, pos0, mask0 = x.clone(), pos.clone(), mask.clone()
    model(x, position_ids=pos, attention_mask=mask)
    assert torch.equal(x, x0) and torch.equal(pos, pos0) and torch.equal(mask, mask0)


# -- bad input -----------------------------------------------------------------------------
def test_ids_outside_vocab_raise_value_error_naming_input_ids(model):
    with pytest.raises(ValueError, match="input_ids"):
        model(torch.tensor([[0, CFG.vocab_size]]))
    with pytest.raises(ValueError, match="input_ids"):
        model(torch.tensor([[-1, 3]]))


def test_empty_prompt_raises(model):
    with pytest.raises(ValueError, match="input_ids"):
        model(torch.zeros(1, 0, dtype=torch.long))


def test_prompt_longer_than_context_raises(model):
    with pytest.raises(ValueError, match="n_positions"):
        model(torch.zeros(1, CFG.n_positions + 1, dtype=torch.long))
    cache = model.new_cache(1, max_len=8)
    with pytest.raises(ValueError, match="max_len"):
        model(torch.zeros(1, 9, dtype=torch.long), cache=cache)


def test_wrong_dtypes_raise_type_error(model):
    with pytest.raises(TypeError, match="input_ids"):
        model(torch.zeros(1, 3))
    with pytest.raises(TypeError, match="attention_mask"):
        model(torch.zeros(1, 3, dtype=torch.long), attention_mask=torch.ones(1, 3, 3))
    with pytest.raises(TypeError, match="position_ids"):
        model(torch.zeros(1, 3, dtype=torch.long), position_ids=torch.zeros(1, 3))


def test_wrong_shapes_raise_value_error(model):
    with pytest.raises(ValueError, match="input_ids"):
        model(torch.zeros(3, dtype=torch.long))
    with pytest.raises(ValueError, match="attention_mask"):
        model(torch.zeros(1, 3, dtype=torch.long), attention_mask=torch.ones(1, 2, 2, dtype=torch.bool))
    with pytest.raises(ValueError, match="cache"):
        model(torch.zeros(2, 3, dtype=torch.long), cache=model.new_cache(1))
    with pytest.raises(ValueError, match="attention_mask"):
        model(torch.zeros(1, 3, dtype=torch.long), attention_mask=torch.zeros(1, 3, 3, dtype=torch.bool))


# -- captured passes: the routing and the keys, on the CPU with a stand-in graph -----------------------------------


class _ReplayingGraph:
    """A stand-in for a CUDA graph: capture runs the pass once, replay runs it again on the static inputs and
    writes its outputs into the static ones in place (as kernels replayed on captured addresses do)."""

    made: list = []

    def __init__(self) -> None:
        self.replays = 0
        _ReplayingGraph.made.append(self)

    def capture(self, fn, inputs, pool):
        self.fn, self.inputs = fn, inputs
        self.outputs = fn(*inputs)
        return self.outputs

    def replay(self) -> None:
        self.replays += 1
        fresh = self.fn(*self.inputs)
        for static, new in zip(*((x if isinstance(x, tuple) else (x,)) for x in (self.outputs, fresh))):
            static.copy_(new)

    def pool(self) -> str:
        return "pool"


@pytest.fixture
def captured_on_cpu(monkeypatch):
    """Capture on the CPU with the stand-in graph (`graphs.capturable` and `graphs.CudaGraph` patched); a fresh
    copy of the bundled pair, so that what its models keep stays in this test."""
    import copy

    import specref.models.graphs as graphs
    from specref.models.pair import load_pair

    monkeypatch.setattr(graphs, "capturable", lambda device: True)
    monkeypatch.setattr(graphs, "CudaGraph", _ReplayingGraph)
    _ReplayingGraph.made.clear()
    target, draft, _ = load_pair()
    return copy.deepcopy(target), copy.deepcopy(draft)


def _graph_keys(model) -> set:
    from specref.models.session import kept

    return {(role, key) for role, cache in kept(model).caches.items() for key in cache.graphs._captured}


@pytest.mark.parametrize("temperature", [0.0, 1.0])
def test_decoding_through_captured_passes_replays_them_and_gives_the_same_tokens(captured_on_cpu, monkeypatch,
                                                                                  temperature):
    import specref.models.graphs as graphs
    from specref.decoding.chain import speculative_generate
    from specref.drafts import ModelDraft
    from specref.models.pair import heldout_prompts
    from specref.models.session import kept

    target, draft = captured_on_cpu
    ids = torch.tensor([p[:20] for p in heldout_prompts(2, 20)])

    def run():
        return speculative_generate(target, ModelDraft(draft), ids, k=4, max_new_tokens=40, temperature=temperature,
                                    generator=torch.Generator().manual_seed(3))[0]

    with monkeypatch.context() as eager_cpu:
        eager_cpu.setattr(graphs, "capturable", lambda device: False)
        eager = run()
    graphed = run()
    assert torch.equal(graphed, eager)
    replays = sum(g.replays for g in _ReplayingGraph.made)
    assert replays > len(_ReplayingGraph.made)  # most passes were replays, not captures
    for model in (target, draft):
        shapes = {(key[0], key[1], key[2]) for _, key in _graph_keys(model)}  # (B, T, slots) of each graph
        # T: decode, catch-up and verification passes (1 .. k + 1), and the prompt's (19 or 20 tokens, once)
        assert shapes and all(B == 2 and (T <= 5 or T in (19, 20)) and S in (32, 64, 128) for B, T, S in shapes)
    for model in (target, draft):  # the switch: every pass eager again, on caches of its own
        kept(model).enabled = False
    made = len(_ReplayingGraph.made)
    assert torch.equal(run(), eager) and len(_ReplayingGraph.made) == made


def test_generations_keep_their_caches_where_passes_are_captured_so_nothing_is_captured_twice(captured_on_cpu):
    from specref.decoding.chain import speculative_generate
    from specref.drafts import ModelDraft
    from specref.models.pair import heldout_prompts
    from specref.models.session import Session, kept

    target, draft = captured_on_cpu
    ids = torch.tensor([p[:20] for p in heldout_prompts(2, 20)])

    def run():
        return speculative_generate(target, ModelDraft(draft), ids, k=4, max_new_tokens=40,
                                    generator=torch.Generator().manual_seed(3))[0]

    first = run()
    captured = {id(m): _graph_keys(m) for m in (target, draft)}
    kept_cache = kept(target).caches["target"]
    second = run()
    assert torch.equal(first, second)
    for model in (target, draft):  # the second generation replayed the first one's graphs: no new capture
        assert _graph_keys(model) == captured[id(model)]
    n = target.config.n_positions
    with Session(60) as s:
        again = s.cache(target, "target", 2, 60, n)
        assert again is kept_cache and again.max_len % 64 == 0 and again.bound == 0  # emptied, in place
        assert int(again.lengths.abs().sum()) == 0
        # Roles keep separate caches (a model may be its own draft)
        assert s.cache(target, "draft", 2, 60, n) is not again
    with Session(61) as s:
        assert s.cache(target, "target", 2, 61, n) is kept_cache
    with Session(60) as s:  # another batch gets a new one, with no graphs yet
        other = s.cache(target, "target", 3, 60, n)
        assert other is not kept_cache and len(other.graphs) == 0
    kept(target).enabled = False  # without capture: a new cache each time
    with Session(60) as s:
        assert s.cache(target, "target", 2, 60, n) is not kept(target).caches["target"]


def test_a_generation_nested_on_the_same_model_cannot_take_the_kept_cache_the_outer_one_holds(captured_on_cpu):
    """Where caches are kept (CUDA, here the CPU with a stand-in graph), an on_step observer that generates on
    the same model asks for the same role's cache: it gets a RuntimeError, not the outer generation's cache
    emptied mid-run; the controls: sequential generations still share the kept cache, an error releases what the
    generation held, and with capture off the nested generation runs on its own cache."""
    from specref.decoding.chain import generate, speculative_generate
    from specref.drafts import ModelDraft
    from specref.models.pair import heldout_prompts
    from specref.models.session import Session, kept

    target, draft = captured_on_cpu
    ids = torch.tensor([p[:20] for p in heldout_prompts(2, 20)])
    alone = generate(target, ids, 8, temperature=0)
    inner: list[torch.Tensor] = []

    def nested(step) -> None:  # an observer that generates on the outer generation's target
        if not inner:
            inner.append(generate(target, ids, 8, temperature=0))

    def run(on_step=None):
        return speculative_generate(target, ModelDraft(draft), ids, k=4, max_new_tokens=24, temperature=0,
                                    on_step=on_step)[0]

    first = run()
    kept_cache = kept(target).caches["target"]
    with pytest.raises(RuntimeError, match="kept 'target' cache is held by a generation that has not finished"):
        run(nested)
    assert not inner and kept(target).held == set() and kept(target).caches["target"] is kept_cache
    assert torch.equal(run(), first)  # the next generation takes the kept cache again
    n = target.config.n_positions
    with Session(60) as outer:  # the rule itself: a held role is refused, another role is not
        held = outer.cache(target, "target", 2, 60, n)
        assert outer.cache(target, "draft", 2, 60, n) is not held
        with pytest.raises(RuntimeError, match="'target'"), Session(60) as inner_session:
            inner_session.cache(target, "target", 2, 60, n)
    first_s, second_s = Session(60), Session(60)  # sessions that end out of order release only their own roles
    first_s.cache(target, "target", 2, 60, n)
    second_s.cache(target, "draft", 2, 60, n)
    first_s.close()
    assert kept(target).held == {"draft"}
    second_s.close()
    assert kept(target).held == set()
    kept(target).enabled = False  # the way out the error names: the inner generation gets a cache of its own
    assert torch.equal(run(nested), first) and torch.equal(inner[0], alone)


def test_moving_the_weights_forgets_the_captured_passes_and_kept_caches(monkeypatch):
    from model_factory import small_gpt2

    import specref.models.graphs as graphs
    from specref.models.session import Session

    monkeypatch.setattr(graphs, "capturable", lambda device: True)
    monkeypatch.setattr(graphs, "CudaGraph", _ReplayingGraph)
    model = small_gpt2(vocab=50, n_embd=32, n_layer=2, seed=5, dtype=torch.float32)
    with Session(40) as s:
        cache = s.cache(model, "target", 1, 40, 64)
    with torch.no_grad():
        model(torch.tensor([[1, 2, 3]]), cache=cache)
    assert len(cache.graphs) == 1
    with Session(40) as s:
        assert s.cache(model, "target", 1, 40, 64) is cache
    with torch.enable_grad():  # with autograd on, nothing is captured: a replay's outputs would carry no history
        model(torch.tensor([[4]]), cache=cache)
    assert len(cache.graphs) == 1
    model.to(torch.float64)  # every weight moves: graphs captured on their addresses must go, and the caches
    with Session(40) as s:
        assert s.cache(model, "target", 1, 40, 64) is not cache
