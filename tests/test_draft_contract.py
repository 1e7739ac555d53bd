"""One contract every draft keeps: the shipped ones, early exit, and one written as a learner writes one.

A draft talks to the loop through `begin`, `propose(tokens, lengths, k, params, generator)`,
`observe(features, starts)` (a draft that reads the target's hidden states) and `rollback(n_valid)`
(specref.drafts.base). Every draft of chapter 5 (`load_draft`), the early-exit self-draft and
`ContextBigramDraft` below (a `Draft` subclass that remembers what it has seen; the package does not vouch
for it, so the loop checks its proposals every step) must:

* answer `propose` with token ids [B, k'] in the vocabulary and q [B, k', V], each row of q summing to 1
  (in float64) with mass on the token it goes with; k = 0 gives nothing; the inputs are left as they were;
  the same generator seed gives the same proposal and another seed another (where the draft samples);
  `propose` before `begin` is refused;
* after proposals, verifications and rollbacks, propose what a fresh draft fed the same context proposes;
* through the verifier, give the target's own output: greedy, token for token, on the bundled target and on
  the grown one (chains, and trees for a tree draft); sampled, the first two tokens follow the target's
  exact distribution (Monte-Carlo test at its stated size), and the same test flags the draft made to
  misreport its q (negative control).

Each check ships with drafts it must catch: one that writes into its input, drops the generator, returns q
rows that do not sum to 1 or never draws (`propose`), and one whose rollback forgets nothing (state).

The shipped drafts fit only the bundled target; the sampled check runs each kind of draft on a 6-token
target (random heads and layers, seeded), where the first two tokens' distribution is enumerable.
Draft-specific behaviour (what the heads are fed, the caches' contents, bad constructor arguments)
stays in each draft's own test file.
"""

from __future__ import annotations

import pytest
import torch
from model_factory import exact_first_two, sample_first_two, small_gpt2

from specref.checks.montecarlo import distribution_test
from specref.decoding.chain import generate, speculative_generate
from specref.decoding.tree import tree_generate
from specref.drafts import (
    Draft,
    EagleDraft,
    MedusaDraft,
    ModelDraft,
    MTPDraft,
    PromptLookupDraft,
    SelfDraft,
    TreeDraft,
    load_draft,
)
from specref.drafts.heads import EagleLayer, MedusaHeads, MTPStack
from specref.drafts.shapes import DynamicTree
from specref.models.grow import widen
from specref.models.pair import heldout_prompts, load_pair
from specref.sampling import SamplingParams, sample


class ContextBigramDraft(Draft):
    """A draft as a learner writes one: the next token after the last one, by the context's own bigram counts.

    q(x | last) is proportional to (the times x followed `last` in the tokens the draft has seen + 1/2),
    processed with the same temperature, top-k and top-p as p; each draft is drawn from q (the argmax when
    greedy) and is the `last` of the next. It remembers what it has seen, each row's context and then its own
    drafts, reads from the buffer only what it has not seen, and on a rollback forgets the tokens no longer kept.
    """

    def __init__(self, vocab_size: int) -> None:
        self.vocab_size = vocab_size
        self.seen: list[list[int]] = []

    def begin(self, batch_size: int) -> None:
        super().begin(batch_size)
        self.seen = [[] for _ in range(batch_size)]

    def rollback(self, n_valid: torch.Tensor) -> None:
        super().rollback(n_valid)
        self.seen = [row[:n] for row, n in zip(self.seen, n_valid.tolist())]

    def propose(self, tokens: torch.Tensor, lengths: torch.Tensor, k: int, params: SamplingParams,
                generator: torch.Generator | None = None) -> tuple[torch.Tensor, torch.Tensor]:  # [B, k], [B, k, V]
        B = self.begun()
        if k < 0:
            raise ValueError(f"k must be >= 0, got {k}")
        if k == 0:
            return tokens.new_zeros((B, 0)), torch.zeros((B, 0, self.vocab_size), dtype=torch.float64)
        rows = tokens.tolist()
        self.seen = [seen + row[len(seen) : n] for seen, row, n in zip(self.seen, rows, lengths.tolist())]
        width = max(map(len, self.seen))
        context = torch.tensor([seen + [-1] * (width - len(seen)) for seen in self.seen])  # [B, W], -1: none
        last = context.gather(1, torch.tensor([[len(seen) - 1] for seen in self.seen]))[:, 0]  # [B]
        nxt = context[:, 1:]  # [B, W-1]
        drafts, qs = [], []
        for _ in range(k):
            follows = (context[:, :-1] == last[:, None]) & (nxt >= 0)  # [B, W-1]
            counts = torch.zeros(B, self.vocab_size, dtype=torch.float64).scatter_add(
                1, nxt.clamp(min=0), follows.to(torch.float64))  # [B, V]
            q = params.probs((counts + 0.5).log())  # [B, V]
            last = q.argmax(-1) if params.greedy else sample(q, generator)
            drafts.append(last)
            qs.append(q)
        x = torch.stack(drafts, 1)  # [B, k]
        self.seen = [seen + row for seen, row in zip(self.seen, x.tolist())]
        return x, torch.stack(qs, 1)


NAMES = ["model", "prompt_lookup", "medusa", "eagle", "eagle3", "eagle_notoken", "mtp", "early_exit", "learner"]
SAMPLES = ("model", "medusa", "eagle", "eagle3", "eagle_notoken", "mtp", "early_exit", "learner")  # draw from q
TARGETS_STATE = ("medusa", "eagle", "eagle3", "eagle_notoken", "mtp", "early_exit")  # state read off the target
K = 3  # within every shipped draft's reach (3 MTP modules, 5 Medusa heads)


def make(name: str, target: torch.nn.Module) -> Draft:
    """The draft `name` for the bundled target or one grown from it."""
    return ContextBigramDraft(target.config.vocab_size) if name == "learner" else load_draft(name, target)


@pytest.fixture(scope="module")
def target64():
    return load_pair(dtype=torch.float64)[0]  # float64: the cached and the fresh computations agree to ~1e-13


@pytest.fixture(scope="module")
def grown64(target64):
    return widen(target64, 2)


@torch.no_grad()
def features(target: torch.nn.Module, draft: Draft, tokens: torch.Tensor) -> tuple[torch.Tensor, ...]:
    """The hidden states the draft reads, of one pass over `tokens` [B, T]: ([B, T, C], ...)."""
    hs = target(tokens, return_hidden=True).hidden_states
    return tuple(hs[i] for i in draft.feature_layers)


def start(draft: Draft, target: torch.nn.Module, tokens: torch.Tensor, lengths: torch.Tensor) -> None:
    """What the loop does before the first proposal: `begin`, and the features of each row's context but its
    last token (the prefill pass), the rows cut to their own lengths by a rollback."""
    B = tokens.shape[0]
    draft.begin(B)
    width = int(lengths.max())
    if draft.feature_layers and width > 1:
        draft.observe(features(target, draft, tokens[:, : width - 1]), torch.zeros(B, dtype=torch.long))
    draft.rollback(lengths - 1)


def buffer(lengths: list[int], width: int) -> tuple[torch.Tensor, torch.Tensor]:  # [B, width], [B]
    """Held-out prompts, row b valid up to lengths[b]; the rest of the row is text the draft must ignore (scratch)."""
    rows = heldout_prompts(len(lengths), width)
    tokens = torch.tensor(rows)
    return tokens, torch.tensor(lengths)


# -- what propose answers -------------------------------------------------------------------------------


def check_propose(new_draft, target: torch.nn.Module, samples: bool) -> None:
    """The contract of `propose` for the drafts `new_draft()` makes (`samples`: it draws from q when not greedy)."""
    V = target.config.vocab_size
    tokens, lengths = buffer([24, 17, 20], 40)
    with pytest.raises(RuntimeError, match="begin"):
        new_draft().propose(tokens, lengths, K, SamplingParams(1.0))

    def proposal(params: SamplingParams, seed: int, k: int = K) -> tuple[torch.Tensor, torch.Tensor]:
        draft = new_draft()
        start(draft, target, tokens, lengths)
        before = tokens.clone(), lengths.clone()
        x, q = draft.propose(tokens, lengths, k, params, torch.Generator().manual_seed(seed))
        assert torch.equal(tokens, before[0]) and torch.equal(lengths, before[1]), "propose changed its inputs"
        return x, q

    for params in (SamplingParams(0.0), SamplingParams(1.0), SamplingParams(0.7, top_k=40, top_p=0.9)):
        x, q = proposal(params, seed=0)
        n = x.shape[1]
        assert x.dtype == torch.long and x.shape == (3, n) and 0 < n <= K, (x.dtype, tuple(x.shape))
        assert q.is_floating_point() and q.shape == (3, n, V), (q.dtype, tuple(q.shape))
        assert bool(((x >= 0) & (x < V)).all()), "a token id outside the vocabulary"
        q64 = q.to(torch.float64)
        assert bool((q64 >= 0).all()) and float((q64.sum(-1) - 1).abs().max()) < 1e-9, "a q row is no distribution"
        assert bool((q64.gather(-1, x[..., None]) > 0).all()), "a draft outside its own q's support"
        if params.greedy:
            assert torch.equal(q64.argmax(-1), x), "a greedy draft that is not its q's argmax"
        again = proposal(params, seed=0)
        assert torch.equal(again[0], x) and torch.equal(again[1], q), "the same seed gave another proposal"
        if not params.greedy and samples:
            others = [proposal(params, seed=s)[0] for s in (1, 2, 3)]
            assert any(not torch.equal(o, x) for o in others), "other seeds gave the same drafts: no sampling"
    x, q = proposal(SamplingParams(1.0), seed=0, k=0)
    assert x.shape == (3, 0) and q.shape == (3, 0, V)


@pytest.mark.parametrize("name", NAMES)
def test_propose_keeps_the_contract(target64, name):
    check_propose(lambda: make(name, target64), target64, name in SAMPLES)


class _WritesItsInput(ContextBigramDraft):
    def propose(self, tokens, lengths, k, params, generator=None):
        x, q = super().propose(tokens, lengths, k, params, generator)
        tokens[:, 0] = x[:, 0] if k else tokens[:, 0]  # the bug: the buffer changed in place
        return x, q


class _GlobalRNG(ContextBigramDraft):
    def propose(self, tokens, lengths, k, params, generator=None):
        return super().propose(tokens, lengths, k, params, None)  # the bug: the generator dropped


class _Unnormalised(ContextBigramDraft):
    def propose(self, tokens, lengths, k, params, generator=None):
        x, q = super().propose(tokens, lengths, k, params, generator)
        return x, 1.01 * q  # the bug: q rows sum to 1.01


class _NeverDraws(ContextBigramDraft):
    def propose(self, tokens, lengths, k, params, generator=None):
        return super().propose(tokens, lengths, k, SamplingParams(0.0), generator)  # the bug: always the argmax


@pytest.mark.parametrize("broken,match", [(_WritesItsInput, "changed its inputs"), (_GlobalRNG, "same seed"),
                                          (_Unnormalised, "no distribution"), (_NeverDraws, "argmax|no sampling")],
                         ids=lambda v: getattr(v, "__name__", str(v)))
def test_negative_control_a_draft_breaking_the_contract_is_caught(target64, broken, match):
    with pytest.raises(AssertionError, match=match):
        check_propose(lambda: broken(target64.config.vocab_size), target64, samples=True)


# -- state: after proposals, verifications and rollbacks, what a fresh draft proposes ---------------------


def verify_by_hand(draft: Draft, target: torch.nn.Module, tokens: torch.Tensor, lengths: torch.Tensor,
                   accept: list[int], generator: torch.Generator) -> torch.Tensor:  # new lengths [B]
    """One step as the loop runs it, with the accepted counts given: propose, the verification pass's features
    (positions lengths - 1 .. + k', one pass over context and drafts), then row b keeps accept[b] drafts and a
    correction (a token other than the next draft, or a bonus after all k'); the draft rolls back to the kept
    drafts."""
    x, _ = draft.propose(tokens, lengths, K, SamplingParams(1.0), generator)
    B, k = x.shape
    rows = torch.arange(B)[:, None]
    at = lengths[:, None] + torch.arange(k)[None]  # [B, k] buffer positions of the drafts
    seen = tokens.clone()
    seen[rows, at] = x
    if draft.feature_layers:
        span = (lengths - 1)[:, None] + torch.arange(k + 1)[None]  # [B, k+1]
        full = features(target, draft, seen[:, : int(lengths.max()) + k])
        draft.observe(tuple(f[rows, span] for f in full), lengths - 1)
    a = torch.tensor(accept).clamp(max=k)  # [B]
    nxt = torch.where(a < k, x.gather(1, a.clamp(max=k - 1)[:, None])[:, 0] + 1, x[:, -1]) % target.config.vocab_size
    keep = torch.arange(k)[None] < a[:, None]
    tokens[rows, at] = torch.where(keep, x, tokens[rows, at])
    tokens[torch.arange(B), lengths + a] = nxt
    draft.rollback(lengths + a)
    return lengths + a + 1


def alone(name: str, target: torch.nn.Module, tokens: torch.Tensor, lengths: torch.Tensor,
          params: SamplingParams) -> tuple[torch.Tensor, torch.Tensor]:  # [B, k], [B, k, V]
    """Each row proposed for by a fresh draft of its own (B = 1) fed that row's context (no generator: greedy,
    or only q's first position read, which does not depend on the draws)."""
    out = []
    for b in range(tokens.shape[0]):
        draft = make(name, target)
        start(draft, target, tokens[b : b + 1], lengths[b : b + 1])
        out.append(draft.propose(tokens[b : b + 1], lengths[b : b + 1], K, params, torch.Generator().manual_seed(0)))
    return torch.cat([x for x, _ in out]), torch.cat([q for _, q in out])


def assert_as_if_alone(name: str, target: torch.nn.Module, draft: Draft, tokens: torch.Tensor,
                       lengths: torch.Tensor) -> None:
    """The draft's greedy drafts, and q of its first sampled draft (a function of the context alone), are those of
    a fresh draft per row; between the two proposals the draft is rolled back to the context."""
    x, _ = draft.propose(tokens, lengths, K, SamplingParams(0.0))
    draft.rollback(lengths)
    want = alone(name, target, tokens, lengths, SamplingParams(0.0))[0]
    assert torch.equal(x, want), f"greedy drafts {x.tolist()}, a fresh draft per row: {want.tolist()}"
    _, q = draft.propose(tokens, lengths, K, SamplingParams(1.0), torch.Generator().manual_seed(0))
    want = alone(name, target, tokens, lengths, SamplingParams(1.0))[1]
    err = float((q[:, 0].to(torch.float64) - want[:, 0].to(torch.float64)).abs().max())
    assert err < 1e-9, f"q of the first draft differs by {err:.3g} from a fresh draft's per row"


@pytest.mark.parametrize("name", NAMES)
def test_after_rollbacks_it_proposes_what_a_fresh_draft_fed_the_context_proposes(target64, grown64, name):
    # On the grown target too where the draft's state comes from the target (its features, or its own blocks).
    for target in (target64, grown64) if name in TARGETS_STATE else (target64,):
        tokens, lengths = buffer([18, 18, 18], 48)  # the loop's start: one prompt length; the rows then drift apart
        draft = make(name, target)
        start(draft, target, tokens, lengths)
        g = torch.Generator().manual_seed(0)
        for accept in ([0, 2, K], [K, 0, 1], [1, K, 0]):  # rows that reject at once, keep some, keep all
            lengths = verify_by_hand(draft, target, tokens, lengths, accept, g)
            assert_as_if_alone(name, target, draft, tokens, lengths)
            draft.rollback(lengths)


class _KeepsRejected(ContextBigramDraft):
    def rollback(self, n_valid: torch.Tensor) -> None:
        Draft.rollback(self, n_valid)  # the bug: the rejected drafts stay in what it has seen


def test_negative_control_a_draft_that_does_not_roll_back_is_caught(target64):
    tokens, lengths = buffer([18, 18, 18], 48)
    draft = _KeepsRejected(target64.config.vocab_size)
    start(draft, target64, tokens, lengths)
    lengths = verify_by_hand(draft, target64, tokens, lengths, [0, 2, K], torch.Generator().manual_seed(0))
    with pytest.raises(AssertionError, match="fresh draft"):
        assert_as_if_alone("learner", target64, draft, tokens, lengths)


@pytest.mark.parametrize("name", NAMES)
def test_a_first_proposal_on_rows_of_unequal_length_is_each_rows_own(target64, name):
    tokens, lengths = buffer([24, 9, 17], 40)
    draft = make(name, target64)
    start(draft, target64, tokens, lengths)
    assert_as_if_alone(name, target64, draft, tokens, lengths)


# -- through the verifier: the target's own output ---------------------------------------------------------


@pytest.fixture(scope="module")
def greedy_expected(target64, grown64):
    ids = torch.tensor(heldout_prompts(2, 32))
    one = torch.tensor(heldout_prompts(2, 1))  # [2, 1]
    return {"bundled": (ids, generate(target64, ids, 16, temperature=0), one, generate(target64, one, 8, temperature=0)),
            "grown": (ids, generate(grown64, ids, 16, temperature=0))}


@pytest.mark.parametrize("where", ["bundled", "grown"])
@pytest.mark.parametrize("name", NAMES)
def test_greedy_output_is_the_targets(target64, grown64, greedy_expected, name, where):
    target = target64 if where == "bundled" else grown64
    ids, expected, *short = greedy_expected[where]
    draft = make(name, target)
    k = getattr(draft, "max_k", None) or 4  # as deep as the draft reaches (5 Medusa heads, 3 MTP modules)
    got, stats = speculative_generate(target, draft, ids, k=k, max_new_tokens=16, temperature=0)
    assert torch.equal(got, expected), f"{name} on the {where} target, k={k}"
    assert 0 < stats.accepted < stats.examined, f"accept and reject should both run: {stats.as_dict()}"
    if isinstance(draft, TreeDraft):
        got, _ = tree_generate(target, draft, ids, DynamicTree(8, max_depth=K), max_new_tokens=16, temperature=0)
        assert torch.equal(got, expected), f"{name}'s trees on the {where} target"
    if short:  # a one-token prompt: no feature exists before the first step
        one, want = short
        assert torch.equal(speculative_generate(target, draft, one, k=K, max_new_tokens=8, temperature=0)[0], want)


# -- sampled: the first two tokens follow the target's exact distribution -----------------------------------

TINY_V = 6
N_RUNS = 10_000  # the distribution test's size: each negative control below is flagged at it with p < 1e-6
PROMPT = [1, 2, 3, 1, 2]  # prompt lookup finds "1 2" and proposes 3, 1
PARAMS = SamplingParams(0.8, top_k=5)  # q must be processed as p is: temperature and top-k


@pytest.fixture(scope="module")
def tiny():
    return small_gpt2(vocab=TINY_V, n_embd=16, n_layer=2, seed=3, n_positions=8, scale=3.0)


def _seeded(module: torch.nn.Module, seed: int, scale: float) -> torch.nn.Module:
    """`module` with every weight drawn from a seeded normal, times `scale` / sqrt(fan-in), in float64."""
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for p in module.parameters():
            fan_in = p.shape[-1] if p.dim() > 1 else 1
            p.copy_(torch.randn(p.shape, generator=g, dtype=torch.float64) * scale / fan_in**0.5)
    return module.double().eval()


def tiny_draft(name: str, target: torch.nn.Module) -> Draft:
    """A draft of kind `name` for the 6-token target: seeded random heads, layers and draft model."""
    C = target.config.n_embd
    if name == "model":
        return ModelDraft(small_gpt2(vocab=TINY_V, n_embd=16, n_layer=1, seed=4, n_positions=8, scale=3.0))
    if name == "prompt_lookup":
        return PromptLookupDraft.for_target(target)
    if name == "medusa":
        return MedusaDraft(target, _seeded(MedusaHeads(C, 2), 7, 2.0))
    if name.startswith("eagle"):
        layers, use_token = {"eagle": ((2,), True), "eagle3": ((0, 1, 2), True), "eagle_notoken": ((2,), False)}[name]
        return EagleDraft(target, _seeded(EagleLayer(C, 2, layers, use_token), 8, 1.0))
    if name == "mtp":
        return MTPDraft(target, _seeded(MTPStack(C, 2, 2), 9, 1.0))
    if name == "early_exit":
        return SelfDraft(target, 1)
    return ContextBigramDraft(TINY_V)


class Misreported(Draft):
    """Negative control: draws with `inner` at temperature T / 2 and reports q at T, mixed half and half with the
    uniform distribution (so a draft that draws nothing, prompt lookup, misreports too)."""

    def __init__(self, inner: Draft) -> None:
        self.inner, self.vocab_size, self.feature_layers = inner, inner.vocab_size, inner.feature_layers

    def join(self, session) -> None:
        super().join(session)
        self.inner.join(session)

    def begin(self, batch_size: int) -> None:
        super().begin(batch_size)
        self.inner.begin(batch_size)

    def observe(self, features: tuple[torch.Tensor, ...], starts: torch.Tensor) -> None:
        self.inner.observe(features, starts)

    def rollback(self, n_valid: torch.Tensor) -> None:
        self.inner.rollback(n_valid)

    def propose(self, tokens, lengths, k, params, generator=None):
        colder = SamplingParams(params.temperature / 2, params.top_k, params.top_p)
        x, q = self.inner.propose(tokens, lengths, k, colder, generator)
        q = q.to(torch.float64).sqrt()  # softmax(l / (T/2)) ** (1/2), renormalised, is softmax(l / T)
        return x, 0.5 * q / q.sum(-1, keepdim=True) + 0.5 / self.vocab_size


@pytest.mark.parametrize("name", NAMES)
def test_sampled_output_is_the_targets_and_a_misreported_q_is_flagged(tiny, name):
    # Three new tokens: the first step drafts K' = 2 (the last token is always the target's).
    exact = exact_first_two(tiny, PROMPT, PARAMS)
    counts = sample_first_two(tiny, tiny_draft(name, tiny), PROMPT, 2, PARAMS, 11, N_RUNS, max_new_tokens=3)
    result = distribution_test(exact, counts=counts)
    assert result.passed, str(result)
    assert result.tv_bound < 0.05, "too few runs to see a draft's q misstated by a few percent"
    broken = sample_first_two(tiny, Misreported(tiny_draft(name, tiny)), PROMPT, 2, PARAMS, 11, N_RUNS,
                              max_new_tokens=3)
    flagged = distribution_test(exact, counts=broken)
    assert flagged.p_value < 1e-6, f"the negative control passed: {flagged}"
    with pytest.raises(ValueError, match="vocabular"):  # a draft for another target's vocabulary
        other = small_gpt2(vocab=TINY_V + 1, n_embd=16, n_layer=2, seed=3, n_positions=8, scale=3.0)
        speculative_generate(other, tiny_draft(name, tiny), torch.tensor([PROMPT]), k=2, max_new_tokens=2)
