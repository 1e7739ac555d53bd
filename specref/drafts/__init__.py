"""Drafts: anything that proposes tokens with the q it drew them from (chapters 4-6).

`base.Draft` (a chain: `propose(k)`) and `base.TreeDraft` (a tree: `propose_tree(spec)`) are the two
protocols the decoding loops talk to, over one base (`base.DraftBase`); `cached.CachedDraft` is a draft
with its own KV cache. `model.ModelDraft` is a smaller language model as a chain draft,
`model.TreeModelDraft` the same model growing a tree; `prompt_lookup.PromptLookupDraft` copies what followed the context's
last few tokens earlier in the buffer; `shapes` holds the tree shapes (`TreeShape`, `DynamicTree`) and
`grow_trees`. `features.FeatureDraft` keeps the target's hidden states that the loop hands to a
draft reading them (`Draft.feature_layers`, `observe`); `eagle.EagleDraft` drafts the next feature
with one layer on them (EAGLE-1/2/3). `base.NoDraft` proposes nothing (plain steps through the
loop). New drafts go here.
"""

from .base import Draft, DraftBase, NoDraft, TreeDraft
from .eagle import EagleDraft
from .features import FeatureDraft
from .load import load_draft
from .medusa import MedusaDraft
from .model import ModelDraft, TreeModelDraft, as_draft, as_tree_draft
from .mtp import MTPDraft
from .prompt_lookup import PromptLookupDraft
from .shapes import DynamicTree, TreeShape, as_tree_spec, build_tree, grow_trees

__all__ = [
    "Draft",
    "DraftBase",
    "DynamicTree",
    "EagleDraft",
    "FeatureDraft",
    "MTPDraft",
    "MedusaDraft",
    "ModelDraft",
    "NoDraft",
    "PromptLookupDraft",
    "TreeDraft",
    "TreeModelDraft",
    "TreeShape",
    "as_draft",
    "as_tree_draft",
    "as_tree_spec",
    "build_tree",
    "grow_trees",
    "load_draft",
]
