"""specref: a small, verified reference implementation of speculative decoding.

Conventions: `p` is the target's next-token distribution, `q` the draft's, both
after the same `process_logits`; `k` drafts per step; `alpha` the acceptance
rate; `c` the cost of a draft step relative to a target step. Every random
function takes an explicit `torch.Generator`.

Modules, one concept each, by floor (a module imports only from its own floor or
below; `tests/test_layering.py` holds the order and checks it):

rules
    sampling            process_logits, sample, SamplingParams, TorchRNG       (nb 02)
    rejection           acceptance_probability, residual, verify_chain_greedy  (nb 02)
    chain_verify        verify_chain: the rule on a chain of drafts             (nb 02)
    theory              tokens per step, speedup, optimal k, alpha estimate    (nb 03)
    trees               Tree, tree_attention_mask, tree_position_ids, verify_tree*  (nb 06)
    tree_shapes         TreeShape, DynamicTree, TreeGrower, grow_trees, build_tree (also drafts.shapes)  (nb 06)
    typical             TypicalAcceptance, verify_chain_typical: Medusa's rule, LOSSY  (nb 05, 08)
    timing              sync, timed: the one timer every floor uses
models
    models.gpt2, models.kvcache, models.tokenizer, models.pretrained       (nb 01, 04)
    models.pair         load_pair, load_grown_pair, training_record, heldout_prompts  (nb 04)
    models.session      Session: one generation's KV caches and captured passes, kept for the next
    models.grow         widen, GrownGPT2: the bundled target grown wider with the same function  (nb 01, 04)
    models.kernels      SmallLinear, kernel_path: the few-token CPU kernel      (nb 01)
    models.workloads    edit_prompts, edit_cases: the copy-heavy "apply an edit" workload  (nb 05)
drafts
    drafts.base         Draft, the one contract (propose; propose_tree where a draft grows trees)  (nb 04, 05)
    drafts.cached       DraftCache: the part that holds a draft's own KV cache, its catch-up, a tree's ancestors
    drafts.model        ModelDraft, TreeModelDraft                             (nb 04, 06)
    drafts.prompt_lookup  PromptLookupDraft: copy what followed the last n-gram
    drafts.features     FeatureBuffer: the part that holds the target's hidden states (the observe hook)
    drafts.eagle        EagleDraft: one layer drafting the next feature (EAGLE-1/2/3)
    drafts.medusa       MedusaDraft: k heads on the last feature, chain or Medusa tree
    drafts.early_exit   SelfDraft: the target's own first layers and LM head as the draft (no training)  (nb 05)
    drafts.train        MedusaTrainer, train_medusa: heads trained live on the frozen target, seeded  (nb 05)
    drafts.mtp          MTPDraft: DeepSeek-V3 MTP modules chained by depth, a cache each
    drafts.load         load_draft(name, target): every shipped draft, checked against the target
decoding
    decoding.loop       SpecStats, the token buffer, prefill, decode: the one driver, on_step  (nb 04)
    decoding.inputs     the checks a generation makes at its start; a proposal's shape
    decoding.chain      generate, speculative_step, speculative_generate       (nb 04)
    decoding.tree       score_tree, keep_path, tree_step, tree_generate        (nb 06)
    decoding.lookahead  lookahead_generate: Jacobi n-grams, made and verified in one pass
    decoding.record     record_generation: each step's drafts and tokens (via on_step)  (nb 05)
    decoding.positions  acceptance_by_position, counts_from_histogram          (nb 05)
    decoding.trace      trace_step: one step, recorded                         (nb 04)
checks, perf
    checks.toy          Markov-chain models                                    (nb 02, 03)
    checks.rng          the symbolic rng and exact_distribution                (nb 02)
    checks.exact        exact enumeration of chain steps                       (nb 02, 03)
    checks.exact_trees  exact enumeration of tree steps                        (nb 06)
    checks.montecarlo   vectorized sampler, distribution test                  (nb 02)
    checks.broken       broken drafts, targets, chain and tree rules: shipped bugs as negative controls  (nb 04, 08)
    checks.pitfalls     the check that catches each shipped bug; exact TV      (nb 08)
    perf.costs, perf.measure   timing a pass, the machine's peaks               (nb 01, 04)
    perf.roofline       weight_bytes, forward_flops, arithmetic_intensity     (nb 01, 07)
    perf.verify_cost    measure_pass_costs: v(k) and c from paired isolated passes  (nb 01, 04, 05, 07)
    perf.tree_timing    measure_tree_pass_costs, time_tree_decoding: tree passes and trees timed  (nb 06)
    perf.training_curve acceptance_counts, training_curve: tau and acceptance by position as training goes on  (nb 05)
    perf.costmodel      PassModel, CostModel, choose_k, batch_steps, crossover, the H100 example  (nb 07)
    perf.draft_costs    a draft's parameters and KV cache; its step on a modelled GPU  (nb 05)
    perf.domains        code / comment / docstring labels, acceptance along a text  (nb 08)
course
    course.plots, course.report, course.widgets, course.doctor  (the notebooks' views and the sentences their
    timings print; the graders are the separate
    package specref_grading, which specref never imports)
"""

from ._lazy import lazy_names

# name -> the module that defines it, imported on first use (PEP 562): importing one module of specref never
# imports another as a side effect, and a kernel given a copy of specref without some modules imports the rest.
_LAZY: dict[str, str] = {
    "acceptance_probability": "specref.rejection",
    "batch_steps": "specref.perf.costmodel",
    "build_tree": "specref.tree_shapes",
    "choose_k": "specref.perf.costmodel",
    "CostModel": "specref.perf.costmodel",
    "crossover_batch": "specref.perf.costmodel",
    "distribution_test": "specref.checks.montecarlo",
    "DistributionTest": "specref.checks.montecarlo",
    "Draft": "specref.drafts.base",
    "DynamicTree": "specref.tree_shapes",
    "EagleDraft": "specref.drafts.eagle",
    "edit_prompts": "specref.models.workloads",
    "estimate_alpha": "specref.theory",
    "expected_tokens_per_step": "specref.theory",
    "FeatureBuffer": "specref.drafts.features",
    "generate": "specref.decoding.chain",
    "generation_distribution": "specref.checks.exact",
    "h100_worked_example": "specref.perf.costmodel",
    "load_draft": "specref.drafts.load",
    "load_pair": "specref.models.pair",
    "load_grown_pair": "specref.models.pair",
    "measure_pass_costs": "specref.perf.verify_cost",
    "widen": "specref.models.grow",
    "lookahead_generate": "specref.decoding.lookahead",
    "MarkovChain": "specref.checks.toy",
    "MedusaDraft": "specref.drafts.medusa",
    "mixture": "specref.checks.toy",
    "ModelDraft": "specref.drafts.model",
    "MTPDraft": "specref.drafts.mtp",
    "one_step_distribution": "specref.checks.exact",
    "optimal_k": "specref.theory",
    "PassModel": "specref.perf.costmodel",
    "process_logits": "specref.sampling",
    "PromptLookupDraft": "specref.drafts.prompt_lookup",
    "random_chain": "specref.checks.toy",
    "residual": "specref.rejection",
    "sample": "specref.sampling",
    "SamplingParams": "specref.sampling",
    "simulate": "specref.checks.montecarlo",
    "SpecStats": "specref.decoding.loop",
    "speculative_generate": "specref.decoding.chain",
    "speedup": "specref.theory",
    "step_distribution": "specref.checks.exact",
    "toy_pair": "specref.checks.toy",
    "Tree": "specref.trees",
    "tree_attention_mask": "specref.trees",
    "tree_generate": "specref.decoding.tree",
    "tree_position_ids": "specref.trees",
    "TreeShape": "specref.tree_shapes",
    "TypicalAcceptance": "specref.typical",
    "verify_chain": "specref.chain_verify",
    "verify_chain_greedy": "specref.rejection",
    "verify_chain_typical": "specref.typical",
    "verify_tree": "specref.trees",
    "verify_tree_greedy": "specref.trees",
}
_SUBPACKAGES = ("checks", "course", "decoding", "drafts", "models", "perf")


__version__ = "0.1.0"


__getattr__, __dir__ = lazy_names(__name__, _LAZY, _SUBPACKAGES)



__all__ = [
    "CostModel",
    "DistributionTest",
    "Draft",
    "DynamicTree",
    "EagleDraft",
    "FeatureBuffer",
    "MTPDraft",
    "MarkovChain",
    "MedusaDraft",
    "ModelDraft",
    "PassModel",
    "PromptLookupDraft",
    "SamplingParams",
    "SpecStats",
    "Tree",
    "TreeShape",
    "TypicalAcceptance",
    "acceptance_probability",
    "batch_steps",
    "build_tree",
    "choose_k",
    "crossover_batch",
    "distribution_test",
    "edit_prompts",
    "estimate_alpha",
    "expected_tokens_per_step",
    "generate",
    "generation_distribution",
    "h100_worked_example",
    "load_draft",
    "load_pair",
    "load_grown_pair",
    "measure_pass_costs",
    "widen",
    "lookahead_generate",
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
    "verify_chain_typical",
    "verify_tree",
    "verify_tree_greedy",
]
