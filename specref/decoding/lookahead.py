"""Lookahead decoding (Fu, Bailis, Stoica, Zhang 2024): Jacobi n-grams made and verified in one target pass.

No draft model: the target itself guesses. Each row keeps

* a 2-D *window* of N - 1 levels x W columns: level m (1 .. N-1), column i holds a guess
  for the token at relative position m + i after the last token (the root, position 0);
  the levels are the trajectories of the previous Jacobi iterations, oldest first;
* an *n-gram pool*: for each first token, up to G (N-1)-token continuations, most recent kept.

One step, per row, is ONE target pass over

    [root | window, level-major: L1[0..W-1], L2[0..W-1], .., L(N-1)[0..W-1] | trie of candidates, breadth-first]

with positions root + depth and this mask (True = may attend; the cached context is always visible):

* lookahead branch (the paper's mask): cell (m, i) sees the root, level 1's cells 0..i and
  the cells of its own column at levels 2..m. So each cell sees one chain,
  root -> L1[0] -> .. -> L1[i] -> L2[i] -> .. -> Lm[i], at consecutive positions: the branch is
  a tree (the "trunk" level 1, a column hanging from each trunk cell), and its mask and
  positions come from `tree_attention_mask` / `tree_position_ids` of that tree.
* verification branch: the pool's candidates whose first token is the root, merged into a trie
  (a `Tree` with deterministic, distinct children); each node sees the root and its ancestors.
* neither branch sees the other.

After the pass:

1. Verification: `verify_tree_greedy` (greedy) or `verify_tree` (sampling) on the trie, with
   p after the root and after each trie node. The candidates are fixed tokens, so q is one-hot
   and the multi-candidate rule is exact at any temperature (see `specref.trees`): greedy
   output is the target's greedy output token for token, sampled output follows the target.
2. Jacobi update: the target's argmax at each top-level cell L(N-1)[i] is the new guess for
   position N + i. Column i's n-gram (L1[i], L2[i], .., L(N-1)[i], new[i]) goes into the pool
   (key L1[i]) once every level past the first is a model output (from the (N-1)-th step on:
   the window starts from the prompt's tokens), then the levels shift: level 1 is dropped and
   the new guesses become level N-1. The window moves with the root, one position per step.
3. The cache keeps context + root + the accepted trie path (`keep_path`); the lookahead
   branch's entries are never kept.

Cost: a pass processes 1 + W (N-1) + (trie nodes <= G (N-1)) tokens instead of k + 1;
`LookaheadStats.processed_per_step` reports it next to `tokens_per_step`.

Which loop: `lookahead_generate` runs the one generation loop (`loop.decode`) over its own
step, and the step ends with the tree step's commit (`tree.commit_tree`). The step is its own
because the lookahead branch rides in the same target pass as the trie, and its outputs flow
back into the window and pool; `tree_step` scores only a draft's tree and hands it no logits.

Near the end of the budget the candidates are cut to what can still be emitted; near the end of
the context window they are cut to what fits, and the lookahead branch is left out of the pass
when it no longer fits (those steps neither update the window nor the pool).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from functools import lru_cache, partial

import torch

from .._validate import check_int
from ..models.gpt2 import unchecked
from ..models.kvcache import KVCache
from ..sampling import SamplingParams
from ..trees import ROOT, Tree, TreeResult, tree_attention_mask, tree_position_ids, verify_tree, verify_tree_greedy
from .inputs import check_model
from .loop import Sequences, StepObserver, clock, decode
from .tree import TreeSpecStats, commit_tree

# -- the lookahead branch's shape ---------------------------------------------------------------


@lru_cache(maxsize=32)
def _window_pattern(window: int, ngram: int) -> tuple[torch.Tensor, torch.Tensor]:  # mask [L, L], depths [L]
    """The lookahead branch as a tree, reordered level-major: cell (m, i) at index (m - 1) * W + i."""
    W, M = window, ngram - 1
    cells = [(m, i) for m in range(1, M + 1) for i in range(W)]

    def parent(c: tuple[int, int]) -> tuple[int, int] | None:  # the previous token of the cell's chain
        m, i = c
        if m == 1:
            return None if i == 0 else (1, i - 1)
        return (m - 1, i)

    # `Tree` wants breadth-first order: by depth (m + i), then by the parent's place.
    index: dict[tuple[int, int], int] = {}
    bfs: list[tuple[int, int]] = []
    for d in range(1, W + M):
        level = [c for c in cells if c[0] + c[1] == d]
        level.sort(key=lambda c: ROOT if parent(c) is None else index[parent(c)])
        for c in level:
            index[c] = len(bfs)
            bfs.append(c)
    parents = [ROOT if parent(c) is None else index[parent(c)] for c in bfs]
    # Only the shape matters for the mask: node indices stand in for tokens (the window's
    # tokens may repeat among siblings, which a deterministic Tree refuses).
    shape = Tree(parents, list(range(len(bfs))))
    perm = torch.tensor([index[c] for c in cells], dtype=torch.long)
    mask = tree_attention_mask(shape)[perm][:, perm]  # [L, L]
    depths = tree_position_ids(shape, 0)[perm]  # [L]: m + i
    return mask, depths


def lookahead_layout(
    trie: Tree,
    start: int,
    window: int | None = None,
    ngram: int | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:  # mask [T, T] bool, positions [T] long
    """One row's pass: [root, window level-major (if window and ngram are given), trie breadth-first].

    T = 1 + W (N - 1) + trie.n_nodes. mask[i, j] says whether token i sees token j (the cached
    context is always visible); positions are start + depth, start being the root's position.
    The returned mask may be shared between calls: do not modify it.
    """
    if not isinstance(trie, Tree):
        raise TypeError(f"trie must be a specref.trees.Tree, got {type(trie).__name__}")
    check_int("start", start, 0, "the root's position")
    if window is not None:
        check_int("window", window, 1, "columns")
        check_int("ngram", ngram, 2, "the n-gram size")
    mask, depths = _layout_pattern(trie.parents, window, ngram)
    return mask, start + depths


@lru_cache(maxsize=4096)
def _layout_pattern(
    parents: tuple[int, ...], window: int | None, ngram: int | None
) -> tuple[torch.Tensor, torch.Tensor]:  # mask [T, T], depths [T]
    """The mask [T, T] and depths [T] of [root, window, trie]: they depend on the trie's shape only, not its tokens."""
    trie = Tree(parents, list(range(len(parents))))  # node indices stand in for tokens: only the shape matters
    if window is None:
        L, la_mask, la_depths = 0, torch.zeros((0, 0), dtype=torch.bool), torch.zeros(0, dtype=torch.long)
    else:
        la_mask, la_depths = _window_pattern(window, ngram)
        L = la_mask.shape[0]
    n = trie.n_nodes
    T = 1 + L + n
    mask = torch.zeros((T, T), dtype=torch.bool)
    mask[:, 0] = True  # everything sees the root
    mask[1 : 1 + L, 1 : 1 + L] = la_mask
    mask[1 + L :, 1 + L :] = tree_attention_mask(trie)
    depths = torch.cat([torch.zeros(1, dtype=torch.long), la_depths, tree_position_ids(trie, 0)])
    return mask, depths


def _stack(layouts: list[tuple[torch.Tensor, torch.Tensor]]) -> tuple[torch.Tensor, torch.Tensor]:
    """Pad to the longest row: a padding entry sees only itself, at the root's position; its output is dropped."""
    T = max(m.shape[0] for m, _ in layouts)
    mask = torch.eye(T, dtype=torch.bool).repeat(len(layouts), 1, 1)  # [B, T, T]
    pos = torch.zeros((len(layouts), T), dtype=torch.long)  # [B, T]
    for b, (m, p) in enumerate(layouts):
        n = m.shape[0]
        mask[b, :n, :n] = m
        pos[b, :n] = p
        pos[b, n:] = p[0]
    return mask, pos


def candidate_trie(candidates: Sequence[Sequence[int]], max_depth: int, max_nodes: int) -> Tree:
    """The candidates (token sequences after the root) merged into one trie, cut to max_depth and max_nodes.

    Candidates are taken in order; shared prefixes become one node; a candidate that would
    exceed max_nodes keeps only the prefix that fits. Children are tried in the order they appear.
    """
    check_int("max_depth", max_depth, 0, "the deepest trie node")
    check_int("max_nodes", max_nodes, 0, "trie nodes")
    nodes: dict[tuple[int, ...], int] = {}  # prefix -> insertion order
    for cand in candidates:
        for d in range(1, min(len(cand), max_depth) + 1):
            prefix = tuple(cand[:d])
            if prefix not in nodes:
                if len(nodes) >= max_nodes:
                    break
                nodes[prefix] = len(nodes)
    index: dict[tuple[int, ...], int] = {(): ROOT}
    parents: list[int] = []
    tokens: list[int] = []
    for d in range(1, max((len(p) for p in nodes), default=0) + 1):  # breadth-first: parents never decrease
        level = sorted((p for p in nodes if len(p) == d), key=lambda p: (index[p[:-1]], nodes[p]))
        for p in level:
            index[p] = len(parents)
            parents.append(index[p[:-1]])
            tokens.append(p[-1])
    return Tree(parents, tokens)  # deterministic: a trie's siblings are distinct


# -- the per-row state ---------------------------------------------------------------------------


class LookaheadState:
    """Each row's Jacobi window (N - 1 levels x W guesses) and n-gram pool (first token -> up to G continuations)."""

    def __init__(self, window: int, ngram: int, guesses: int) -> None:
        self.window = check_int("window", window, 1, "W, the lookahead window's columns")
        self.ngram = check_int("ngram", ngram, 2, "N, the n-gram size; N = 2 is Jacobi decoding")
        self.guesses = check_int("guesses", guesses, 1, "G, the candidates verified per step")
        self.levels: list[list[list[int]]] = []  # [B][N-1][W]
        self.pools: list[dict[int, dict[tuple[int, ...], None]]] = []  # [B] first token -> continuations, oldest first
        self.updates: list[int] = []  # [B] Jacobi updates so far

    def begin(self, input_ids: torch.Tensor, pool_from_prompt: bool = False) -> None:  # [B, T]
        """Fill each row's window from its prompt's tokens, cycled (deterministic, so greedy needs no generator)."""
        W, M = self.window, self.ngram - 1
        self.levels, self.pools, self.updates = [], [], []
        for row in input_ids.tolist():
            flat = [row[j % len(row)] for j in range(W * M)]
            self.levels.append([flat[m * W : (m + 1) * W] for m in range(M)])
            self.pools.append({})
            self.updates.append(0)
            if pool_from_prompt:
                for j in range(len(row) - M):
                    self.add(len(self.pools) - 1, row[j], tuple(row[j + 1 : j + 1 + M]))

    def add(self, b: int, first: int, rest: tuple[int, ...]) -> None:
        """Put an n-gram into row b's pool as its most recent; past G continuations the oldest goes."""
        conts = self.pools[b].setdefault(first, {})
        conts.pop(rest, None)
        conts[rest] = None
        if len(conts) > self.guesses:
            del conts[next(iter(conts))]

    def candidates(self, b: int, root: int) -> list[tuple[int, ...]]:
        """Row b's continuations of `root`, most recent first (at most G)."""
        return list(reversed(self.pools[b].get(root, {})))

    def advance(self, b: int, new: list[int]) -> None:
        """One Jacobi update of row b: collect the columns' n-grams, drop level 1, append the new guesses."""
        levels = self.levels[b]
        if self.updates[b] >= self.ngram - 2:  # levels 2 .. N-1 are all model outputs
            for i in range(self.window):
                self.add(b, levels[0][i], tuple(levels[m][i] for m in range(1, self.ngram - 1)) + (new[i],))
        self.levels[b] = levels[1:] + [list(new)]
        self.updates[b] += 1

    def pool_size(self) -> int:
        """n-grams held, over all rows."""
        return sum(len(c) for pool in self.pools for c in pool.values())


# -- stats and the step --------------------------------------------------------------------------


@dataclass
class LookaheadStats(TreeSpecStats):
    """TreeSpecStats for lookahead (k = N - 1, nodes = trie nodes verified), plus what each pass processed."""

    window: int = 0
    ngram: int = 0
    guesses: int = 0
    processed: int = 0  # tokens the passes processed, over row-steps: 1 + lookahead branch + verification branch
    lookahead_tokens: int = 0  # the lookahead branch's share of `processed`
    pool_ngrams: int = 0  # n-grams in the pools at the end

    @property
    def processed_per_step(self) -> float:
        """Mean tokens one target pass processed per sequence: the compute lookahead spends per step."""
        return self.processed / max(self.steps, 1)

    @property
    def tokens_per_processed(self) -> float:
        """Tokens emitted per token processed: 1 for plain decoding, lower when guesses are wasted."""
        return self.emitted / max(self.processed, 1)

    def as_dict(self) -> dict[str, float | int | list[int] | str]:
        d = super().as_dict()
        d.update(window=self.window, ngram=self.ngram, guesses=self.guesses, processed=self.processed,
                 lookahead_tokens=self.lookahead_tokens, processed_per_step=self.processed_per_step,
                 tokens_per_processed=self.tokens_per_processed, pool_ngrams=self.pool_ngrams)
        return d


@dataclass(frozen=True)
class LookaheadStep:
    """What one `lookahead_step` did (rows that were already done keep nothing)."""

    windows: list[list[list[int]] | None]  # [B] the window fed ([N-1][W], level 1 first), None if left out
    tries: list[Tree]  # [B] the verification branch
    logits: torch.Tensor  # [B, T, V] the pass: row 0 after the root, 1 .. L the window, then the trie
    results: list[TreeResult]  # [B] accepted trie path and emitted tokens
    kept: list[int]  # [B] tokens each row appended
    processed: list[int]  # [B] real (unpadded) tokens of each row in the pass; 0 for a row already done


@torch.no_grad()
def lookahead_step(
    target: torch.nn.Module,
    state: LookaheadState,
    seqs: Sequences,
    cache: KVCache,  # the target's: every token of each unfinished row but its last
    params: SamplingParams,
    generator: torch.Generator | None = None,
    eos_token_id: int | None = None,
    stats: LookaheadStats | None = None,
) -> LookaheadStep:
    """One lookahead step for every unfinished row: candidates from the pool, one pass with both branches,
    verify the trie, update the window and pool, commit, keep context + accepted path in the cache."""
    if not isinstance(state, LookaheadState):
        raise TypeError(f"state must be a LookaheadState (the windows and pools), got {type(state).__name__}")
    W, N = state.window, state.ngram
    stats = LookaheadStats(k=N - 1, window=W, ngram=N, guesses=state.guesses) if stats is None else stats
    dev, B, n_ctx = seqs.tokens.device, seqs.batch_size, target.config.n_positions
    active = [not d for d in seqs.done_h]
    longest = max((n for n, a in zip(seqs.lengths_h, active) if a), default=1)
    # Slots for root + nodes after the cached context (done rows hold no cache), and depths that stay in the window;
    # the cache was allocated once for the run and never grows.
    slots = min(n_ctx, cache.max_len) - (longest - 1)
    max_depth = max(0, min(seqs.tokens_left() - 1, n_ctx - longest))  # the last token always comes from the target
    L = W * (N - 1)
    roots = seqs.last_tokens()[:, 0]  # [B]
    roots_h = roots.tolist()
    # 1. Draft: each row's candidates that start at its root, as a trie; the window if it fits.
    with clock(stats, "time_draft", dev):
        empty = Tree((), ())
        tries = [candidate_trie(state.candidates(b, roots_h[b]), max_depth, slots - 1) if active[b] else empty
                 for b in range(B)]
        widest = max(t.n_nodes for t in tries)
        use_window = 1 + L + widest <= slots and (longest - 1) + W + N - 2 < n_ctx
        windows = [[list(lv) for lv in state.levels[b]] if use_window and active[b] else None for b in range(B)]
        layouts = [lookahead_layout(tries[b], seqs.lengths_h[b] - 1, *((W, N) if windows[b] else ()))
                   for b in range(B)]
        mask, pos = _stack(layouts)  # [B, T, T], [B, T]
        ids = torch.zeros(pos.shape, dtype=torch.long)
        ids[:, 0] = roots.cpu()
        for b in range(B):
            if windows[b] is not None:
                ids[b, 1 : 1 + L] = torch.tensor([x for lv in windows[b] for x in lv])
            if tries[b].n_nodes:
                off = 1 + (L if windows[b] is not None else 0)
                ids[b, off : off + tries[b].n_nodes] = torch.tensor(tries[b].tokens)
    # 2. One target pass over both branches.
    with clock(stats, "time_target", dev):  # the unchecked pass: the generation checked its inputs
        logits = unchecked(target)(ids.to(dev), cache=cache, position_ids=pos.to(dev),
                                   attention_mask=mask.to(dev))  # [B, T, V]
    stats.target_passes += 1
    # 3. Verify each trie: p after the root (row 0) and after each trie node.
    offsets = [1 + (L if w is not None else 0) for w in windows]
    with clock(stats, "time_verify", dev):
        probs = None if params.greedy else params.probs(logits)  # [B, T, V] one call for every row
        results = []
        for b, t in enumerate(tries):
            if not active[b]:  # nothing to emit: no verification, no random draws
                results.append(TreeResult([0], [], []))
                continue
            src = logits if probs is None else probs
            rows = torch.cat([src[b, :1], src[b, offsets[b] : offsets[b] + t.n_nodes]])  # [n+1, V]
            results.append(verify_tree_greedy(t, rows) if probs is None else verify_tree(t, rows, generator))
    # 4. Jacobi update: the argmax at each top-level cell is the new guess one position further.
    with clock(stats, "time_draft", dev):
        if use_window:
            new = logits[:, 1 + (N - 2) * W : 1 + L].argmax(-1).tolist()  # [B, W]
            for b in range(B):
                if active[b]:
                    state.advance(b, new[b])
    # 5. Commit; the cache keeps context + root + the accepted trie path (never the window). A finished row
    # holds no cache (done rows' contexts are 0), which keeps room for the others.
    contexts = torch.tensor([n if a else 0 for n, a in zip(seqs.lengths_h, active)], device=cache.device)
    kept, _ = commit_tree(seqs, cache, tries, results, contexts, eos_token_id, stats,
                          offsets=[o - 1 for o in offsets], release_done=True)
    processed = [m.shape[0] if a else 0 for (m, _), a in zip(layouts, active)]
    served = [b for b in range(B) if kept[b]]
    stats.processed += sum(processed[b] for b in served)
    stats.lookahead_tokens += sum(L for b in served if windows[b] is not None)
    return LookaheadStep(windows, tries, logits, results, kept, processed)


@torch.no_grad()
def lookahead_generate(
    target: torch.nn.Module,
    input_ids: torch.Tensor,  # [B, T] or [T]
    max_new_tokens: int = 64,
    window: int = 5,
    ngram: int = 4,
    guesses: int = 5,
    temperature: float = 1.0,
    top_k: int | None = None,
    top_p: float | None = None,
    generator: torch.Generator | None = None,
    eos_token_id: int | None = None,
    pool_from_prompt: bool = False,
    on_step: StepObserver | None = None,
    timing: bool | None = None,
) -> tuple[torch.Tensor, LookaheadStats]:  # [B, T + max_new_tokens], stats
    """Lookahead decoding: the output distribution is exactly the target's (greedy: the same tokens).

    `window` W columns and `ngram` N (N - 1 levels) make the lookahead branch, `guesses` G caps
    the candidates verified per step. `pool_from_prompt` (an option of the reference
    implementation) also seeds the pool with the prompt's own n-grams. Exactly `max_new_tokens`
    tokens per row unless it emits `eos_token_id`. `on_step(step)`, if given, sees each step's
    `LookaheadStep` (`specref.decoding.loop.decode`); `timing` as in `speculative_generate`.
    """
    state = LookaheadState(window, ngram, guesses)  # raises on bad W, N, G
    check_model(target, "target")
    n_ctx = target.config.n_positions
    if 1 + (window + guesses) * (ngram - 1) > n_ctx:
        raise ValueError(f"window={window}, ngram={ngram}, guesses={guesses}: one pass would hold "
                         f"1 + (W + G)(N - 1) = {1 + (window + guesses) * (ngram - 1)} tokens, more than the "
                         f"target's context window n_positions={n_ctx}")
    if not isinstance(pool_from_prompt, bool):
        raise TypeError(f"pool_from_prompt must be a bool, got {pool_from_prompt!r}")
    stats = LookaheadStats(k=ngram - 1, window=window, ngram=ngram, guesses=guesses,
                           tree=f"lookahead(W={window}, N={ngram}, G={guesses})")
    step = partial(lookahead_step, target, state, generator=generator, eos_token_id=eos_token_id, stats=stats)
    # A pass holds more tokens than it keeps: room for one pass's window and candidates (`lookahead_step` keeps
    # a pass within the cache).
    out = decode(target, input_ids, max_new_tokens, (temperature, top_k, top_p), generator, eos_token_id, step,
                 stats, room=(window + guesses) * (ngram - 1),
                 begin=partial(state.begin, pool_from_prompt=pool_from_prompt), on_step=on_step, timing=timing)
    stats.pool_ngrams = state.pool_size()
    return out, stats
