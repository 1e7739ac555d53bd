"""Write specref/assets/heldout_prompts.json: fixed prompts cut from the held-out source files.

Prompts are the first lines of functions (from a `def` line on) in the files
that `tools/training/train_pair.py` held out, so benchmarks and notebooks measure the
pair on code it never trained on. The file is bundled so every machine uses
the same prompts whatever its Python version.

    python tools/training/make_prompts.py [--n 48] [--chars 400]
"""

from __future__ import annotations

import argparse
import hashlib
import json
import re
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "tools" / "training"))
sys.path.insert(0, str(ROOT))

from train_pair import collect_corpus  # noqa: E402


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--n", type=int, default=48)
    ap.add_argument("--chars", type=int, default=400)
    ap.add_argument("--out", default=str(ROOT / "specref" / "assets" / "heldout_prompts.json"))
    args = ap.parse_args()
    _, heldout, info = collect_corpus(include_tests=True, max_file_bytes=400_000, heldout_percent=2.0)
    candidates = []
    for rel, text in heldout:
        for m in re.finditer(r"^[ \t]*def [A-Za-z_]\w*\(", text, flags=re.M):
            snippet = text[m.start() : m.start() + args.chars]
            if len(snippet) == args.chars and "\t" not in snippet:
                candidates.append((rel, m.start(), snippet))
    # A deterministic, spread-out choice: order by a hash of (file, offset), take the first n.
    candidates.sort(key=lambda c: hashlib.sha256(f"{c[0]}:{c[1]}".encode()).hexdigest())
    chosen = sorted(candidates[: args.n], key=lambda c: (c[0], c[1]))
    record = {
        "about": "prompts cut from held-out stdlib files (see TRAINING.json); first lines of functions",
        "python_version": info["python_version"],
        "prompts": [{"file": rel, "offset": off, "text": s} for rel, off, s in chosen],
    }
    Path(args.out).write_text(json.dumps(record, indent=1) + "\n")
    print(f"wrote {len(chosen)} prompts from {len({c[0] for c in chosen})} files to {args.out}")


if __name__ == "__main__":
    main()
