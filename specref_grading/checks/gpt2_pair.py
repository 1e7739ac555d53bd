"""Graders for exercise 4: a KV-cached, temperature-sampled speculative decoder on the bundled GPT-2 pair.

The learner writes three functions with this contract (the exercise states it):

    propose(draft, draft_cache, seq, k, temperature, top_k, generator) -> (drafts, q)
        drafts: k token ids; q: [k, V], q[i] the processed distribution drafts[i] was sampled from.
        On entry draft_cache holds a prefix seq[:m] (m <= len(seq) - 1); the draft is fed seq[m:]
        and then its own drafts, one call each.
    speculative_step(target, draft, seq, target_cache, draft_cache, k, temperature, top_k, generator)
        -> the emitted tokens (1 to k + 1), seq unchanged.
        On entry target_cache holds seq[:-1]. ONE target call over [seq[-1], drafts]. On exit, with
        new = seq + emitted: target_cache holds new[:-1]; draft_cache holds new[:m'] with
        m' = len(new) - 1, or len(new) - 2 when every draft was accepted (the last draft was never fed).
    speculative_decode(target, draft, prompt, k, max_new_tokens, temperature, top_k, generator)
        -> exactly max_new_tokens new token ids.

What is graded, all on float64 copies of the pair, so no verdict depends on a CPU's float32 rounding:

* `check_propose`: q equals the draft's processed distributions recomputed from scratch, every draft
  lies in q's support, the draft cache holds seq + drafts[:-1] and equals a recompute, k draft calls;
* `check_speculative_step`: (b) one target pass per step; (d) after a step both caches hold what a
  recompute from scratch of the kept tokens gives, at the lengths above; greedy steps emit what the
  greedy rule emits; (c) the first two tokens of sampled generation follow the target's exact
  distribution (`distribution_test`), with power shown against broken decoders at the same N;
* `check_speculative_decode`: (a) greedy output equals the target's greedy output token for token;
  (b) at most one target pass per step plus one for the prompt; (c) those passes, replayed in order, decode the
  output by the greedy rule (`_greedy_replay`), as they must for `count_steps` too.

Task 4 times the learner's decoder against plain decoding on the grown target, with their own timing code. No
point depends on a timing. Graded exactly: `count_steps(target, draft, prompts, k, max_new_tokens)` ->
(new tokens, steps) on the grader's pair (`check_timed_counts`, `check_step_counts`), the counts of the run they
timed against the grader's count of the same run, and their prediction E / (v(k) + c k) recomputed from the
values they report (`check_prediction`). The explanation of the gap is graded by hand.

Every `check_*` function raises AssertionError with the input, the expected and the received
answer and a hint, or returns None and prints one line on success.
"""

from __future__ import annotations

import copy
import functools
import math
from collections.abc import Callable

import torch

from specref.checks.montecarlo import distribution_test
from specref.checks.pair_power import SAMPLING, exact_first_two, sampling_power  # noqa: F401 (the setup's tool)
from specref.models import heldout_prompts, load_pair
from specref.models.kvcache import KVCache
from specref.sampling import process_logits

from .report import as_float, as_int, as_ints, as_items, derived_seed, failure, passed
from .rules import graded

# The reference rule: the tasks write the speculative loop, so specref's own drafts and decoding loop are out
# of bounds; the rule itself (verify_chain), the models and process_logits stay allowed (the setup imports them).
# Task 4 times the learner's own decoder with their own timing code and predicts from their own numbers:
# specref's timing (specref.perf) and its speedup formulas (specref.theory) are out of bounds there.
FORBIDDEN = ("specref.decoding", "specref.drafts", "specref.perf", "specref.theory", "specref_grading")
ALLOWED = ("specref_grading.checks.gpt2_pair.SAMPLING_HIDDEN",
           "specref_grading.checks.gpt2_pair.check_first_two_tokens",
           "specref_grading.checks.gpt2_pair.check_propose",
           "specref_grading.checks.gpt2_pair.check_speculative_decode",
           "specref_grading.checks.gpt2_pair.check_speculative_step",
           "specref_grading.checks.gpt2_pair.check_timed_counts",
           "specref_grading.checks.gpt2_pair.check_step_counts",
           "specref_grading.checks.gpt2_pair.check_prediction", "specref.checks.pair_power.sampling_power")


# --------------------------------------------------------------------------------------
# The graded pair, in float64, and a model wrapper that counts and remembers passes
# --------------------------------------------------------------------------------------


@functools.lru_cache(maxsize=1)
def _pair64() -> tuple[torch.nn.Module, torch.nn.Module]:
    """The bundled pair converted to float64 (read-only for the graders: learners get wrappers)."""
    target, draft, _ = load_pair()
    return copy.deepcopy(target).double().eval(), copy.deepcopy(draft).double().eval()


class _Memo(torch.nn.Module):
    """A model seen through a counter and a memo of its cached forward passes.

    `calls` counts forward calls. A call `model(ids, cache=c)` on one sequence, with a cache this
    wrapper made (it records which token sits in each slot), is remembered by (tokens in the cache,
    new tokens): a repeat writes the remembered K/V into the cache and returns the remembered logits,
    exactly what the model would compute (same shapes, same float64 arithmetic). The sampling check
    runs thousands of steps over a handful of distinct inputs; the memo makes that fast. Anything
    else (no cache, masks, a cache the wrapper does not know) runs the real model.

    The model inside is not a public attribute nor a registered submodule (no `.model`, `children()`,
    `get_submodule`): learner code reaches it only through `forward`, so every pass it makes is counted.
    `fed` holds the token ids of each call on one sequence (None for any other input).
    """

    def __init__(self, model: torch.nn.Module, memo: dict | None = None) -> None:
        super().__init__()
        object.__setattr__(self, "_inner", model)  # bypasses nn.Module's registry: unreachable from public names
        self.config = model.config
        self.calls = 0
        self.inputs: list[int] = []  # the number of new tokens of each call
        self.fed: list[list[int] | None] = []  # the token ids of each call, [1, T] integer inputs only
        self.held: list[int | None] = []  # tokens in the cache before each call (0 without one; None: unreadable)
        self._memo: dict = {} if memo is None else memo

    def get_submodule(self, target: str) -> torch.nn.Module:
        """Only the wrapper itself: nn.Module's own version would look up any attribute, `_inner` among them."""
        if target:
            raise AttributeError(f"the pass counter has no submodule {target!r}")
        return self

    def get_parameter(self, target: str):
        raise AttributeError(f"the pass counter has no parameter {target!r}")

    def get_buffer(self, target: str):
        raise AttributeError(f"the pass counter has no buffer {target!r}")

    @property
    def device(self) -> torch.device:
        return self._inner.device

    @property
    def dtype(self) -> torch.dtype:
        return self._inner.dtype

    def new_cache(self, batch_size: int, max_len: int | None = None, device=None, dtype=None) -> KVCache:
        cache = self._inner.new_cache(batch_size, max_len, device, dtype)
        if batch_size == 1:
            cache._grader_tokens = []
        return cache

    def forward(self, input_ids, cache=None, position_ids=None, attention_mask=None, return_hidden=False,
                logits_to_keep=0):
        self.calls += 1
        one_row = (isinstance(input_ids, torch.Tensor) and input_ids.dim() == 2 and input_ids.shape[0] == 1
                   and not input_ids.is_floating_point() and input_ids.dtype != torch.bool)
        self.fed.append([int(t) for t in input_ids[0].tolist()] if one_row else None)
        self.held.append(0 if cache is None else int(cache.lengths[0]) if isinstance(cache, KVCache)
                         and cache.lengths.numel() == 1 else None)
        known = getattr(cache, "_grader_tokens", None)
        plain = (
            known is not None and position_ids is None and attention_mask is None and not return_hidden
            and isinstance(input_ids, torch.Tensor) and input_ids.dim() == 2 and input_ids.shape[0] == 1
            and not input_ids.is_floating_point() and input_ids.dtype != torch.bool and input_ids.shape[1] > 0
            and isinstance(logits_to_keep, int) and not isinstance(logits_to_keep, bool) and logits_to_keep >= 0
        )
        if not plain:
            if isinstance(input_ids, torch.Tensor) and input_ids.dim() == 2:
                self.inputs.append(int(input_ids.shape[1]))
            if cache is not None and hasattr(cache, "_grader_tokens"):
                del cache._grader_tokens  # slots written by a call we did not follow
            return self._inner(input_ids, cache, position_ids, attention_mask, return_hidden, logits_to_keep)
        n, T = int(cache.lengths[0]), int(input_ids.shape[1])
        self.inputs.append(T)
        new = tuple(input_ids[0].tolist())
        if len(known) < n or n + T > cache.max_len:
            del cache._grader_tokens
            return self._inner(input_ids, cache=cache, logits_to_keep=logits_to_keep)
        key = (tuple(known[:n]), new, logits_to_keep)
        if key in self._memo:
            logits, k_new, v_new = self._memo[key]
            cache.k[:, 0, :, n : n + T] = k_new
            cache.v[:, 0, :, n : n + T] = v_new
            cache.advance(T)
        else:
            logits = self._inner(input_ids, cache=cache, logits_to_keep=logits_to_keep)
            self._memo[key] = (logits, cache.k[:, 0, :, n : n + T].clone(), cache.v[:, 0, :, n : n + T].clone())
        cache._grader_tokens = list(key[0]) + list(new)
        return logits.clone()


def _learners_pair() -> tuple[torch.nn.Module, torch.nn.Module]:
    """Copies of the float64 pair for the learner's code, made once per check: what that code does to the models
    it is handed (weights written through .data, say) stays in its copies, never in `_pair64`, the reference
    every expected answer is computed from (in this check and in the later ones)."""
    target, draft = _pair64()
    return copy.deepcopy(target), copy.deepcopy(draft)


def _graded_pair(pair: tuple[torch.nn.Module, torch.nn.Module], memo: tuple[dict, dict] | None = None
                 ) -> tuple[_Memo, _Memo]:
    """Counting wrappers around `pair`: the learner's copies (`_learners_pair`), never the reference."""
    target, draft = pair
    return _Memo(target, memo[0] if memo else None), _Memo(draft, memo[1] if memo else None)


def _prefilled(model: _Memo, tokens: list[int], room: int) -> KVCache:
    """A cache of `model` holding `tokens`, with room for `room` more."""
    cache = model.new_cache(1, max_len=len(tokens) + room)
    if tokens:
        with torch.no_grad():
            model(torch.tensor([tokens]), cache=cache)
    return cache


def _clone(cache: KVCache) -> KVCache:
    out = cache.clone()
    if hasattr(cache, "_grader_tokens"):
        out._grader_tokens = list(cache._grader_tokens)
    return out


def _cache_error(model: torch.nn.Module, cache: object, tokens: list[int], name: str) -> str | None:
    """Why `cache` does not hold exactly `tokens` (checked against a recompute from scratch), or None."""
    if not isinstance(cache, KVCache):
        return f"{name} is not a KVCache (got {type(cache).__name__})"
    n = int(cache.lengths[0])
    if n != len(tokens):
        return f"{name} holds {n} tokens; it should hold {len(tokens)}"
    if n == 0:
        return None
    fresh = model.new_cache(1, max_len=n)
    with torch.no_grad():
        model(torch.tensor([tokens]), cache=fresh)
    for what, got, want in (("keys", cache.k, fresh.k), ("values", cache.v, fresh.v)):
        got = got[:, 0, :, :n].to(torch.float64)
        want = want[:, 0, :, :n]
        if not torch.allclose(got, want, rtol=1e-7, atol=1e-9):
            bad = (got - want).abs().amax(dim=(0, 1, 3))  # [n] worst difference per slot
            slot = int(torch.nonzero(bad > 1e-9)[0])
            return (f"{name}'s {what} at slot {slot} differ from a recompute of the kept tokens "
                    f"(slot {slot} should hold token {tokens[slot]} after {tokens[:slot][-3:]}...)")
    return None


def _as_token_list(out: object) -> list[int] | None:
    """Token ids by value (`as_ints`): a list, a tuple or a 1-D tensor of whole numbers."""
    if isinstance(out, torch.Tensor) and out.dim() != 1:
        return None
    return as_ints(out)


# --------------------------------------------------------------------------------------
# Exercise 4.1: drafting with the draft's own KV cache
# --------------------------------------------------------------------------------------

PROPOSE_CASES = (  # (prompt index, prompt tokens, k, temperature, top_k, tokens already in the draft cache)
    (0, 24, 4, 0.0, None, 23),  # greedy: q one-hot
    (1, 24, 3, 1.0, None, 23),  # full vocabulary
    (2, 20, 2, 0.7, 5, 18),  # two tokens to catch up on (the state after a step that accepted every draft)
)


@graded(1, "check_propose", FORBIDDEN, ALLOWED)
def check_propose(fn: Callable[..., object], cases=PROPOSE_CASES, seed: int = 0) -> None:
    """Grade propose(draft, draft_cache, seq, k, temperature, top_k, generator) -> (drafts, q)."""
    g = "check_propose"
    _, draft_real = _pair64()
    mine = _learners_pair()
    for n, (pi, n_tok, k, temp, top_k, m) in enumerate(cases, 1):
        seq = heldout_prompts(n=pi + 1, n_tokens=n_tok)[pi]
        _, draft = _graded_pair(mine)
        cache = _prefilled(draft, seq[:m], room=len(seq) - m + k + 1)
        draft.calls = 0
        draft.inputs = []
        where = f"wrong answer on case {n} of {len(cases)}."
        inputs = [f"len(seq) = {len(seq)}, draft_cache holds seq[:{m}], k = {k}, temperature = {temp}, top_k = {top_k}"]
        gen = torch.Generator().manual_seed(derived_seed(seed, "propose", n))
        with torch.no_grad(), torch.random.fork_rng(devices=[]):
            torch.manual_seed(derived_seed(seed, "global", n))
            try:
                out = fn(draft, cache, list(seq), k, temp, top_k, gen)
            except NotImplementedError:
                raise
            except Exception as e:  # noqa: BLE001 - the learner's error, shown with its input
                raise failure(g, where, inputs + [f"your function raised {type(e).__name__}: {e}"]) from e
        if as_items(out, 2) is None:
            raise failure(g, where, inputs + [f"got {type(out).__name__}"], "return a pair (drafts, q).")
        out = tuple(as_items(out, 2))
        drafts = _as_token_list(out[0])
        q = out[1]
        if drafts is None or len(drafts) != k:
            raise failure(g, where, inputs + [f"got drafts = {out[0]!r}"], f"drafts must be {k} int token ids.")
        V = draft.config.vocab_size
        if not isinstance(q, torch.Tensor) or tuple(q.shape) != (k, V):
            shape = tuple(q.shape) if isinstance(q, torch.Tensor) else type(q).__name__
            raise failure(g, where, inputs + [f"got q of shape {shape}"], f"q must be a [k, V] = [{k}, {V}] tensor.")
        with torch.no_grad():
            logits = draft_real(torch.tensor([seq + drafts]))[0, len(seq) - 1 : len(seq) - 1 + k]  # [k, V]
        want = process_logits(logits, temp, top_k)
        got = q.detach().to(torch.float64)
        if not torch.allclose(got, want, rtol=1e-6, atol=1e-9):
            i = int(((got - want).abs().amax(-1) > 1e-9).nonzero()[0])
            hint = (f"q[{i}] must be process_logits(logits, temperature, top_k) of the draft's logits after "
                    f"seq + drafts[:{i}]: the distribution drafts[{i}] was sampled from.")
            raw = torch.softmax(logits[i], -1)
            if torch.allclose(got[i], raw, atol=1e-9) and not torch.allclose(want[i], raw, atol=1e-9):
                hint += " Yours looks unprocessed (a plain softmax): process q exactly as p will be."
            raise failure(g, where, inputs + [f"q[{i}] differs from the draft's processed distribution"], hint)
        for i, x in enumerate(drafts):
            if not 0 <= x < V or float(want[i, x]) <= 0:
                raise failure(g, where, inputs + [f"drafts = {drafts}"],
                            f"drafts[{i}] = {x} has probability 0 under q[{i}]: sample each draft from its q.")
        err = _cache_error(draft_real, cache, seq + drafts[:-1], "the draft cache")
        if err:
            raise failure(g, where, inputs + [err],
                        "on exit the draft cache holds seq + drafts[:-1], grown from what it held on entry; never "
                        "recompute the whole sequence.")
        if draft.calls > k:
            raise failure(g, where, inputs + [f"{draft.calls} draft calls for k = {k}"],
                        f"the contract allows at most k = {k} draft calls per proposal.")
    passed(g, f"{len(cases)} cases: q, drafts, the draft cache and {sum(c[2] for c in cases)} draft calls")


# --------------------------------------------------------------------------------------
# Exercise 4.2: one speculative step, with rollback of both caches
# --------------------------------------------------------------------------------------

# The sampling check. The setting is chosen for power, not realism: after held-out prompt 15 cut to
# 30 tokens, at temperature 0.7 and top-k 3, the target's first token has three possible values
# (about 0.50, 0.41, 0.09) and the draft disagrees on half the mass: beta = sum min(p, q) = 0.50. The
# first two tokens then take 9 cells. `sampling_power` computes the effect sizes exactly (float64,
# by enumerating the broken rules) and tests/grading/test_ex04.py holds them to these numbers: per
# sample, the chi-square non-centrality of the first token alone is 0.25 for skipping the residual and
# 0.53 for a q handed to the rule unprocessed (softmax at temperature 1, no top-k). At N = 2000 that
# is 500 and 1060, against a critical value of 29.6 (chi-square, 8 dof, level SAMPLING_ALPHA = 2.5e-4): each
# is flagged with probability 1 - 1e-30 or so. In TV, the bugs move the first token by 0.25 and 0.36; the test's
# TV bound at N = 2000 over 9 cells is 0.057 (over the full 4096-token vocabulary it would be 0.84).
# A target cache never rolled back changes the second token after every rejected first draft (half the
# runs) and is flagged too; the greedy and cache checks catch it first.
# False-fail rate: the grader draws a fresh seed for every grading, so a correct decoder's verdict is a random
# draw. It fails when the chi-square p-value is below SAMPLING_ALPHA (probability SAMPLING_ALPHA, to the
# chi-square approximation, cells expected below 5 pooled), or the TV exceeds its Bretagnolle-Huber-Carol bound
# (probability below SAMPLING_ALPHA), or the first drafts accepted fall outside N beta +- 6 sd (below 1e-9 a side): at
# most 2 SAMPLING_ALPHA + 2e-9 = 5e-4 per check, 1 in 2,000 (tests/grading/test_false_fail.py measures it).
# The hidden setting (prompt 31, 9 tokens, top-k 4, k = 1): beta 0.50, TV 0.25 and 0.30, 16 cells.
SAMPLING_HIDDEN = {"prompt": 31, "n_tokens": 9, "k": 1, "temperature": 0.7, "top_k": 4, "n": 2000}
SAMPLING_ALPHA = 2.5e-4  # the distribution test's level: a correct decoder fails at most 2 x this (see above)
FALSE_FAIL_RATE = 2 * SAMPLING_ALPHA + 2e-9  # check_first_two_tokens on a correct decoder, at a random seed


def _first_beta(prompt: list[int], temperature: float, top_k: int | None) -> float:
    """sum_x min(p(x), q(x)) after `prompt`: the probability a step's first draft is accepted there."""
    target, draft = _pair64()
    with torch.no_grad():
        p = process_logits(target(torch.tensor([prompt]))[0, -1], temperature, top_k)
        q = process_logits(draft(torch.tensor([prompt]))[0, -1], temperature, top_k)
    return float(torch.minimum(p, q).sum())


def _greedy_reference_step(prompt: list[int], k: int) -> list[int]:
    """What a greedy step emits after `prompt`: the draft's greedy drafts, then the greedy rule."""
    target, draft = _pair64()
    seq = list(prompt)
    drafts: list[int] = []
    with torch.no_grad():
        for _ in range(k):
            drafts.append(int(draft(torch.tensor([seq + drafts]))[0, -1].argmax()))
        best = target(torch.tensor([seq + drafts]))[0, len(seq) - 1 :].argmax(-1).tolist()
    out = []
    for i, x in enumerate(drafts):
        if x != best[i]:
            break
        out.append(x)
    return out + [best[len(out)]]


def _step_cases() -> list[tuple[str, list[int], int, float, int | None, int]]:
    """(label, seq, k, temperature, top_k, seed): a greedy step rejecting its first draft, one accepting
    all of them, and sampled steps (full vocabulary and top-k) started from several prompts."""
    prompts = heldout_prompts(n=12, n_tokens=24)
    cases = []
    reject = next(p for p in prompts if len(_greedy_reference_step(p, 3)) == 1)
    accept = next(p for p in prompts if len(_greedy_reference_step(p, 2)) == 3)
    cases.append(("greedy, the first draft is rejected", reject, 3, 0.0, None, 0))
    cases.append(("greedy, every draft is accepted", accept, 2, 0.0, None, 0))
    for i, (temp, top_k) in enumerate([(1.0, None), (0.7, 3), (1.0, 5), (0.8, None)] * 2):
        cases.append((f"sampled, temperature {temp}, top_k {top_k}", prompts[i + 2], 4, temp, top_k, i + 1))
    return cases


# A step's emission is tied to the passes counted on the models the check handed out (`_step_outcome`): the drafts
# the target's one pass scored were fed to that draft (all but the last, in order) and lie in q's support, and what
# the step emitted is an outcome the rule can give from those p and q (float64, recomputed here). A step that decodes
# on models of its own and books one pass on fake drafts emits what no counted pass could have given.
SUPPORT_RTOL = 1e-6  # a float32 learner's p(x) vs q(x) near a tie: a rejection within this is not held against it


@functools.lru_cache(maxsize=1 << 14)
def _step_outcome(seq: tuple[int, ...], drafts: tuple[int, ...], emitted: tuple[int, ...], temperature: float,
                  top_k: int | None) -> str | None:
    """Why `emitted` is no outcome of the speculative rule on `drafts` after `seq`, or None.

    With p_i, q_i the processed target and draft after seq + drafts[:i] (float64), an outcome accepts drafts[:j]
    (each p_i(d_i) > 0) and then emits y: after a rejection of d_j (q_j(d_j) > p_j(d_j)) a y of the residual's
    support (p_j(y) > q_j(y)); after k acceptances a y with p_k(y) > 0. Every draft lies in q's support."""
    target, draft = _pair64()
    n, k, j, y = len(seq), len(drafts), len(emitted) - 1, emitted[-1]
    ids = torch.tensor([list(seq) + list(drafts)])
    with torch.no_grad():
        p = process_logits(target(ids)[0, n - 1 :], temperature, top_k)  # [k + 1, V]
        q = process_logits(draft(ids)[0, n - 1 : n - 1 + k], temperature, top_k)  # [k, V]
    slack = 1 - SUPPORT_RTOL
    for i, d in enumerate(drafts):
        if float(q[i, d]) <= 0:
            return f"draft {i} ({d}) has probability 0 under the draft's q: the draft never proposed it"
    if any(float(p[i, d]) <= 0 for i, d in enumerate(drafts[:j])):
        return "an accepted draft has probability 0 under p: the rule never accepts it"
    if j == k:
        return None if float(p[k, y]) > 0 else f"the bonus token {y} has probability 0 under p"
    if not float(p[j, drafts[j]]) < slack * float(q[j, drafts[j]]):
        return f"draft {j} ({drafts[j]}) has p >= q: the rule accepts it, never rejects it"
    if not float(p[j, y]) > slack * float(q[j, y]):
        return f"token {y} after rejecting draft {j} is outside the residual's support (p <= q there)"
    return None


def _run_step(fn, target, draft, seq, tc, dc, k, temp, top_k, gen, g, where, inputs):
    seq_in = list(seq)
    before, draft_before, draft_fed = target.calls, draft.calls, len(draft.fed)
    try:
        with torch.no_grad():
            out = fn(target, draft, seq_in, tc, dc, k, temp, top_k, gen)
    except NotImplementedError:
        raise
    except Exception as e:  # noqa: BLE001 - the learner's error, shown with its input
        raise failure(g, where, inputs + [f"your step raised {type(e).__name__}: {e}"]) from e
    emitted = _as_token_list(out)
    if seq_in != list(seq):
        raise failure(g, where, inputs, "your step changed `seq`; return the emitted tokens and let the loop append them.")
    if emitted is None or not 1 <= len(emitted) <= k + 1:
        raise failure(g, where, inputs + [f"got {out!r}"],
                    f"return the emitted tokens as a list of 1 to k + 1 = {k + 1} ints.")
    if target.calls - before != 1:
        raise failure(g, where, inputs + [f"your step called the target {target.calls - before} times"],
                    "a step makes exactly one target call, on the target cache: every p the rule needs comes "
                    "from it.")
    # Speculation happened: the draft proposed, the target scored [seq[-1], k drafts], and what the step
    # emitted before its last token is the accepted prefix of those drafts.
    if draft.calls == draft_before:
        raise failure(g, where, inputs + ["your step never called the draft"],
                    "a speculative step first lets the draft propose k tokens, then verifies them in one target pass.")
    fed = target.fed[-1]
    if fed is None or len(fed) != k + 1 or fed[0] != seq[-1]:
        shown = "not one [1, T] tensor of token ids" if fed is None else f"{len(fed)} token(s) starting with {fed[0]}"
        raise failure(g, where, inputs + [f"your target call was fed {shown}"],
                    f"the target pass scores seq[-1] and the k = {k} drafts: a [1, {k + 1}] tensor of token ids.")
    if emitted[:-1] != fed[1:len(emitted)]:
        raise failure(g, where, inputs + [f"the target scored drafts {fed[1:]}", f"your step emitted {emitted}"],
                    "every token a step emits but its last is an accepted draft, in order: the emitted tokens "
                    "start with the drafts the target scored.")
    why = None if _fed_in_order(draft.fed[draft_fed:], fed[1:-1]) else (
        f"the draft was not fed the drafts {fed[1:-1]} the target scored")
    if why is None and all(0 <= t < target.config.vocab_size for t in emitted):
        why = _step_outcome(tuple(seq), tuple(fed[1:]), tuple(emitted), float(temp), top_k)
    if why is not None:
        raise failure(g, where, inputs + [f"the target scored drafts {fed[1:]}", f"your step emitted {emitted}", why],
                    "the draft you are given proposes the drafts (fed back one by one), the target you are given "
                    "scores them in one pass, and the rule decides from those p and q: accepted drafts, then after a "
                    "rejection a token of the residual max(p - q, 0), after k acceptances one of p. The tokens a step "
                    "emits are an outcome of those counted passes, never of models of your own.")
    return emitted


def _check_caches(target_real, draft_real, seq, emitted, drafts_fed_all, tc, dc, g, where, inputs) -> None:
    new = list(seq) + emitted
    err = _cache_error(target_real, tc, new[:-1], "the target cache")
    if err:
        hint = "after the step the target cache must hold every token of seq + emitted but the last, and nothing else."
        raise failure(g, where, inputs + [f"emitted {emitted}", err], hint)
    m = int(dc.lengths[0]) if isinstance(dc, KVCache) else -1
    ok_lengths = {len(new) - 1} | ({len(new) - 2} if drafts_fed_all else set())
    if m not in ok_lengths:
        raise failure(g, where, inputs + [f"emitted {emitted}", f"the draft cache holds {m} tokens; it should hold "
                                        f"{' or '.join(str(x) for x in sorted(ok_lengths))}"],
                    "after the step the draft cache keeps every entry still valid for seq + emitted, and nothing "
                    "else.")
    err = _cache_error(draft_real, dc, new[:m], "the draft cache")
    if err:
        raise failure(g, where, inputs + [f"emitted {emitted}", err], "the draft cache must hold a prefix of seq + emitted.")


@graded(2, "check_speculative_step", FORBIDDEN, ALLOWED)
def check_speculative_step(fn: Callable[..., object], sampling: dict | None = None, seed: int = 0) -> None:
    """Grade speculative_step: one target pass, both caches against a recompute, greedy steps, and the
    exact distribution of the first two sampled tokens (see SAMPLING for the power argument)."""
    n_cases = _step_caches(fn, seed)
    n = _first_two_tokens(fn, sampling, seed)
    passed("check_speculative_step", f"{n_cases} steps match a recompute of both caches, one target pass each; "
                                      f"{n} sampled generations follow the target's exact distribution")


@graded(2, "check_step_caches", FORBIDDEN, ALLOWED)
def check_step_caches(fn: Callable[..., object], seed: int = 0) -> None:
    """(b) one target pass per step and (d) both caches equal a recompute after the step; greedy steps emit
    what the greedy rule emits."""
    n = _step_caches(fn, seed)
    passed("check_step_caches", f"{n} steps match a recompute of both caches, one target pass each")


def _step_caches(fn: Callable[..., object], seed: int) -> int:
    g = "check_speculative_step"
    target_real, draft_real = _pair64()
    V = target_real.config.vocab_size
    mine = _learners_pair()
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(derived_seed(seed, "global"))
        cases = _step_cases()
        for n, (label, seq, k, temp, top_k, case_seed) in enumerate(cases, 1):
            target, draft = _graded_pair(mine)
            tc = _prefilled(target, seq[:-1], room=k + 2)
            dc = _prefilled(draft, seq[:-1], room=k + 2)
            where = f"wrong answer on step case {n} of {len(cases)} ({label})."
            inputs = [f"len(seq) = {len(seq)}, k = {k}, temperature = {temp}, top_k = {top_k}",
                      "both caches hold seq[:-1]"]
            gen = torch.Generator().manual_seed(derived_seed(seed, "step", case_seed))
            emitted = _run_step(fn, target, draft, seq, tc, dc, k, temp, top_k, gen, g, where, inputs)
            if any(not 0 <= t < V for t in emitted):
                raise failure(g, where, inputs + [f"emitted {emitted}"], f"token ids lie in [0, {V}).")
            if temp == 0:
                want = _greedy_reference_step(seq, k)
                if emitted != want:
                    raise failure(g, where, inputs + [f"expected {want}", f"got      {emitted}"],
                                "greedy (temperature 0): p and q are one-hot on the argmax; accept drafts while they "
                                "equal the target's argmax, then emit the target's argmax.")
            _check_caches(target_real, draft_real, seq, emitted, len(emitted) == k + 1, tc, dc, g, where, inputs)
    return len(cases)


@graded(2, "check_first_two_tokens", FORBIDDEN, ALLOWED)
def check_first_two_tokens(fn: Callable[..., object], sampling: dict | None = None, seed: int = 0) -> None:
    """(c) the first two tokens of N sampled generations, each started from the same prefilled caches,
    against their exact distribution (`distribution_test`, level SAMPLING_ALPHA).

    False-fail rate at a random seed: at most FALSE_FAIL_RATE = 5e-4 (1 in 2,000) for a correct decoder (the
    chi-square and TV tests at SAMPLING_ALPHA = 2.5e-4 each, plus the 6-sd bounds on first-draft acceptances).
    """
    n = _first_two_tokens(fn, sampling, seed)
    passed("check_first_two_tokens", f"{n} sampled generations follow the target's exact distribution")


def _first_two_tokens(fn: Callable[..., object], sampling: dict | None, seed: int) -> int:
    g = "check_speculative_step"
    s = dict(SAMPLING if sampling is None else sampling)
    target_real, _ = _pair64()
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(derived_seed(seed, "global"))
        prompt = heldout_prompts(n=s["prompt"] + 1, n_tokens=s["n_tokens"])[s["prompt"]]
        k, temp, top_k, N = s["k"], s["temperature"], s["top_k"], s["n"]
        exact = exact_first_two(target_real, prompt, temp, top_k)
        cells = {c: i for i, c in enumerate(sorted(exact))}
        expected = torch.tensor([exact[c] for c in sorted(exact)] + [0.0], dtype=torch.float64)
        target, draft = _graded_pair(_learners_pair())
        tc0 = _prefilled(target, prompt[:-1], room=2 * (k + 1) + 2)
        dc0 = _prefilled(draft, prompt[:-1], room=2 * (k + 1) + 2)
        gen = torch.Generator().manual_seed(derived_seed(seed, "first_two_tokens"))
        counts = torch.zeros(len(expected), dtype=torch.long)
        accepted_first = 0  # generations whose first step accepted its first draft: P = beta at the prompt
        where = f"the first two sampled tokens do not follow the target's distribution ({N} generations)."
        inputs = [f"held-out prompt {s['prompt']} ({s['n_tokens']} tokens), k = {k}, temperature = {temp}, top_k = {top_k}"]
        for _ in range(N):
            seq, tc, dc, out = list(prompt), _clone(tc0), _clone(dc0), []
            while len(out) < 2:
                emitted = _run_step(fn, target, draft, seq, tc, dc, k, temp, top_k, gen, g,
                                    "running the sampling check.", inputs)
                accepted_first += not out and len(emitted) > 1
                out += emitted
                seq += emitted
            counts[cells.get(tuple(out[:2]), len(expected) - 1)] += 1
        beta = _first_beta(prompt, temp, top_k)
        sd = math.sqrt(N * beta * (1 - beta))  # a correct step falls outside N beta +- 6 sd with odds < 1e-9
        if accepted_first < N * beta - 6 * sd:
            raise failure(g, "the sampled steps rarely accept a draft.",
                          inputs + [f"{accepted_first} of {N} first steps accepted their first draft"],
                          "a draft x is accepted with probability min(1, p(x)/q(x)); a step that rejects every draft "
                          "(or samples from the target alone) emits the right distribution but does not speculate.")
        if accepted_first > N * beta + 6 * sd:
            raise failure(g, "the sampled steps accept more drafts than the rule can.",
                          inputs + [f"{accepted_first} of {N} first steps accepted their first draft, where "
                                    f"{beta:.3f} of them are expected"],
                          "a draft x is accepted with probability min(1, p(x)/q(x)): the drafts are the draft's "
                          "samples, not tokens chosen to be accepted.")
        test = distribution_test(expected, counts=counts, alpha=SAMPLING_ALPHA)
        if not test.passed:
            rows = [f"  {c}: expected {exact[c]:.4f}, observed {int(counts[i]) / N:.4f}" for c, i in cells.items()]
            if counts[-1]:
                rows.append(f"  outside the support: observed {int(counts[-1])} (expected 0)")
            raise failure(g, where, inputs + ["P(first two tokens):"] + rows + [str(test)],
                        "the rule is exact only for the p and q it is given: q the distribution each draft was "
                        "sampled from, p the target's, processed the same way.")
    return N


def _fed_in_order(fed: list[list[int] | None], tokens: list[int]) -> bool:
    """Whether `tokens` is a subsequence of everything the model was fed, call after call (drafts in between)."""
    stream = iter(t for call in fed if call is not None for t in call)
    return all(any(t == s for s in stream) for t in tokens)


def _greedy_steps(prompt: list[int], k: int, max_new_tokens: int, expected: list[int]) -> int:
    """Target passes a greedy speculative decoder needs after the prompt's pass (draft runs from scratch)."""
    return _greedy_run(tuple(prompt), k, max_new_tokens, tuple(expected))[0]


def _margin(logits: torch.Tensor) -> float:  # [V]
    """How far an argmax decision is from a tie: the best logit minus the second best."""
    top = logits.topk(2).values
    return float(top[0] - top[1])


@functools.lru_cache(maxsize=256)  # the step count and the replay's margin ask for the same run
def _greedy_run(prompt: tuple[int, ...], k: int, max_new_tokens: int, expected: tuple[int, ...]) -> tuple[int, float]:
    """(steps, margin): the steps of `_greedy_steps`, and the smallest `_margin` of the draft's argmax decisions."""
    _, draft = _pair64()
    steps, pos, margin = 0, 0, math.inf
    with torch.no_grad():
        while pos < max_new_tokens:
            seq, drafts = list(prompt + expected[:pos]), []
            for _ in range(k):
                logits = draft(torch.tensor([seq + drafts]))[0, -1]
                margin = min(margin, _margin(logits))
                drafts.append(int(logits.argmax()))
            n_acc = 0
            while n_acc < k and pos + n_acc < len(expected) and drafts[n_acc] == expected[pos + n_acc]:
                n_acc += 1
            pos += n_acc + 1
            steps += 1
    return steps, margin


# The decoder and count checks tie what was decoded to the target passes counted on the handed models
# (`_greedy_replay`): read in order, those passes must be a greedy speculative decoding of the target's own greedy
# output, each step's emission the greedy rule's outcome on that pass (`_step_outcome` at temperature 0: the drafts
# the draft's argmax choices, the accepted prefix and the correction the target's). Plain decoding on a model of the
# kernel's own with dummy passes booked to match the counts books passes that decode nothing. The rule is exact in
# float64. The learner decides on the handed float64 pair: its cached passes differ from this recompute by float64
# rounding (about 1e-12), or, if it casts the logits to float32, by half an ulp of a logit (2^-24 x 32 = 2e-6 for
# logits below 32 in magnitude, which tests/grading/test_ex04_decode_tied.py holds along the graded runs). A run
# whose smallest argmax margin (target or draft, float64) is below REPLAY_MARGIN, 50 times that, is not replayed.
REPLAY_MARGIN = 1e-4


def _greedy_replay(runs: list[tuple[list[int], list[int], int]], k: int, target: _Memo, draft: _Memo) -> str | None:
    """Why the target's counted passes are no greedy speculative decoding of `runs`, in order, or None.

    runs: (prompt, S, end) per prompt: S the target's greedy tokens after the prompt, k + 1 past the budget;
    end = len(prompt) + the budget. With cur the tokens decoded so far (prompt + S[:cur - len(prompt)]), a pass on
    a cache of n tokens fed f is either a prefill (n + len(f) <= cur, f the tokens there: it emits nothing) or a
    step (n <= cur - 1, f = the tokens n..cur, then at most k drafts), which emits the greedy rule's outcome on its
    drafts (`_step_outcome`) and moves cur by that, up to end; at end the next prompt starts. The drafts of every
    step but its last were fed to the handed draft, in order. A pass that fits both readings keeps both."""
    def tokens(i: int) -> list[int]:
        return runs[i][0] + runs[i][1]

    def with_next(states: set) -> set:  # a finished prompt may be followed by the next one's passes
        return states | {(i + 1, len(runs[i + 1][0]), fed) for i, cur, fed in states
                         if cur == runs[i][2] and i + 1 < len(runs)}

    states = with_next({(0, len(runs[0][0]), ())})
    for c, (n, f) in enumerate(zip(target.held, target.fed), 1):
        if n is None or f is None:
            return f"target pass {c} was not one row of token ids on no cache or on a cache of the target's"
        after, why = set(), None
        for i, cur, fed in states:
            seq = tokens(i)
            if n + len(f) <= cur and f == seq[n : n + len(f)]:
                after.add((i, cur, fed))  # a prefill of tokens already decoded
            if n <= cur - 1 and f[: cur - n] == seq[n:cur] and 0 <= len(f) - (cur - n) <= k:
                drafts = f[cur - n :]
                j = next((a for a, d in enumerate(drafts) if d != seq[cur + a]), len(drafts))
                why = _step_outcome(tuple(seq[:cur]), tuple(drafts), tuple(seq[cur : cur + j + 1]), 0.0, None)
                if why is None:
                    after.add((i, min(runs[i][2], cur + j + 1), fed + tuple(drafts[:-1])))
        if not after:
            shown = f"{len(f)} tokens on a cache of {n}"
            return (f"target pass {c} ({shown}) is neither a prefill of the tokens decoded so far nor a step that "
                    f"scores the last token and at most k = {k} drafts" + (f": {why}" if why else ""))
        states = with_next(after)
    done = [fed for i, cur, fed in states if i == len(runs) - 1 and cur == runs[-1][2]]
    if not done:
        return "the target's passes end before the last token was decoded"
    if not any(_fed_in_order(draft.fed, list(fed)) for fed in done):
        return "the drafts the target scored were not fed to the draft you are given, in order"
    return None


def _tie_error(prompts: list[list[int]], k: int, max_new_tokens: int, margin: float, target: _Memo,
               draft: _Memo) -> str | None:
    """`_greedy_replay` of greedy speculative decoding of `prompts`, or None where `margin` is below REPLAY_MARGIN."""
    runs = []
    for prompt in prompts:
        ext, m = _target_greedy(prompt, max_new_tokens + k + 1)
        runs.append((list(prompt), ext, len(prompt) + max_new_tokens))
        margin = min(margin, m)
    return None if margin < REPLAY_MARGIN else _greedy_replay(runs, k, target, draft)


_TIE_HINT = ("every token comes from the passes of the `target` and `draft` you are given: after the prompt, each "
             "target pass scores the last token and the draft's greedy drafts, and the step emits the accepted "
             "drafts and the target's own token, never tokens of models of your own.")


@graded(3, "check_speculative_decode", FORBIDDEN, ALLOWED)
def check_speculative_decode(
    fn: Callable[..., object],
    n_prompts: int = 2,
    first_prompt: int = 0,
    ks: tuple[int, ...] = (1, 3, 5),
    max_new_tokens: int = 24,
) -> None:
    """Grade speculative_decode: greedy output equals the target's, token for token, and the target
    is called once per step plus once for the prompt; a sampled run returns max_new_tokens tokens."""
    g = "check_speculative_decode"
    target_real, _ = _pair64()
    mine = _learners_pair()
    prompts = heldout_prompts(n=first_prompt + n_prompts, n_tokens=24)[first_prompt:]
    for prompt in prompts:
        ids = torch.tensor([prompt])
        expected = []
        with torch.no_grad():
            cache = target_real.new_cache(1)
            logits = target_real(ids, cache=cache)[0, -1]
            for i in range(max_new_tokens):
                expected.append(int(logits.argmax()))
                if i < max_new_tokens - 1:
                    logits = target_real(torch.tensor([[expected[-1]]]), cache=cache)[0, -1]
        for k in ks:
            target, draft = _graded_pair(mine)
            where = f"k = {k}, greedy (temperature 0), {max_new_tokens} new tokens."
            inputs = [f"prompt: {len(prompt)} tokens of a held-out file"]
            try:
                with torch.no_grad():
                    out = fn(target, draft, list(prompt), k, max_new_tokens, 0.0, None, torch.Generator().manual_seed(0))
            except NotImplementedError:
                raise
            except Exception as e:  # noqa: BLE001
                raise failure(g, where, inputs + [f"your decoder raised {type(e).__name__}: {e}"]) from e
            got = _as_token_list(out)
            if got != expected:
                first = None if got is None else next(
                    (i for i, (a, b) in enumerate(zip(got, expected)) if a != b), min(len(got), len(expected)))
                raise failure(g, where, inputs + [f"expected {expected}", f"got      {out!r}",
                                                f"first difference at new token {first}"],
                            "return exactly max_new_tokens new tokens (not the prompt); after each step append the "
                            "emitted tokens, never more than the budget.")
            steps = _greedy_steps(prompt, k, max_new_tokens, expected)
            if target.calls > steps + 1:
                raise failure(g, where, inputs + [f"your decoder called the target {target.calls} times"],
                            f"speculative decoding needs {steps} passes here, one per step, plus one for the prompt.")
            if target.calls < steps:  # the output came from passes the wrapper did not see: another model's
                raise failure(g, where, inputs + [f"your decoder called the target {target.calls} times"],
                            f"every step verifies its drafts in one pass of the `target` it is given: {steps} steps "
                            "here, so at least as many passes of that target (not of another model).")
            if not _fed_in_order(target.fed, list(prompt) + expected[:-1]):
                raise failure(g, where, inputs + ["the target's passes were not fed the prompt and the tokens you "
                                                  "returned, in order"],
                            "every token comes from a pass of the `target` you are given: the prompt first, then each "
                            "step feeds the last token and its drafts.")
            if draft.calls < steps - 1:
                raise failure(g, where, inputs + [f"your decoder called the draft {draft.calls} times, {steps} steps"],
                            "each step lets the draft propose its k tokens before the target verifies them.")
            margin = _greedy_run(tuple(prompt), k, max_new_tokens, tuple(expected))[1]
            why = _tie_error([list(prompt)], k, max_new_tokens, margin, target, draft)
            if why is not None:
                raise failure(g, where, inputs + [why], _TIE_HINT)
    # A sampled run: the right number of valid tokens.
    target, draft = _graded_pair(mine)
    with torch.no_grad(), torch.random.fork_rng(devices=[]):
        out = fn(target, draft, list(prompts[0]), 3, 10, 0.8, 5, torch.Generator().manual_seed(1))
    got = _as_token_list(out)
    if got is None or len(got) != 10 or any(not 0 <= t < target.config.vocab_size for t in got):
        raise failure(g, "sampled run (temperature 0.8, top_k 5, k = 3, 10 new tokens).", [f"got {out!r}"],
                    "return exactly max_new_tokens token ids.")
    passed(g, f"{len(prompts)} prompts x k = {ks}: the target's greedy output, one target pass per step")


# --------------------------------------------------------------------------------------
# Exercise 4.4: the learner's decoder timed against plain decoding; what of it is reproducible
# --------------------------------------------------------------------------------------

# The learner times the grown target (float32, the bundled target grown wider with the same function) on their own
# CPU; no point depends on those timings. Two things are reproducible and graded exactly:
#
# * the counts (new tokens, speculative steps) of the greedy run they timed. The grader counts the same run on the
#   bundled pair in float64. A greedy count is a chain of argmax decisions, and float32 rounding moves these
#   models' logits by less than 1e-4 (tests/grading/test_ex04.py measures the grown float32 target and the float32
#   draft against float64 along the timed run and holds the difference below COUNT_MARGIN / 4), so a decision
#   whose float64 margin, best logit minus second best, is above COUNT_MARGIN comes out the same in float32 on any
#   CPU. The check computes the run's smallest margin and compares the reported counts only when it clears
#   COUNT_MARGIN (the exercise's timed run does, by far: the test holds it to that). Their count function is also
#   run on the grader's own pair, with its passes counted;
# * the prediction E / (v(k) + c k), recomputed from the values they report: E their counted tokens per step,
#   v(k) and c the medians of their repeats (an odd number of repeats: the median is the middle value, one
#   convention for every library). Four roundings separate their arithmetic from the grader's float64 one: at most
#   about 4 x 2^-24 = 2.4e-7 relative if they computed in float32, far less in float64; PREDICTION_RTOL allows 1e-6.
COUNT_MARGIN = 1e-3
PREDICTION_RTOL = 1e-6
HIDDEN_COUNTS = {"n_prompts": 2, "n_tokens": 24, "ks": (1, 3), "max_new_tokens": 32}  # prompts drawn from the seed


def _target_greedy(prompt: list[int], n: int) -> tuple[list[int], float]:
    """The float64 target's n greedy tokens after `prompt`, and the smallest `_margin` of its decisions (a fresh
    list each call: the run is made once per prompt and n in this process, whatever the k it is compared at)."""
    tokens, margin = _target_greedy_run(tuple(int(t) for t in prompt), int(n))
    return list(tokens), margin


@functools.lru_cache(maxsize=64)
def _target_greedy_run(prompt: tuple[int, ...], n: int) -> tuple[tuple[int, ...], float]:
    target, _ = _pair64()
    out: list[int] = []
    margin = math.inf
    with torch.no_grad():
        cache = target.new_cache(1)
        logits = target(torch.tensor([prompt]), cache=cache)[0, -1]
        for i in range(n):
            margin = min(margin, _margin(logits))
            out.append(int(logits.argmax()))
            if i < n - 1:
                logits = target(torch.tensor([[out[-1]]]), cache=cache)[0, -1]
    return tuple(out), margin


def greedy_count(prompts: list[list[int]], k: int, max_new_tokens: int) -> tuple[int, int, float]:
    """(new tokens, steps, margin) of greedy speculative decoding of every prompt on the float64 pair: what a correct
    decoder emits and the steps it takes (the prompts' own passes not counted), summed over the prompts, and the
    smallest margin of an argmax decision of the target or the draft along the way."""
    tokens = steps = 0
    margin = math.inf
    for prompt in prompts:
        expected, m_target = _target_greedy(prompt, max_new_tokens)
        s, m_draft = _greedy_run(tuple(prompt), k, max_new_tokens, tuple(expected))
        tokens, steps, margin = tokens + max_new_tokens, steps + s, min(margin, m_target, m_draft)
    return tokens, steps, margin


def _per_k(x: object, ks: tuple[int, ...]) -> dict[int, object] | None:
    """A learner's per-k values by value: a dict keyed by each k (whole numbers), or a sequence aligned with `ks`."""
    if isinstance(x, dict):
        keyed = {as_int(key): v for key, v in x.items()}
        return {k: keyed[k] for k in ks} if all(k in keyed for k in ks) else None
    items = as_items(x, len(ks))
    return None if items is None else dict(zip(ks, items))


def _count_run(fn: Callable[..., object], prompts: list[list[int]], max_new_tokens: int, ks: tuple[int, ...],
               want: dict[int, tuple[int, int, float]], g: str) -> None:
    """Run the learner's count function on the grader's float64 pair for each k: its (tokens, steps) against the
    grader's count, and the passes it made against those steps."""
    mine = _learners_pair()
    for k in ks:
        target, draft = _graded_pair(mine)
        where = f"k = {k}, greedy, {len(prompts)} prompts x {max_new_tokens} new tokens, on the grader's float64 pair."
        inputs = [f"prompts of {[len(p) for p in prompts]} tokens"]
        try:
            with torch.no_grad(), torch.random.fork_rng(devices=[]):
                out = fn(target, draft, [list(p) for p in prompts], k, max_new_tokens)
        except NotImplementedError:
            raise
        except Exception as e:  # noqa: BLE001 - the learner's error, shown with its input
            raise failure(g, where, inputs + [f"your function raised {type(e).__name__}: {e}"]) from e
        got = as_ints(out, 2)
        tokens, steps, _ = want[k]
        if got is None:
            raise failure(g, where, inputs + [f"got {out!r}"], "return (new tokens, steps): two whole numbers.")
        if got[0] != tokens:
            raise failure(g, where, inputs + [f"expected {tokens} new tokens", f"got {got[0]}"],
                          "count the new tokens of every prompt, not the prompts' own.")
        if not steps <= target.calls <= steps + len(prompts) or draft.calls == 0:
            raise failure(g, where, inputs + [f"the target was called {target.calls} times, the draft "
                                              f"{draft.calls} times"],
                          "decode every prompt once with your speculative decoder, and count that run.")
        if got[1] != steps:
            raise failure(g, where, inputs + [f"expected {steps} steps", f"got {got[1]}",
                                              f"the target was called {target.calls} times"],
                          "a step is one verification: one target pass over the last token and the drafts. The "
                          "passes over the prompts are not steps.")
        why = _tie_error(prompts, k, max_new_tokens, want[k][2], target, draft)
        if why is not None:
            raise failure(g, where, inputs + [why], _TIE_HINT)


@graded(4, "check_timed_counts", FORBIDDEN, ALLOWED)
def check_timed_counts(fn: Callable[..., object], counts: object, prompts: list[list[int]], max_new_tokens: int,
                       ks: tuple[int, ...]) -> None:
    """Grade count_steps(target, draft, prompts, k, max_new_tokens) -> (new tokens, steps) on the grader's pair, and
    the counts the learner reports from the run they timed, against the grader's count of the same run (exact)."""
    g = "check_timed_counts"
    prompts, ks = [list(p) for p in prompts], tuple(ks)
    want = {k: greedy_count(prompts, k, max_new_tokens) for k in ks}
    _count_run(fn, prompts, max_new_tokens, ks, want, g)
    margin = min(m for _, _, m in want.values())
    if margin < COUNT_MARGIN:  # an exercise whose timed run comes near a tie: its float32 counts are not compared
        passed(g, f"k = {ks}: your count function's steps, counted exactly; the timed run's own counts were not "
                  f"compared (a decision of that run is within {margin:.1e} of a tie)")
        return
    per_k = _per_k(counts, ks)
    if per_k is None:
        raise failure(g, "the counts of your timed run.", [f"got counts = {counts!r}"],
                      f"counts maps each k in {ks} to (new tokens, steps) of the run you timed.")
    for k in ks:
        got = as_ints(per_k[k], 2)
        if got is None or tuple(got) != want[k][:2]:
            raise failure(g, f"the counts of your timed run at k = {k}.", [f"you report {per_k[k]!r}"],
                          "they differ from the grader's count of the same run (these prompts, this budget, greedy; "
                          "the grown target decides like the bundled one): report the counts of the run you timed.")
    passed(g, f"k = {ks}: your count function and your timed run's counts equal the grader's count, exactly")


@graded(4, "check_step_counts", FORBIDDEN, ALLOWED)
def check_step_counts(fn: Callable[..., object], setting: dict | None = None, seed: int = 0) -> None:
    """count_steps on other prompts (drawn from `seed`) and other k, against the grader's count (exact)."""
    s = dict(HIDDEN_COUNTS if setting is None else setting)
    first = derived_seed(seed, "counts") % 40
    prompts = heldout_prompts(n=first + s["n_prompts"], n_tokens=s["n_tokens"])[first:]
    ks = tuple(s["ks"])
    want = {k: greedy_count(prompts, k, s["max_new_tokens"]) for k in ks}
    _count_run(fn, prompts, s["max_new_tokens"], ks, want, "check_step_counts")
    passed("check_step_counts", f"{len(prompts)} other prompts x k = {ks}: your steps, counted exactly")


def _repeats(x: object) -> list[float] | None:
    """A learner's repeats by value: an odd number (at least 3) of finite positive numbers, else None."""
    items = as_items(x)
    vals = None if items is None else [as_float(v) for v in items]
    if vals is None or len(vals) < 3 or len(vals) % 2 == 0:
        return None
    if any(v is None or not math.isfinite(v) or v <= 0 for v in vals):
        return None
    return vals  # type: ignore[return-value]


def _median(vals: list[float]) -> float:
    return sorted(vals)[len(vals) // 2]


@graded(4, "check_prediction", FORBIDDEN, ALLOWED, learner_args=0)
def check_prediction(counts: object, v_repeats: object, c_repeats: object, predicted: object,
                     ks: tuple[int, ...]) -> None:
    """The prediction recomputed from what the learner reports: E / (v(k) + c k), E = new tokens / steps of their
    counts, v(k) and c the medians of their repeats, at PREDICTION_RTOL. No timing is judged."""
    g = "check_prediction"
    ks = tuple(ks)
    where = "your prediction, recomputed from the values you report."
    c = _repeats(c_repeats)
    if c is None:
        raise failure(g, where, [f"c_repeats = {c_repeats!r}"],
                      "c_repeats holds c of each repeat: an odd number (3 or more) of positive numbers.")
    given = {"counts": counts, "v_repeats": v_repeats, "predicted": predicted}
    tables = {name: _per_k(x, ks) for name, x in given.items()}
    for name, table in tables.items():
        if table is None:
            raise failure(g, where, [f"{name} = {given[name]!r}"[:300]],
                          f"{name} maps each k in {ks} to its value (a dict keyed by k).")
    for k in ks:
        n = as_ints(tables["counts"][k], 2)
        v = _repeats(tables["v_repeats"][k])
        got = as_float(tables["predicted"][k])
        if n is None or n[1] <= 0 or v is None or got is None:
            raise failure(g, where, [f"k = {k}: counts {tables['counts'][k]!r}, v_repeats {tables['v_repeats'][k]!r}, "
                                     f"predicted {tables['predicted'][k]!r}"[:400]],
                          "counts[k] is (new tokens, steps); v_repeats[k] an odd number (3 or more) of positive "
                          "numbers; predicted[k] one number.")
        want = (n[0] / n[1]) / (_median(v) + _median(c) * k)
        if not math.isfinite(got) or abs(got - want) > PREDICTION_RTOL * want:
            raise failure(g, where, [f"k = {k}: from your counts and the medians of your repeats, "
                                     f"E / (v(k) + c k) = {want:.6g}", f"you predicted {got:.6g}"],
                          "predict from the values you report: E your timed run's tokens per step (new tokens / "
                          "steps), v(k) and c the medians (middle values) of your repeats.")
    passed(g, f"k = {ks}: each prediction is E / (v(k) + c k) of the values you report")
