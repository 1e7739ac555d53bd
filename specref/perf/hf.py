"""Hugging Face's assisted generation and prompt lookup beside specref, on one pair: one harness.

`to_hf` converts a `specref.models.GPT2` into `transformers.GPT2LMHeadModel` with the same
weights (the two share a state-dict layout; tests/test_gpt2.py checks the logits). `count_passes`
wraps a model's forward to count target passes on either side, because transformers reports no
such count. `hf_generate` runs HF's greedy assisted generation (a draft model, or prompt lookup)
and `specref_generate` runs specref's greedy speculative decoding; both return the new tokens
and the count, so tokens per target pass are compared like for like. `time_libraries` times both on
the pair with its target grown until its weights stream from memory.

Pass counting. specref spends one pass on the prompt (every token but the last) that emits
nothing, then one pass per step; HF folds the prompt into its first verification pass. So a
step is one counted pass on both sides once specref's prefill is left out (`Run.steps`).

transformers is imported inside the functions: `hf_missing()` says what is missing where the
installed version lacks a name this harness uses, and callers skip instead of failing.
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field

import torch

from ..decoding.chain import speculative_generate
from ..drafts import ModelDraft, PromptLookupDraft
from ..models.gpt2 import GPT2

SCHEDULES = ("constant", "heuristic", "heuristic_transient")
"""HF's `num_assistant_tokens_schedule` values: "heuristic*" add 2 to k after a step that accepts
every draft and take 1 away (never below 1) after any other step; "_transient" resets k per call."""


def hf_missing(config: object | None = None) -> str | None:
    """None when the installed transformers has everything this harness uses, else what is missing.

    `config`: the generation config to inspect (default: a fresh `transformers.GenerationConfig()`).
    """
    try:
        import transformers
    except ImportError:
        return "transformers is not installed"
    config = transformers.GenerationConfig() if config is None else config
    names = ("num_assistant_tokens", "num_assistant_tokens_schedule", "assistant_confidence_threshold",
             "prompt_lookup_num_tokens", "max_matching_ngram_size")
    absent = [n for n in names if not hasattr(config, n)]
    if absent:
        return f"transformers {transformers.__version__} has no GenerationConfig.{', '.join(absent)}"
    return None


def sklearn_present() -> bool:
    """Whether HF's adaptive confidence threshold can run: it fits a ROC curve with scikit-learn."""
    from transformers.utils import is_sklearn_available

    return bool(is_sklearn_available())


def to_hf(model: GPT2) -> torch.nn.Module:
    """`transformers.GPT2LMHeadModel` with `model`'s weights, dtype and device; eager attention; no EOS.

    The bundled config names token 0 as EOS (and BOS). specref's decoders stop only when asked
    (`eos_token_id=None` by default), so the HF model's generation config drops EOS too:
    otherwise HF stops at the first token 0 and the two outputs differ in length, not in rule.
    """
    if not isinstance(model, GPT2):
        raise TypeError(f"model must be a specref GPT2, got {type(model).__name__}")
    import transformers

    hf_cfg = transformers.GPT2Config(**model.config.to_dict())
    hf_cfg._attn_implementation = "eager"
    with torch.random.fork_rng(devices=[]):  # the module's random init is overwritten: leave no trace
        hf = transformers.GPT2LMHeadModel(hf_cfg)
    missing, unexpected = hf.load_state_dict(model.state_dict(), strict=False)
    missing = [m for m in missing if not m.endswith((".attn.bias", ".attn.masked_bias"))]
    if missing or unexpected:
        raise ValueError(f"state dicts differ: missing {missing}, unexpected {unexpected}")
    hf = hf.to(device=model.device, dtype=model.dtype).eval()
    hf.generation_config.eos_token_id = None
    hf.generation_config.bos_token_id = None
    hf.generation_config.pad_token_id = 0  # only pads finished rows; batch 1 never has one
    return hf


@contextlib.contextmanager
def _quiet() -> Iterator[None]:
    """transformers' logger at error level while the block runs (its deprecation notes are about its own internals)."""
    from transformers.utils import logging

    level = logging.get_verbosity()
    logging.set_verbosity_error()
    try:
        yield
    finally:
        logging.set_verbosity(level)


@dataclass
class PassCount:
    """Forward calls of one model and the tokens they scored."""

    passes: int = 0
    tokens: int = 0
    sizes: list[int] = field(default_factory=list)  # positions scored by each pass, in order


@contextlib.contextmanager
def count_passes(model: torch.nn.Module) -> Iterator[PassCount]:
    """Count `model`'s forward calls (and the input positions they score) while the block runs."""
    count = PassCount()
    original = model.forward

    def forward(*args: object, **kwargs: object) -> object:
        ids = kwargs.get("input_ids", args[0] if args else None)
        count.passes += 1
        size = int(ids.shape[-1]) if isinstance(ids, torch.Tensor) else 0
        count.tokens += size
        count.sizes.append(size)
        return original(*args, **kwargs)

    model.forward = forward
    try:
        yield count
    finally:
        del model.forward  # the instance attribute goes; the class's forward is back


@dataclass(frozen=True)
class Run:
    """One greedy generation: its new tokens and the target passes it took."""

    new_tokens: torch.Tensor  # [n] the generated tokens (the prompt excluded)
    target_passes: int  # every forward call of the target, specref's prefill included
    prefill_passes: int  # passes that scored the prompt and emitted nothing (specref: 1, HF: 0)
    seconds: float
    drafted: tuple[int, ...] = ()  # drafts verified by each step (the pass's positions less the fed token)

    @property
    def steps(self) -> int:
        """Target passes that emitted tokens: one per speculative step."""
        return self.target_passes - self.prefill_passes

    @property
    def tokens_per_pass(self) -> float:
        """Tokens emitted per step (accepted drafts + the target's own token)."""
        return self.new_tokens.numel() / max(self.steps, 1)


def hf_generate(
    target: torch.nn.Module,  # GPT2LMHeadModel
    prompt: list[int],
    max_new_tokens: int,
    *,
    draft: torch.nn.Module | None = None,  # GPT2LMHeadModel: assisted generation
    k: int = 4,
    schedule: str = "constant",
    confidence_threshold: float | None = 0.0,  # 0 switches it off; None leaves HF's default (0.4)
    lookup: bool = False,  # prompt lookup (`prompt_lookup_num_tokens = k`) instead of a draft model
    max_ngram: int = 2,
    ensemble_weight: float | None = None,  # transformers 5.x: LOSSY verification against w p + (1 - w) q
) -> Run:
    """HF greedy generation with a draft model or prompt lookup, its target passes counted.

    HF reads k, the schedule and the confidence threshold from the *draft's* generation config
    (`assistant_model.generation_config`), so they are set there and restored afterwards.
    """
    if (draft is None) == (not lookup):
        raise ValueError("give exactly one of draft (a draft model) and lookup=True (prompt lookup)")
    if schedule not in SCHEDULES:
        raise ValueError(f"schedule must be one of {SCHEDULES}, got {schedule!r}")
    if isinstance(k, bool) or not isinstance(k, int) or k < 1:
        raise ValueError(f"k must be an int >= 1, got {k!r}")
    ids = torch.tensor([prompt], device=target.device)  # [1, T]
    kwargs: dict[str, object] = {"max_new_tokens": max_new_tokens, "min_new_tokens": max_new_tokens,
                                 "do_sample": False, "attention_mask": torch.ones_like(ids)}
    if lookup:
        kwargs.update(prompt_lookup_num_tokens=k, max_matching_ngram_size=max_ngram)
        saved = None
    else:
        cfg = draft.generation_config
        names = ("num_assistant_tokens", "num_assistant_tokens_schedule", "assistant_confidence_threshold")
        saved = {n: getattr(cfg, n) for n in names}
        cfg.num_assistant_tokens, cfg.num_assistant_tokens_schedule = k, schedule
        cfg.assistant_confidence_threshold = confidence_threshold
        kwargs["assistant_model"] = draft
        if ensemble_weight is not None:
            kwargs["assistant_ensemble_weight"] = ensemble_weight
    try:
        with torch.no_grad(), count_passes(target) as count, _quiet():
            start = time.perf_counter()
            out = target.generate(ids, **kwargs)
            seconds = time.perf_counter() - start
    finally:
        if saved is not None:
            for n, v in saved.items():
                setattr(draft.generation_config, n, v)
    # HF's first pass scores the prompt and the first drafts; every later one the last token and the drafts.
    drafted = (count.sizes[0] - ids.shape[1], *(s - 1 for s in count.sizes[1:])) if count.sizes else ()
    return Run(out[0, ids.shape[1]:].cpu(), count.passes, 0, seconds, drafted)


def specref_generate(
    target: GPT2,
    prompt: list[int],
    max_new_tokens: int,
    *,
    draft: GPT2 | None = None,
    k: int = 4,
    lookup: bool = False,  # specref's PromptLookupDraft (latest match), proposing nothing on a miss
    max_ngram: int = 2,
) -> Run:
    """specref's greedy speculative decoding with a draft model or prompt lookup, its target passes counted."""
    if (draft is None) == (not lookup):
        raise ValueError("give exactly one of draft (a draft model) and lookup=True (prompt lookup)")
    drafter = (PromptLookupDraft.for_target(target, max_ngram=max_ngram, min_ngram=1, on_miss="skip") if lookup
               else ModelDraft(draft))
    ids = torch.tensor([prompt], device=target.device)
    with count_passes(target) as count:
        start = time.perf_counter()
        out, _ = speculative_generate(target, drafter, ids, k=k, max_new_tokens=max_new_tokens, temperature=0)
        seconds = time.perf_counter() - start
    prefill = 1 if len(prompt) > 1 else 0
    return Run(out[0, ids.shape[1]:].cpu(), count.passes, prefill, seconds, tuple(s - 1 for s in count.sizes[prefill:]))


def time_repeats(run: Callable[[], Run], repeats: int) -> list[float]:
    """Seconds of `repeats` calls of `run` (one untimed warm-up first)."""
    run()
    return [run().seconds for _ in range(repeats)]


KERNEL_LABELS = ("HF, PyTorch's kernels", "specref, PyTorch's kernels", "specref, few-token kernel")


def time_libraries(target: GPT2, draft: GPT2, prompt: list[int], max_new_tokens: int, *, k: int = 4,
                   repeats: int = 3, factor: int = 4) -> tuple[dict[str, tuple[int, list[float]]], object]:
    """Both libraries' greedy speculative decoding at a constant k, timed on float32 copies of the pair with the
    target grown `factor` times wider (`specref.models.grow.widen`: the same function, so the same steps).

    Each row is (steps, seconds of each of `repeats` timed runs after one untimed warm-up): HF and specref on
    PyTorch's kernels, then specref on the few-token kernel (`use_small_kernel`) where one compiles. Returns the
    rows by `KERNEL_LABELS` and the kernel report (its `name` and `reason`).
    """
    import copy

    from ..models.gpt2 import use_small_kernel
    from ..models.grow import widen

    grown = widen(copy.deepcopy(target).float(), factor)  # [the same logits], weights that stream from memory
    draft32 = copy.deepcopy(draft).float()
    hf_grown, hf_draft = to_hf(grown), to_hf(draft32)

    def timed(run: Callable[[], Run]) -> tuple[int, list[float]]:
        return run().steps, [run().seconds for _ in range(repeats)]  # the warm-up's steps, then the repeats

    rows = {KERNEL_LABELS[0]: timed(lambda: hf_generate(hf_grown, prompt, max_new_tokens, draft=hf_draft, k=k)),
            KERNEL_LABELS[1]: timed(lambda: specref_generate(grown, prompt, max_new_tokens, draft=draft32, k=k))}
    kernel = use_small_kernel(grown)  # attaches the few-token kernel where one compiles; else leaves grown as it was
    if kernel.name == "compiled":
        rows[KERNEL_LABELS[2]] = timed(lambda: specref_generate(grown, prompt, max_new_tokens, draft=draft32, k=k))
    return rows, kernel
