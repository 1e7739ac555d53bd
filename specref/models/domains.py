"""Deprecated path: the acceptance analysis by kind of text lives in `specref.perf.domains`.

It reads a target/draft pair and measures acceptance, so it sits on the checks/perf floor; this
module only re-exports its names, with a DeprecationWarning, so old imports keep working.
"""

from __future__ import annotations

import warnings

from ..perf.domains import LABELS, acceptance_along, source_labels, token_labels

__all__ = ["LABELS", "acceptance_along", "source_labels", "token_labels"]

warnings.warn("specref.models.domains moved to specref.perf.domains; import it from there",
              DeprecationWarning, stacklevel=2)
