"""GPT-2 in one readable file, with Hugging Face's parameter names and layouts.

``GPT2(config).state_dict()`` has exactly the keys and shapes of ``transformers.GPT2LMHeadModel``; linear
layers are GPT-2's ``Conv1D`` (weight ``[in, out]``: ``x @ weight + bias``). For speculative decoding: a static
KV cache with one length per row (``KVCache``), ``position_ids`` and a bool ``attention_mask`` among the new
tokens (a flattened tree in one pass), every layer's hidden states (``return_hidden=True``, for feature drafts).
A pass calls the blocks as functions over their parameters on rows ``[B * T, C]`` (`run_blocks`); hooks go on
the `GPT2` itself.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterable
from contextlib import nullcontext
from dataclasses import asdict, dataclass, fields
from functools import lru_cache, partial
from typing import Any, NamedTuple

import torch
import torch.nn as nn
import torch.nn.functional as F
from torch.nn.attention import SDPBackend, sdpa_kernel

from .._validate import check_int, check_tokens
from .kernels import KernelPath, SmallLinear, kernel_path
from .kvcache import KVCache
from .meta_init import NoMetaDraws

__all__ = ["GPT2", "GPT2Config", "GPT2Output", "normalize_state_dict", "use_small_kernel"]

# cuDNN attention builds a graph per new key length, so per decoding step: decoding uses the other fused kernels.
_DECODE_SDPA_BACKENDS = [SDPBackend.FLASH_ATTENTION, SDPBackend.EFFICIENT_ATTENTION, SDPBackend.MATH]

# The longest pass replayed from a captured graph (a verification of k + 1 tokens, a tree); a prompt runs eagerly.
GRAPH_MAX_TOKENS = 32


@dataclass
class GPT2Config:
    """The GPT-2 hyper-parameters, under the field names of HF ``config.json``."""

    vocab_size: int = 50257
    n_positions: int = 1024
    n_embd: int = 768
    n_layer: int = 12
    n_head: int = 12
    n_inner: int | None = None  # MLP width; None means 4 * n_embd
    activation_function: str = "gelu_new"
    layer_norm_epsilon: float = 1e-5
    initializer_range: float = 0.02
    # Dropout rates are kept for config.json round-trips; this model applies none.
    resid_pdrop: float = 0.0
    embd_pdrop: float = 0.0
    attn_pdrop: float = 0.0
    bos_token_id: int | None = None
    eos_token_id: int | None = None
    tie_word_embeddings: bool = True

    def __post_init__(self) -> None:
        for name in ("vocab_size", "n_positions", "n_embd", "n_layer", "n_head"):
            check_int(name, getattr(self, name), 1, "a positive size", ValueError)
        if self.n_embd % self.n_head:
            raise ValueError(f"n_embd ({self.n_embd}) must be divisible by n_head ({self.n_head})")
        if self.n_inner is not None and (not isinstance(self.n_inner, int) or self.n_inner <= 0):
            raise ValueError(f"n_inner must be None or a positive int, got {self.n_inner!r}")
        if self.activation_function not in _ACTIVATIONS:
            raise ValueError(f"activation_function must be one of {sorted(_ACTIVATIONS)}, "
                             f"got {self.activation_function!r}")

    @property
    def head_dim(self) -> int:
        return self.n_embd // self.n_head

    def to_dict(self) -> dict[str, Any]:
        """A dict that HF ``GPT2Config.from_dict`` (and ``config.json``) understands."""
        d = asdict(self)
        d["model_type"] = "gpt2"
        d["architectures"] = ["GPT2LMHeadModel"]
        return d

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> GPT2Config:
        """Read an HF GPT-2 ``config.json`` dict; unknown keys (task heads, versions...) are ignored."""
        if not isinstance(d, dict):
            raise TypeError(f"d must be a dict, got {type(d).__name__}")
        if d.get("model_type", "gpt2") != "gpt2":
            raise ValueError(f"not a GPT-2 config: model_type={d.get('model_type')!r}")
        if d.get("scale_attn_by_inverse_layer_idx") or d.get("reorder_and_upcast_attn"):
            raise ValueError("scale_attn_by_inverse_layer_idx / reorder_and_upcast_attn are not supported")
        names = {f.name for f in fields(cls)}
        return cls(**{k: v for k, v in d.items() if k in names})


def check_attention_mask(attention_mask: torch.Tensor | None, B: int, T: int,
                         device: torch.device) -> torch.Tensor | None:  # [B or 1, T, T] bool on device, None: causal
    """Validate a mask among the new tokens: bool ``[B or 1, T, T]``, True on the diagonal."""
    if attention_mask is None:
        return None
    if not isinstance(attention_mask, torch.Tensor) or attention_mask.dtype != torch.bool:
        raise TypeError("attention_mask must be a bool tensor (True = may attend)")
    if attention_mask.ndim != 3 or attention_mask.shape[1:] != (T, T) or attention_mask.shape[0] not in (1, B):
        raise ValueError(f"attention_mask must have shape [{B} or 1, {T}, {T}], "
                         f"got {tuple(attention_mask.shape)}")
    new_mask = attention_mask.to(device)
    # A row with no visible key makes softmax 0/0 = NaN; a node always sees itself.
    if not bool(new_mask.diagonal(dim1=1, dim2=2).all()):
        raise ValueError("attention_mask must let every new token attend to itself (diagonal all True)")
    return new_mask


def check_cache(cache: object, n_layer: int, n_head: int, head_dim: int, batch_size: int,
                device: torch.device, n_new: int) -> int:
    """Raise unless `cache` fits this model, batch and device with room for n_new more tokens per row (reads back).

    Returns the longest cached row + n_new."""
    if not isinstance(cache, KVCache):
        raise TypeError(f"cache must be a KVCache, got {type(cache).__name__}")
    if cache.n_layer != n_layer or cache.k.shape[2] != n_head or cache.k.shape[4] != head_dim:
        raise ValueError("cache was built for a different model shape")
    if cache.batch_size != batch_size:
        raise ValueError(f"cache holds {cache.batch_size} sequences but the input has B={batch_size}")
    if cache.device != device:
        raise ValueError(f"cache is on {cache.device} but the model is on {device}")
    n_slots = cache.tighten() + n_new
    if n_slots > cache.max_len:
        raise ValueError(f"total length {n_slots} exceeds the cache's max_len={cache.max_len}")
    return n_slots


def attention_mask_over_slots(
    past: torch.Tensor | None,  # [B] cached lengths, or None without a cache
    slots: torch.Tensor,  # [B, T] cache slot of each new token (past[:, None] + arange(T))
    n_slots: int,  # S: how many cache slots the new tokens attend over
    new_mask: torch.Tensor | None,  # [B or 1, T, T] bool among the new tokens (checked), None = causal
) -> torch.Tensor:  # [B or 1, 1, T, S] bool
    """The attention rule, the one coding of it: a mask over cache slots, built on the device (no read back).

    New token ``i`` of row ``b`` sees every cached slot ``< past[b]`` and new token ``j`` iff
    ``new_mask[b, i, j]`` (None: ``j <= i``); every other slot (stale, or past the row) is masked.
    """
    B, T = slots.shape
    dev = slots.device
    if past is None:
        t = _arange(T, dev)
        return ((t[:, None] >= t[None, :])[None] if new_mask is None else new_mask)[:, None]  # [B or 1, 1, T, T]
    s = _arange(n_slots, dev)
    if new_mask is None:  # causal: slot s is visible to new token i iff s <= its own slot
        return (s[None, None, :] <= slots[:, :, None])[:, None]  # [B, 1, T, S]
    # Slot s of sequence b is visible to new token i iff it is cached (s < past[b])
    # or it is new token j = s - past[b] and new_mask[b, i, j].
    rel = s[None, :] - past[:, None]  # [B, S]
    in_new = (rel >= 0) & (rel < T)
    gathered = new_mask.expand(B, T, T).gather(2, rel.clamp(0, T - 1)[:, None, :].expand(B, T, n_slots))
    return ((rel < 0)[:, None, :] | (in_new[:, None, :] & gathered))[:, None]  # [B, 1, T, S]


def additive_mask(mask: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:  # bool [..., T, S] -> dtype, same shape
    """The mask as scores to add, 0 where visible, -inf where not: converted once per pass, not in every layer."""
    return torch.zeros(mask.shape, dtype=dtype, device=mask.device).masked_fill_(~mask, float("-inf"))


def _arange(n: int, device: torch.device) -> torch.Tensor:  # [n] long
    """``arange(n)`` on ``device``, made once and shared (never written); made afresh while a CUDA graph is captured
    (a tensor made there holds its values only once the graph replays)."""
    if device.type == "cuda" and torch.cuda.is_current_stream_capturing():
        return torch.arange(n, device=device)
    return _shared_arange(n, device)


@lru_cache(maxsize=256)
def _shared_arange(n: int, device: torch.device) -> torch.Tensor:  # [n] long
    with torch.inference_mode(False):  # a normal tensor, which a training pass may keep for its backward
        return torch.arange(n, device=device)


_gelu_new = partial(F.gelu, approximate="tanh")  # GPT-2's tanh approximation (HF "gelu_new")
_ACTIVATIONS = {"gelu_new": _gelu_new, "gelu_pytorch_tanh": _gelu_new, "gelu": F.gelu, "relu": F.relu}


class Conv1D(nn.Module):
    """GPT-2's linear layer: ``y = x @ weight + bias`` with ``weight`` stored ``[in, out]``."""

    def __init__(self, n_in: int, n_out: int) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.empty(n_in, n_out))
        self.bias = nn.Parameter(torch.zeros(n_out))

    def forward(self, x: torch.Tensor) -> torch.Tensor:  # [..., in] -> [..., out]
        return _linear(self, x.reshape(-1, x.shape[-1])).view(*x.shape[:-1], -1)


class Attention(nn.Module):
    def __init__(self, config: GPT2Config) -> None:
        super().__init__()
        self.n_head, self.head_dim = config.n_head, config.head_dim
        self.c_attn = Conv1D(config.n_embd, 3 * config.n_embd)
        self.c_proj = Conv1D(config.n_embd, config.n_embd)


class MLP(nn.Module):
    def __init__(self, config: GPT2Config) -> None:
        super().__init__()
        inner = config.n_inner or 4 * config.n_embd
        self.c_fc = Conv1D(config.n_embd, inner)
        self.c_proj = Conv1D(inner, config.n_embd)
        self.act = _ACTIVATIONS[config.activation_function]


class Block(nn.Module):
    """Pre-LayerNorm transformer block: x + attn(ln_1(x)), then x + mlp(ln_2(x))."""

    def __init__(self, config: GPT2Config) -> None:
        super().__init__()
        self.ln_1 = nn.LayerNorm(config.n_embd, eps=config.layer_norm_epsilon)
        self.attn = Attention(config)
        self.ln_2 = nn.LayerNorm(config.n_embd, eps=config.layer_norm_epsilon)
        self.mlp = MLP(config)


# -- the block as functions over its parameters, on rows [N, C], N = B * T ------------------------
# Parameters are read at each call, so replaced weights are used; hooks on a block or submodule do not fire.


def _linear(conv: Conv1D, x: torch.Tensor) -> torch.Tensor:  # [N, in] -> [N, out]
    """``Conv1D.forward`` on rows: ``bias + x @ weight`` (the few-token kernel where `use_small_kernel` set one)."""
    p = conv._parameters
    fast = conv.__dict__.get("fast")
    if fast is not None and fast.serves(p["weight"], p["bias"], x):
        return fast(x)
    return torch.addmm(p["bias"], x, p["weight"])


def _norm(ln: nn.LayerNorm, x: torch.Tensor) -> torch.Tensor:  # [N, C] -> [N, C]
    """``nn.LayerNorm.forward``, one row at a time (``F.layer_norm`` without its Python wrapper)."""
    p = ln._parameters
    return torch.layer_norm(x, ln.normalized_shape, p["weight"], p["bias"], ln.eps)


def _block(
    block: Block,
    x: torch.Tensor,  # [N, C], N = B * T rows
    B: int,
    T: int,
    mask: torch.Tensor,  # [B or 1, 1, T, S] bool or additive
    k_slots: torch.Tensor | None,  # [B, H, S, D] this layer's first S cache slots (a view), None without a cache
    v_slots: torch.Tensor | None,  # [B, H, S, D]
    idx: torch.Tensor | None,  # [B, H, T, D] each new token's cache slot, expanded
) -> torch.Tensor:  # [N, C]
    """``Block.forward`` on rows: x + attn(ln_1(x)), the new K/V written at their slots and the S slots attended
    (the mask hides the others); then x + mlp(ln_2(x))."""
    m = block._modules  # submodules read from _modules: no nn.Module.__getattr__ on the hot path
    attn, mlp = m["attn"], m["mlp"]
    qkv = _linear(attn._modules["c_attn"], _norm(m["ln_1"], x)).view(B, T, 3, attn.n_head, attn.head_dim)
    q, k, v = qkv.permute(2, 0, 3, 1, 4).unbind(0)  # [B, H, T, D] each
    if k_slots is not None:
        dtype = k_slots.dtype
        k_slots.scatter_(2, idx, k if k.dtype == dtype else k.to(dtype))
        v_slots.scatter_(2, idx, v if v.dtype == dtype else v.to(dtype))
        k = k_slots if dtype == q.dtype else k_slots.to(q.dtype)
        v = v_slots if dtype == q.dtype else v_slots.to(q.dtype)
    y = F.scaled_dot_product_attention(q, k, v, attn_mask=mask)  # [B, H, T, D]
    x = x + _linear(attn._modules["c_proj"], y.transpose(1, 2).reshape(x.shape))
    fc = mlp._modules
    return x + _linear(fc["c_proj"], mlp.act(_linear(fc["c_fc"], _norm(m["ln_2"], x))))


def new_slots(cache: KVCache | None, B: int, T: int, device: torch.device) -> torch.Tensor:  # [B, T] long
    """Each new token's cache slot, ``lengths[b] + arange(T)`` (its default position); ``arange(T)`` without a cache."""
    new = _arange(T, device)
    return new.expand(B, T) if cache is None else cache.lengths[:, None] + new


def run_blocks(
    blocks: Iterable[Block],
    x: torch.Tensor,  # [B, T, C] the new tokens' inputs
    cache: KVCache | None,  # one layer per block
    slots: torch.Tensor,  # [B, T] each new token's cache slot (`new_slots`)
    n_slots: int,  # S: the slots attended over (`KVCache.capacity(T)`; T without a cache)
    new_mask: torch.Tensor | None,  # [B or 1, T, T] bool among the new tokens (checked), None = causal
    hidden: list[torch.Tensor] | None = None,  # gets each block's input [B, T, C] when given
) -> torch.Tensor:  # [B * T, C]
    """The one pass of blocks over a KV cache (the target's and a head's): write K/V at `slots`, attend over S slots.

    Under `attention_mask_over_slots`; nothing is read back; the caller advances the lengths.
    """
    B, T, C = x.shape
    mask = additive_mask(attention_mask_over_slots(None if cache is None else cache.lengths, slots, n_slots,
                                                   new_mask), x.dtype)  # [B or 1, 1, T, S]
    k_slots = v_slots = idx = None
    # Every layer's first S slots as views made at once; with autograd (which refuses in-place writes into
    # unbind's views) each layer takes its own.
    lazy = cache is not None and torch.is_grad_enabled()
    if cache is not None:
        idx = slots.view(B, 1, T, 1).expand(B, cache.k.shape[2], T, cache.k.shape[4])  # [B, H, T, D]
        if not lazy:
            k_slots = cache.k.narrow(3, 0, n_slots).unbind(0)  # L x [B, H, S, D]
            v_slots = cache.v.narrow(3, 0, n_slots).unbind(0)
    x = x.reshape(B * T, C)  # [N, C]: the blocks work on rows
    with sdpa_kernel(_DECODE_SDPA_BACKENDS) if x.is_cuda else nullcontext():
        for layer, block in enumerate(blocks):
            if hidden is not None:
                hidden.append(x.view(B, T, C))
            if lazy:
                k_l, v_l = cache.k[layer].narrow(2, 0, n_slots), cache.v[layer].narrow(2, 0, n_slots)
            else:
                k_l, v_l = (None, None) if cache is None else (k_slots[layer], v_slots[layer])
            x = _block(block, x, B, T, mask, k_l, v_l, idx)
    return x


class Transformer(nn.Module):
    # A container only, so that parameter names carry HF's "transformer." prefix.
    def __init__(self, config: GPT2Config) -> None:
        super().__init__()
        self.wte = nn.Embedding(config.vocab_size, config.n_embd)
        self.wpe = nn.Embedding(config.n_positions, config.n_embd)
        self.h = nn.ModuleList(Block(config) for _ in range(config.n_layer))
        self.ln_f = nn.LayerNorm(config.n_embd, eps=config.layer_norm_epsilon)


class GPT2Output(NamedTuple):
    logits: torch.Tensor  # [B, T, V]
    # n_layer + 1 tensors [B, T, C] (HF's): the embeddings, the outputs of blocks 0..n_layer-2, ln_f(the last's)
    hidden_states: tuple[torch.Tensor, ...]


# HF checkpoints may carry these non-persistent attention buffers; they hold no weights.
_IGNORED_SUFFIXES = (".attn.bias", ".attn.masked_bias")


class GPT2(nn.Module):
    """GPT-2 language model (``GPT2LMHeadModel``) with a speculative-decoding-friendly forward."""

    def __init__(self, config: GPT2Config) -> None:
        super().__init__()
        if not isinstance(config, GPT2Config):
            raise TypeError(f"config must be a GPT2Config, got {type(config).__name__}")
        self.config = config
        with NoMetaDraws():  # on the meta device (a shape for a checkpoint): nothing drawn
            self.transformer = Transformer(config)
            self.lm_head = nn.Linear(config.n_embd, config.vocab_size, bias=False)
            if config.tie_word_embeddings:
                self.lm_head.weight = self.transformer.wte.weight  # tied, as in GPT-2
            self.apply(self._init_weights)
            # GPT-2 scales residual projections by 1/sqrt(2 * n_layer) so the residual
            # stream's variance does not grow with depth.
            for name, p in self.named_parameters():
                if name.endswith("c_proj.weight"):
                    nn.init.normal_(p, mean=0.0, std=config.initializer_range / math.sqrt(2 * config.n_layer))

    def _init_weights(self, module: nn.Module) -> None:  # biases start at 0 and LayerNorms at 1, GPT-2's values
        std = self.config.initializer_range
        if isinstance(module, (Conv1D, nn.Embedding)):
            nn.init.normal_(module.weight, mean=0.0, std=std)
        if isinstance(module, nn.Linear) and not self.config.tie_word_embeddings:  # an untied LM head
            nn.init.normal_(module.weight, mean=0.0, std=std)

    def _apply(self, fn, *args, **kwargs):  # .to(), .half() ...: the packed copies of the old weights go
        drop_small_kernel(self)
        return super()._apply(fn, *args, **kwargs)

    # -- convenience -------------------------------------------------------------------
    @property
    def device(self) -> torch.device:
        return self.transformer.wte.weight.device

    @property
    def dtype(self) -> torch.dtype:
        return self.transformer.wte.weight.dtype

    def num_parameters(self, exclude_embeddings: bool = False) -> int:
        n = sum(p.numel() for p in self.parameters())  # tied lm_head counted once
        if exclude_embeddings:
            n -= self.transformer.wte.weight.numel() + self.transformer.wpe.weight.numel()
        return n

    def new_cache(self, batch_size: int, max_len: int | None = None, device: torch.device | str | None = None,
                  dtype: torch.dtype | None = None) -> KVCache:
        """An empty cache for ``batch_size`` sequences of up to ``max_len`` (default ``n_positions``) tokens."""
        c = self.config
        max_len = c.n_positions if max_len is None else max_len
        if check_int("max_len", max_len, 1, f"cache slots, at most n_positions={c.n_positions}", ValueError) \
                > c.n_positions:
            raise ValueError(f"max_len must be an int in [1, n_positions={c.n_positions}], got {max_len!r}")
        return KVCache(c.n_layer, batch_size, c.n_head, c.head_dim, max_len,
                       device=self.device if device is None else device,
                       dtype=self.dtype if dtype is None else dtype)

    # -- forward -----------------------------------------------------------------------
    def forward(
        self,
        input_ids: torch.Tensor,  # [B, T] long
        cache: KVCache | None = None,
        position_ids: torch.Tensor | None = None,  # [B, T] or [1, T] long
        attention_mask: torch.Tensor | None = None,  # [B or 1, T, T] bool, among the new tokens
        return_hidden: bool = False,
        logits_to_keep: int = 0,
        *,
        checked: bool = True,
    ) -> torch.Tensor | GPT2Output:
        """Logits ``[B, T, V]`` for ``input_ids`` appended after ``cache``, under `attention_mask_over_slots`.

        Positions default to ``cache.lengths[b] + arange(T)``; the new K/V go to slots ``lengths[b] ..`` and
        ``lengths`` grows by T. ``return_hidden=True`` returns ``GPT2Output(logits, hidden_states)``;
        ``logits_to_keep=n`` (HF's name) keeps the last ``n`` tokens' logits (0: all). Every argument is checked
        (reads back); ``checked=False``, the decoding loops' call, runs `step` through ``__call__`` (hooks fire).
        """
        if not checked:
            return self.step(input_ids, cache, position_ids, attention_mask, return_hidden, logits_to_keep)
        c = self.config
        check_int("logits_to_keep", logits_to_keep, 0, "0 = all tokens", ValueError)
        check_tokens("input_ids", input_ids, c.vocab_size)
        if input_ids.ndim != 2 or 0 in input_ids.shape:
            raise ValueError(f"input_ids must have shape [B, T], non-empty, got {tuple(input_ids.shape)}")
        B, T = input_ids.shape
        dev = self.device
        input_ids = input_ids.to(device=dev, dtype=torch.long)
        n_slots = T if cache is None else check_cache(cache, c.n_layer, c.n_head, c.head_dim, B, dev, T)
        if position_ids is None:
            if n_slots > c.n_positions:
                raise ValueError(f"total length {n_slots} (cached + new tokens) exceeds n_positions={c.n_positions}")
        else:
            if not isinstance(position_ids, torch.Tensor) or position_ids.dtype.is_floating_point \
                    or position_ids.dtype == torch.bool:
                raise TypeError("position_ids must be an integer tensor")
            if position_ids.ndim != 2 or position_ids.shape[1] != T or position_ids.shape[0] not in (1, B):
                raise ValueError(f"position_ids must have shape [{B} or 1, {T}], got {tuple(position_ids.shape)}")
            position_ids = position_ids.to(device=dev, dtype=torch.long)
            if bool((position_ids < 0).any()) or bool((position_ids >= c.n_positions).any()):
                raise ValueError(f"position_ids must lie in [0, n_positions={c.n_positions})")
        new_mask = check_attention_mask(attention_mask, B, T, dev)
        return self.step(input_ids, cache, position_ids, new_mask, bool(return_hidden), logits_to_keep)

    def step(
        self,
        input_ids: torch.Tensor,  # [B, T] long, on the model's device, ids in the vocabulary
        cache: KVCache | None = None,  # checked: this model's shape, B rows, room for T more
        position_ids: torch.Tensor | None = None,  # [B or 1, T] long, in [0, n_positions)
        attention_mask: torch.Tensor | None = None,  # [B or 1, T, T] bool on the device, True on the diagonal
        return_hidden: bool = False,
        logits_to_keep: int = 0,
    ) -> torch.Tensor | GPT2Output:
        """``forward`` without its checks, reading nothing back; the lengths advance in place after the pass.

        Its shapes depend only on (B, T) and ``cache.capacity(T)``, so a pass of at most ``GRAPH_MAX_TOKENS`` tokens
        over a cache with ``graphs`` replays one graph per key (shapes, outputs asked for); a longer one runs eagerly.
        """
        B, T = input_ids.shape
        n_slots = T if cache is None else cache.capacity(T)
        shape = (cache, n_slots, return_hidden, logits_to_keep, position_ids is not None, attention_mask is not None)
        inputs = tuple(t for t in (input_ids, position_ids, attention_mask) if t is not None)
        # Captured only without autograd (the decoding loops run under no_grad): a replay's outputs have no history.
        if cache is not None and cache.graphs is not None and T <= GRAPH_MAX_TOKENS and not torch.is_grad_enabled():
            key = (B, T, n_slots, return_hidden, logits_to_keep, tuple(t.shape for t in inputs))
            out = cache.graphs.run(key, partial(self._core, *shape), *inputs)
        else:
            out = self._core(*shape, *inputs)
        if cache is not None:
            cache.advance(T)
        return GPT2Output(out[0], tuple(out[1:])) if return_hidden else out

    def _core(
        self, cache: KVCache | None, n_slots: int, return_hidden: bool, logits_to_keep: int,
        has_positions: bool, has_mask: bool, input_ids: torch.Tensor, *rest: torch.Tensor,
    ) -> torch.Tensor | tuple[torch.Tensor, ...]:  # logits [B, T or logits_to_keep, V] (, hidden states...)
        """The pass over fixed shapes: write K/V at slots lengths[b] .., attend over n_slots slots; no read back."""
        position_ids = rest[0] if has_positions else None
        new_mask = rest[-1] if has_mask else None
        B, T = input_ids.shape
        slots = new_slots(cache, B, T, input_ids.device)  # [B, T]
        tr = self.transformer._modules
        x = torch.embedding(tr["wte"]._parameters["weight"], input_ids) \
            + torch.embedding(tr["wpe"]._parameters["weight"], slots if position_ids is None else position_ids)
        C = x.shape[-1]
        hidden: list[torch.Tensor] | None = [] if return_hidden else None
        x = run_blocks(tr["h"]._modules.values(), x, cache, slots, n_slots, new_mask, hidden)
        x = _norm(tr["ln_f"], x).view(B, T, C)
        # lm_head as nn.Linear computes it, on [B, T or logits_to_keep, C]
        x_out = x[:, -logits_to_keep:] if logits_to_keep else x
        head, fast = self.lm_head.weight, self.lm_head.__dict__.get("fast")
        if fast is not None and fast.serves(head, None, x_out.reshape(-1, C)):
            logits = fast(x_out.reshape(-1, C)).view(*x_out.shape[:-1], -1)
        else:
            logits = F.linear(x_out, head)
        return (logits, *hidden, x) if return_hidden else logits

    # -- HF interop ----------------------------------------------------------------------
    def load_state_dict(self, state_dict: dict[str, torch.Tensor], strict: bool = True, assign: bool = False):
        """Load GPT-2 weights with HF names (`normalize_state_dict`); a missing ``lm_head.weight`` is tied to wte."""
        drop_small_kernel(self)
        sd = normalize_state_dict(state_dict)
        if "lm_head.weight" not in sd and self.config.tie_word_embeddings:
            sd["lm_head.weight"] = sd.get("transformer.wte.weight", self.transformer.wte.weight)
        result = super().load_state_dict(sd, strict=strict, assign=assign)
        if self.config.tie_word_embeddings:
            self.lm_head.weight = self.transformer.wte.weight  # keep the tie even with assign=True
        return result


def use_small_kernel(model: GPT2) -> KernelPath:
    """Pack `model`'s weights for the few-token CPU kernel (`specref.models.kernels`); returns the path it runs.

    Serves passes of at most `kernels.MAX_ROWS` rows (batch x new tokens) of a float32 model on the CPU; other
    passes, and weights changed since, keep PyTorch's. Moving, casting, reloading, copying or pickling the model
    drops the packed copies (as large as the weights). Where no kernel compiles, the path says why.
    """
    if not isinstance(model, GPT2):
        raise TypeError(f"model must be a GPT2, got {type(model).__name__}")
    path = kernel_path()
    if path.name != "compiled":
        return path
    if model.device.type != "cpu" or model.dtype != torch.float32:
        return KernelPath("torch", f"the model is {model.dtype} on {model.device}: the kernel serves float32 on the CPU")
    if any(p.is_inference() for p in model.parameters()):
        return KernelPath("torch", "the model's weights were made in inference mode, whose tensors keep no version "
                                   "to tell a change: load it outside torch.inference_mode()")
    for module in model.modules():
        if isinstance(module, Conv1D):
            module.fast = SmallLinear(module.weight, module.bias)
    model.lm_head.fast = SmallLinear(model.lm_head.weight, None, transposed=True)
    return path


def drop_small_kernel(model: nn.Module) -> None:
    """Forget the packed copies `use_small_kernel` made (the weights move or are replaced): PyTorch's kernels serve."""
    for module in model.modules():
        module.__dict__.pop("fast", None)


def unchecked(model: nn.Module) -> Callable[..., Any]:
    """The pass a decoding loop calls once its inputs are checked: ``checked=False`` for a GPT2, else the model."""
    return partial(model, checked=False) if isinstance(model, GPT2) else model


def normalize_state_dict(state_dict: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """HF GPT-2 state dict -> ``GPT2`` keys: the ``transformer.`` prefix added where absent, buffers dropped."""
    if not isinstance(state_dict, dict):
        raise TypeError(f"state_dict must be a dict, got {type(state_dict).__name__}")
    out: dict[str, torch.Tensor] = {}
    for key, value in state_dict.items():
        if key.endswith(_IGNORED_SUFFIXES):
            continue
        if key != "lm_head.weight" and not key.startswith("transformer."):
            key = "transformer." + key
        out[key] = value
    return out
