"""Tables and sentences the lectures print from their own timings.

A timing belongs to the machine it ran on, so a lecture never writes its direction by hand: it prints a
sentence generated from the numbers it measured. These functions hold the wording in one place; each reads
medians and the ranges (lowest, highest) of a few repeats and says only what the repeats support.

- `side_of_one(low, high)`: where the repeats of a speedup lie against 1;
- `compare_repeats(a, b, ...)`: whether two timed quantities differ in every repeat, by their medians, or not
  at all;
- `flat_up_to(costs, ks)`: the largest pass size whose median cost stays within a limit of a one-token pass;
- `pass_table(costs, view)`: a pass's time against the tokens it scores, beside the roofline;
- `fastest_rounds(rounds)`: the fastest of several rounds of timings, and the spread of the fastest few.
"""

from __future__ import annotations

from collections.abc import Sequence

Repeated = tuple[float, float, float]  # (median, lowest, highest) over the repeats


def side_of_one(low: float, high: float) -> str:
    """Where a speedup's repeats lie against 1: above in every repeat, below in every repeat, or on both sides."""
    if low > high:
        raise ValueError(f"low must be <= high, got {low} > {high}")
    if low > 1:
        return "every repeat above 1"
    if high < 1:
        return "every repeat below 1"
    return "on both sides of 1"


def compare_repeats(a: Repeated, b: Repeated, a_name: str, b_name: str) -> str:
    """How `a` stands against `b` (each (median, low, high)), from the strongest statement the repeats support.

    Lower (or higher) in every repeat when the ranges do not overlap; else a median outside the other's range;
    else the repeats overlap and the run does not tell the two apart.
    """
    for name, (median, low, high) in ((a_name, a), (b_name, b)):
        if not low <= median <= high:
            raise ValueError(f"{name} must be (median, low, high) with low <= median <= high, got {(median, low, high)}")
    (am, alo, ahi), (bm, blo, bhi) = a, b
    if ahi < blo:
        return f"lower with {a_name} in every repeat"
    if am < blo:
        return f"{a_name}'s median is below every repeat of {b_name}"
    if bhi < alo:
        return f"higher with {a_name} in every repeat"
    if bm < alo:
        return f"{b_name}'s median is below every repeat of {a_name}"
    return f"the repeats overlap: this run does not tell {a_name} and {b_name} apart"


def flat_up_to(costs, ks: Sequence[int], limit: float = 1.5) -> int:
    """The largest T = k + 1 up to which every pass cost at most `limit` x a one-token pass (medians), else 1.

    `costs` is a `specref.perf.PassCosts` (its `v(k)`); `ks` in increasing order.
    """
    if limit < 1:
        raise ValueError(f"limit must be >= 1 (a multiple of a one-token pass), got {limit}")
    flat = 1
    for k in ks:
        if costs.v(k) > limit:
            break
        flat = k + 1
    return flat


PASS_TABLE_HEADER = "   T   measured   v = x one token [range]   roofline   roofline x one token   roofline / measured"


def pass_table(costs, view: dict, header: bool = True) -> str:
    """One row per T: the measured median, v with its range, the roofline's time, its ratio and the share it explains.

    `costs` is a `specref.perf.PassCosts` measured at k = T - 1 for every T > 1 of the view; `view` the
    `specref.course.plots.roofline_view` of the same passes, with `measured` (its `tokens` start at 1). Several
    tables printed one after another can share one `PASS_TABLE_HEADER` (header=False).
    """
    tokens = [int(T) for T in view["tokens"]]
    if tokens[0] != 1 or "measured" not in view:
        raise ValueError(f"view must start at T = 1 and hold measured times, got tokens {tokens}")
    lines = [PASS_TABLE_HEADER] if header else []
    for i, T in enumerate(tokens):
        v, (lo, hi) = (1.0, (1.0, 1.0)) if T == 1 else (costs.v(T - 1), costs.v_range(T - 1))
        lines.append(f"{T:4d} {view['measured'][i] * 1e3:7.2f} ms {v:8.2f} [{lo:.2f}-{hi:.2f}] "
                     f"{view['roofline'][i] * 1e3:12.2f} ms {view['roofline'][i] / view['roofline'][0]:12.2f} "
                     f"{view['explained'][i]:20.0%}")
    return "\n".join(lines)


def fastest_rounds(rounds: Sequence[Sequence[float]], keep: int = 3) -> tuple[list[float], list[tuple[float, float]]]:
    """From rounds of timings [n_rounds][n] (seconds per pass at n sizes, the first the one-token pass): the fastest
    time per size (load only ever adds time), and per size the lowest and highest ratio to the one-token pass over
    the `keep` fastest rounds of each, paired by rank.
    """
    if not rounds or len({len(r) for r in rounds}) != 1 or not rounds[0]:
        raise ValueError("rounds must be a non-empty list of equally long, non-empty lists of times")
    if not 1 <= keep <= len(rounds):
        raise ValueError(f"keep must be between 1 and the number of rounds ({len(rounds)}), got {keep}")
    ranked = [sorted(column) for column in zip(*rounds)]  # [n][n_rounds], fastest first
    times = [column[0] for column in ranked]
    spread = [(min(col[j] / ranked[0][j] for j in range(keep)), max(col[j] / ranked[0][j] for j in range(keep)))
              for col in ranked]
    return times, spread
