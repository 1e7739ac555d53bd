"""trace_step records the very step speculative_generate takes."""

from __future__ import annotations

import torch

from model_factory import noisy_copy, small_gpt2
from specref.decoding.chain import generate
from specref.decoding.trace import trace_step


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
