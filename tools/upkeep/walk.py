"""Walk a tree draft through one tree step and count where it goes back: wings already left, floors climbed.

    python tools/upkeep/walk.py [--root DIR] [--draft model|eagle|medusa|all] [--follow work|object] [--show]

A wing is a top-level entry of the package (`specref/drafts/` is one wing, `specref/trees.py`
another); its floor is its height in the package's import graph (a wing that imports nothing of
specref is on floor 0, any other one floor above the highest wing it imports). The walk is the
sequence of wings that Python code runs in while `tree_step` serves the draft: every frame of
specref code entered or resumed, from the step's call of the draft to its end, consecutive
repeats merged, the step's own wing (decoding) left out between its calls on the draft.
`--follow object` walks a coarser path: only the calls whose frame holds the draft object.

Read the two together. The work walk counts every call into a helper on another floor and the return
from it (drafts > _validate > drafts is one return), so its returns mostly measure how many such calls
a step makes; its climbs are callbacks, which a house of floors should not need. The object walk says
where the draft object itself is handed. One step is walked: the second of a greedy `tree_generate`
with the static shape (2, 2, 1) on a batch of two prompts.

- a return: the walk enters a wing it had left before;
- a climb back up: the walk enters a wing on a higher floor than the one it leaves, other than
  by a call returning (a callback: code on a lower floor calling code above it).

`--root` reads the package from another checkout (an older commit, for a before/after).
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from house import cycles_in, heights, import_graph, wing_graph, wing_of

REPO = Path(__file__).resolve().parents[2]


def wing_floors(package: Path) -> tuple[dict[str, int], list[str]]:
    """({wing: floor}, the circles among the wings) of the package at `package` (`house.py`)."""
    wings = wing_graph(import_graph(package))
    return heights(wings), cycles_in(wings)


def walk_step(draft_kind: str, follow: str = "work") -> list[tuple[str, str]]:
    """The wings of one tree step, as (wing, how it was entered: 'call' or 'return').

    follow="work": every frame of the draft's work (its methods and all they run);
    follow="object": only the calls whose frame holds the draft object (self, an argument, a closure's).
    """
    if follow not in ("work", "object"):
        raise ValueError(f"follow must be 'work' or 'object', got {follow!r}")
    import torch

    import specref
    from specref.decoding import tree as tree_mod

    target, draft_model, _ = specref.load_pair()
    draft = draft_model if draft_kind == "model" else specref.load_draft(draft_kind, target)
    ids = torch.tensor([[464, 3290, 318, 257, 1332, 286], [40, 716, 257, 1310, 1310, 1310]])
    events: list[tuple[str, str]] = []
    inside = {"depth": 0, "draft": None}
    real_step = tree_mod.tree_step
    steps = {"n": 0}

    def profile(frame, event, arg):  # noqa: ANN001
        if event not in ("call", "return"):
            return
        if follow == "object":
            if event == "call" and any(v is inside["draft"] for v in frame.f_locals.values()):
                name = frame.f_globals.get("__name__", "")
                if name.split(".")[0] == "specref":
                    events.append((wing_of(name), event))
            return
        mine = frame.f_locals.get("self") is inside["draft"] and inside["draft"] is not None
        if event == "call" and mine:
            inside["depth"] += 1
        if inside["depth"] == 0:
            return  # the step's own work, between its calls on the draft
        if event == "return" and mine:
            inside["depth"] -= 1
            if inside["depth"] == 0:
                return  # back in the step
        name = frame.f_globals.get("__name__", "")
        if event == "return":  # the wing we come back to is the caller's
            caller = frame.f_back
            name = caller.f_globals.get("__name__", "") if caller is not None else ""
        if name.split(".")[0] == "specref":
            events.append((wing_of(name), event))

    def traced_step(*args, **kwargs):  # noqa: ANN002, ANN003
        steps["n"] += 1
        if steps["n"] != 2:  # the second step: past the first one's set-up
            return real_step(*args, **kwargs)
        inside["draft"] = args[1]  # tree_step(target, draft, ...): the draft the step serves
        before = sys.getprofile()
        sys.setprofile(profile)
        try:
            return real_step(*args, **kwargs)
        finally:
            sys.setprofile(before)

    tree_mod.tree_step = traced_step
    try:
        specref.tree_generate(target, draft, ids, (2, 2, 1), max_new_tokens=12)
    finally:
        tree_mod.tree_step = real_step
    return events


def count(events: list[tuple[str, str]], floors: dict[str, int]) -> tuple[list[str], int, int]:
    """(the walk, returns to wings already left, climbs back up)."""
    walk: list[tuple[str, str]] = []
    for wing, how in events:
        if not walk or walk[-1][0] != wing:
            walk.append((wing, how))
    returns = climbs = 0
    left: set[str] = set()
    for (prev, _), (wing, how) in zip(walk, walk[1:]):
        left.add(prev)
        if wing in left:
            returns += 1
        if how == "call" and floors.get(wing, 0) > floors.get(prev, 0):
            climbs += 1
    return [r for r, _ in walk], returns, climbs


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--root", type=Path, default=REPO, help="the checkout whose specref/ to walk")
    ap.add_argument("--draft", default="all", choices=["model", "eagle", "medusa", "all"])
    ap.add_argument("--follow", default="work", choices=["work", "object"],
                    help="work: all code the draft runs; object: only frames that hold the draft")
    ap.add_argument("--show", action="store_true", help="print the walk itself")
    args = ap.parse_args()
    sys.path.insert(0, str(args.root.resolve()))
    import specref

    if Path(specref.__file__).resolve().parent != (args.root / "specref").resolve():
        raise SystemExit(f"specref came from {specref.__file__}, not from {args.root}")
    floors, circles = wing_floors(args.root / "specref")
    print(f"{args.root}: {len(floors)} wings on {len(set(floors.values()))} floors: "
          + ", ".join(f"{r} {f}" for r, f in sorted(floors.items(), key=lambda x: (x[1], x[0]))))
    for c in circles:
        print(f"a circle among the wings: {c}")
    for kind in (["model", "eagle", "medusa"] if args.draft == "all" else [args.draft]):
        walk, returns, climbs = count(walk_step(kind, args.follow), floors)
        print(f"{kind:7s} wings entered {len(walk):4d}  returns to wings already left {returns:4d}  "
              f"climbs back up {climbs:3d}")
        if args.show:
            print("   " + " > ".join(walk))


if __name__ == "__main__":
    main()
