"""The sentences and tables the lectures print from their timings (specref.course.report)."""

from __future__ import annotations

import pytest

from specref.course.plots import roofline_view
from specref.course.report import (
    PASS_TABLE_HEADER,
    compare_repeats,
    fastest_rounds,
    flat_up_to,
    pass_table,
    side_of_one,
)
from specref.perf.verify_cost import PassCosts


def _costs(one: tuple[float, ...], verify: dict[int, tuple[float, ...]]) -> PassCosts:
    return PassCosts(ks=tuple(verify), one=one, verify=verify, draft=None, context=8, batch_size=1, threads=1,
                     clock="cpu", kernel="torch")


def test_side_of_one_says_where_the_repeats_lie() -> None:
    assert side_of_one(1.1, 1.4) == "every repeat above 1"
    assert side_of_one(0.7, 0.9) == "every repeat below 1"
    assert side_of_one(0.9, 1.2) == "on both sides of 1"
    assert side_of_one(1.0, 1.2) == "on both sides of 1"  # a repeat at exactly 1 is not a gain
    with pytest.raises(ValueError, match="low must be <= high"):
        side_of_one(1.2, 0.9)


def test_compare_repeats_claims_only_what_the_ranges_support() -> None:
    assert compare_repeats((1.0, 0.9, 1.1), (2.0, 1.8, 2.2), "a", "b") == "lower with a in every repeat"
    assert compare_repeats((1.5, 1.2, 1.9), (2.0, 1.8, 2.2), "a", "b") == "a's median is below every repeat of b"
    assert compare_repeats((2.0, 1.8, 2.2), (1.0, 0.9, 1.1), "a", "b") == "higher with a in every repeat"
    assert compare_repeats((2.0, 1.8, 2.2), (1.5, 1.2, 1.9), "a", "b") == "b's median is below every repeat of a"
    overlap = compare_repeats((1.5, 1.0, 2.0), (1.6, 1.1, 2.1), "a", "b")
    assert overlap.startswith("the repeats overlap")  # the negative control: no direction claimed
    with pytest.raises(ValueError, match="low <= median <= high"):
        compare_repeats((3.0, 1.0, 2.0), (1.0, 0.9, 1.1), "a", "b")


def test_flat_up_to_stops_at_the_first_pass_over_the_limit() -> None:
    costs = _costs((1.0, 1.0, 1.0), {1: (1.1, 1.2, 1.0), 3: (1.4, 1.5, 1.3), 7: (2.0, 2.1, 1.9), 15: (1.2, 1.2, 1.2)})
    assert flat_up_to(costs, [1, 3, 7, 15]) == 4  # 15 is cheap again, but 7 already broke the limit
    assert flat_up_to(costs, [1, 3, 7, 15], limit=2.5) == 16
    assert flat_up_to(_costs((1.0,), {1: (1.6,)}), [1]) == 1
    with pytest.raises(ValueError, match="limit must be >= 1"):
        flat_up_to(costs, [1], limit=0.5)


def test_pass_table_prints_one_row_per_token_count_with_v_and_the_roofline() -> None:
    costs = _costs((2e-3, 2e-3, 2e-3), {1: (2.2e-3, 2.4e-3, 2.0e-3)})
    view = roofline_view(1e6, 1e6, 1e9, 1e12, [1, 2], measured=[2e-3, 2.2e-3])
    table = pass_table(costs, view).splitlines()
    assert table[0] == PASS_TABLE_HEADER and len(table) == 3
    assert table[1].split()[:2] == ["1", "2.00"] and "1.00 [1.00-1.00]" in table[1]
    assert table[2].split()[:2] == ["2", "2.20"] and "1.10 [1.00-1.20]" in table[2]
    assert table[2].endswith("45%")  # roofline 1 ms of a measured 2.2 ms
    assert pass_table(costs, view, header=False).splitlines() == table[1:]
    with pytest.raises(ValueError, match="start at T = 1"):
        pass_table(costs, roofline_view(1e6, 1e6, 1e9, 1e12, [2, 4], measured=[1.0, 1.0]))


def test_fastest_rounds_keeps_the_fastest_time_and_the_spread_of_the_fastest_few() -> None:
    rounds = [[1.0, 1.2], [1.1, 1.0], [2.0, 4.0], [1.05, 1.5]]  # [round][T]; a slow round from load
    times, spread = fastest_rounds(rounds, keep=3)
    assert times == [1.0, 1.0]
    # T = 2 ranked: 1.0, 1.2, 1.5, 4.0 against T = 1's 1.0, 1.05, 1.1, 2.0, paired by rank over the 3 fastest
    assert spread[0] == (1.0, 1.0)
    assert spread[1] == pytest.approx((1.0, 1.5 / 1.1))
    with pytest.raises(ValueError, match="keep must be"):
        fastest_rounds(rounds, keep=5)
    with pytest.raises(ValueError, match="equally long"):
        fastest_rounds([[1.0], [1.0, 2.0]])
