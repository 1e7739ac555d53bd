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

    .venv/bin/python benchmarks/target_copies.py [--cases 8]
"""

from __future__ import annotations

import argparse

import torch

from specref import generate, load_pair
from specref.models.workloads import MARKER, edit_cases


def copy_figures(target, prompt: list[int], copy: list[int]) -> tuple[float, int]:
    """(teacher-forced share of copy tokens that are the target's argmax, greedy tokens that follow the copy)."""
    full = torch.tensor([prompt + copy])  # [1, P + C]
    argmax = target(full).argmax(-1)[0, len(prompt) - 1 : -1]  # [C]: the target's token before each copy token
    forced = (argmax == torch.tensor(copy)).float().mean().item()
    out = generate(target, torch.tensor([prompt]), max_new_tokens=len(copy), temperature=0.0)[0, len(prompt):]
    followed = next((i for i, (a, b) in enumerate(zip(out.tolist(), copy)) if a != b), len(copy))
    return forced, followed


@torch.no_grad()
def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--cases", type=int, default=8)
    args = ap.parse_args()
    torch.set_num_threads(1)
    target, _, tok = load_pair(dtype=torch.float64)  # float64: the argmaxes are the same on every CPU
    rows: dict[str, list[tuple[float, int, int]]] = {"exact repeat": [], "edit prompt": []}
    for case in edit_cases(args.cases):
        # Exact repeat, split in tokens (a split in the text after "\n" would cut a "\n    " token in two):
        # the prompt holds the snippet, "\n" and the first third of the repeat; the copy is the rest.
        full = tok.encode(case.snippet + "\n" + case.snippet)
        cut = len(full) - 2 * len(tok.encode(case.snippet)) // 3
        rows["exact repeat"].append((*copy_figures(target, full[:cut], full[cut:]), len(full) - cut))
        # The edit prompt: its tokens are a prefix of the faithful edit's (edit_cases cuts mid-line for that).
        full = tok.encode(case.snippet + MARKER.format(old=case.old, new=case.new) + case.edited)
        if full[: len(case.tokens)] != case.tokens:
            raise RuntimeError(f"edit case from text {case.source}: its prompt is not a prefix of the edit in tokens")
        rows["edit prompt"].append((*copy_figures(target, case.tokens, full[len(case.tokens):]),
                                    len(full) - len(case.tokens)))
    for name, figs in rows.items():
        forced = sum(f * n for f, _, n in figs) / sum(n for *_, n in figs)
        followed = [fl for _, fl, _ in figs]
        lengths = [n for *_, n in figs]
        print(f"{name:12s} {len(figs)} snippets: teacher forced, the target's argmax is the copy's next token at "
              f"{forced:.3f} of {sum(lengths)} positions; greedy, it follows the copy for {followed} tokens of "
              f"{lengths}")


if __name__ == "__main__":
    main()
