"""Drafts: anything that proposes k tokens with the q it drew them from (chapter 5).

`base.Draft` is the one protocol the decoding loop talks to; `model.ModelDraft` is a
smaller language model with its own KV cache.
"""

from .base import Draft
from .model import ModelDraft, as_draft

__all__ = ["Draft", "ModelDraft", "as_draft"]
