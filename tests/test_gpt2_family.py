"""The real GPT-2 family as a pair (`gpt2_family_pair`), loaded from HF-layout folders with random weights.

Every folder here is written the way the hub and the HF cache lay them out: ``config.json`` with the
hub's extra keys, the weights as ``model.safetensors`` or shards with their index (keys in the
original hub style, ``h.0...`` with the ``attn.bias`` buffers, or with the ``transformer.`` prefix and
an ``lm_head.weight``), a ``tokenizer.json``, and in a cache ``models--<org>--<name>/snapshots/<rev>/``
whose files link into ``blobs/``.  The configs are tiny; only the layout is real.
"""

import hashlib
import json
import shutil
import socket
from pathlib import Path

import pytest
import torch
from safetensors.torch import save_file

from specref.decoding.chain import generate, speculative_generate
from specref.models import GPT2, GPT2Config, pretrained, train_tokenizer
from specref.models.pretrained import FamilyPair, gpt2_family_pair
from specref.models.tokenizer import BPETokenizer

TEXT = ["def add(x, y):\n    return x + y\n", "class Stack:\n    def push(self, item):\n        self.items.append(item)\n",
        "for i in range(10):\n    print(i * i)\n"] * 4
OTHER_TEXT = ["SELECT name FROM users WHERE id = 1;\n", "<html><body>hello</body></html>\n"] * 4


def tokenizer(text: list[str] = TEXT) -> BPETokenizer:
    return train_tokenizer(text, vocab_size=300)


V = tokenizer().vocab_size
TARGET_CFG = GPT2Config(vocab_size=V, n_positions=64, n_embd=48, n_layer=3, n_head=4, bos_token_id=0, eos_token_id=0)
DRAFT_CFG = GPT2Config(vocab_size=V, n_positions=64, n_embd=32, n_layer=1, n_head=4, bos_token_id=0, eos_token_id=0)


def random_model(cfg: GPT2Config, seed: int) -> GPT2:
    with torch.random.fork_rng():
        torch.manual_seed(seed)
        return GPT2(cfg).eval()


def write_folder(path: Path, model: GPT2, *, keys: str = "hub", shards: int = 1,
                 tok: BPETokenizer | None = None) -> Path:
    """``model`` as an HF-layout folder at ``path``, keys as the hub's original files (``hub``) or as
    ``GPT2LMHeadModel.save_pretrained`` writes them (``transformers``)."""
    path.mkdir(parents=True, exist_ok=True)
    cfg = model.config
    sd = {k: v.detach().clone().contiguous() for k, v in model.state_dict().items() if k != "lm_head.weight"}
    if keys == "hub":  # no transformer. prefix, and the causal-mask buffers the original checkpoints carry
        sd = {k.removeprefix("transformer."): v for k, v in sd.items()}
        mask = torch.tril(torch.ones(cfg.n_positions, cfg.n_positions))[None, None]
        sd.update({f"h.{i}.attn.bias": mask.clone() for i in range(cfg.n_layer)})
    else:
        sd["lm_head.weight"] = model.lm_head.weight.detach().clone()
    if shards == 1:
        save_file(sd, str(path / "model.safetensors"), metadata={"format": "pt"})
    else:
        names, weight_map = sorted(sd), {}
        for i in range(shards):
            shard = f"model-{i + 1:05d}-of-{shards:05d}.safetensors"
            part = {n: sd[n] for n in names[i::shards]}
            save_file(part, str(path / shard), metadata={"format": "pt"})
            weight_map.update(dict.fromkeys(part, shard))
        total = sum(t.numel() * t.element_size() for t in sd.values())
        (path / "model.safetensors.index.json").write_text(
            json.dumps({"metadata": {"total_size": total}, "weight_map": weight_map}, indent=2))
    config = {**cfg.to_dict(), "n_ctx": cfg.n_positions, "summary_type": "cls_index", "summary_use_proj": True,
              "task_specific_params": {"text-generation": {"do_sample": True, "max_length": 50}}}
    (path / "config.json").write_text(json.dumps(config, indent=2))
    if tok is not None:
        tok.save(path / "tokenizer.json")
    return path


def into_cache(cache: Path, repo: str, folder: Path, rev: str = "e7da7f221ccf5f2856f4331d34c2d0e82aa2a986") -> Path:
    """Move ``folder``'s files into the HF cache layout: blobs named by their hash, a snapshot linking to them."""
    base = cache / ("models--" + repo.replace("/", "--"))
    snap = base / "snapshots" / rev
    (base / "blobs").mkdir(parents=True, exist_ok=True)
    snap.mkdir(parents=True, exist_ok=True)
    for f in sorted(folder.iterdir()):
        blob = base / "blobs" / hashlib.sha256(f.read_bytes()).hexdigest()
        shutil.move(str(f), blob)
        try:
            (snap / f.name).symlink_to(Path("..", "..", "blobs", blob.name))
        except OSError:  # no symlinks on this system: the cache then holds copies, as huggingface_hub does
            shutil.copy(blob, snap / f.name)
    folder.rmdir()
    (base / "refs").mkdir(exist_ok=True)
    (base / "refs" / "main").write_text(rev)
    return snap


def cached(cache: Path, repo: str, model: GPT2, tmp: Path, **kw) -> Path:
    return into_cache(cache, repo, write_folder(tmp / ("staging-" + repo.replace("/", "-")), model, **kw))


@pytest.fixture(autouse=True)
def offline(monkeypatch, tmp_path):
    """An empty HF cache of the test's own, and every way to the network refused (a test fails if it is tried)."""
    calls: list[tuple] = []

    def refuse(*args, **kwargs):
        calls.append(args)
        raise AssertionError(f"the network was touched: {args}")

    try:
        import huggingface_hub
        import huggingface_hub.file_download
    except ImportError:
        pass
    else:
        for mod in (huggingface_hub, huggingface_hub.file_download):
            for name in ("hf_hub_download", "snapshot_download"):
                if hasattr(mod, name):
                    monkeypatch.setattr(mod, name, refuse)
    monkeypatch.setattr(socket.socket, "connect", refuse)
    monkeypatch.setattr(socket, "create_connection", refuse)
    monkeypatch.delenv("HF_HUB_OFFLINE", raising=False)  # the code itself must not reach out, offline or not
    monkeypatch.setenv("HF_HUB_CACHE", str(tmp_path / "hub"))
    monkeypatch.setenv("HF_HOME", str(tmp_path / "hf-home"))
    return calls


@pytest.fixture
def cache(tmp_path) -> Path:
    return tmp_path / "hub"


def ids(batch: int = 2, length: int = 6) -> torch.Tensor:
    return torch.randint(1, V, (batch, length), generator=torch.Generator().manual_seed(0))


# -- loading and decoding ----------------------------------------------------------------------------


@torch.no_grad()
@pytest.mark.parametrize("draft_weights", ["own", "the target's"])
def test_pair_from_the_hf_cache_decodes_greedy_exactly_as_plain_decoding(cache, tmp_path, offline, draft_weights):
    target = random_model(TARGET_CFG, seed=1)
    draft = target if draft_weights == "the target's" else random_model(DRAFT_CFG, seed=2)
    cached(cache, "openai-community/gpt2-medium", target, tmp_path, shards=3, tok=tokenizer())
    cached(cache, "gpt2", draft, tmp_path, tok=tokenizer())
    pair = gpt2_family_pair("gpt2-medium", "gpt2", dtype=torch.float64)
    assert isinstance(pair, FamilyPair) and len(pair) == 3
    t, d, tok = pair
    assert t.config == TARGET_CFG and d.config == draft.config and tok.vocab_size == V
    assert not t.training and not d.training
    assert all(p.dtype == torch.float64 and p.device.type == "cpu" for p in [*t.parameters(), *d.parameters()])
    for name, p in t.state_dict().items():
        assert torch.equal(p, target.state_dict()[name].double()), name
    prompt = torch.tensor([tok.encode("def add(x, y):\n")])
    for x in (prompt, ids()):
        plain = generate(t, x, max_new_tokens=24, temperature=0)
        spec, stats = speculative_generate(t, d, x, k=3, max_new_tokens=24, temperature=0)
        assert torch.equal(spec, plain)  # token for token
        assert stats.examined > 0
        if draft_weights == "the target's":
            assert stats.accepted == stats.examined  # the same function drafts: every draft is kept
    assert tok.decode(tok.encode("def add(x, y):\n")) == "def add(x, y):\n"
    assert offline == []


@torch.no_grad()
def test_logits_equal_transformers_on_the_same_folders_in_float64(cache, tmp_path):
    transformers = pytest.importorskip("transformers")
    snaps = {"gpt2-xl": cached(cache, "gpt2-xl", random_model(TARGET_CFG, 3), tmp_path, shards=2, tok=tokenizer()),
             "distilgpt2": cached(cache, "distilbert/distilgpt2", random_model(DRAFT_CFG, 4), tmp_path,
                                  keys="transformers")}
    target, draft, _ = gpt2_family_pair("gpt2-xl", "distilgpt2", dtype=torch.float64)
    for ours, snap in ((target, snaps["gpt2-xl"]), (draft, snaps["distilgpt2"])):
        hf = transformers.GPT2LMHeadModel.from_pretrained(snap, attn_implementation="eager").to(torch.float64).eval()
        x = ids(3, 17)
        torch.testing.assert_close(ours(x), hf(x).logits, atol=1e-10, rtol=1e-10)


@torch.no_grad()
def test_a_named_folder_of_hf_folders_loads_and_the_hf_cache_is_not_read(cache, tmp_path, offline):
    root = tmp_path / "models"
    target = random_model(TARGET_CFG, 5)
    draft = random_model(DRAFT_CFG, 6)
    write_folder(root / "gpt2-large", target, shards=2, tok=tokenizer())
    write_folder(root / "distilgpt2", draft, keys="transformers", tok=tokenizer())
    t, d, tok = gpt2_family_pair("gpt2-large", "distilgpt2", folder=str(root))
    assert t.dtype == d.dtype == torch.float32 and tok.vocab_size == V
    for ours, source in ((t, target), (d, draft)):
        for name, p in ours.state_dict().items():
            assert torch.equal(p, source.state_dict()[name]), name
    assert offline == []
    # With a folder only the folder counts: a pair in the HF cache is not used in its place.
    cached(cache, "openai-community/gpt2-medium", target, tmp_path, tok=tokenizer())
    cached(cache, "openai-community/gpt2", draft, tmp_path)
    assert gpt2_family_pair("gpt2-medium", "gpt2").target.config == TARGET_CFG
    with pytest.raises(FileNotFoundError, match="gpt2-medium"):
        gpt2_family_pair("gpt2-medium", "gpt2", folder=root)


def test_a_named_folder_may_be_a_cache_as_hf_download_cache_dir_writes_it(tmp_path):
    root = tmp_path / "drive"
    cached(root, "openai-community/gpt2-xl", random_model(TARGET_CFG, 7), tmp_path)
    cached(root, "openai-community/gpt2", random_model(DRAFT_CFG, 8), tmp_path, tok=tokenizer())
    pair = gpt2_family_pair("gpt2-xl", "gpt2", folder=root, dtype=torch.bfloat16)
    assert pair.target.dtype == pair.draft.dtype == torch.bfloat16
    assert pair.tokenizer.vocab_size == V  # the draft's tokenizer.json serves the pair


def test_gpt2_and_distilgpt2_make_a_pair_and_the_models_exports_it(cache, tmp_path):
    from specref import models

    cached(cache, "gpt2", random_model(TARGET_CFG, 9), tmp_path, tok=tokenizer())
    cached(cache, "distilgpt2", random_model(DRAFT_CFG, 10), tmp_path, keys="transformers", tok=tokenizer())
    assert models.gpt2_family_pair is gpt2_family_pair
    assert models.gpt2_family_pair("gpt2", "distilgpt2").draft.config == DRAFT_CFG


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
@torch.no_grad()
def test_pair_on_a_gpu_decodes_greedy_exactly_as_plain_decoding(cache, tmp_path):
    cached(cache, "gpt2-medium", random_model(TARGET_CFG, 11), tmp_path, tok=tokenizer())
    cached(cache, "gpt2", random_model(DRAFT_CFG, 12), tmp_path)
    t, d, _ = gpt2_family_pair(device="cuda")
    assert t.device.type == d.device.type == "cuda"
    x = ids().cuda()
    spec, _ = speculative_generate(t, d, x, k=3, max_new_tokens=16, temperature=0)
    assert torch.equal(spec, generate(t, x, max_new_tokens=16, temperature=0))


# -- downloads only when asked -------------------------------------------------------------------


def fake_hub(monkeypatch, remote: dict[str, Path]) -> list[tuple[str, str, str | None]]:
    """``hf_hub_download`` serving ``remote`` (repo -> folder) into the cache layout, as huggingface_hub does."""
    import huggingface_hub

    calls: list[tuple[str, str, str | None]] = []

    def download(repo_id: str, filename: str, *, cache_dir: str | None = None, **kwargs) -> str:
        calls.append((repo_id, filename, cache_dir))
        src = remote[repo_id] / filename
        if not src.is_file():
            raise FileNotFoundError(f"{repo_id} has no {filename}")
        import os

        base = Path(cache_dir or os.environ["HF_HUB_CACHE"]) / ("models--" + repo_id.replace("/", "--"))
        snap = base / "snapshots" / "r1"
        snap.mkdir(parents=True, exist_ok=True)
        shutil.copy(src, snap / filename)
        return str(snap / filename)

    monkeypatch.setattr(huggingface_hub, "hf_hub_download", download)
    return calls


@torch.no_grad()
def test_download_true_fetches_only_the_missing_model(cache, tmp_path, monkeypatch):
    pytest.importorskip("huggingface_hub")
    target = random_model(TARGET_CFG, 13)
    remote = {"openai-community/gpt2-medium": write_folder(tmp_path / "remote" / "gpt2-medium", target,
                                                           tok=tokenizer())}
    cached(cache, "openai-community/gpt2", random_model(DRAFT_CFG, 14), tmp_path, tok=tokenizer())
    calls = fake_hub(monkeypatch, remote)
    with pytest.raises(FileNotFoundError, match="target gpt2-medium"):
        gpt2_family_pair()
    assert calls == []  # not asked: nothing fetched
    t, _, _ = gpt2_family_pair(download=True)
    assert [c[:2] for c in calls] == [("openai-community/gpt2-medium", f)
                                      for f in ("config.json", "model.safetensors", "tokenizer.json")]
    assert all(c[2] is None for c in calls)  # into the HF cache
    assert torch.equal(t.transformer.h[0].mlp.c_fc.weight, target.transformer.h[0].mlp.c_fc.weight)
    calls.clear()
    gpt2_family_pair(download=True)
    assert calls == []  # now cached


def test_download_true_with_a_folder_fetches_into_that_folder(tmp_path, monkeypatch):
    pytest.importorskip("huggingface_hub")
    remote = {"openai-community/gpt2-large": write_folder(tmp_path / "remote" / "large", random_model(TARGET_CFG, 15)),
              "distilbert/distilgpt2": write_folder(tmp_path / "remote" / "distil", random_model(DRAFT_CFG, 16),
                                                    keys="transformers", tok=tokenizer())}
    calls = fake_hub(monkeypatch, remote)
    root = tmp_path / "new" / "models"
    pair = gpt2_family_pair("gpt2-large", "distilgpt2", download=True, folder=root)
    assert pair.tokenizer.vocab_size == V
    assert {c[2] for c in calls} == {str(root)}
    assert (root / "models--distilbert--distilgpt2" / "snapshots").is_dir()
    assert not (tmp_path / "hub").exists()  # the HF cache was left alone


# -- what is missing, and how to get it -----------------------------------------------------------------


def test_absent_weights_name_each_model_where_it_was_looked_for_and_the_command(cache, offline):
    with pytest.raises(FileNotFoundError) as err:
        gpt2_family_pair("gpt2-medium", "gpt2")
    text = str(err.value)
    for part in ("target gpt2-medium (355 M parameters, about 1.5 GB)", "draft gpt2 (124 M parameters",
                 f"not in the Hugging Face cache {cache}",
                 "hf download openai-community/gpt2-medium config.json model.safetensors tokenizer.json",
                 "hf download openai-community/gpt2 config.json", "huggingface-cli download", "download=True",
                 "nothing is downloaded unless download=True"):
        assert part in text, part
    assert offline == []


def test_only_the_absent_model_is_named(cache, tmp_path):
    cached(cache, "gpt2-xl", random_model(TARGET_CFG, 17), tmp_path, tok=tokenizer())
    with pytest.raises(FileNotFoundError) as err:
        gpt2_family_pair("gpt2-xl", "distilgpt2")
    assert "\n  draft distilgpt2 (82 M parameters" in str(err.value) and "\n  target" not in str(err.value)
    assert "hf download distilbert/distilgpt2 config.json" in str(err.value)


def test_an_interrupted_download_is_named(cache, tmp_path):
    snap = cached(cache, "gpt2-medium", random_model(TARGET_CFG, 18), tmp_path, tok=tokenizer())
    cached(cache, "gpt2", random_model(DRAFT_CFG, 19), tmp_path)
    (snap / "model.safetensors").unlink()
    with pytest.raises(FileNotFoundError, match=r"snapshots/e7da7f2\w+ lacks model\.safetensors \(or pytorch_model\.bin\); was a download interrupted\?"):
        gpt2_family_pair()


def test_what_a_named_folder_lacks_is_named(tmp_path):
    root = tmp_path / "models"
    write_folder(root / "gpt2-medium", random_model(TARGET_CFG, 20), tok=tokenizer())
    (root / "gpt2-medium" / "config.json").unlink()
    with pytest.raises(FileNotFoundError) as err:
        gpt2_family_pair(folder=root)
    text = str(err.value)
    assert f"{root / 'gpt2-medium'} lacks config.json" in text
    assert "holds neither gpt2/ nor models--gpt2/snapshots/<rev>/ or models--openai-community--gpt2" in text
    assert f"--cache-dir {root}" in text
    with pytest.raises(FileNotFoundError, match="is not a folder"):
        gpt2_family_pair(folder=tmp_path / "nowhere")
    assert not (tmp_path / "nowhere").exists()


def test_a_missing_tokenizer_is_named_and_one_beside_either_model_serves(cache, tmp_path):
    cached(cache, "gpt2-medium", random_model(TARGET_CFG, 21), tmp_path)
    snap = cached(cache, "gpt2", random_model(DRAFT_CFG, 22), tmp_path, tok=tokenizer())
    assert gpt2_family_pair().tokenizer.vocab_size == V
    (snap / "tokenizer.json").unlink()
    with pytest.raises(FileNotFoundError, match=r"^tokenizer: .*hf download openai-community/gpt2-medium "
                                                r"tokenizer\.json"):
        gpt2_family_pair()


# -- refusals -------------------------------------------------------------------------------------------


@pytest.mark.parametrize(("kwargs", "error", "match"), [
    ({"target": "gpt3"}, ValueError, r"^target must be one of gpt2, gpt2-medium, gpt2-large, gpt2-xl, got 'gpt3'"),
    ({"target": "distilgpt2", "draft": "gpt2"}, ValueError, "^target must be one of"),
    ({"draft": "gpt2-large"}, ValueError, r"^draft must be one of distilgpt2, gpt2, got 'gpt2-large'"),
    ({"target": "gpt2", "draft": "gpt2"}, ValueError, "^draft must be smaller than the target"),
    ({"target": 3}, TypeError, "^target must be a str"),
    ({"draft": None}, TypeError, "^draft must be a str"),
    ({"device": 0}, TypeError, "^device must be"),
    ({"dtype": torch.int64}, TypeError, "^dtype must be a floating"),
    ({"dtype": "float32"}, TypeError, "^dtype must be a floating"),
    ({"download": "yes"}, TypeError, "^download must be a bool"),
    ({"folder": 3}, TypeError, "^folder must be"),
])
def test_bad_arguments_are_refused_naming_the_argument(kwargs, error, match, offline):
    with pytest.raises(error, match=match):
        gpt2_family_pair(**kwargs)
    assert offline == []


@pytest.mark.skipif(torch.cuda.is_available(), reason="a CUDA GPU is present")
def test_a_cuda_device_without_one_is_refused():
    with pytest.raises(ValueError, match="^device is 'cuda' but torch sees no CUDA device"):
        gpt2_family_pair(device="cuda")


@pytest.fixture
def no_weights_read(monkeypatch):
    def refuse(*args, **kwargs):
        raise AssertionError("weights were read before the pair was checked")

    monkeypatch.setattr(pretrained, "load_folder", refuse)


def test_vocabularies_of_different_sizes_are_refused_before_any_weights_are_read(cache, tmp_path, no_weights_read):
    cached(cache, "gpt2-medium", random_model(TARGET_CFG, 23), tmp_path, tok=tokenizer())
    other = GPT2Config(vocab_size=V + 1, n_positions=64, n_embd=32, n_layer=1, n_head=4)
    cached(cache, "gpt2", random_model(other, 24), tmp_path)
    with pytest.raises(ValueError, match=rf"^draft: gpt2 in .* scores {V + 1} tokens but the target gpt2-medium"):
        gpt2_family_pair()


def test_two_different_tokenizers_are_refused(cache, tmp_path, no_weights_read):
    cached(cache, "gpt2-medium", random_model(TARGET_CFG, 25), tmp_path, tok=tokenizer())
    cached(cache, "gpt2", random_model(DRAFT_CFG, 26), tmp_path, tok=tokenizer(OTHER_TEXT))
    with pytest.raises(ValueError, match="^tokenizer: the target's .* map tokens to different ids"):
        gpt2_family_pair()


def test_a_tokenizer_larger_than_the_vocabulary_is_refused(cache, tmp_path, no_weights_read):
    small = GPT2Config(vocab_size=V - 10, n_positions=64, n_embd=32, n_layer=1, n_head=4)
    cached(cache, "gpt2-medium", random_model(small, 27), tmp_path, tok=tokenizer())
    cached(cache, "gpt2", random_model(small, 28), tmp_path)
    with pytest.raises(ValueError, match=rf"^tokenizer: .* has {V} tokens but the models score only {V - 10}"):
        gpt2_family_pair()


def test_the_family_table_names_every_allowed_model():
    assert set(pretrained.FAMILY_TARGETS) | set(pretrained.FAMILY_DRAFTS) == set(pretrained.GPT2_FAMILY)
    assert set(pretrained.GPT2_FAMILY) <= set(pretrained.HUB_ALIASES)
