"""Why live position-1 acceptance is below the heads' teacher-forced figure: where steps start.

Greedy decoding with a draft accepts draft 1 of a step exactly when the draft's argmax after the
step's context equals the target's. So live position-1 acceptance is teacher-forced agreement
*at the positions where steps start*, and those are not average positions: most steps start
right after a correction. This script decodes the held-out prompts greedily (k = 6) with the
small draft model and with EAGLE-1, records every step (`record_generation`), and prints, per
draft: live position-1 acceptance, teacher-forced agreement at the same step starts (equal to
it, or the loop is wrong), and teacher-forced agreement at every position of the continuation.
Untimed: the figures are counts, the same on a quiet or a busy machine.

    .venv/bin/python benchmarks/acceptance_at_step_starts.py [--prompts 24] [--k 6]
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "tools" / "training"))

import train_heads  # noqa: E402  (the heads' own teacher-forced predictions)

from specref import load_draft, load_pair  # noqa: E402
from specref.decoding.record import record_generation  # noqa: E402
from specref.drafts.heads import load_bundled_heads  # noqa: E402
from specref.models.pair import heldout_prompts  # noqa: E402


@torch.no_grad()
def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--prompts", type=int, default=24)
    ap.add_argument("--prompt-tokens", type=int, default=64)
    ap.add_argument("--new-tokens", type=int, default=64)
    ap.add_argument("--k", type=int, default=6)
    args = ap.parse_args()
    torch.set_num_threads(1)
    target, small, _ = load_pair()
    P = args.prompt_tokens
    prompts = torch.tensor(heldout_prompts(args.prompts, P))  # [N, P]
    seqs = train_heads.greedy_sequences(target, prompts, args.new_tokens)  # [N, P + new]
    t_arg = target(seqs).argmax(-1)  # [N, T]: the target's token after position u
    sets = {"eagle1": load_bundled_heads("eagle1")}  # the one head set whose guesses are compared
    guesses = {"model": small(seqs).argmax(-1),  # [N, T]: the draft's guess for the token after position u
               "eagle": torch.nn.functional.pad(train_heads.predictions(sets, target, seqs, 1)["eagle1"][:, :, 0],
                                                (1, 0), value=-1)[:, : seqs.shape[1]]}  # start s: the token after s + 1
    for name, guess in guesses.items():
        draft = load_draft(name, target)
        live, forced, n_steps = 0, 0, 0
        for i in range(len(prompts)):
            out, steps, _ = record_generation(target, draft, prompts[i : i + 1], args.k, args.new_tokens, 0.0,
                                              torch.Generator().manual_seed(0))
            if not torch.equal(out[0], seqs[i]):
                raise RuntimeError(f"{name}: greedy speculative output differs from plain greedy on prompt {i}")
            for s in (s for s in steps if s.drafts):
                live += s.n_accepted >= 1
                forced += int(guess[i, s.start - 1] == t_arg[i, s.start - 1])
                n_steps += 1
        everywhere = (guess[:, P - 1 : -1] == t_arg[:, P - 1 : -1]).float().mean().item()
        print(f"{name:6s} live position 1 {live / n_steps:.3f} over {n_steps} steps; teacher forced at the same "
              f"step starts {forced / n_steps:.3f} ({'equal' if live == forced else 'NOT equal'}); teacher forced "
              f"at every position of the continuation {everywhere:.3f}")


if __name__ == "__main__":
    main()
