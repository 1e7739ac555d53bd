"""The tree shapes, `TreeGrower` and `grow_trees`, where the drafts and their users import them from (`specref.tree_shapes`)."""

from ..tree_shapes import (
           DraftLogits,
           DynamicTree,
           TreeGrower,
           TreeShape,
           TreeSpec,
           as_tree_spec,
           build_tree,
           grow_trees,
)

__all__ = ["DraftLogits", "DynamicTree", "TreeGrower", "TreeShape", "TreeSpec", "as_tree_spec", "build_tree",
           "grow_trees"]
