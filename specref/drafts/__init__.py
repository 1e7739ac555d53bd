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

from .base import Draft, DraftBase, NoDraft, TreeDraft
from .eagle import EagleDraft
from .features import FeatureDraft
from .load import load_draft
from .medusa import MedusaDraft
from .model import ModelDraft, TreeModelDraft, as_draft, as_tree_draft
from .mtp import MTPDraft
from .prompt_lookup import PromptLookupDraft
from ..tree_shapes import DynamicTree, TreeShape, as_tree_spec, build_tree, grow_trees

__all__ = [
    "Draft", "DraftBase", "DynamicTree", "EagleDraft", "FeatureDraft", "MTPDraft", "MedusaDraft", "ModelDraft",
    "NoDraft", "PromptLookupDraft", "TreeDraft", "TreeModelDraft", "TreeShape", "as_draft", "as_tree_draft",
    "as_tree_spec", "build_tree", "grow_trees", "load_draft",
]
