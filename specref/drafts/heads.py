"""The trainable parts of the feature drafts (Medusa, EAGLE, MTP), and their save/load.

Decoding logic lives in the drafts that use these modules; their training-time alignment
(teacher-forced inputs and labels) lives next to its only user, in tools/training/heads_alignment.py.

Notation. Token ``x_u`` sits at position ``u``; the target's *feature* at ``t`` is
``f_t = hidden_states[-1][:, t]`` (``GPT2Output.hidden_states``: ``[0]`` the embedding output, ``[l]``
the output of block ``l - 1``, ``[n_layer]`` = ``ln_f`` of the last block's output), and
``target.lm_head(f_t)`` predicts ``x_{t+1}``. In decoding, ``t`` is the last position the target has
scored and a draft's position ``j = 1, 2, ...`` is the token ``x_{t+1+j}``. Token and position
embeddings and the LM head are the target's own, frozen and shared, never stored with the heads
(so a head set is small and tied to its target: ``target_fingerprint``).
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import torch
import torch.nn as nn
import torch.nn.functional as F

from .._validate import as_int_tuple, check_int, check_tensor
from ..models.gpt2 import GPT2, Block, GPT2Config, check_attention_mask, check_cache, new_slots, run_blocks
from ..models.kvcache import KVCache

KINDS = ("medusa", "eagle", "mtp")


# -- shared pieces -----------------------------------------------------------------------------
def check_features(name: str, x: object, C: int, B: int | None = None, T: int | None = None) -> torch.Tensor:
    """Raise unless `x` is a float [B (or 1), T, C] tensor (B and T checked when given)."""
    x = check_tensor(name, x)
    if not x.is_floating_point():
        raise TypeError(f"{name} must be a floating-point tensor, got {x.dtype}")
    if x.ndim != 3 or x.shape[-1] != C:
        raise ValueError(f"{name} must have shape [B, T, {C}], got {tuple(x.shape)}")
    if B is not None and x.shape[0] not in (B, 1) or T is not None and x.shape[1] != T:
        raise ValueError(f"{name} must have shape [{B} (or 1), {T}, {C}], got {tuple(x.shape)}")
    return x


class OneBlock(nn.Module):
    """A module around one GPT-2 block (`EagleLayer`, `MTPModule`): the block, its 1-layer cache, its attention."""

    def __init__(self, n_embd: int, n_head: int) -> None:
        super().__init__()
        check_int("n_embd", n_embd, 1, "the target's width")
        check_int("n_head", n_head, 1, "attention heads")
        if n_embd % n_head:
            raise ValueError(f"n_embd ({n_embd}) must be divisible by n_head ({n_head})")
        self.n_embd, self.n_head = n_embd, n_head

    def new_block(self, std: float = 0.02) -> Block:
        """A block with GPT-2's initialisation (its residual projections scaled by 1/sqrt(2 * 1 layer))."""
        # vocab_size and n_positions are unused by a lone Block.
        block = Block(GPT2Config(vocab_size=1, n_positions=1, n_embd=self.n_embd, n_layer=1, n_head=self.n_head))
        for name, p in block.named_parameters():
            if name.endswith("weight") and p.ndim == 2:
                nn.init.normal_(p, 0.0, std / (2 ** 0.5) if "c_proj" in name else std)
            elif name.endswith("bias") and "ln_" not in name:
                nn.init.zeros_(p)
        return block

    def new_cache(self, batch_size: int, max_len: int, device: torch.device | str | None = None,
                  dtype: torch.dtype | None = None) -> KVCache:
        """An empty 1-layer cache for the block: ``batch_size`` rows of up to ``max_len`` entries."""
        p = next(self.parameters())
        return KVCache(1, batch_size, self.n_head, self.n_embd // self.n_head, max_len,
                       device=p.device if device is None else device, dtype=p.dtype if dtype is None else dtype)

    def attend(self, x: torch.Tensor, cache: KVCache | None, attention_mask: torch.Tensor | None,
               check: bool = True) -> torch.Tensor:  # [B, T, C] -> [B, T, C]
        """The block over new rows ``x``: the target's own pass over a cache (`gpt2.run_blocks`), one layer.

        ``check=True`` validates the mask and the cache (reading back); ``check=False`` is the
        core pass a draft runs inside a generation: no read back, the cache's slots chosen on the
        host (``KVCache.capacity``), the mask built on the device, the lengths advanced in place.
        """
        B, T, C = x.shape
        if check:
            attention_mask = check_attention_mask(attention_mask, B, T, x.device)
            if cache is not None:
                check_cache(cache, 1, self.n_head, C // self.n_head, B, x.device, T)
        n_slots = T if cache is None else cache.capacity(T)
        y = run_blocks([self.block], x, cache, new_slots(cache, B, T, x.device), n_slots, attention_mask)
        if cache is not None:
            cache.advance(T)
        return y.view(B, T, C)


# -- Medusa ----------------------------------------------------------------------------------
class MedusaHeads(nn.Module):
    """Medusa-1 heads: head ``i`` maps the target's feature ``f_t`` to ``f_t + SiLU(W_i f_t + b_i)``.

    ``target.lm_head`` of head ``i``'s output predicts ``x_{t+2+i}`` (draft position ``i + 1``),
    without seeing ``x_{t+1} .. x_{t+1+i}``. All heads share the target's frozen ``lm_head``
    (the paper gives each its own), so a head holds ``C * C + C`` parameters; ``W_i`` starts at
    zero (as in Medusa), so every head starts as the target's own next-token head.
    """

    def __init__(self, n_embd: int, n_heads: int) -> None:
        super().__init__()
        check_int("n_embd", n_embd, 1, "the target's width")
        check_int("n_heads", n_heads, 1, "Medusa heads")
        self.n_embd, self.n_heads = n_embd, n_heads
        self.weight = nn.Parameter(torch.zeros(n_heads, n_embd, n_embd))  # [n, C_in, C_out]
        self.bias = nn.Parameter(torch.zeros(n_heads, n_embd))  # [n, C]

    def forward(self, h: torch.Tensor, n: int | None = None) -> torch.Tensor:  # [B, T, C] -> [B, T, n, C]
        """Heads 0 .. n-1 (all when n is None) on every row of h; a head never reads another's output."""
        h = check_features("h", h, self.n_embd)
        n = self.n_heads if n is None else check_int("n", n, 1, f"heads to run (at most {self.n_heads})")
        if n > self.n_heads:
            raise ValueError(f"n must be at most n_heads = {self.n_heads}, got {n}")
        z = torch.einsum("btc,ncd->btnd", h, self.weight[:n]) + self.bias[:n]  # [B, T, n, C]
        return h[:, :, None, :] + F.silu(z)

    def logits(self, h: torch.Tensor, lm_head: nn.Module, n: int | None = None) -> torch.Tensor:  # -> [B, T, n, V]
        """``lm_head(forward(h, n))``: head i's logits at row t are for token ``x_{t+2+i}``; only heads 0 .. n-1 run."""
        return lm_head(self(h, n))


# -- EAGLE -----------------------------------------------------------------------------------
class EagleLayer(OneBlock):
    """The EAGLE draft layer: one GPT-2 block on (feature at ``s``, embedding of ``x_{s+1}``) -> feature at ``s + 1``.

    ``f_hat_s = LayerNorm(Block(fc([g_s ; wte(x_{s+1})]) + wpe(s + 1)))`` with the target's frozen
    embeddings (GPT-2 has no rotary positions inside the block, so its absolute ones are added);
    ``target.lm_head(f_hat_s)`` is q for ``x_{s+2}``. ``g_s = fuse(hidden_states[feature_layers])``
    at ``s``, or while drafting the layer's own previous output. EAGLE-1: ``feature_layers =
    (n_layer,)``; EAGLE-3: (low, mid, top) fused by ``Linear(3C -> C)``, trained with training-time
    test; ``use_token=False``: the ablation without the token one step ahead (``tok_emb`` ignored).
    Attention runs over a 1-layer ``KVCache`` with ``GPT2.forward``'s rule. With target features
    for ``0 .. n - 2`` the cache holds rows ``s = 0 .. n - 2``; drafting step ``j`` writes row
    ``n - 3 + j``, rows the verifier then drops (``EagleDraft`` keeps only rows of true features).
    """

    def __init__(self, n_embd: int, n_head: int, feature_layers: tuple[int, ...], use_token: bool = True) -> None:
        super().__init__(n_embd, n_head)
        layers = as_int_tuple("feature_layers", feature_layers)
        if not layers:
            raise TypeError(f"feature_layers must be a non-empty tuple of ints, got {feature_layers!r}")
        for v in layers:
            check_int("feature_layers[i]", v, 0, "an index into GPT2Output.hidden_states")
        if not isinstance(use_token, bool):
            raise TypeError(f"use_token must be a bool, got {use_token!r}")
        self.feature_layers, self.use_token = layers, use_token
        C, k = n_embd, len(layers)
        self.fuse_fc = nn.Linear(k * C, C) if k > 1 else None
        self.fc = nn.Linear(2 * C if use_token else C, C)
        self.block = self.new_block()
        self.norm_out = nn.LayerNorm(n_embd, eps=1e-5)  # the output lives where the target's ln_f output does

    def fuse(self, feats: Sequence[torch.Tensor]) -> torch.Tensor:  # k x [B, T, C] -> [B, T, C]
        """``hidden_states[l]`` for ``l`` in ``feature_layers`` (in that order) -> g; one layer: identity."""
        if isinstance(feats, torch.Tensor) or not isinstance(feats, Sequence) \
                or len(feats) != len(self.feature_layers):
            raise ValueError(f"feats must be a sequence of {len(self.feature_layers)} tensors "
                             f"(hidden_states{list(self.feature_layers)})")
        first = check_features("feats[0]", feats[0], self.n_embd)
        for f in feats[1:]:
            check_features("feats[i]", f, self.n_embd)
            if f.shape != first.shape:
                raise ValueError(f"feats must share one shape, got {[tuple(x.shape) for x in feats]}")
        if self.fuse_fc is None:
            return first
        return self.fuse_fc(torch.cat(list(feats), -1))

    def forward(
        self,
        g: torch.Tensor,  # [B, T, C]
        tok_emb: torch.Tensor | None,  # [B, T, C] embedding of x_{s+1}; ignored without use_token
        pos_emb: torch.Tensor,  # [B or 1, T, C] wpe(s + 1)
        cache: KVCache | None = None,
        attention_mask: torch.Tensor | None = None,  # [B or 1, T, T] bool among the new rows
        check: bool = True,  # False inside a generation: no read back (`OneBlock.attend`)
    ) -> torch.Tensor:  # f_hat [B, T, C]
        g = check_features("g", g, self.n_embd)
        B, T, _ = g.shape
        pos_emb = check_features("pos_emb", pos_emb, self.n_embd, B, T)
        if self.use_token:
            tok_emb = check_features("tok_emb", tok_emb, self.n_embd, B, T)
            x = self.fc(torch.cat([g, tok_emb.expand(B, T, -1)], -1))
        else:
            x = self.fc(g)
        return self.norm_out(self.attend(x + pos_emb, cache, attention_mask, check))


# -- MTP -------------------------------------------------------------------------------------
class MTPModule(OneBlock):
    """One DeepSeek-V3 MTP module (depth d): ``h^d = Block(M [RMSNorm(h^{d-1}) ; RMSNorm(Emb(x_{i+d}))] + wpe(i+d))``.

    At row ``i``, ``h_prev`` is depth ``d - 1``'s output at the same row (``h^0`` = the target's
    feature ``f_i``), ``tok_emb = wte(x_{i+d})``, ``pos_emb = wpe(i + d)`` (GPT-2's absolute
    positions stand in for DeepSeek's rotary ones). ``logits(h, target.lm_head)`` =
    ``lm_head(LayerNorm(h))`` predicts ``x_{i+d+1}``. Modules chain by depth (``MTPStack``); each
    attends causally over its own depth's rows (a 1-layer cache). Row ``i`` of depth ``d`` needs
    ``x_{i+d}``: with ``n`` tokens known, rows ``0 .. n - 1 - d`` read true tokens only; rows that
    read drafts are rolled back after verification (``MTPDraft``).
    """

    def __init__(self, n_embd: int, n_head: int) -> None:
        super().__init__(n_embd, n_head)
        self.norm_h = nn.RMSNorm(n_embd, eps=1e-6)
        self.norm_e = nn.RMSNorm(n_embd, eps=1e-6)
        self.proj = nn.Linear(2 * n_embd, n_embd, bias=False)  # DeepSeek's M_k
        self.block = self.new_block()
        self.norm_out = nn.LayerNorm(n_embd, eps=1e-5)

    def forward(
        self,
        h_prev: torch.Tensor,  # [B, T, C]
        tok_emb: torch.Tensor,  # [B, T, C] embedding of x_{i+d}
        pos_emb: torch.Tensor,  # [B or 1, T, C] wpe(i + d)
        cache: KVCache | None = None,
        attention_mask: torch.Tensor | None = None,
        check: bool = True,  # False inside a generation: no read back (`OneBlock.attend`)
    ) -> torch.Tensor:  # h^d [B, T, C]
        h_prev = check_features("h_prev", h_prev, self.n_embd)
        B, T, _ = h_prev.shape
        tok_emb = check_features("tok_emb", tok_emb, self.n_embd, B, T)
        pos_emb = check_features("pos_emb", pos_emb, self.n_embd, B, T)
        x = self.proj(torch.cat([self.norm_h(h_prev), self.norm_e(tok_emb.expand(B, T, -1))], -1)) + pos_emb
        return self.attend(x, cache, attention_mask, check)

    def logits(self, h: torch.Tensor, lm_head: nn.Module) -> torch.Tensor:  # [B, T, C] -> [B, T, V]
        return lm_head(self.norm_out(h))


class MTPStack(nn.Module):
    """``depth`` MTP modules; ``modules_list[d - 1]`` is depth d (predicts draft position d)."""

    def __init__(self, n_embd: int, n_head: int, depth: int) -> None:
        super().__init__()
        check_int("depth", depth, 1, "MTP depths")
        self.n_embd, self.n_head, self.depth = n_embd, n_head, depth
        self.modules_list = nn.ModuleList(MTPModule(n_embd, n_head) for _ in range(depth))

    def __getitem__(self, d: int) -> MTPModule:
        return self.modules_list[d]

    def __len__(self) -> int:
        return self.depth


# -- the target's frozen embeddings --------------------------------------------------------
def embed(target: GPT2, token_ids: torch.Tensor, positions: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """The target's frozen ``wte(token_ids)`` ``[B, T, C]`` and ``wpe(positions)`` ``[B or 1, T, C]``."""
    tr = target.transformer
    pos = positions if positions.ndim == 2 else positions[None]
    return tr.wte(token_ids), tr.wpe(pos)



# -- configs, saving and loading -------------------------------------------------------------
def target_fingerprint(target: GPT2) -> str:
    """sha256 of the target's token embedding (= its LM head) in float16: which target a head set belongs to."""
    w = target.transformer.wte.weight.detach().to("cpu", torch.float16).contiguous()
    return hashlib.sha256(w.numpy().tobytes()).hexdigest()[:16]


@dataclass
class HeadsConfig:
    """What a head set is and which target it was trained on (stored in its safetensors' metadata)."""

    kind: str  # "medusa" | "eagle" | "mtp"
    name: str  # file stem, e.g. "eagle1"
    n_embd: int
    n_head: int = 1  # attention heads of the block (eagle, mtp)
    n_heads: int = 1  # Medusa heads, or MTP depth
    feature_layers: tuple[int, ...] = ()  # eagle only
    use_token: bool = True  # eagle only
    ttt_steps: int = 1  # eagle: training-time test steps used in training (1 = teacher forcing only)
    target_vocab_size: int = 0
    target_n_layer: int = 0
    target_fingerprint: str = ""
    notes: dict[str, Any] = field(default_factory=dict)

    def __post_init__(self) -> None:
        if self.kind not in KINDS:
            raise ValueError(f"kind must be one of {KINDS}, got {self.kind!r}")
        self.feature_layers = tuple(self.feature_layers)

    def to_dict(self) -> dict[str, Any]:
        d = asdict(self)
        d["feature_layers"] = list(self.feature_layers)
        return d

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> HeadsConfig:
        return cls(**d)

    def check_target(self, target: GPT2) -> None:
        """Raise ValueError unless ``target`` is the model this head set was trained on."""
        c = target.config
        if (c.n_embd, c.vocab_size, c.n_layer) != (self.n_embd, self.target_vocab_size, self.target_n_layer):
            raise ValueError(f"head set {self.name!r} was trained on a target with n_embd={self.n_embd}, "
                             f"vocab_size={self.target_vocab_size}, n_layer={self.target_n_layer}; got "
                             f"n_embd={c.n_embd}, vocab_size={c.vocab_size}, n_layer={c.n_layer}")
        if self.target_fingerprint and target_fingerprint(target) != self.target_fingerprint:
            raise ValueError(f"head set {self.name!r} was trained on another target (embedding fingerprint "
                             f"{self.target_fingerprint}, this target's is {target_fingerprint(target)})")


def build_heads(config: HeadsConfig) -> nn.Module:
    """A freshly initialised module for ``config``."""
    if config.kind == "medusa":
        return MedusaHeads(config.n_embd, config.n_heads)
    if config.kind == "eagle":
        return EagleLayer(config.n_embd, config.n_head, config.feature_layers, config.use_token)
    return MTPStack(config.n_embd, config.n_head, config.n_heads)


def save_heads(module: nn.Module, config: HeadsConfig, path: str | Path,
               dtype: torch.dtype = torch.float16) -> int:
    """Write ``module``'s weights in ``dtype`` with ``config`` in the metadata; returns the file's size in bytes."""
    from safetensors.torch import save_file

    if not isinstance(config, HeadsConfig):
        raise TypeError(f"config must be a HeadsConfig, got {type(config).__name__}")
    sd = {k: v.detach().to("cpu", dtype).contiguous().clone() for k, v in module.state_dict().items()}
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    save_file(sd, str(path), metadata={"format": "pt", "config": json.dumps(config.to_dict())})
    path.chmod(0o644)  # safetensors writes owner-only files; these are package data
    return path.stat().st_size


def load_heads(path: Any, device: torch.device | str | None = None,
               dtype: torch.dtype = torch.float32) -> tuple[nn.Module, HeadsConfig]:
    """``(module, config)`` from a file written by ``save_heads``, in eval mode on ``device`` in ``dtype``."""
    from safetensors import safe_open
    from safetensors.torch import load_file

    path = Path(str(path))
    if not path.is_file():
        raise FileNotFoundError(f"no head set at {path}; run `python tools/training/train_heads.py` to create it")
    with safe_open(str(path), "pt") as f:
        meta = f.metadata() or {}
    if "config" not in meta:
        raise ValueError(f"{path} has no head-set config in its metadata (not written by save_heads)")
    config = HeadsConfig.from_dict(json.loads(meta["config"]))
    with torch.random.fork_rng(devices=[]):  # the random init is overwritten: leave the caller's global RNG alone
        module = build_heads(config)
    module.load_state_dict(load_file(str(path)))
    return module.to(device=device, dtype=dtype).eval(), config


def load_bundled_heads(name: str, device: torch.device | str | None = None,
                       dtype: torch.dtype = torch.float32) -> tuple[nn.Module, HeadsConfig]:
    """A head set shipped in ``specref/assets/heads/<name>.safetensors`` (names: see ``heads.json`` there)."""
    import importlib.resources

    if not isinstance(name, str) or not name.replace("_", "").isalnum():
        raise ValueError(f"name must be a head-set name such as 'eagle1', got {name!r}")
    res = importlib.resources.files("specref").joinpath("assets", "heads", f"{name}.safetensors")
    with importlib.resources.as_file(res) as p:
        return load_heads(p, device, dtype)
