"""Transformer models used as targets and drafts: GPT-2 with a speculative-decoding KV cache (chapters 1, 4).

gpt2 (the model), kvcache (per-row lengths, truncate, compact), tokenizer, pretrained
(HF-layout loading and saving), pair (the bundled pair, its training record, held-out prompts).
"""

from .gpt2 import GPT2, GPT2Config, GPT2Output, normalize_state_dict
from .kvcache import KVCache
from .pair import heldout_prompts, load_pair, training_record
from .pretrained import from_pretrained, save_pretrained
from .tokenizer import EOT, BPETokenizer, load_tokenizer, train_tokenizer

__all__ = [
    "GPT2",
    "GPT2Config",
    "GPT2Output",
    "KVCache",
    "BPETokenizer",
    "EOT",
    "from_pretrained",
    "heldout_prompts",
    "load_pair",
    "load_tokenizer",
    "normalize_state_dict",
    "save_pretrained",
    "train_tokenizer",
    "training_record",
]
