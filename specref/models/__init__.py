"""Transformer models used as targets and drafts: GPT-2 with a speculative-decoding KV cache (chapters 1, 4).

gpt2 (the model), kvcache (per-row lengths, truncate, compact), graphs (passes captured as CUDA
graphs), session (one generation's caches and graphs), tokenizer, pretrained (HF-layout loading and saving, the GPU timing pair, the real GPT-2
family pair), pair (the bundled pair, its training record, held-out prompts).
"""

from .._lazy import lazy_names

# name -> the module that defines it, imported on first use (PEP 562): see specref/__init__.py.
_LAZY: dict[str, str] = {
    "BPETokenizer": "specref.models.tokenizer",
    "CapturedPasses": "specref.models.graphs",
    "EOT": "specref.models.tokenizer",
    "from_pretrained": "specref.models.pretrained",
    "gpt2_family_pair": "specref.models.pretrained",
    "GPT2": "specref.models.gpt2",
    "GPT2Config": "specref.models.gpt2",
    "GPT2Output": "specref.models.gpt2",
    "heldout_prompts": "specref.models.pair",
    "KVCache": "specref.models.kvcache",
    "load_pair": "specref.models.pair",
    "load_tokenizer": "specref.models.tokenizer",
    "timing_pair": "specref.models.pretrained",
    "TimingPair": "specref.models.pretrained",
    "normalize_state_dict": "specref.models.gpt2",
    "save_pretrained": "specref.models.pretrained",
    "Session": "specref.models.session",
    "train_tokenizer": "specref.models.tokenizer",
    "training_record": "specref.models.pair",
}

__all__ = [
    "GPT2",
    "GPT2Config",
    "GPT2Output",
    "KVCache",
    "BPETokenizer",
    "CapturedPasses",
    "EOT",
    "from_pretrained",
    "gpt2_family_pair",
    "heldout_prompts",
    "load_pair",
    "load_tokenizer",
    "timing_pair",
    "TimingPair",
    "normalize_state_dict",
    "save_pretrained",
    "Session",
    "train_tokenizer",
    "training_record",
]


__getattr__, __dir__ = lazy_names(__name__, _LAZY)
