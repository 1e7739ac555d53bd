"""A reference under another name scores nothing: ex02's answer key is the accept/reject rule wherever it lies.

ex08's samplers (specref.checks.samplers, with a private `_residual`) and the lectures' views
(specref.course.plots.accept_reject_view: beta, min(p, q) and the residual of a pair) compute ex02's answers. They
are in ex02's FORBIDDEN: the in-process reference rule fails an answer that calls them, and the kernel's copy for
ex02 cannot hold them even if the exercise's own code imported them (the allow-list copy leaves them out besides,
since ex02's setup imports only the symbolic rng).
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

from specref.checks.samplers import _residual
from specref_grading.checks import accept_reject as A
from specref_grading.notebook import source
from specref_grading.trust import kernel_tree

ROOT = Path(__file__).resolve().parents[1]


def _ex02_forbidden() -> tuple[str, ...]:
    nb = json.loads((ROOT / "solutions" / "ex02_accept_reject.ipynb").read_text(encoding="utf-8"))
    return kernel_tree.forbidden_for([source(c) for c in nb["cells"] if c.get("cell_type") == "code"])


def test_ex08s_residual_handed_in_or_wrapped_scores_nothing_for_ex02():
    def residual(p, q):  # the wrapped form: a learner's own function that calls the helper
        return torch.tensor(_residual(p.tolist(), q.tolist()), dtype=torch.float64)

    for answer in (_residual, residual):
        with pytest.raises(AssertionError, match="uses specref.checks.samplers._residual"):
            A.check_residual(answer)


def test_the_lectures_view_of_a_pair_scores_nothing_for_ex02():
    from specref.course.plots import accept_reject_view

    def residual(p, q):
        return accept_reject_view(p, q)["residual"]

    with pytest.raises(AssertionError, match="uses specref.course.plots.accept_reject_view"):
        A.check_residual(residual)


@pytest.mark.parametrize("name", ["specref.checks.samplers._residual", "specref.checks.samplers.make_sampler",
                                  "specref.course.plots.accept_reject_view",
                                  "specref.course.widgets.accept_reject_widget"])
def test_ex02s_kernel_copy_cannot_hold_another_modules_copy_of_its_rule(name):
    forbidden = _ex02_forbidden()
    assert not kernel_tree.shared_reading().available(forbidden, name), name


def test_ex02s_setup_still_has_what_it_imports():
    assert kernel_tree.shared_reading().available(_ex02_forbidden(), "specref.checks.rng.exact_distribution")
