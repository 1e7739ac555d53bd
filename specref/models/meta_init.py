"""Building a model on the meta device without its random initialisers.

The rule: on the meta device a tensor has a shape and no values, so drawing its initial weights is a no-op; it
is skipped (`NoMetaDraws`), and every other call runs as it is. A model built there (a shape to assign a checkpoint
to) then costs no import of torch's compiler, which meta's ``normal_`` pulls in on its first call (seconds of CPU
in a fresh process). On any real device the draws are untouched.
"""

from __future__ import annotations

import torch
from torch import nn


class NoMetaDraws(torch.overrides.TorchFunctionMode):
    """``normal_`` of a meta tensor returns it unchanged; everything else runs as called."""

    def __torch_function__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        tensor = args[0] if args else kwargs.get("tensor")
        if func in (nn.init.normal_, torch.Tensor.normal_) and isinstance(tensor, torch.Tensor) and tensor.is_meta:
            return tensor
        return func(*args, **kwargs)
