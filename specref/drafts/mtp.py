"""MTP: DeepSeek-V3's multi-token-prediction modules, chained by depth, as a draft (chapter 5).

Rule. Module d (d = 1 .. D, `specref.drafts.heads.MTPModule`) at row i reads h^{d-1}_i (h^0 =
f, the target's last hidden state; else module d-1's output at the same row) and the
embedding of x_{i+d}; its logits are for x_{i+d+1}. With t = length - 2 the newest position
the target has scored, module d at row t proposes draft position d, x_{t+1+d}, drawn from
q_d = its processed logits (one-hot on the argmax when greedy); module d needs module
d-1's output and draft d-1. Here the modules are trained post hoc on a frozen target
(DeepSeek-V3 trains them with the main model).

The caches. Module d keeps its own 1-layer `KVCache` and outputs h^d for exactly the rows
whose inputs are true tokens: rows 0 .. t+1-d. Drafting position d, module d runs one pass
after its cached rows up to row t: the rows that became true since the last step (kept),
then rows t+2-d .. t, which read the drafts in place of unknown tokens (computed, then
dropped). So when the earlier drafts are right the draft computes what teacher-forced
training computed; `rollback(n_valid)` keeps the rows i with i + d < n_valid. A one-token
prompt has no feature yet: the first step proposes that token again with one-hot q (exact).
"""

from __future__ import annotations

from collections.abc import Sequence

import torch

from ..models.kvcache import KVCache
from ..sampling import SamplingParams
from .base import Draft, check_k, draw
from .cached import pick
from .features import FeatureBuffer, check_target, repeat_prompt
from .heads import MTPModule, MTPStack


class MTPDraft(Draft):
    """DeepSeek-V3-style MTP modules as a chain draft: module d at the newest scored row proposes draft position d.

    `target` lends its frozen embeddings (wte, wpe), its output head and its width;
    `modules` is an `MTPStack` or a sequence of `MTPModule`s, depth 1 first. It reads
    the target's last hidden state (`feature_layers = (n_layer,)`) and proposes at most
    `depth` tokens. State: one part, `features` (a `FeatureBuffer`), and per module a KV
    cache and its outputs over the rows with true inputs (see the module docstring).
    """

    def __init__(self, target: torch.nn.Module, modules: MTPStack | Sequence[MTPModule]) -> None:
        mods = list(modules.modules_list) if isinstance(modules, MTPStack) else modules
        if isinstance(mods, torch.nn.Module) or not isinstance(mods, Sequence) or not mods \
                or not all(isinstance(m, MTPModule) for m in mods):
            raise TypeError("modules must be an MTPStack or a non-empty sequence of "
                            f"specref.drafts.heads.MTPModule, got {type(modules).__name__}")
        widths = {m.n_embd for m in mods}
        if len(widths) != 1:
            raise ValueError(f"the MTP modules must share one width, got {sorted(widths)}")
        check_target(target, mods[0], "the MTP modules")
        self.features = FeatureBuffer((target.config.n_layer,), mods[0], "the MTP modules")
        self.feature_layers = self.features.layers
        self.target, self.modules = target, list(mods)
        self.depth = self.max_k = len(mods)  # module d drafts position d
        self.n_embd = mods[0].n_embd
        self.vocab_size = int(target.config.vocab_size)
        self.caches: list[KVCache] | None = None  # per depth: the block's K/V over the true rows
        self.outputs: list[torch.Tensor] | None = None  # per depth [B, S, C]: h^d of the true rows

    def begin(self, batch_size: int) -> None:
        super().begin(batch_size)
        self.features.begin(batch_size, self.run_rows)
        self.caches, self.outputs = None, None

    def observe(self, features: tuple[torch.Tensor, ...], starts: torch.Tensor) -> None:  # ([B, T, C], ...), [B]
        self.begun("observe")
        self.features.observe(features, starts)

    def rollback(self, n_valid: torch.Tensor) -> None:  # [B]
        super().rollback(n_valid)
        self.features.rollback(n_valid)
        if self.caches is not None:
            n = n_valid.to(self.caches[0].device, torch.long)
            for d, cache in enumerate(self.caches, start=1):  # row i of depth d read x_{i+d}: kept iff i + d < n_valid
                cache.truncate(torch.minimum(cache.lengths, (n - d).clamp(min=0)), check=False)

    def true_rows(self, d: int) -> torch.Tensor:  # [B]
        """How many leading rows of depth d (1-based) the draft holds, computed from true inputs only."""
        B = self.begun("true_rows")
        if self.caches is None:
            return torch.zeros(B, dtype=torch.long)
        return self.caches[d - 1].lengths.clone()

    def _allocate(self, B: int) -> None:
        # Rows never exceed the run's longest row (`Draft.run_rows`, else the window); padding rows of one pass
        # can reach up to that many further. Allocated once per generation.
        n = 2 * (self.run_rows or self.target.config.n_positions)
        p = next(self.modules[0].parameters())
        self.caches = [m.new_cache(B, n) for m in self.modules]
        self.outputs = [torch.zeros((B, n, self.n_embd), dtype=p.dtype, device=p.device) for _ in self.modules]

    def _run(self, d: int, h_prev: torch.Tensor, tok: torch.Tensor, pos: torch.Tensor) -> torch.Tensor:
        """Module d over new rows after its cache: h_prev [B, W, C], tok [B, W] ids, pos [B, W] -> h^d [B, W, C]."""
        tr = self.target.transformer
        self.passes += 1
        return self.modules[d - 1](h_prev, tr.wte(tok), tr.wpe(pos.clamp(max=self.target.config.n_positions - 1)),
                                   cache=self.caches[d - 1], check=False)

    @torch.no_grad()
    def propose(
        self,
        tokens: torch.Tensor,  # [B, L] buffer; row b holds lengths[b] valid tokens
        lengths: torch.Tensor,  # [B]
        k: int,
        params: SamplingParams,
        generator: torch.Generator | None = None,
    ) -> tuple[torch.Tensor, torch.Tensor]:  # drafts [B, k], q [B, k, V]
        k = check_k(k, self.max_k, f"this MTP draft has {self.depth} modules: module d drafts position d")
        self.begun()
        t = self.features.scored(tokens, lengths)  # [B] the newest scored position
        B, dtype = tokens.shape[0], self.target.lm_head.weight.dtype
        if k == 0:
            return self.empty(tokens, dtype)
        if t is None:  # a one-token prompt: nothing scored yet
            return repeat_prompt(tokens, k, self.vocab_size, dtype)
        if self.caches is None:
            self._allocate(B)
        lengths = t + 2
        # The buffer followed by the drafts so far: x_u for u < length is true, x_{length + j} is draft j + 1.
        ext = torch.cat([tokens, tokens.new_zeros((B, k))], 1)  # [B, L + k]
        drafts: list[torch.Tensor] = []  # [B] each
        qs: list[torch.Tensor] = []  # [B, V] each
        for d in range(1, k + 1):
            h_t = self._depth_pass(d, ext, t)  # [B, 1, C]: h^d at row t
            logits = self.modules[d - 1].logits(h_t, self.target.lm_head)[:, 0]  # [B, V]: x_{t+1+d}
            x, q = draw(logits, params, generator)
            drafts.append(x)
            qs.append(q)
            ext.scatter_(1, (lengths + d - 1)[:, None], x[:, None])
        return torch.stack(drafts, 1), torch.stack(qs, 1)

    def _depth_pass(self, d: int, ext: torch.Tensor, t: torch.Tensor) -> torch.Tensor:  # -> [B, 1, C]
        """Module d over its rows from the cached ones to t, in one pass; it keeps the true rows (<= t + 1 - d).

        Row i reads h^{d-1}_i (the target's feature for d = 1, else depth d-1's output, which
        this step has just written up to row t) and x_{i+d} from `ext`. A batch row with fewer
        new rows than the widest is padded at the end, which causal attention keeps from its
        real rows. Every output row goes to depth d's buffer, so that depth d+1 can read rows
        up to t; the cache is then truncated to the true rows, which alone count as held.
        """
        cache = self.caches[d - 1]
        keep = (t + 2 - d).clamp(min=0)  # rows 0 .. t+1-d read true tokens only
        start = torch.minimum(cache.lengths, keep)  # [B]
        W, most = torch.stack([(t + 1 - start).max(), keep.max()]).tolist()  # one read back per depth
        cache.truncate(start, check=False, bound=most)
        if W > 0:
            rows = start[:, None] + torch.arange(W, device=t.device)  # [B, W]; rows > t[b] are padding
            prev = self.features.buffers[0] if d == 1 else self.outputs[d - 2]
            tok = ext.gather(1, (rows + d).clamp(max=ext.shape[1] - 1))
            out = self._run(d, pick(prev, rows.clamp(max=prev.shape[1] - 1)), tok, rows + d)  # [B, W, C]
            self.outputs[d - 1].scatter_(1, rows[..., None].expand(*rows.shape, self.n_embd), out)
            cache.truncate(keep, check=False, bound=most)  # keep <= start + W: only padding rows go
        return pick(self.outputs[d - 1], t[:, None])
