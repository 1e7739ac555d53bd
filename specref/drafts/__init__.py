"""Drafts: anything that proposes tokens with the q it drew them from (chapters 4-6).

One contract (`base.Draft`): `begin`, `propose(k)` for chains, `propose_tree(spec)` for a draft
that grows trees (`TreeDraft` names those), `observe` for one that reads the target's hidden
states, `rollback`. A draft holds its state as parts: `cached.DraftCache`, its own KV cache over
the buffer's rows, and `features.FeatureBuffer`, the target's hidden states aligned to the
buffer. `model.ModelDraft` is a smaller language model (a cache), `model.TreeModelDraft` the same
model growing trees; `early_exit.SelfDraft` is the target's own first layers as that smaller model
(self-speculation); `prompt_lookup.PromptLookupDraft` copies what followed the context's last
tokens earlier on (no state); `medusa.MedusaDraft` (features), `eagle.EagleDraft` (features and a
cache) and `mtp.MTPDraft` (features and a cache per depth) read the target's hidden states
(their modules: `heads`). The tree shapes and `grow_trees` (the rule that grows them,
`specref.tree_shapes`) are re-exported here and from `shapes`; `base.NoDraft` proposes nothing;
`load.load_draft` loads the shipped drafts by name. `train.MedusaTrainer` trains Medusa heads on
the frozen target, live.
"""

from .._lazy import lazy_names

# name -> the module that defines it, imported on first use (PEP 562): see specref/__init__.py.
_LAZY: dict[str, str] = {
    "as_draft": "specref.drafts.model",
    "as_tree_draft": "specref.drafts.model",
    "as_tree_spec": "specref.tree_shapes",
    "build_tree": "specref.tree_shapes",
    "Draft": "specref.drafts.base",
    "DraftCache": "specref.drafts.cached",
    "DynamicTree": "specref.tree_shapes",
    "EagleDraft": "specref.drafts.eagle",
    "early_exit_model": "specref.drafts.early_exit",
    "FeatureBuffer": "specref.drafts.features",
    "grow_trees": "specref.tree_shapes",
    "load_draft": "specref.drafts.load",
    "MedusaDraft": "specref.drafts.medusa",
    "MedusaTrainer": "specref.drafts.train",
    "ModelDraft": "specref.drafts.model",
    "MTPDraft": "specref.drafts.mtp",
    "NoDraft": "specref.drafts.base",
    "PromptLookupDraft": "specref.drafts.prompt_lookup",
    "SelfDraft": "specref.drafts.early_exit",
    "train_medusa": "specref.drafts.train",
    "TreeDraft": "specref.drafts.base",
    "TreeModelDraft": "specref.drafts.model",
    "TreeShape": "specref.tree_shapes",
}

__all__ = [
    "Draft", "DraftCache", "DynamicTree", "EagleDraft", "FeatureBuffer", "MTPDraft", "MedusaDraft", "MedusaTrainer",
    "ModelDraft", "NoDraft", "PromptLookupDraft", "SelfDraft", "TreeDraft", "TreeModelDraft", "TreeShape", "as_draft",
    "as_tree_draft", "as_tree_spec", "build_tree", "early_exit_model", "grow_trees", "load_draft", "train_medusa",
]


__getattr__, __dir__ = lazy_names(__name__, _LAZY)
