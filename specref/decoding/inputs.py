"""What a generation checks where its inputs enter (`loop.decode` calls these once); inside it the passes are
unchecked, and a step checks only a draft's proposal and, with the counts it reads back anyway, the target's logits.
"""

from __future__ import annotations

import math

import torch

from .._validate import check_int, check_probs, check_tokens
from ..sampling import SamplingParams


def check_model(model: object, name: str = "model") -> None:
    """Raise a TypeError unless `model` is a GPT-2-like model: callable, with `config` and `new_cache()`."""
    if not (callable(model) and hasattr(model, "config") and hasattr(model, "new_cache")):
        raise TypeError(f"{name} must be a GPT-2-like model (specref.models.gpt2.GPT2: config, new_cache()), "
                        f"got {type(model).__name__}")


def check_eos(eos_token_id: object, vocab_size: int) -> None:
    """eos_token_id must be None (no stop token) or a token id in [0, vocab_size)."""
    if eos_token_id is None:
        return
    if check_int("eos_token_id", eos_token_id, 0, f"a token id in [0, {vocab_size}) or None") >= vocab_size:
        raise ValueError(f"eos_token_id must be a token id in [0, {vocab_size}) or None, got {eos_token_id}")


def check_inputs(model: torch.nn.Module, input_ids: object, max_new_tokens: object, name: str = "model") -> torch.Tensor:
    """input_ids as a [B, T] long tensor on the model's device; T + max_new_tokens must fit the window."""
    check_model(model, name)
    check_tokens("input_ids", input_ids, model.config.vocab_size)  # a tensor of ids in the vocabulary
    if input_ids.dim() == 1:
        input_ids = input_ids[None]
    if input_ids.dim() != 2 or input_ids.shape[0] == 0:
        raise ValueError(f"input_ids must have shape [B, T] with B >= 1, got {tuple(input_ids.shape)}")
    if input_ids.shape[1] == 0:
        raise ValueError("input_ids is an empty prompt: give at least one token")
    check_int("max_new_tokens", max_new_tokens, 0, "tokens to generate per row", ValueError)
    n_ctx = model.config.n_positions
    if input_ids.shape[1] + max_new_tokens > n_ctx:
        raise ValueError(f"prompt ({input_ids.shape[1]} tokens) + max_new_tokens ({max_new_tokens}) exceeds "
                         f"{name}'s context window n_positions={n_ctx}")
    return input_ids.to(model.device, torch.long)


def check_pair(target: torch.nn.Module, draft: object) -> None:
    """Draft and target must share one vocabulary and one device."""
    check_model(target, "target")
    if draft.vocab_size != target.config.vocab_size:
        raise ValueError(f"draft and target vocabularies differ ({draft.vocab_size} vs "
                         f"{target.config.vocab_size}): they must share one tokenizer")
    draft_device = getattr(getattr(draft, "model", None), "device", target.device)
    if draft_device != target.device:
        raise ValueError(f"target is on {target.device} but the draft is on {draft_device}: put both on one device")
    n_hidden = target.config.n_layer + 1  # GPT2Output.hidden_states: the embeddings, then one per block
    layers = tuple(getattr(draft, "feature_layers", ()))
    if any(not isinstance(i, int) or isinstance(i, bool) or not 0 <= i < n_hidden for i in layers):
        raise ValueError(f"the draft reads hidden states {list(layers)} but the target has {n_hidden} "
                         f"(indices 0..{n_hidden - 1}): it was built for another target")


def check_proposal(drafts: object, q: object, B: int, k: int, V: int, greedy: bool,
                   values: bool = True) -> int:  # [B, k'], [B, k', V]
    """A proposal must be k' <= k token ids per row (the same k' in every row) and, when sampling, k' q's per row.

    Returns k' (fewer than asked, none included, is allowed). Shapes are checked on the host; the values
    (ids in the vocabulary, q distributions: two reads back) only with `values` (cleared for `Draft.trusted`).
    """
    if not (isinstance(drafts, torch.Tensor) and drafts.dim() == 2 and drafts.shape[0] == B and drafts.shape[1] <= k):
        raise ValueError(f"the draft must propose a [B, k'] tensor of token ids with B = {B} and k' <= k = {k}, "
                         f"got {tuple(getattr(drafts, 'shape', ())) or type(drafts).__name__}")
    n = drafts.shape[1]
    if values:
        check_tokens("draft tokens", drafts, V)
    if not greedy:
        if not isinstance(q, torch.Tensor) or tuple(q.shape) != (B, n, V):
            raise ValueError(f"the draft must return q of shape [B, k', V] = [{B}, {n}, {V}] (k' = the tokens it "
                             f"proposed), got {tuple(getattr(q, 'shape', ())) or type(q).__name__}")
        if values:
            check_probs("the draft's q", q)
    return n


def check_logits_total(total: float, logits: torch.Tensor, params: SamplingParams) -> None:
    """The logits' check from their float32 total (NaN or +inf shows in it); -inf (masked) takes the full check."""
    if math.isnan(total) or total == math.inf:
        raise ValueError("the target's logits contain NaN or +inf")
    if total == -math.inf:
        params.probs(logits)  # refuses a row that is all -inf
