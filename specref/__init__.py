"""specref: a small, verified reference implementation of speculative decoding.

Conventions: `p` is the target's next-token distribution, `q` the draft's, both
after the same `process_logits`; `k` drafts per step; `alpha` the acceptance
rate; `c` the cost of a draft step relative to a target step. Every random
function takes an explicit `torch.Generator`.

Modules, one concept each: sampling (process_logits, sample), rejection (the
accept/reject rule), theory (tokens per step, speedup), toy (Markov-chain
models), exact (exact enumeration), montecarlo (vectorized sampler and
distribution test), models (GPT-2 with KV cache, the bundled pair), drafts and
decode (speculative generation), trees (tree verification), costs and measure
(timing), plots and widgets (notebook views), grading* (exercise graders).
"""

from .decoding.chain import SpecStats, generate, speculative_generate
from .drafts import Draft, ModelDraft
from .sampling import SamplingParams
from .checks.exact import generation_distribution, one_step_distribution, step_distribution
from .models.pretrained import load_pair
from .checks.montecarlo import DistributionTest, distribution_test, simulate
from .rejection import acceptance_probability, residual, verify_chain, verify_chain_greedy
from .sampling import process_logits, sample
from .theory import estimate_alpha, expected_tokens_per_step, optimal_k, speedup
from .checks.toy import MarkovChain, mixture, random_chain, toy_pair
from .trees import (
    DynamicTree,
    Tree,
    TreeShape,
    build_tree,
    tree_attention_mask,
    tree_position_ids,
    verify_tree,
    verify_tree_greedy,
)
from .decoding.tree import tree_generate

__version__ = "0.1.0"


__all__ = [
    "DistributionTest",
    "Draft",
    "DynamicTree",
    "MarkovChain",
    "ModelDraft",
    "SamplingParams",
    "SpecStats",
    "Tree",
    "TreeShape",
    "acceptance_probability",
    "build_tree",
    "distribution_test",
    "estimate_alpha",
    "expected_tokens_per_step",
    "generate",
    "generation_distribution",
    "load_pair",
    "mixture",
    "one_step_distribution",
    "optimal_k",
    "process_logits",
    "random_chain",
    "residual",
    "sample",
    "simulate",
    "speculative_generate",
    "speedup",
    "step_distribution",
    "toy_pair",
    "tree_attention_mask",
    "tree_generate",
    "tree_position_ids",
    "verify_chain",
    "verify_chain_greedy",
    "verify_tree",
    "verify_tree_greedy",
]
