"""The trainable heads of the feature drafts: shapes, the teacher-forced alignment, save/load, bad arguments.

The alignment tests run on a small random GPT-2 in float64: what each module's row reads is
checked by perturbing one token and seeing which rows move, and training-time test's
teacher-forced steps are checked against drafting step by step with a KV cache (with a
leaky mask as the negative control that the same comparison must catch).
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest
import torch
from model_factory import small_gpt2

from specref.drafts.heads import (
    EagleLayer,
    HeadsConfig,
    MedusaHeads,
    MTPModule,
    MTPStack,
    build_heads,
    load_bundled_heads,
    load_heads,
    save_heads,
    target_fingerprint,
)
from specref.models.pair import assets_dir

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tools" / "training"))  # heads_alignment
import heads_alignment  # noqa: E402
from heads_alignment import (  # noqa: E402
    eagle_inputs,
    eagle_unroll,
    medusa_inputs,
    mtp_inputs,
    mtp_unroll,
    ttt_attention_mask,
    ttt_shift,
)

C, H, V, NL = 16, 2, 11, 3


@pytest.fixture(scope="module")
def target():
    return small_gpt2(vocab=V, n_embd=C, n_layer=NL, seed=0, n_positions=32)


def _hidden(target, ids):
    return target(ids, return_hidden=True).hidden_states


def _f64(m):
    torch.manual_seed(1)
    return m.double().eval()


def _ids(B=2, T=12, seed=0):
    return torch.randint(0, V, (B, T), generator=torch.Generator().manual_seed(seed))


# -- shapes and alignment ------------------------------------------------------------------------
def test_medusa_shapes_start_and_label_alignment(target):
    ids = _ids()
    hs = _hidden(target, ids)
    heads = _f64(MedusaHeads(C, 4))
    out = heads(hs[-1])
    assert out.shape == (2, 12, 4, C)
    assert heads.logits(hs[-1], target.lm_head).shape == (2, 12, 4, V)
    # W starts at zero: every head starts as the target's own next-token head.
    assert torch.equal(out, hs[-1][:, :, None].expand_as(out))
    mb = medusa_inputs(hs, 4)
    for i, lab in enumerate(mb.labels):  # head i at row t: label lm_head(f_{t+1+i}), rows 0 .. T-2-i
        assert lab.shape == (2, 12 - 1 - i, C)
        torch.testing.assert_close(target.lm_head(lab), target(ids)[:, 1 + i:], rtol=0, atol=1e-12)



def test_medusa_runs_only_the_heads_it_is_asked_for(target):
    hs = _hidden(target, _ids())
    heads = _f64(MedusaHeads(C, 4))
    with torch.no_grad():
        for p in heads.parameters():
            p.normal_(0, 0.3, generator=torch.Generator().manual_seed(3))
    every = heads.logits(hs[-1], target.lm_head)  # [2, 12, 4, V]
    for n in (1, 2, 4):
        some = heads.logits(hs[-1], target.lm_head, n)
        assert some.shape == (2, 12, n, V)
        torch.testing.assert_close(some, every[:, :, :n], rtol=0, atol=1e-12)
    for bad in (0, 5):
        with pytest.raises(ValueError, match="n"):
            heads(hs[-1], bad)
    with pytest.raises(TypeError, match="n"):
        heads(hs[-1], 2.0)


def test_eagle_inputs_read_feature_t_token_t_plus_1_position_t_plus_1(target):
    ids = _ids()
    hs = _hidden(target, ids)
    for layers in ((NL,), (1, 2, NL)):
        layer = _f64(EagleLayer(C, H, layers))
        eb = eagle_inputs(layer, hs, ids, target)
        assert eb.g.shape == eb.tok_emb.shape == eb.next_feature.shape == (2, 11, C)
        assert eb.pos_emb.shape == (1, 11, C)
        if len(layers) == 1:
            assert torch.equal(eb.g, hs[-1][:, :11])
        assert torch.equal(eb.tok_emb, target.transformer.wte(ids[:, 1:]))
        assert torch.equal(eb.pos_emb[0], target.transformer.wpe.weight[1:12])
        # row s's label is the target's distribution for x_{s+2}
        torch.testing.assert_close(target.lm_head(eb.next_feature), target(ids)[:, 1:], rtol=0, atol=1e-12)
        assert eagle_unroll(layer, eb, 1)[0].shape == (2, 11, C)


@pytest.mark.parametrize("use_token", [True, False])
def test_eagle_row_s_sees_tokens_up_to_s_plus_1_only(target, use_token):
    """Changing x_u moves rows s >= u - 1 with the token (it reads x_{s+1}), rows s >= u without it."""
    layer = _f64(EagleLayer(C, H, (NL,), use_token=use_token))
    ids = _ids(B=1, T=12)
    u = 7
    ids2 = ids.clone()
    ids2[0, u] = (ids[0, u] + 1) % V
    outs = []
    for x in (ids, ids2):
        outs.append(eagle_unroll(layer, eagle_inputs(layer, _hidden(target, x), x, target), 1)[0])
    moved = (outs[0] - outs[1]).abs().amax(-1)[0] > 1e-12  # [L]
    first = u - 1 if use_token else u
    assert not moved[:first].any()
    assert moved[first:].all()


def test_mtp_depth_d_row_i_reads_token_i_plus_d(target):
    stack = _f64(MTPStack(C, H, 3))
    ids = _ids(B=1, T=12)
    outs = mtp_unroll(stack, _hidden(target, ids), ids, target)
    assert [o.shape for o in outs] == [(1, 11, C), (1, 10, C), (1, 9, C)]
    assert stack[0].logits(outs[0], target.lm_head).shape == (1, 11, V)
    u = 8
    ids2 = ids.clone()
    ids2[0, u] = (ids[0, u] + 1) % V
    outs2 = mtp_unroll(stack, _hidden(target, ids2), ids2, target)
    for d, (a, b) in enumerate(zip(outs, outs2), 1):
        moved = (a - b).abs().amax(-1)[0] > 1e-12
        assert not moved[:u - d].any() and moved[u - d:].all(), d
    h, tok, pos = mtp_inputs(2, outs[0], ids, target)
    assert torch.equal(tok, target.transformer.wte(ids[:, 2:])) and torch.equal(pos[0], target.transformer.wpe.weight[2:12])
    assert torch.equal(h, outs[0][:, :10])


def test_cache_matches_one_pass(target):
    """Feeding rows through the 1-layer KVCache in pieces gives the outputs of one causal pass."""
    ids = _ids()
    hs = _hidden(target, ids)
    layer = _f64(EagleLayer(C, H, (NL,)))
    eb = eagle_inputs(layer, hs, ids, target)
    full = layer(eb.g, eb.tok_emb, eb.pos_emb)
    cache = layer.new_cache(2, 16)
    parts = [layer(eb.g[:, a:b], eb.tok_emb[:, a:b], eb.pos_emb[:, a:b], cache=cache) for a, b in ((0, 5), (5, 6), (6, 11))]
    torch.testing.assert_close(torch.cat(parts, 1), full, rtol=0, atol=1e-12)
    assert cache.lengths.tolist() == [11, 11]
    mod = _f64(MTPModule(C, H))
    h, tok, pos = mtp_inputs(1, hs[-1], ids, target)
    full = mod(h, tok, pos)
    cache = mod.new_cache(2, 16)
    parts = [mod(h[:, a:b], tok[:, a:b], pos[:, a:b], cache=cache) for a, b in ((0, 4), (4, 11))]
    torch.testing.assert_close(torch.cat(parts, 1), full, rtol=0, atol=1e-12)


def test_ttt_mask_small_case():
    m = ttt_attention_mask(3, 2).int().tolist()
    assert m == [
        [1, 0, 0, 0, 0, 0],
        [1, 1, 0, 0, 0, 0],
        [1, 1, 1, 0, 0, 0],
        [0, 0, 0, 1, 0, 0],  # step 2, row 0: no draft starts before row 0; sees itself only
        [1, 0, 0, 0, 1, 0],  # step 2, row 1 (start t=0): target rows <= 0, itself
        [1, 1, 0, 0, 0, 1],
    ]
    assert torch.equal(ttt_shift(torch.arange(6.0).view(1, 3, 2)), torch.tensor([[[0.0, 0], [0, 1], [2, 3]]]))


def _drafted(layer, eb, t, steps):
    """Step-by-step drafting from start t with a KV cache, true tokens as the drafts: outputs per step."""
    cache = layer.new_cache(eb.g.shape[0], 32)
    y = layer(eb.g[:, :t + 1], eb.tok_emb[:, :t + 1], eb.pos_emb[:, :t + 1], cache=cache)[:, -1:]
    outs = [y]
    for j in range(2, steps + 1):
        s = t + j - 1
        y = layer(y, eb.tok_emb[:, s:s + 1], eb.pos_emb[:, s:s + 1], cache=cache)
        outs.append(y)
    return outs


def test_training_time_test_equals_drafting_with_a_cache(target, monkeypatch):
    ids = _ids(T=14)
    hs = _hidden(target, ids)
    layer = _f64(EagleLayer(C, H, (1, 2, NL)))
    eb = eagle_inputs(layer, hs, ids, target)
    steps = 3
    tf = eagle_unroll(layer, eb, steps)
    for t in (0, 4, 9):
        for j, y in enumerate(_drafted(layer, eb, t, steps), 1):
            torch.testing.assert_close(tf[j - 1][:, t + j - 1], y[:, 0], rtol=0, atol=1e-10)

    # Negative control: a leaky mask (later steps also see the target's row at their own position).
    def leaky(L, n, device=None):
        m = ttt_attention_mask(L, n, device)
        s = torch.arange(L)
        for j in range(1, n):
            m[j * L:(j + 1) * L, :L] = s[None, :] <= s[:, None]
        return m

    monkeypatch.setattr(heads_alignment, "ttt_attention_mask", leaky)
    bad = heads_alignment.eagle_unroll(layer, eb, steps)
    y = _drafted(layer, eb, 4, steps)
    assert (bad[1][:, 5] - y[1][:, 0]).abs().max() > 1e-6


# -- saving and loading ---------------------------------------------------------------------------
@pytest.mark.parametrize("kind", ["medusa", "eagle", "mtp"])
def test_saved_set_loads_back_bit_identically(tmp_path, target, kind):
    cfg = HeadsConfig(kind=kind, name=f"x_{kind}", n_embd=C, n_head=H, n_heads=2, feature_layers=(1, NL),
                      ttt_steps=2, target_vocab_size=V, target_n_layer=NL, target_fingerprint=target_fingerprint(target))
    torch.manual_seed(2)
    m = build_heads(cfg)
    with torch.no_grad():
        for p in m.parameters():
            p.add_(torch.randn_like(p))  # not the init: every tensor carries its own values
    size = save_heads(m, cfg, tmp_path / "h.safetensors")
    assert size == (tmp_path / "h.safetensors").stat().st_size
    half, cfg2 = load_heads(tmp_path / "h.safetensors", dtype=torch.float16)
    assert cfg2 == cfg and type(half) is type(m)
    want = {k: v.half() for k, v in m.state_dict().items()}
    got = half.state_dict()
    assert want.keys() == got.keys() and all(torch.equal(want[k], got[k]) for k in want)
    full, _ = load_heads(tmp_path / "h.safetensors")
    assert all(torch.equal(full.state_dict()[k], want[k].float()) for k in want)
    cfg2.check_target(target)
    other = small_gpt2(vocab=V, n_embd=C, n_layer=NL, seed=5, n_positions=32)
    with pytest.raises(ValueError, match="another target"):
        cfg2.check_target(other)
    with pytest.raises(ValueError, match="n_embd"):
        cfg2.check_target(small_gpt2(vocab=V, n_embd=8, n_layer=NL, seed=5))


def test_load_errors(tmp_path):
    from safetensors.torch import save_file

    save_file({"w": torch.zeros(2)}, str(tmp_path / "plain.safetensors"))
    with pytest.raises(ValueError, match="no head-set config"):
        load_heads(tmp_path / "plain.safetensors")
    with pytest.raises(FileNotFoundError, match="train_heads"):
        load_heads(tmp_path / "missing.safetensors")
    with pytest.raises(ValueError, match="name"):
        load_bundled_heads("../target/model")


def test_bundled_heads_fit_the_bundled_target_and_the_size_limit():
    """A lost head set, or its record, fails here: they are part of the course (tools/training/train_heads.py)."""
    from specref.drafts.load import DRAFTS
    from specref.models.pair import load_pair

    folder = assets_dir().joinpath("heads")
    assert folder.joinpath("heads.json").is_file(), "specref/assets/heads/heads.json is missing"
    target = load_pair()[0]
    record = json.loads(folder.joinpath("heads.json").read_text())
    assert set(record["sets"]) == {stem for stem in DRAFTS.values() if stem is not None}, record["sets"]
    total = 0
    for name in record["sets"]:
        m, cfg = load_bundled_heads(name)
        cfg.check_target(target)
        total += folder.joinpath(f"{name}.safetensors").stat().st_size
    assert total == record["total_bytes"] and total <= 4_000_000


# -- bad arguments --------------------------------------------------------------------------------
def test_bad_arguments(target):
    with pytest.raises(ValueError, match="n_heads"):
        MedusaHeads(C, 0)
    with pytest.raises(TypeError, match="n_embd"):
        MedusaHeads(16.0, 2)
    with pytest.raises(ValueError, match="divisible"):
        EagleLayer(15, 2, (NL,))
    with pytest.raises(TypeError, match="feature_layers"):
        EagleLayer(C, H, ())
    with pytest.raises(TypeError, match="use_token"):
        EagleLayer(C, H, (NL,), use_token=1)
    with pytest.raises(ValueError, match="depth"):
        MTPStack(C, H, 0)
    with pytest.raises(ValueError, match="kind"):
        HeadsConfig(kind="lookahead", name="x", n_embd=C)
    layer = EagleLayer(C, H, (1, NL)).double()
    x = torch.zeros(1, 4, C, dtype=torch.float64)
    with pytest.raises(ValueError, match=r"shape \[B, T, 16\]"):
        layer(torch.zeros(1, 4, C + 1, dtype=torch.float64), x, x)
    with pytest.raises(ValueError, match="pos_emb"):
        layer(x, x, torch.zeros(1, 3, C, dtype=torch.float64))
    with pytest.raises(ValueError, match="2 tensors"):
        layer.fuse([x])
    with pytest.raises(TypeError, match="bool"):
        layer(x, x, x, attention_mask=torch.ones(1, 4, 4))
    with pytest.raises(ValueError, match="different model shape"):
        layer(x, x, x, cache=target.new_cache(1, 8))
    with pytest.raises(ValueError, match="max_len"):
        layer(x, x, x, cache=layer.new_cache(1, 3))
    with pytest.raises(ValueError, match="steps"):
        ttt_attention_mask(4, 0)
    ids = _ids()
    hs = _hidden(target, ids)
    with pytest.raises(ValueError, match="hidden_states"):
        eagle_inputs(layer, hs[:-1], ids, target)
    with pytest.raises(ValueError, match="vocabulary"):
        eagle_inputs(layer, hs, ids + V, target)
    with pytest.raises(ValueError, match="depth"):
        mtp_inputs(12, hs[-1], ids, target)
    with pytest.raises(ValueError, match="n_heads"):
        medusa_inputs(hs, 12)


def test_train_heads_predictions_runs_only_the_sets_it_is_given():
    """A subset of the head sets gives exactly the full run's predictions for those sets, and no others."""
    import sys
    from pathlib import Path

    from specref.models.pair import heldout_prompts, load_pair

    sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tools" / "training"))
    import train_heads

    target = load_pair()[0]
    seqs = torch.tensor(heldout_prompts(2, 24))  # [2, 24]
    names = ("medusa", "eagle1", "eagle_notoken", "eagle3", "mtp")
    every = train_heads.predictions({n: load_bundled_heads(n) for n in names}, target, seqs, 3)
    assert set(every) == set(names)
    for subset in (("eagle1",), ("medusa", "mtp")):
        some = train_heads.predictions({n: load_bundled_heads(n) for n in subset}, target, seqs, 3)
        assert set(some) == set(subset)
        for n in subset:
            assert torch.equal(some[n], every[n])
