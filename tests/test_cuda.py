"""The same rules on a CUDA GPU: skipped without one (CI has none), run wherever a GPU is present.

Exactness does not depend on the device, so these repeat the CPU suite's key checks
on CUDA tensors and CUDA generators: logits equal the CPU's, greedy speculative
decoding equals greedy decoding, sampled tokens follow the target's exact
distribution (with a negative control), and the bundled pair runs in bf16.
"""

from __future__ import annotations

import copy

import numpy as np
import pytest
import torch

from model_factory import TINY_VOCAB, exact_first_two, noisy_copy, small_gpt2
from model_factory import tiny_pair as tiny_pair_models
from specref.decoding.chain import generate, speculative_generate
from specref.decoding.tree import tree_generate
from specref.sampling import SamplingParams
from specref.models.pair import load_pair
from specref.checks.montecarlo import distribution_test
from specref.rejection import verify_chain
from specref.sampling import sample

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

    def always_accept(draft_tokens, q, p, generator=None, u=None):
        B, k = draft_tokens.shape
        return torch.cat([draft_tokens, sample(p[:, k], generator)[:, None]], 1), torch.full((B,), k, device=p.device)

    monkeypatch.setattr(decode, "verify_chain_unchecked", always_accept)
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
