"""Drafts: anything that proposes tokens with the q it drew them from (chapters 4-6).

Two protocols over one base (`base`): a chain draft's `Draft.propose(k)` and a tree draft's
`TreeDraft.propose_tree(spec)`. `model.ModelDraft` is a smaller language model with its own KV
cache (`cached.CachedDraft`), `model.TreeModelDraft` the same model growing trees;
`prompt_lookup.PromptLookupDraft` copies what followed the context's last tokens earlier on;
`features.FeatureDraft` keeps the target's hidden states for the drafts that read them:
`medusa.MedusaDraft`, `eagle.EagleDraft`, `mtp.MTPDraft` (their modules: `heads`). The tree
shapes and `grow_trees` (the rule that grows them, `specref.tree_shapes`) are re-exported here and
from `shapes`; `base.NoDraft` proposes nothing; `load.load_draft` loads the shipped drafts by name.
"""

from .._lazy import lazy_names

# name -> the module that defines it, imported on first use (PEP 562): see specref/__init__.py.
_LAZY: dict[str, str] = {
    "as_draft": "specref.drafts.model",
    "as_tree_draft": "specref.drafts.model",
    "as_tree_spec": "specref.tree_shapes",
    "build_tree": "specref.tree_shapes",
    "Draft": "specref.drafts.base",
    "DraftBase": "specref.drafts.base",
    "DynamicTree": "specref.tree_shapes",
    "EagleDraft": "specref.drafts.eagle",
    "FeatureDraft": "specref.drafts.features",
    "grow_trees": "specref.tree_shapes",
    "load_draft": "specref.drafts.load",
    "MedusaDraft": "specref.drafts.medusa",
    "ModelDraft": "specref.drafts.model",
    "MTPDraft": "specref.drafts.mtp",
    "NoDraft": "specref.drafts.base",
    "PromptLookupDraft": "specref.drafts.prompt_lookup",
    "TreeDraft": "specref.drafts.base",
    "TreeModelDraft": "specref.drafts.model",
    "TreeShape": "specref.tree_shapes",
}

__all__ = [
    "Draft", "DraftBase", "DynamicTree", "EagleDraft", "FeatureDraft", "MTPDraft", "MedusaDraft", "ModelDraft",
    "NoDraft", "PromptLookupDraft", "TreeDraft", "TreeModelDraft", "TreeShape", "as_draft", "as_tree_draft",
    "as_tree_spec", "build_tree", "grow_trees", "load_draft",
]


__getattr__, __dir__ = lazy_names(__name__, _LAZY)
