"""How long a careful read of each lecture takes, from what the committed notebook holds.

    python tools/upkeep/reading_times.py [NOTEBOOK ...]   (no files: notebooks/*.ipynb)
    python tools/upkeep/reading_times.py --readme          write the lectures' minutes and total into README.md

A careful read of a technical notebook: the markdown read to learn (formulas included), every code cell read,
run and its output looked at. The rates, stated once here and in the README:

- markdown: WORDS_PER_MINUTE = 120 words a minute (whitespace-separated words; a formula's pieces count as
  words). Reading to learn technical text runs at roughly 100-150 words a minute, about half the speed of
  ordinary reading;
- code: SECONDS_PER_CELL = 15 s for each code cell (run it, look at what it did) plus SECONDS_PER_LINE = 5 s
  for each non-blank source line (comments included);
- output: SECONDS_PER_OUTPUT_LINE = 3 s for each printed line (stream or text/plain), SECONDS_PER_FIGURE = 30 s
  for each figure or widget.

No timing of the notebook's execution enters: that is the machine's (each runs in under a minute). The README's
table gives each notebook's minutes rounded to ROUND_TO = 5 minutes and the total rounded the same way;
tests/test_release.py holds the README to what this script computes from the committed notebooks.
"""

from __future__ import annotations

import json
import re
import sys
from dataclasses import dataclass
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
WORDS_PER_MINUTE = 120
SECONDS_PER_CELL = 15
SECONDS_PER_LINE = 5
SECONDS_PER_OUTPUT_LINE = 3
SECONDS_PER_FIGURE = 30
ROUND_TO = 5  # minutes
WIDGET = "application/vnd.jupyter.widget-view+json"


def _text(value: str | list[str]) -> str:
    return value if isinstance(value, str) else "".join(value)


@dataclass(frozen=True)
class Reading:
    name: str
    words: int  # of markdown
    cells: int  # code cells
    lines: int  # non-blank source lines of code
    output_lines: int  # printed lines
    figures: int  # figures and widgets

    @property
    def minutes(self) -> float:
        seconds = (self.words / WORDS_PER_MINUTE * 60 + self.cells * SECONDS_PER_CELL + self.lines * SECONDS_PER_LINE
                   + self.output_lines * SECONDS_PER_OUTPUT_LINE + self.figures * SECONDS_PER_FIGURE)
        return seconds / 60


def reading(path: Path | str) -> Reading:
    """What one notebook holds to be read (module docstring)."""
    path = Path(path)
    nb = json.loads(path.read_text(encoding="utf-8"))
    words = cells = lines = output_lines = figures = 0
    for cell in nb["cells"]:
        source = _text(cell.get("source", ""))
        if cell.get("cell_type") == "markdown":
            words += len(source.split())
        elif cell.get("cell_type") == "code":
            cells += 1
            lines += sum(1 for line in source.splitlines() if line.strip())
            for out in cell.get("outputs", []):
                data = out.get("data", {})
                if WIDGET in data or any(kind.startswith("image/") for kind in data):
                    figures += 1
                elif out.get("output_type") == "stream":
                    output_lines += len(_text(out.get("text", "")).splitlines())
                elif "text/plain" in data:
                    output_lines += len(_text(data["text/plain"]).splitlines())
    return Reading(path.name, words, cells, lines, output_lines, figures)


def rounded(minutes: float) -> int:
    """Minutes to the README's rounding (ROUND_TO), never below one step."""
    return max(ROUND_TO, ROUND_TO * round(minutes / ROUND_TO))


def hours(minutes: int) -> str:
    """120 -> '2 h', 445 -> '7 h 25'."""
    h, m = divmod(minutes, 60)
    return f"{h} h {m:02d}" if m else f"{h} h"


def lectures(repo: Path = REPO) -> list[Path]:
    return sorted((repo / "notebooks").glob("[0-9][0-9]_*.ipynb"))


def update_readme(readme: Path = REPO / "README.md", repo: Path = REPO) -> list[str]:
    """Write each lecture's rounded minutes into the README's table (its last column) and the rounded total into
    its "N h MM in all"; returns what changed."""
    text = readme.read_text(encoding="utf-8")
    rows = [reading(p) for p in lectures(repo)]
    changed = []
    for r in rows:
        row = re.compile(rf"^(\| \d\d \| `{re.escape(r.name)}` \|.*\| )(\d+)( \|)$", re.MULTILINE)
        m = row.search(text)
        if m is None:
            raise ValueError(f"{readme} has no table row for {r.name}")
        if int(m.group(2)) != rounded(r.minutes):
            changed.append(f"{r.name}: {m.group(2)} -> {rounded(r.minutes)}")
        text = text[:m.start(2)] + str(rounded(r.minutes)) + text[m.end(2):]
    total = hours(rounded(sum(r.minutes for r in rows)))
    m = re.search(r"\d+ h(?: \d+)? in all", text)
    if m is None:
        raise ValueError(f"{readme} has no total ('N h MM in all')")
    if m.group(0) != f"{total} in all":
        changed.append(f"total: {m.group(0)} -> {total} in all")
    readme.write_text(text[:m.start()] + f"{total} in all" + text[m.end():], encoding="utf-8")
    return changed


def main(argv: list[str] | None = None) -> int:
    args = sys.argv[1:] if argv is None else argv
    if args == ["--readme"]:
        for line in update_readme() or ["README.md already matches"]:
            print(line)
        return 0
    paths = [Path(a) for a in args] or lectures()
    rows = [reading(p) for p in paths]
    print(f"rates: {WORDS_PER_MINUTE} words/min of markdown; {SECONDS_PER_CELL} s per code cell + {SECONDS_PER_LINE} s "
          f"per source line; {SECONDS_PER_OUTPUT_LINE} s per output line, {SECONDS_PER_FIGURE} s per figure or widget")
    print(f"{'notebook':40s} {'words':>6s} {'cells':>5s} {'lines':>5s} {'out':>4s} {'figs':>4s} {'min':>6s} "
          f"{'README':>6s}")
    for r in rows:
        print(f"{r.name:40s} {r.words:6d} {r.cells:5d} {r.lines:5d} {r.output_lines:4d} {r.figures:4d} "
              f"{r.minutes:6.1f} {rounded(r.minutes):6d}")
    total = sum(r.minutes for r in rows)
    print(f"{'total':40s} {'':32s} {total:6.1f} {rounded(total):6d} ({hours(rounded(total))})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
