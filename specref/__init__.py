"""specref: a small, verified reference implementation of speculative decoding.

Conventions: `p` is the target's next-token distribution, `q` the draft's, both
after the same `process_logits`; `k` drafts per step; `alpha` the acceptance
rate; `c` the cost of a draft step relative to a target step. Every random
function takes an explicit `torch.Generator`.
"""

from .rejection import acceptance_probability, residual, verify_chain, verify_chain_greedy
from .sampling import process_logits, sample
from .theory import expected_tokens_per_step, optimal_k, speedup

__version__ = "0.1.0"

__all__ = [
    "acceptance_probability",
    "expected_tokens_per_step",
    "optimal_k",
    "process_logits",
    "residual",
    "sample",
    "speedup",
    "verify_chain",
    "verify_chain_greedy",
]
