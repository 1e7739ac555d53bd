"""Loading HF-layout checkpoints and the bundled target/draft pair."""

import math
import os

import pytest
import torch

from specref.models import GPT2, GPT2Config, from_pretrained, load_pair, load_tokenizer, save_pretrained
from specref.models.pair import assets_dir

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
    with pytest.raises(FileNotFoundError, match="huggingface-cli download"):
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
