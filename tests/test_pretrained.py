"""Loading HF-layout checkpoints and the bundled target/draft pair."""

import json
import math
import os

import pytest
import torch
from safetensors.torch import save_file

from specref.models import (
    GPT2,
    GPT2Config,
    TimingPair,
    from_pretrained,
    load_pair,
    load_tokenizer,
    pretrained,
    save_pretrained,
    timing_pair,
    train_tokenizer,
)
from specref.models.pair import assets_dir
from specref.models.pretrained import pretrained_tokenizer, random_gpt2

os.environ.setdefault("HF_HUB_OFFLINE", "1")

TOL = dict(atol=1e-5, rtol=1e-5)
CFG = GPT2Config(vocab_size=101, n_positions=32, n_embd=32, n_layer=2, n_head=4, bos_token_id=0, eos_token_id=0)


def hf_model(seed: int = 0):
    transformers = pytest.importorskip("transformers")
    hf_cfg = transformers.GPT2Config(**CFG.to_dict())
    hf_cfg._attn_implementation = "eager"
    with torch.random.fork_rng():
        torch.manual_seed(seed)
        return transformers.GPT2LMHeadModel(hf_cfg).eval()


def x_ids() -> torch.Tensor:
    return torch.randint(0, CFG.vocab_size, (2, 11), generator=torch.Generator().manual_seed(0))


@torch.no_grad()
def test_hf_save_pretrained_folder_loads_with_equal_logits(tmp_path):
    hf = hf_model()
    hf.save_pretrained(tmp_path)
    ours = from_pretrained(tmp_path)
    assert not ours.training and ours.dtype == torch.float32
    torch.testing.assert_close(ours(x_ids()), hf(x_ids()).logits, **TOL)


@torch.no_grad()
def test_folder_with_only_pytorch_model_bin_loads(tmp_path):
    hf = hf_model(seed=1)
    hf.config.to_json_file(tmp_path / "config.json")
    torch.save(hf.state_dict(), tmp_path / "pytorch_model.bin")
    torch.testing.assert_close(from_pretrained(tmp_path)(x_ids()), hf(x_ids()).logits, **TOL)


@torch.no_grad()
def test_our_save_pretrained_loads_in_hf(tmp_path):
    transformers = pytest.importorskip("transformers")
    with torch.random.fork_rng():
        torch.manual_seed(2)
        ours = GPT2(CFG).eval()
    save_pretrained(ours, tmp_path)
    hf = transformers.GPT2LMHeadModel.from_pretrained(tmp_path, attn_implementation="eager").eval()
    torch.testing.assert_close(hf(x_ids()).logits, ours(x_ids()), **TOL)


def test_missing_files_error_names_them(tmp_path):
    (tmp_path / "config.json").write_text("{}")
    with pytest.raises(FileNotFoundError, match="model.safetensors"):
        from_pretrained(tmp_path)
    with pytest.raises(FileNotFoundError, match="hf download gpt2-this-does-not-exist config.json"):
        from_pretrained("gpt2-this-does-not-exist")


@torch.no_grad()
def test_hub_name_is_found_in_hf_hub_cache(tmp_path, monkeypatch):
    hf = hf_model(seed=3)
    snap = tmp_path / "models--distilbert--distilgpt2" / "snapshots" / "abc123"
    hf.save_pretrained(snap)
    (tmp_path / "models--distilbert--distilgpt2" / "refs").mkdir()
    (tmp_path / "models--distilbert--distilgpt2" / "refs" / "main").write_text("abc123")
    monkeypatch.setenv("HF_HUB_CACHE", str(tmp_path))
    torch.testing.assert_close(from_pretrained("distilgpt2")(x_ids()), hf(x_ids()).logits, **TOL)


def test_from_pretrained_honours_dtype(tmp_path):
    hf_model().save_pretrained(tmp_path)
    assert from_pretrained(tmp_path, dtype=torch.bfloat16).dtype == torch.bfloat16


# -- the bundled pair ----------------------------------------------------------------------
ASSETS_READY = all(assets_dir().joinpath(*f.split("/")).is_file()
                   for f in ("target/model.safetensors", "draft/model.safetensors", "tokenizer.json",
                             "TRAINING.json"))
needs_assets = pytest.mark.skipif(not ASSETS_READY, reason="bundled assets not trained yet "
                                  "(run tools/training/train_pair.py to write specref/assets)")

SNIPPET = '''def fibonacci(n):
    """Return the n-th Fibonacci number."""
    a, b = 0, 1
    for _ in range(n):
        a, b = b, a + b
    return a


class Stack:
    def __init__(self):
        self.items = []

    def push(self, item):
        self.items.append(item)

    def pop(self):
        if not self.items:
            raise IndexError("pop from empty stack")
        return self.items.pop()
'''


@pytest.fixture(scope="module")
def pair():
    return load_pair()


@needs_assets
def test_bundled_pair_loads_in_eval_mode_with_one_vocabulary(pair):
    target, draft, tok = pair
    assert not target.training and not draft.training
    assert target.config.vocab_size == draft.config.vocab_size == tok.vocab_size
    assert target.dtype == draft.dtype == torch.float32
    assert draft.num_parameters() < target.num_parameters()


@needs_assets
def test_bundled_tokenizer_round_trips_python_source(pair):
    tok = pair[2]
    assert tok.decode(tok.encode(SNIPPET)) == SNIPPET
    assert load_tokenizer(assets_dir() / "tokenizer.json").encode(SNIPPET) == tok.encode(SNIPPET)


@needs_assets
@torch.no_grad()
def test_bundled_target_has_lower_perplexity_than_draft(pair):
    target, draft, tok = pair
    x = torch.tensor([tok.encode(SNIPPET)])

    def ppl(m):
        logits = m(x[:, :-1])
        return math.exp(torch.nn.functional.cross_entropy(logits[0], x[0, 1:]).item())

    assert ppl(target) < ppl(draft)


@needs_assets
def test_bundled_pair_meets_the_greedy_acceptance_bar(pair):
    # The quality bar of the bundled pair: greedy alpha (accepted / examined drafts) >= 0.6
    # on held-out prompts, which the training run never saw.
    from specref.decoding.chain import speculative_generate
    from specref.models.pair import heldout_prompts

    target, draft, _ = pair
    accepted = examined = 0
    for prompt in heldout_prompts(16, 64):
        _, stats = speculative_generate(target, draft, torch.tensor([prompt]), k=4, max_new_tokens=48,
                                        temperature=0)
        accepted, examined = accepted + stats.accepted, examined + stats.examined
    assert accepted / examined >= 0.6, f"greedy alpha {accepted / examined:.3f} is below the 0.6 bar"


# -- loading without a detour, without a download, with clear errors; the GPU timing pair -----------


def tiny_model(seed: int, cfg: GPT2Config = CFG) -> GPT2:
    with torch.random.fork_rng():
        torch.manual_seed(seed)
        return GPT2(cfg).eval()


def hf_folder(path, seed: int = 0, cfg: GPT2Config = CFG, shards: int = 1, tokenizer: bool = True) -> GPT2:
    """An HF-layout folder: config.json, model.safetensors (or shards and their index), tokenizer.json."""
    model = tiny_model(seed, cfg)
    path.mkdir(parents=True, exist_ok=True)
    save_pretrained(model, path)
    if shards > 1:
        from safetensors.torch import load_file
        sd = load_file(path / "model.safetensors")
        (path / "model.safetensors").unlink()
        names, weight_map = sorted(sd), {}
        for i in range(shards):
            shard = f"model-{i + 1:05d}-of-{shards:05d}.safetensors"
            part = {n: sd[n] for n in names[i::shards]}
            save_file(part, str(path / shard), metadata={"format": "pt"})
            weight_map.update({n: shard for n in part})
        (path / "model.safetensors.index.json").write_text(json.dumps({"metadata": {}, "weight_map": weight_map}))
    if tokenizer:
        train_tokenizer(["def f(x):\n    return x + 1\n"] * 4, vocab_size=300).save(path / "tokenizer.json")
    return model


@pytest.fixture
def no_download(monkeypatch, tmp_path):
    """An empty HF cache, the network allowed by the environment, and a download that fails the test if tried."""
    calls: list[str] = []

    def refuse(*args, **kwargs):
        calls.append(str(args))
        raise AssertionError("a download was attempted")

    hub = pytest.importorskip("huggingface_hub")
    monkeypatch.setattr(hub, "hf_hub_download", refuse)
    monkeypatch.delenv("HF_HUB_OFFLINE", raising=False)
    monkeypatch.setenv("HF_HUB_CACHE", str(tmp_path / "empty-cache"))
    return calls


@torch.no_grad()
@pytest.mark.parametrize("dtype", [torch.float32, torch.float64, torch.bfloat16])
def test_loads_straight_into_the_dtype_with_no_random_init(tmp_path, monkeypatch, dtype):
    source = hf_folder(tmp_path)
    inits: list[torch.device] = []
    real_normal = torch.nn.init.normal_

    def spy(tensor, *args, **kwargs):
        inits.append(tensor.device)
        return real_normal(tensor, *args, **kwargs)

    monkeypatch.setattr(torch.nn.init, "normal_", spy)
    rng = torch.random.get_rng_state()
    model = from_pretrained(tmp_path, dtype=dtype)
    assert torch.equal(torch.random.get_rng_state(), rng)  # the caller's global RNG is left alone
    assert inits and all(d.type == "meta" for d in inits)  # GPT2.__init__ ran on the meta device only
    assert all(p.dtype == dtype and p.device.type == "cpu" for p in model.parameters())
    assert model.lm_head.weight is model.transformer.wte.weight and not model.training
    for name, p in model.state_dict().items():
        assert torch.equal(p, source.state_dict()[name].to(dtype)), name


def test_safetensors_are_never_read_whole(tmp_path, monkeypatch):
    hf_folder(tmp_path)

    def refuse(self):
        raise AssertionError(f"{self} was read whole")

    monkeypatch.setattr(type(tmp_path), "read_bytes", refuse)
    assert from_pretrained(tmp_path).dtype == torch.float32


@torch.no_grad()
def test_sharded_checkpoint_loads_and_a_missing_shard_is_named(tmp_path):
    source = hf_folder(tmp_path, shards=3)
    assert not (tmp_path / "model.safetensors").exists()
    torch.testing.assert_close(from_pretrained(tmp_path)(x_ids()), source(x_ids()), atol=0, rtol=0)
    (tmp_path / "model-00002-of-00003.safetensors").unlink()
    with pytest.raises(FileNotFoundError, match="model-00002-of-00003.safetensors"):
        from_pretrained(tmp_path)


@pytest.mark.parametrize("missing", ["config.json", "model.safetensors", "tokenizer.json"])
def test_a_missing_file_is_named(tmp_path, missing):
    hf_folder(tmp_path)
    (tmp_path / missing).unlink()
    with pytest.raises(FileNotFoundError, match=missing.replace(".", r"\.")):
        pretrained_tokenizer(tmp_path)
    if missing != "tokenizer.json":
        with pytest.raises(FileNotFoundError, match=missing.replace(".", r"\.")):
            from_pretrained(tmp_path)
    else:
        assert from_pretrained(tmp_path).dtype == torch.float32  # the model itself needs no tokenizer


def test_tokenizer_is_found_beside_the_weights(tmp_path):
    hf_folder(tmp_path)
    tok = pretrained_tokenizer(tmp_path)
    assert tok.decode(tok.encode("def f(x):\n")) == "def f(x):\n"


def test_nothing_is_downloaded_unless_asked(no_download):
    with pytest.raises(FileNotFoundError, match="download=True"):
        from_pretrained("gpt2")
    with pytest.raises(FileNotFoundError, match="tokenizer.json"):
        pretrained_tokenizer("gpt2")
    assert no_download == []
    with pytest.raises(AssertionError, match="a download was attempted"):
        from_pretrained("gpt2", download=True)  # asked: the download function is called
    assert len(no_download) == 1


def test_download_must_be_a_bool(tmp_path):
    hf_folder(tmp_path)
    with pytest.raises(TypeError, match="download must be a bool"):
        from_pretrained(tmp_path, download="yes")


# The timing pair's shapes, shrunk so that the tests build them in milliseconds.
TINY_XL = GPT2Config(vocab_size=101, n_positions=32, n_embd=48, n_layer=3, n_head=4)


@pytest.fixture
def tiny_timing_shapes(monkeypatch):
    monkeypatch.setattr(pretrained, "TIMING_CONFIGS", {"gpt2-xl": TINY_XL, "gpt2": CFG})


def test_random_gpt2_is_made_in_its_dtype_seeded_and_tied(monkeypatch):
    made = []
    real_empty = torch.empty

    def spy(*args, **kwargs):
        t = real_empty(*args, **kwargs)
        made.append((t.device.type, t.dtype))
        return t

    monkeypatch.setattr(torch, "empty", spy)
    model = random_gpt2(TINY_XL, "cpu", torch.bfloat16, seed=3)
    assert made and all(dt == torch.bfloat16 or dev == "meta" for dev, dt in made)  # no float32 detour
    assert all(p.dtype == torch.bfloat16 for p in model.parameters())
    assert model.lm_head.weight is model.transformer.wte.weight
    again, other = random_gpt2(TINY_XL, "cpu", torch.bfloat16, seed=3), random_gpt2(TINY_XL, "cpu", torch.bfloat16, seed=4)
    w = "transformer.h.0.attn.c_attn.weight"
    assert torch.equal(model.state_dict()[w], again.state_dict()[w])
    assert not torch.equal(model.state_dict()[w], other.state_dict()[w])
    assert float(model.state_dict()[w].float().std()) == pytest.approx(0.02, rel=0.1)
    assert torch.all(model.state_dict()["transformer.h.0.ln_1.weight"] == 1)
    assert torch.isfinite(model(x_ids()).float()).all()


def test_timing_pair_falls_back_to_random_weights_of_the_shapes(no_download, tiny_timing_shapes):
    pair = timing_pair("cpu")
    assert isinstance(pair, TimingPair) and pair.tokenizer is None
    assert pair.target.config == TINY_XL and pair.draft.config == CFG
    assert pair.target.dtype == pair.draft.dtype == torch.bfloat16
    assert "random weights" in pair.source and "costs the same" in pair.source
    assert "not in the Hugging Face cache" in pair.source and "empty-cache" not in pair.source
    assert no_download == []


def test_timing_pair_with_the_real_shapes_declares_gpt2_xl_and_gpt2():
    xl, small = pretrained.TIMING_CONFIGS["gpt2-xl"], pretrained.TIMING_CONFIGS["gpt2"]
    assert (xl.n_layer, xl.n_embd, xl.n_head, xl.vocab_size) == (48, 1600, 25, 50257)
    assert (small.n_layer, small.n_embd, small.n_head, small.vocab_size) == (12, 768, 12, 50257)
    n_xl = 12 * xl.n_layer * xl.n_embd ** 2 + (xl.vocab_size + xl.n_positions) * xl.n_embd
    assert 1.5e9 < n_xl < 1.6e9  # GPT-2 XL's 1.56 B parameters


@torch.no_grad()
def test_timing_pair_loads_a_named_folder_in_bf16(tmp_path, no_download):
    xl = hf_folder(tmp_path / "gpt2-xl", seed=5, cfg=TINY_XL)
    small = hf_folder(tmp_path / "gpt2", seed=6)
    pair = timing_pair("cpu", folder=tmp_path)
    assert pair.target.dtype == pair.draft.dtype == torch.bfloat16 and pair.tokenizer is not None
    assert "trained weights" in pair.source and str(tmp_path) in pair.source
    w = "transformer.h.0.mlp.c_fc.weight"
    assert torch.equal(pair.target.state_dict()[w], xl.state_dict()[w].to(torch.bfloat16))
    assert torch.equal(pair.draft.state_dict()[w], small.state_dict()[w].to(torch.bfloat16))
    assert no_download == []


@pytest.mark.parametrize("missing", ["gpt2-xl/config.json", "gpt2/model.safetensors", "gpt2-xl/tokenizer.json", "gpt2"])
def test_timing_pair_names_what_a_named_folder_lacks(tmp_path, missing):
    hf_folder(tmp_path / "gpt2-xl", cfg=TINY_XL)
    hf_folder(tmp_path / "gpt2")
    import shutil
    target = tmp_path / missing
    shutil.rmtree(target) if target.is_dir() else target.unlink()
    with pytest.raises(FileNotFoundError, match=missing.split("/")[-1].replace(".", r"\.")):
        timing_pair("cpu", folder=tmp_path)


@torch.no_grad()
def test_timing_pair_is_found_in_the_hf_cache(tmp_path, monkeypatch, no_download):
    cache = tmp_path / "hub"
    monkeypatch.setenv("HF_HUB_CACHE", str(cache))
    hf_folder(cache / "models--openai-community--gpt2-xl" / "snapshots" / "r1", cfg=TINY_XL)
    hf_folder(cache / "models--gpt2" / "snapshots" / "r2", tokenizer=False)  # the XL's tokenizer serves both
    pair = timing_pair("cpu", torch.float32)
    assert pair.target.config == TINY_XL and pair.tokenizer is not None and "Hugging Face cache" in pair.source
    assert str(tmp_path) not in pair.source
    assert pair.target.dtype == torch.float32


def test_timing_pair_refuses_bad_arguments():
    with pytest.raises(TypeError, match="dtype must be a floating"):
        timing_pair("cpu", torch.int64)
    with pytest.raises(TypeError, match="device"):
        timing_pair(None)  # type: ignore[arg-type]
    with pytest.raises(TypeError, match="folder must be"):
        timing_pair("cpu", folder=3)  # type: ignore[arg-type]
