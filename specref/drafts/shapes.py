"""The tree shapes and `grow_trees`, where the drafts and their users import them from (`specref.tree_shapes`)."""

from ..tree_shapes import DraftLogits, DynamicTree, TreeShape, TreeSpec, as_tree_spec, build_tree, grow_trees

__all__ = ["DraftLogits", "DynamicTree", "TreeShape", "TreeSpec", "as_tree_spec", "build_tree", "grow_trees"]
