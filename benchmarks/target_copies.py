"""Does the bundled target copy? The ceiling on prompt lookup's gain on the copy workload.

Prompt lookup proposes the text that followed an earlier occurrence of the context's last
tokens; greedy verification accepts a proposal only where it is the target's own argmax. So on
copy-heavy text prompt lookup pays exactly as much as the target itself copies. This script
measures that on the held-out snippets of the edit workload (`specref.models.workloads.edit_cases`),
in two settings, untimed (the figures are counts, the same on every machine):

1. exact repeat: the prompt is the snippet, a newline, then the first third of the snippet again.
   Teacher forced along the rest of the snippet: the share of positions where the target's argmax
   is the next token of the copy. Free running: how many tokens the target's greedy continuation
   follows the copy before it leaves it.
2. the edit prompts themselves (snippet, "# old -> new" marker, the edited head): the same two
   figures along the faithfully edited rest.
3. the quote workload (`quote_prompts`: a passage the target wrote itself, a blank line, its opening
   again), the copy workload notebook 05 uses: the share of the target's greedy tokens that continue a
   span of the prompt (`span_continuations`), against the same share on ordinary held-out code.

    .venv/bin/python benchmarks/target_copies.py [--cases 8]
"""

from __future__ import annotations

import argparse

import torch

from specref import generate, load_pair
from specref.models.pair import heldout_prompts
from specref.models.workloads import (
    MARKER,
    copy_agreement,
    edit_cases,
    quote_prompts,
    repeat_tokens,
    span_continuations,
)


def followed(target, prompt: list[int], copy: list[int]) -> int:
    """How many tokens the target's greedy continuation of `prompt` follows `copy` before it leaves it."""
    out = generate(target, torch.tensor([prompt]), max_new_tokens=len(copy), temperature=0.0)[0, len(prompt):]
    return next((i for i, (a, b) in enumerate(zip(out.tolist(), copy)) if a != b), len(copy))


@torch.no_grad()
def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--cases", type=int, default=8)
    args = ap.parse_args()
    torch.set_num_threads(1)
    target, _, tok = load_pair(dtype=torch.float64)  # float64: the argmaxes are the same on every CPU
    rows: dict[str, list[tuple[int, int, int]]] = {"exact repeat": [], "edit prompt": []}
    for case in edit_cases(args.cases):
        # The edit prompt's tokens are a prefix of the faithful edit's (edit_cases cuts mid-line for that).
        edit = tok.encode(case.snippet + MARKER.format(old=case.old, new=case.new) + case.edited)
        if edit[: len(case.tokens)] != case.tokens:
            raise RuntimeError(f"edit case from text {case.source}: its prompt is not a prefix of the edit in tokens")
        for name, (tokens, start) in (("exact repeat", repeat_tokens(case)), ("edit prompt", (edit, len(case.tokens)))):
            hits, n = copy_agreement(target, tokens, start)
            rows[name].append((hits, n, followed(target, tokens[:start], tokens[start:])))
    for name, figs in rows.items():
        hits, n, along = (list(col) for col in zip(*figs))
        print(f"{name:12s} {len(figs)} snippets: teacher forced, the target's argmax is the copy's next token at "
              f"{sum(hits) / sum(n):.3f} of {sum(n)} positions; greedy, it follows the copy for {along} tokens of {n}")
    for name, prompts in (("quote", quote_prompts(target, args.cases)), ("ordinary", heldout_prompts(args.cases, 48))):
        h = t = 0
        for p in prompts:
            out = generate(target, torch.tensor([p]), max_new_tokens=48, temperature=0.0)[0, len(p):].tolist()
            a, b = span_continuations(p, out)
            h, t = h + a, t + b
        print(f"{name:12s} {len(prompts)} prompts: {h} of {t} greedy tokens continue a span of the prompt ({h / t:.3f})")

if __name__ == "__main__":
    main()
