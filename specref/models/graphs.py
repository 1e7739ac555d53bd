"""Passes captured once as CUDA graphs and replayed: a small pass's hundreds of kernel launches, paid once.

The rule of a captured pass (``CapturedPasses.run(key, fn, *inputs)``):

* The first call with a key runs ``fn(*inputs)`` eagerly (the warm-up, whose result is returned), then
  captures ``fn`` on static copies of the inputs. Capture executes no kernel, so a side effect on a
  persistent buffer (a KV cache's lengths) happens once per call; Python code in ``fn`` runs twice on
  that call: keep host-side counting outside ``fn``.
* A later call copies its inputs into the static buffers (same shape, dtype and device, else
  ``ValueError``), replays, and returns clones of the static outputs.
* ``fn`` must keep its shapes for a key, read nothing back, draw no random numbers, and keep the
  buffers it reads and writes where they are (a replay runs on the captured addresses).
* Disabled, or with inputs on a device without graphs (`capturable`): plain ``fn(*inputs)``.

All graphs of one ``CapturedPasses`` share one memory pool (about what the largest needs).
"""

from __future__ import annotations

import warnings
from collections.abc import Callable, Hashable, Sequence
from dataclasses import dataclass
from typing import Any

import torch

__all__ = ["CapturedPasses", "capturable"]


def capturable(device: torch.device) -> bool:
    """Whether passes on `device` are captured as graphs: CUDA devices only."""
    return device.type == "cuda"


class CudaGraph:
    """A ``torch.cuda.CUDAGraph`` captured with ``torch.cuda.graph``: record, replay, pool."""

    def __init__(self) -> None:
        self.graph = torch.cuda.CUDAGraph()

    def capture(self, fn: Callable[..., Any], inputs: Sequence[torch.Tensor], pool: Any) -> Any:
        with torch.cuda.graph(self.graph, pool=pool):
            return fn(*inputs)

    def replay(self) -> None:
        self.graph.replay()

    def pool(self) -> Any:
        return self.graph.pool()


@dataclass
class _Captured:
    graph: CudaGraph
    inputs: tuple[torch.Tensor, ...]  # the static buffers the graph reads
    outputs: Any  # the static buffers the graph writes: a tensor or a tuple/NamedTuple of them


def _check_output(out: Any, key: Hashable) -> None:
    items = out if isinstance(out, tuple) else (out,)
    for item in items:
        if item is not None and not isinstance(item, torch.Tensor):
            raise TypeError(f"a captured pass must return a tensor or a tuple/NamedTuple of tensors (or None); "
                            f"key {key!r} returned a {type(item).__name__}")


def _clone(out: Any) -> Any:
    """Copies of a static output, so that the next replay cannot change them."""
    if isinstance(out, torch.Tensor):
        return out.clone()
    items = [x.clone() if isinstance(x, torch.Tensor) else x for x in out]
    return out._make(items) if hasattr(out, "_make") else tuple(items)  # a NamedTuple keeps its type


class CapturedPasses:
    """One CUDA graph per key, captured on first use, replayed after (the module's rule); ``enabled=False``: eager."""

    def __init__(self, enabled: bool = True) -> None:
        if not isinstance(enabled, bool):
            raise TypeError(f"enabled must be a bool, got {type(enabled).__name__}")
        self.enabled = enabled
        self._captured: dict[Hashable, _Captured] = {}
        self._eager: set[Hashable] = set()  # keys whose capture failed: they run eagerly
        self._pool: Any = None

    def __len__(self) -> int:  # how many graphs are held
        return len(self._captured)

    def __contains__(self, key: Hashable) -> bool:
        return key in self._captured

    def clear(self) -> None:
        """Forget every graph and the shared pool (the next call with any key captures afresh)."""
        self._captured.clear()
        self._eager.clear()
        self._pool = None

    def run(self, key: Hashable, fn: Callable[..., Any], *inputs: torch.Tensor) -> Any:
        """``fn(*inputs)``, replayed from the key's graph when one is held (see the module rule)."""
        if not self.enabled:
            return fn(*inputs)
        for i, x in enumerate(inputs):
            if not isinstance(x, torch.Tensor):
                raise TypeError(f"inputs of a captured pass must be tensors; input {i} of key {key!r} "
                                f"is a {type(x).__name__}")
        held = self._captured.get(key)
        if held is not None:
            return self._replay(key, held, inputs)
        out = fn(*inputs)  # eager; on a key's first capturable call, the warm-up, whose side effects are this call's
        if key in self._eager or not inputs or not all(capturable(x.device) for x in inputs):
            return out
        _check_output(out, key)
        with torch.inference_mode(False):  # buffers a later replay outside inference mode may write
            static_inputs = tuple(x.detach().clone() for x in inputs)
        graph = CudaGraph()
        try:
            with torch.no_grad():  # not inference_mode: every replay writes the static buffers in place
                static_outputs = graph.capture(fn, static_inputs, self._pool)
        except RuntimeError as err:  # this call's result stands (the eager pass ran); later calls stay eager
            warnings.warn(f"the pass of key {key!r} could not be captured as a CUDA graph and runs eagerly from "
                          f"now on: a captured pass must read nothing back to the host and keep its shapes ({err})",
                          RuntimeWarning, stacklevel=2)
            self._eager.add(key)
            return out
        _check_output(static_outputs, key)
        if self._pool is None:
            self._pool = graph.pool()
        self._captured[key] = _Captured(graph, static_inputs, static_outputs)
        return out

    def _replay(self, key: Hashable, held: _Captured, inputs: Sequence[torch.Tensor]) -> Any:
        if len(inputs) != len(held.inputs):
            raise ValueError(f"key {key!r} was captured with {len(held.inputs)} inputs, got {len(inputs)}")
        for i, (x, s) in enumerate(zip(inputs, held.inputs)):
            if x.shape != s.shape or x.dtype != s.dtype or x.device != s.device:
                raise ValueError(f"input {i} of key {key!r} must match the captured buffer "
                                 f"({tuple(s.shape)}, {s.dtype}, {s.device}), got "
                                 f"({tuple(x.shape)}, {x.dtype}, {x.device}): use another key for another shape")
        with torch.no_grad():
            for x, s in zip(inputs, held.inputs):
                if x.data_ptr() != s.data_ptr():
                    s.copy_(x)
            held.graph.replay()
            return _clone(held.outputs)
