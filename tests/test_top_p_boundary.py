"""top-p at the exact boundary: a token whose preceding mass equals top_p is dropped (the set already reaches top_p)."""

from __future__ import annotations

import math

import torch

from specref.sampling import process_logits

# softmax of these float64 logits is exactly [0.5, 0.25, 0.25]: the masses before the sorted tokens are 0, 0.5, 0.75.
LOGITS = torch.tensor([math.log(2), 0.0, 0.0], dtype=torch.float64)


def test_the_probabilities_are_exact_so_the_boundary_is_hit_exactly():
    assert torch.softmax(LOGITS, -1).tolist() == [0.5, 0.25, 0.25]


def test_a_token_whose_mass_before_equals_top_p_is_dropped():
    assert process_logits(LOGITS, top_p=0.5).tolist() == [1.0, 0.0, 0.0]


def test_just_above_the_boundary_the_next_token_is_kept():
    kept = process_logits(LOGITS, top_p=math.nextafter(0.5, 1.0)) > 0
    assert bool(kept[0]) and int(kept.sum()) == 2
