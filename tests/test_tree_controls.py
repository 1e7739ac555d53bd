"""Negative controls for trees: the exact tree check passes the real rule and flags every broken one."""

from __future__ import annotations

import pytest

from specref.checks.exact_trees import BROKEN_TREE_RULES, PrefixModel, tree_step_error
from specref.trees import verify_tree

TARGET, DRAFT = PrefixModel(3, seed=1), PrefixModel(3, seed=2)
SHAPE = (2, 1)  # two top-2 children, one grandchild each: rejections, a residual and leaves to reach


def test_the_exact_tree_check_passes_the_real_rule():
    assert tree_step_error(SHAPE, TARGET, DRAFT, verify_tree) < 1e-12


@pytest.mark.parametrize("name", sorted(BROKEN_TREE_RULES))
def test_the_exact_tree_check_flags_a_broken_rule(name):
    assert tree_step_error(SHAPE, TARGET, DRAFT, BROKEN_TREE_RULES[name]) > 1e-2, name
