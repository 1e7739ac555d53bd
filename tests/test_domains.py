"""specref.perf.domains: labelling Python source by kind, and teacher-forced acceptance along a text."""

from __future__ import annotations

import pytest
import torch

from specref.perf import domains
from specref.perf.domains import acceptance_along, source_labels, token_labels
from specref.sampling import SamplingParams

SNIPPET = 'def f(x):\n    """Twice x."""\n    y = "no doc"  # a comment\n    return 2 * x\n'


def _spans(text: str, labels: list[str], kind: str) -> str:
    return "".join(c if lab == kind else "|" for c, lab in zip(text, labels)).strip("|")


def test_comments_and_docstrings_are_labelled_and_other_strings_are_code():
    labels = source_labels(SNIPPET)
    assert len(labels) == len(SNIPPET)
    assert _spans(SNIPPET, labels, "docstring") == '"""Twice x."""'
    assert _spans(SNIPPET, labels, "comment") == "# a comment"
    assert SNIPPET.index('"no doc"') not in [i for i, lab in enumerate(labels) if lab != "code"]


def test_a_snippet_cut_inside_a_docstring_is_docstring_to_the_end():
    text = 'def g():\n    """Start of a long\n    docstring that never'
    labels = source_labels(text)
    start = text.index('"""')
    assert set(labels[start:]) == {"docstring"} and set(labels[:start]) == {"code"}


def test_token_labels_take_the_first_non_blank_character():
    pieces = ["def", " f", "(x):\n", "    ", '"""Twice x."""', "\n", "    y", ' = "no doc"', "  #", " a comment", "\n",
              "    return", " 2 * x\n"]
    table = {i: s for i, s in enumerate(pieces)}
    labels = token_labels(SNIPPET, list(range(len(pieces))), table.__getitem__)
    assert labels[4] == "docstring" and labels[8] == "comment" and labels[9] == "comment" and labels[6] == "code"
    with pytest.raises(ValueError, match="add up"):
        token_labels(SNIPPET, [0, 1], table.__getitem__)


def test_acceptance_along_a_text_is_beta_of_the_processed_pair():
    class Fixed(torch.nn.Module):
        def __init__(self, logits):
            super().__init__()
            self.logits = logits
            self.device = torch.device("cpu")

        def forward(self, x):
            return self.logits[None, : x.shape[1]]

    g = torch.Generator().manual_seed(0)
    lt, ld = torch.randn(6, 5, dtype=torch.float64, generator=g), torch.randn(6, 5, dtype=torch.float64, generator=g)
    beta, agree = acceptance_along(Fixed(lt), Fixed(ld), [1, 2, 3, 4, 0, 1], SamplingParams(0.7))
    p, q = torch.softmax(lt[:5] / 0.7, -1), torch.softmax(ld[:5] / 0.7, -1)
    assert torch.allclose(beta, torch.minimum(p, q).sum(-1), atol=1e-12)
    assert torch.equal(agree, lt[:5].argmax(-1) == ld[:5].argmax(-1))
    greedy, _ = acceptance_along(Fixed(lt), Fixed(ld), [1, 2, 3], SamplingParams(0.0))
    assert torch.equal(greedy.bool(), agree[:2])
    with pytest.raises(ValueError, match="at least 2"):
        acceptance_along(Fixed(lt), Fixed(ld), [1], SamplingParams(1.0))
    with pytest.raises(TypeError, match="params must be a specref.sampling.SamplingParams"):
        acceptance_along(Fixed(lt), Fixed(ld), [1, 2, 3], 0.7)


def test_domain_view_means_and_the_plot_draws_them():
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    from specref.course.plots import domain_view, plot_acceptance_by_domain

    view = domain_view({"code": [0.5, 1.0], "prose": [0.25], "empty": []},
                       {"code": [True, False], "prose": [True], "empty": []})
    assert view["names"] == ["code", "prose"] and view["n"].tolist() == [2, 1]
    assert view["beta"].tolist() == [0.75, 0.25] and view["agree"].tolist() == [0.5, 1.0]
    ax = plot_acceptance_by_domain(view)
    heights = sorted(round(b.get_height(), 6) for b in ax.patches)
    assert heights == [0.25, 0.5, 0.75, 1.0]
    plt.close("all")
    with pytest.raises(ValueError, match="same kinds"):
        domain_view({"code": [0.5]}, {"code": []})


def test_the_module_lives_on_the_perf_floor_only():
    """No alias under another path: a 0.1.0 package keeps no deprecated names."""
    with pytest.raises(ModuleNotFoundError):
        import specref.models.domains  # noqa: F401
    assert domains.__name__ == "specref.perf.domains"
