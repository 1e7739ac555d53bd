"""Find hand-written claims about how a timing came out: they belong in a cell's output, generated from the run.

A timing belongs to the machine it ran on. A notebook that times something prints its verdict from the
numbers it measured ("on this run, k = 3 was fastest: 2.1x"), so the sentence matches the outputs on every
machine. A markdown cell or the README cannot know how the learner's run came out, so it may explain,
predict, model and point at a measurement, but not state its direction.

A sentence is flagged when it

* names the direction of a timed outcome (faster, slower, flat, "costs about as much", a speedup "of"
  some factor; or beats, loses, gains next to a word of timing: time, speed, speedup, wall clock...), and
* places it on a measurement or on the reader's machine ("here", "this run", "on a CPU", "measured",
  "timed", "above", "your machine"...), and
* is not a model, a prediction or a condition ("predicts", "the model", "the formula", "would", "if",
  "roofline", "on a GPU", "the chapter", "expect"...).

The rule reads markdown cells of notebooks (lectures, solutions, exercises) and the README's learner
sections (`learner_text.README_LEARNER_SECTIONS`); code cells generate their sentences and are not read.

Usage: python tools/upkeep/measured_claims.py [FILE ...]  (no files: notebooks, solutions, exercises, README).
Exits 1 if anything was found.
"""

from __future__ import annotations

import json
import re
import sys
from dataclasses import dataclass
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from learner_text import REPO, readme_learner_text  # noqa: E402  (a sibling script, not a package)

# A direction that is about time by itself, and one that is about time only next to a word of timing
# ("prompt lookup gains the most" in tokens per pass is a counted fact, not a timing).
DIRECTION = re.compile(
    r"\b(?:faster|slower|quicker|flat|costs? (?:about|nearly|roughly|almost) (?:as much|the same)|"
    r"speedups? of)\b",
    re.IGNORECASE,
)
WEAK_DIRECTION = re.compile(r"\b(?:beats?|beating|loses|lose|losing|wins?|gains?|outruns?)\b", re.IGNORECASE)
TIMING = re.compile(r"\b(?:timed|timings?|time per|wall[- ]clock|speed|speedups?|seconds|ms|throughput|"
                    r"plain decoding)\b", re.IGNORECASE)
MEASURED = re.compile(
    r"\b(?:here|this run|this machine|this cpu|this laptop|your (?:machine|cpu|laptop|run)|on a cpu|on the cpu|"
    r"measured|measures|timed|times|above|below|in practice)\b",
    re.IGNORECASE,
)
MODELLED = re.compile(
    r"\b(?:predicts?|predicted|prediction|model(?:led|s)?|formula|would|could|might|if|when|whether|roofline|"
    r"on (?:a|the) gpu|on an? h100|on gpus|expects?|expected|assum\w*|in theory|ideal|should|allows?|"
    r"can|may|says|prints?|printed)\b",
    re.IGNORECASE,
)
_SENTENCE = re.compile(r"(?<=[.!?])\s+(?=[A-Z(`*])|\n\s*\n|\n\s*[-*] ")


@dataclass(frozen=True)
class Claim:
    where: str
    sentence: str

    def __str__(self) -> str:
        return f"{self.where}: a hand-written measured direction: {self.sentence.strip()[:200]!r}"


def claims_in_text(text: str, where: str = "") -> list[Claim]:
    """Every sentence of `text` that states a timed outcome's direction as a fact of a measurement."""
    if not isinstance(text, str):
        raise TypeError(f"text must be a str, got {type(text).__name__}")
    text = re.sub(r"```.*?```|\$\$.*?\$\$", " ", text, flags=re.S)  # code blocks and display maths say nothing
    found = []
    for sentence in _SENTENCE.split(text):
        s = " ".join(sentence.split())
        direction = DIRECTION.search(s) or (WEAK_DIRECTION.search(s) and TIMING.search(s))
        if direction and MEASURED.search(s) and not MODELLED.search(s):
            found.append(Claim(where, s))
    return found


def markdown_cells(path: Path) -> list[tuple[int, str]]:
    nb = json.loads(path.read_text())
    return [(i, "".join(c["source"])) for i, c in enumerate(nb["cells"]) if c["cell_type"] == "markdown"]


def lint_notebook(path: Path) -> list[Claim]:
    return [c for i, text in markdown_cells(path) for c in claims_in_text(text, f"{path.name} cell {i}")]


def lint_readme(path: Path = REPO / "README.md") -> list[Claim]:
    return [c for name, text in readme_learner_text(path.read_text()) for c in claims_in_text(text, f"README: {name}")]


def default_files() -> list[Path]:
    return sorted(p for d in ("notebooks", "solutions", "exercises") for p in (REPO / d).glob("*.ipynb"))


def main(argv: list[str]) -> int:
    files = [Path(a) for a in argv] or [*default_files(), REPO / "README.md"]
    found = [c for f in files for c in (lint_readme(f) if f.suffix == ".md" else lint_notebook(f))]
    for c in found:
        print(c)
    return 1 if found else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
