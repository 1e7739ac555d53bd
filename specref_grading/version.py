"""The grader's version key: a hash of every file whose change can change a grade.

A resumed class run (`classrun`) regrades a submission whose key changed. The key covers this package whole
(the wall, the plan, the protocol, the per-exercise checks, the exercise generator) and the specref package
whole, its assets included (the bundled models, tokenizer and prompts): an answer may import any of specref
that its exercise allows, the copy of specref the learner's kernel sees is made from all of it, and the checks
load the bundled pair. Regrading after a change no grade depended on costs time, never a wrong grade.
"""

from __future__ import annotations

import hashlib
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
PACKAGES = ("specref", "specref_grading")


def grader_files(root: Path = ROOT) -> list[Path]:
    """Every file the key hashes: all of specref/ and specref_grading/ under `root`, but compiled caches."""
    return sorted(p for name in PACKAGES for p in (root / name).rglob("*")
                  if p.is_file() and "__pycache__" not in p.parts)


def grader_version(root: Path = ROOT) -> str:
    """A hash of the files that decide a grade (`grader_files`): a run graded by another grader is regraded.

    `root` is the folder that holds specref/ and specref_grading/ (this checkout's, unless a test names another).
    """
    h = hashlib.sha256()
    for f in grader_files(root):
        h.update(str(f.relative_to(root)).encode() + b"\0" + f.read_bytes() + b"\0")
    return h.hexdigest()[:16]
