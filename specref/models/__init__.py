"""Transformer models used as targets and drafts: GPT-2 with a speculative-decoding KV cache."""

from .gpt2 import GPT2, GPT2Config, GPT2Output, normalize_state_dict
from .kvcache import KVCache
from .pretrained import from_pretrained, load_pair, save_pretrained, training_record
from .tokenizer import EOT, BPETokenizer, load_tokenizer, train_tokenizer

__all__ = [
    "GPT2",
    "GPT2Config",
    "GPT2Output",
    "KVCache",
    "BPETokenizer",
    "EOT",
    "from_pretrained",
    "load_pair",
    "load_tokenizer",
    "normalize_state_dict",
    "save_pretrained",
    "train_tokenizer",
    "training_record",
]
