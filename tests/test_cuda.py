"""The same rules on a CUDA GPU: skipped without one (CI has none), run wherever a GPU is present.

Exactness does not depend on the device, so these repeat the CPU suite's key checks
on CUDA tensors and CUDA generators: logits equal the CPU's, greedy speculative
decoding equals greedy decoding, sampled tokens follow the target's exact
distribution (with a negative control), and the bundled pair runs in bf16.

On CUDA a GPT2's passes over a cache that carries captured passes (``cache.graphs``, given by a
decoding `Session`, ``specref.models.session``) replay CUDA graphs: a replay's logits equal the
eager pass's in the same dtype, the decoding rules hold with graphs on (the tests count replays to
be sure they ran), and ``kept(model).enabled = False`` switches them off. Last, the GPU timing pair
(``specref.models.pretrained.timing_pair``) loads in bf16 without a float32 detour.
"""

from __future__ import annotations

import copy

import numpy as np
import pytest
import torch
from model_factory import TINY_VOCAB, exact_first_two, noisy_copy, small_gpt2
from model_factory import tiny_pair as tiny_pair_models

import specref.models.graphs as graphs
from specref.chain_verify import verify_chain
from specref.checks.montecarlo import distribution_test
from specref.decoding.chain import generate, speculative_generate
from specref.decoding.tree import tree_generate
from specref.models.graphs import CapturedPasses, CudaGraph
from specref.models.pair import load_pair
from specref.models.session import kept
from specref.sampling import SamplingParams, sample

pytestmark = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
CUDA = torch.device("cuda")


def _gen(seed: int) -> torch.Generator:
    return torch.Generator(device=CUDA).manual_seed(seed)


@pytest.fixture(scope="module")
def pair():
    target = small_gpt2(vocab=64, n_embd=32, n_layer=2, seed=0, scale=20.0)  # float64: no argmax flips
    draft = noisy_copy(target, noise=0.05, seed=1)  # on the CPU: its noise comes from a CPU generator
    return target.to(CUDA), draft.to(CUDA)


def test_logits_and_cache_on_cuda_equal_the_cpu():
    cpu = small_gpt2(vocab=64, n_embd=32, n_layer=2, seed=0, dtype=torch.float32)
    gpu = small_gpt2(vocab=64, n_embd=32, n_layer=2, seed=0, dtype=torch.float32).to(CUDA)
    ids = torch.randint(0, 64, (3, 12), generator=torch.Generator().manual_seed(0))
    full = cpu(ids)
    cache = gpu.new_cache(3)
    chunks = [gpu(ids[:, :5].to(CUDA), cache=cache), gpu(ids[:, 5:9].to(CUDA), cache=cache)]
    cache.truncate(7)  # roll back two tokens, then recompute them with the rest
    chunks = [chunks[0], chunks[1][:, :2], gpu(ids[:, 7:].to(CUDA), cache=cache)]
    assert cache.k.device.type == "cuda" and cache.lengths.tolist() == [12, 12, 12]
    torch.testing.assert_close(torch.cat(chunks, 1).cpu(), full, atol=1e-4, rtol=1e-4)


@pytest.mark.parametrize("k", [1, 4, 8])
def test_greedy_speculative_on_cuda_equals_greedy_decoding(pair, k):
    target, draft = pair
    ids = torch.randint(0, 64, (4, 6), generator=torch.Generator().manual_seed(k)).to(CUDA)
    expected = generate(target, ids, 120, temperature=0)
    got, stats = speculative_generate(target, draft, ids, k=k, max_new_tokens=120, temperature=0)
    assert got.device.type == "cuda" and torch.equal(got, expected)
    assert 0 < stats.acceptance_rate < 1


def test_verify_chain_on_cuda_equals_the_cpu_for_the_same_uniforms():
    g = torch.Generator().manual_seed(0)
    B, k, V = 64, 4, 50
    p = torch.softmax(3 * torch.randn(B, k + 1, V, generator=g, dtype=torch.float64), -1)
    q = torch.softmax(3 * torch.randn(B, k, V, generator=g, dtype=torch.float64), -1)
    drafts = sample(q, g)
    u = torch.rand(B, k + 1, generator=g, dtype=torch.float64)
    cpu = verify_chain(drafts, q, p, u=u)
    gpu = verify_chain(drafts.to(CUDA), q.to(CUDA), p.to(CUDA), u=u.to(CUDA))
    assert torch.equal(gpu[0].cpu(), cpu[0]) and torch.equal(gpu[1].cpu(), cpu[1])
    assert 0 < int(cpu[1].sum()) < B * k  # some rows reject, some accept


N_RUNS = 30_000


def _first_two_counts(target, draft, k, seed) -> np.ndarray:
    ids = torch.tensor([[1, 2]] * N_RUNS, device=CUDA)
    out, _ = speculative_generate(target, draft, ids, k=k, max_new_tokens=2, temperature=1.0, generator=_gen(seed))
    pairs = out[:, 2:].cpu().numpy()
    return np.bincount(pairs[:, 0] * TINY_VOCAB + pairs[:, 1], minlength=TINY_VOCAB**2).reshape(TINY_VOCAB, -1)


@pytest.fixture(scope="module")
def tiny():
    target, draft = tiny_pair_models()
    return target.to(CUDA), draft.to(CUDA)


def test_sampled_first_two_tokens_on_cuda_follow_the_target(tiny):
    target, draft = tiny
    exact = exact_first_two(target, [1, 2], SamplingParams(1.0)).cpu()
    assert distribution_test(exact, counts=_first_two_counts(target, draft, 2, seed=11)).passed


def test_negative_control_always_accept_on_cuda_is_flagged(tiny, monkeypatch):
    import specref.decoding.chain as decode

    def always_accept(draft_tokens, q, p, generator=None, u=None, check_support=True):
        B, k = draft_tokens.shape
        return torch.cat([draft_tokens, sample(p[:, k], generator)[:, None]], 1), torch.full((B,), k, device=p.device)

    monkeypatch.setattr(decode, "_verify_chain", always_accept)
    target, draft = tiny
    exact = exact_first_two(target, [1, 2], SamplingParams(1.0)).cpu()
    assert distribution_test(exact, counts=_first_two_counts(target, draft, 2, seed=12)).p_value < 1e-6


def test_models_on_different_devices_are_refused(pair):
    target, draft = pair
    with pytest.raises(ValueError, match="one device"):
        speculative_generate(target, copy.deepcopy(draft).cpu(), torch.tensor([[1, 2]], device=CUDA), k=2,
                             max_new_tokens=4)


def test_bundled_pair_on_cuda_float64_greedy_equals_plain_for_chains_and_trees():
    target, draft, tok = load_pair(device="cuda", dtype=torch.float64)
    ids = torch.tensor([tok.encode("def main(argv):\n    ")], device=CUDA)
    expected = generate(target, ids, 60, temperature=0)
    chain, stats = speculative_generate(target, draft, ids, k=4, max_new_tokens=60, temperature=0)
    tree, _ = tree_generate(target, draft, ids, (2, 2, 1), max_new_tokens=60, temperature=0)
    assert torch.equal(chain, expected) and torch.equal(tree, expected)
    assert stats.acceptance_rate > 0.5


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_bundled_pair_runs_in_half_precision_on_cuda(dtype):
    target, draft, tok = load_pair(device="cuda", dtype=dtype)
    assert target.dtype == dtype and target.new_cache(1).k.dtype == dtype
    ids = torch.tensor([tok.encode("import os\nimport sys\n")], device=CUDA)
    out, stats = speculative_generate(target, draft, ids, k=4, max_new_tokens=48, temperature=1.0, generator=_gen(0))
    assert out.shape == (1, ids.shape[1] + 48) and int(out.min()) >= 0
    assert stats.emitted == 48 and stats.tokens_per_step > 1


# -- CUDA graphs ---------------------------------------------------------------------------------
class CountingGraph(CudaGraph):
    """The real CUDA graph, counting its captures and replays (so a test knows replays happened)."""

    captures = 0
    replays = 0

    def capture(self, fn, inputs, pool):
        CountingGraph.captures += 1
        return super().capture(fn, inputs, pool)

    def replay(self) -> None:
        CountingGraph.replays += 1
        super().replay()


@pytest.fixture(autouse=True)
def _counting_graphs(monkeypatch):
    monkeypatch.setattr(graphs, "CudaGraph", CountingGraph)


def counting(*models) -> None:
    """Each model's kept caches (and their graphs) dropped, the counts zeroed, capture switched on."""
    CountingGraph.captures = CountingGraph.replays = 0
    for m in models:
        kept(m).caches.clear()
        kept(m).enabled = True


def n_graphs(model) -> int:
    return sum(len(c.graphs) for c in kept(model).caches.values())


def _chunks(model, ids: torch.Tensor, prompt_len: int, t: int, graphed: bool) -> tuple[list[torch.Tensor], object]:
    """Logits of the prompt, then of successive t-token chunks, through one cache (public forward)."""
    cache = model.new_cache(ids.shape[0], max_len=ids.shape[1])
    cache.graphs = CapturedPasses() if graphed else None
    out = [model(ids[:, :prompt_len], cache=cache)]
    for start in range(prompt_len, ids.shape[1] - t + 1, t):
        out.append(model(ids[:, start:start + t], cache=cache))
    return out, cache


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("which", ["target", "draft"])
@pytest.mark.parametrize("t", [1, 5])  # a decode pass (T = 1) and a verification pass (T = k + 1, k = 4)
@torch.no_grad()
def test_replayed_logits_equal_the_eager_pass(dtype, which, t):
    target, draft, _ = load_pair(device="cuda", dtype=dtype)
    model = target if which == "target" else draft
    ids = torch.randint(0, model.config.vocab_size, (3, 16 + 12 * t), generator=torch.Generator().manual_seed(t))
    ids = ids.to(CUDA)
    counting(model)
    eager, eager_cache = _chunks(model, ids, 16, t, graphed=False)
    graphed, graphed_cache = _chunks(model, ids, 16, t, graphed=True)
    assert CountingGraph.replays >= 6 and CountingGraph.captures < CountingGraph.replays
    for i, (g, e) in enumerate(zip(graphed, eager)):
        assert g.dtype == dtype
        torch.testing.assert_close(g, e, atol=0, rtol=0, msg=lambda m, i=i: f"chunk {i}: {m}")
    assert torch.equal(graphed_cache.lengths, eager_cache.lengths)
    n = int(eager_cache.lengths.max())
    assert torch.equal(graphed_cache.k[..., :n, :], eager_cache.k[..., :n, :])


@torch.no_grad()
def test_a_replay_does_not_change_what_an_earlier_call_returned():
    target = load_pair(device="cuda", dtype=torch.float32)[0]
    counting(target)
    ids = torch.randint(0, target.config.vocab_size, (2, 12), generator=torch.Generator().manual_seed(0)).to(CUDA)
    cache = target.new_cache(2, max_len=12)
    cache.graphs = CapturedPasses()
    target(ids[:, :8], cache=cache)
    first = [target(ids[:, i:i + 1], cache=cache) for i in range(8, 12)]  # warm-up, then replays
    kept = [f.clone() for f in first]
    assert CountingGraph.replays >= 2
    for f, k in zip(first, kept):
        assert torch.equal(f, k)
    assert not torch.equal(first[-1], first[-2])


def test_the_graphs_switch():
    target, draft, tok = load_pair(device="cuda", dtype=torch.float32)
    ids = torch.tensor([tok.encode("def main(argv):\n    ")], device=CUDA)
    counting(target, draft)
    kept(target).enabled = kept(draft).enabled = False
    off, _ = speculative_generate(target, draft, ids, k=4, max_new_tokens=32, temperature=0)
    assert CountingGraph.captures == CountingGraph.replays == 0 and n_graphs(target) == n_graphs(draft) == 0
    kept(target).enabled = kept(draft).enabled = True
    on, _ = speculative_generate(target, draft, ids, k=4, max_new_tokens=32, temperature=0)
    assert n_graphs(target) > 0 and n_graphs(draft) > 0 and CountingGraph.replays > CountingGraph.captures
    assert torch.equal(on, off)


def _near_tie(target64, tokens: torch.Tensor, at: int, tol: float = 1e-4) -> bool:
    """Whether the float64 target's top two logits at position ``at`` are within ``tol``: a tie float32 may round either way."""
    with torch.no_grad():
        logits = target64(tokens[:, :at].to(torch.long))[:, -1].double()  # [B, V]
    top = logits.topk(2, dim=-1).values
    return bool(((top[:, 0] - top[:, 1]) < tol).any())


def _assert_same_or_near_tie(got: torch.Tensor, expected: torch.Tensor, target64) -> None:
    if torch.equal(got, expected):
        return
    at = int((got != expected).any(0).nonzero()[0])  # the first position where any row differs
    assert _near_tie(target64, expected, at), f"greedy output differs at position {at} with no near-tie there"


@pytest.fixture(scope="module")
def bundled32():
    target, _, tok = load_pair(device="cuda", dtype=torch.float32)
    target64 = load_pair(device="cuda", dtype=torch.float64)[0]
    kept(target64).enabled = False  # the eager reference
    prompts = [tok.encode("def main(argv):\n    "), tok.encode("import os\nimport sys\n\n\ndef ")]
    width = min(len(p) for p in prompts)
    ids = torch.tensor([p[:width] for p in prompts], device=CUDA)
    return target, tok, target64, ids


DRAFT_KINDS = ["model", "prompt_lookup", "medusa", "eagle", "eagle3", "eagle_notoken", "mtp"]


@pytest.mark.parametrize("name", DRAFT_KINDS)
def test_float32_greedy_with_graphs_equals_plain_greedy_for_every_draft(bundled32, name):
    from specref.drafts.load import DRAFTS, load_draft

    assert sorted(DRAFT_KINDS) == sorted(DRAFTS)
    target, _, target64, ids = bundled32
    expected = generate(target, ids, 48, temperature=0)
    draft = load_draft(name, target)
    counting(target, *([draft.model] if name == "model" else []))
    k = min(4, getattr(draft, "max_k", None) or 4)  # an MTP stack drafts at most one token per module
    got, stats = speculative_generate(target, draft, ids, k=k, max_new_tokens=48, temperature=0)
    assert CountingGraph.replays > 0 and stats.emitted == 2 * 48
    _assert_same_or_near_tie(got, expected, target64)


@pytest.mark.parametrize("name", ["model", "medusa", "eagle"])
def test_float32_greedy_trees_and_lookahead_with_graphs_equal_plain_greedy(bundled32, name):
    from specref.decoding.lookahead import lookahead_generate
    from specref.drafts.load import load_draft

    target, _, target64, ids = bundled32
    expected = generate(target, ids, 40, temperature=0)
    draft = load_draft(name, target)
    counting(target)
    got, _ = tree_generate(target, draft, ids, (2, 2, 1), max_new_tokens=40, temperature=0)
    _assert_same_or_near_tie(got, expected, target64)
    if name == "model":
        got, _ = lookahead_generate(target, ids, 40, temperature=0)
        _assert_same_or_near_tie(got, expected, target64)
    assert CountingGraph.replays > 0


def test_sampling_with_graphs_keeps_the_exact_distribution_and_the_control_is_flagged(tiny, monkeypatch):
    """The Monte-Carlo check of chapter 3 with graphs counted on, then with always-accept: flagged."""
    import specref.decoding.chain as decode

    target, draft = tiny
    counting(target, draft)
    exact = exact_first_two(target, [1, 2], SamplingParams(1.0)).cpu()
    assert distribution_test(exact, counts=_first_two_counts(target, draft, 2, seed=21)).passed
    assert CountingGraph.captures > 0  # a 2-token run captures once per shape; its replays come with longer runs

    def always_accept(draft_tokens, q, p, generator=None, u=None, check_support=True):
        B, k = draft_tokens.shape
        return torch.cat([draft_tokens, sample(p[:, k], generator)[:, None]], 1), torch.full((B,), k, device=p.device)

    monkeypatch.setattr(decode, "_verify_chain", always_accept)
    assert distribution_test(exact, counts=_first_two_counts(target, draft, 2, seed=22)).p_value < 1e-6


def test_sampled_longer_runs_replay_and_match_the_eager_stream(tiny):
    """With the same generator seed, sampled output with graphs on equals it with graphs off."""
    target, draft = tiny
    ids = torch.tensor([[1, 2]] * 64, device=CUDA)  # the tiny pair holds 8 positions: 2 + 6 new tokens
    counting(target, draft)
    kept(target).enabled = kept(draft).enabled = False
    off, _ = speculative_generate(target, draft, ids, k=2, max_new_tokens=6, temperature=1.0, generator=_gen(5))
    kept(target).enabled = kept(draft).enabled = True
    on, _ = speculative_generate(target, draft, ids, k=2, max_new_tokens=6, temperature=1.0, generator=_gen(5))
    assert CountingGraph.replays > 0 and torch.equal(on, off)


# -- the GPU timing pair --------------------------------------------------------------------------
def test_timing_pair_builds_gpt2_xl_and_gpt2_shapes_in_bf16_without_a_float32_detour(monkeypatch, tmp_path):
    from specref.models.pretrained import timing_pair

    monkeypatch.setenv("HF_HUB_CACHE", str(tmp_path))  # an empty cache: the random-weight case, always
    torch.cuda.synchronize()
    torch.cuda.empty_cache()
    base = torch.cuda.memory_allocated()
    torch.cuda.reset_peak_memory_stats()
    pair = timing_pair("cuda")
    target, draft = pair.target, pair.draft
    assert (target.config.n_layer, target.config.n_embd, target.config.n_head) == (48, 1600, 25)
    assert (draft.config.n_layer, draft.config.n_embd, draft.config.n_head) == (12, 768, 12)
    assert target.config.vocab_size == draft.config.vocab_size == 50257
    for m in (target, draft):
        assert all(p.dtype == torch.bfloat16 and p.is_cuda for p in m.parameters())
        assert m.lm_head.weight is m.transformer.wte.weight
    weights = sum(p.numel() * p.element_size() for m in (target, draft) for p in m.parameters())
    assert 3.0e9 < weights < 3.5e9  # 1.56 B + 124 M parameters in bf16
    assert torch.cuda.max_memory_allocated() - base < 1.25 * weights  # a float32 model would be 2x
    assert pair.tokenizer is None and "random weights" in pair.source
    cache = target.new_cache(2, max_len=64)
    logits = target(torch.zeros(2, 8, dtype=torch.long, device=CUDA), cache=cache)
    assert logits.shape == (2, 8, 50257) and torch.isfinite(logits.float()).all()


def test_timing_pair_loads_hf_folders_onto_the_gpu_in_bf16(tmp_path):
    from specref.models import save_pretrained, train_tokenizer
    from specref.models.pretrained import timing_pair

    for name, seed in (("gpt2-xl", 0), ("gpt2", 1)):
        model = small_gpt2(vocab=300, n_embd=32, n_layer=2 + seed, seed=seed, dtype=torch.float32)
        save_pretrained(model, tmp_path / name)
        train_tokenizer(["def f(x):\n    return x\n"] * 4, vocab_size=300).save(tmp_path / name / "tokenizer.json")
    pair = timing_pair("cuda", folder=tmp_path)
    assert pair.target.device.type == "cuda" and pair.target.dtype == torch.bfloat16
    assert pair.draft.config.n_layer == 3 and pair.tokenizer is not None and "trained weights" in pair.source
    reference = small_gpt2(vocab=300, n_embd=32, n_layer=2, seed=0, dtype=torch.float32)
    w = "transformer.h.1.attn.c_proj.weight"
    assert torch.equal(pair.target.state_dict()[w].cpu(), reference.state_dict()[w].to(torch.bfloat16))
