"""specref.perf.hf.time_libraries: both libraries timed on the grown pair, the same steps on each kernel."""

from __future__ import annotations

import pytest
import torch

from specref import load_pair
from specref.models.pair import heldout_prompts
from specref.perf import hf

pytest.importorskip("transformers")


def test_time_libraries_times_every_row_for_the_same_steps() -> None:
    target, draft, _ = load_pair(dtype=torch.float64)
    prompt = heldout_prompts(n=1, n_tokens=16)[0]
    rows, kernel = hf.time_libraries(target, draft, prompt, 6, k=3, repeats=2, factor=2)
    assert list(rows) == list(hf.KERNEL_LABELS[:3 if kernel.name == "compiled" else 2])
    steps = {label: s for label, (s, _) in rows.items()}
    assert len(set(steps.values())) == 1 and 1 <= steps[hf.KERNEL_LABELS[0]] <= 6  # the same function, the same steps
    assert all(len(ts) == 2 and min(ts) > 0 for _, ts in rows.values())
    assert target.dtype == torch.float64 and next(target.parameters()).dtype == torch.float64  # inputs left as they were
