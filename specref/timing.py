"""One timer for every floor: wait for the device, then read the clock.

A GPU runs queued work after the call that queued it returns, so a timer must wait
for the device before and after the block it measures (`sync`), or it measures the
launch and not the work. `timed` adds a block's wall time to a named counter.
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from contextlib import contextmanager

import torch


def sync(device: torch.device | str) -> None:
    """Wait for queued GPU work, so a timer measures the work and not its launch."""
    if (device.type if isinstance(device, torch.device) else torch.device(device).type) == "cuda":
        torch.cuda.synchronize(device)


@contextmanager
def timed(counters: object, name: str, device: torch.device) -> Iterator[None]:
    """Add the block's wall time to the float `counters.<name>`, waiting for the device before and after it."""
    sync(device)
    t0 = time.perf_counter()
    yield
    sync(device)
    setattr(counters, name, getattr(counters, name) + time.perf_counter() - t0)
