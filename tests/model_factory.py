"""Small random GPT-2 models for tests: sharp enough to avoid argmax ties, cheap enough for CPU."""

from __future__ import annotations

import copy

import numpy as np
import torch

from specref.decoding.chain import speculative_generate
from specref.models.gpt2 import GPT2, GPT2Config


def small_gpt2(vocab: int, n_embd: int, n_layer: int, seed: int, n_positions: int = 256, scale: float = 1.0,
               dtype: torch.dtype = torch.float64) -> GPT2:
    torch.manual_seed(seed)  # tests may seed the global RNG; library code never does
    m = GPT2(GPT2Config(vocab_size=vocab, n_positions=n_positions, n_embd=n_embd, n_layer=n_layer, n_head=2))
    with torch.no_grad():
        for p in m.parameters():  # larger weights: sharper, more varied logits than GPT-2's init
            p.mul_(scale)
    return m.to(dtype).eval()


def noisy_copy(model: GPT2, noise: float, seed: int) -> GPT2:
    """A draft that agrees with the target often but not always."""
    g = torch.Generator().manual_seed(seed)
    d = copy.deepcopy(model)
    with torch.no_grad():
        for p in d.parameters():
            p.add_(noise * p.std() * torch.randn(p.shape, generator=g, dtype=p.dtype))
    return d


TINY_VOCAB = 6


def tiny_pair() -> tuple[GPT2, GPT2]:
    """A target and an unrelated draft over 6 tokens: every first-two-token outcome is enumerable."""
    target = small_gpt2(vocab=TINY_VOCAB, n_embd=16, n_layer=1, seed=3, n_positions=8, scale=3.0)
    return target, small_gpt2(vocab=TINY_VOCAB, n_embd=16, n_layer=1, seed=4, n_positions=8, scale=3.0)


@torch.no_grad()
def exact_first_two(target: GPT2, prompt: list[int], params) -> torch.Tensor:  # [V, V]
    """P(x1, x2) = p(x1 | prompt) p(x2 | prompt, x1), from the target alone (params: SamplingParams)."""
    V = target.config.vocab_size
    ids = torch.tensor([prompt + [x1] for x1 in range(V)])
    probs = params.probs(target(ids))  # [V, T+1, V]: row x1 holds p(. | prompt) and p(. | prompt, x1)
    return probs[0, -2, :, None] * probs[:, -1, :]


def sample_first_two(target: GPT2, draft, prompt: list[int], k: int, params, seed: int, n: int,
                     max_new_tokens: int = 2) -> np.ndarray:  # [V, V] counts
    """Counts of the first two new tokens over n speculative runs of `prompt` (compare with `exact_first_two`)."""
    ids = torch.tensor([prompt] * n)
    out, _ = speculative_generate(target, draft, ids, k=k, max_new_tokens=max_new_tokens,
                                  temperature=params.temperature, top_k=params.top_k, top_p=params.top_p,
                                  generator=torch.Generator().manual_seed(seed))
    pairs = out[:, len(prompt) : len(prompt) + 2].numpy()
    V = target.config.vocab_size
    return np.bincount(pairs[:, 0] * V + pairs[:, 1], minlength=V**2).reshape(V, V)


def drawn_colder(propose):
    """Negative control for a draft's propose: it draws at temperature T / 2 but reports q at temperature T.

    softmax(l / (T/2)) ** (1/2), renormalised, is softmax(l / T): so the q it reports is exactly
    the right-temperature distribution, and only the tokens betray it.
    """
    from specref.sampling import SamplingParams

    def wrapped(self, tokens, lengths, k, params, generator=None):
        colder = SamplingParams(params.temperature / 2, params.top_k, params.top_p)
        x, q_drawn = propose(self, tokens, lengths, k, colder, generator)
        q = q_drawn.sqrt()
        return x, q / q.sum(-1, keepdim=True)

    return wrapped


def best_k(alpha, c, v):
    """ex03 Task 3 as the solution writes it: draft k + 1 adds alpha^(k+1) tokens and c + v(k+1) - v(k) of cost;
    stop at the first draft whose rate does not beat the current speedup."""
    k, tokens, cost, v_k = 0, 1.0, v(0), v(0)
    while True:
        gain, v_next = alpha ** (k + 1), v(k + 1)
        extra = c + v_next - v_k
        if gain * cost <= extra * tokens:
            return k
        tokens, cost, v_k, k = tokens + gain, cost + extra, v_next, k + 1


def best_k_exhaustive(alpha, c, v):
    """ex03 Task 3 by exhaustive search to a proven bound, as an honest learner may write it: every k scores at most
    E_inf / (1 + c k), E_inf = 1 / (1 - alpha), so once that falls below the best speedup found no later k can win.
    Searched in blocks of doubling length; one call of v per k (close to a million over the visible and hidden cases)."""
    e_inf = 1 / (1 - alpha)
    speedups, tokens, end = [], 0.0, 1024
    while True:
        for k in range(len(speedups), end):
            tokens += alpha ** k
            speedups.append(tokens / (v(k) + c * k))
        best = max(range(len(speedups)), key=speedups.__getitem__)
        if 1 + c * end > e_inf / speedups[best]:
            return best
        end *= 2
