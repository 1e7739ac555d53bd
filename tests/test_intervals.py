"""specref.perf.intervals: tau's interval is centred on emitted / steps and stays in the range tau can take,
with the coverage it states; the t-interval on the same skewed steps is the negative control."""

from __future__ import annotations

import numpy as np
import pytest
from scipy import stats

from specref.perf.intervals import apart, mean_ci, rate_ci, ratio_ci, tau_ci

MOSTLY_ONES = [1] * 182 + [2, 2, 2, 3]  # a draft that rarely lands a guess: tau just above 1


def test_tau_ci_is_centred_on_emitted_over_steps_and_never_below_one_where_a_t_interval_is():
    tau, low, high = tau_ci(MOSTLY_ONES)
    assert tau == sum(MOSTLY_ONES) / len(MOSTLY_ONES)
    assert 1 <= low <= tau <= high
    assert mean_ci(MOSTLY_ONES)[1] < 1  # negative control: the t-interval of the same steps reaches below 1


def _coverage(interval, level: float, trials: int = 300, seed: int = 0) -> float:
    """Share of `trials` samples (1 + Binomial(4, 0.6) tokens per step, 150 steps) whose interval holds the true tau."""
    rng = np.random.default_rng(seed)
    hits = 0
    for i in range(trials):
        x = 1 + rng.binomial(4, 0.6, size=150)
        _, low, high = interval(x.tolist(), level, i)
        hits += low <= 1 + 4 * 0.6 <= high
    return hits / trials


def test_tau_ci_covers_the_true_tau_at_its_level_and_a_mislabelled_level_is_flagged():
    """Binomial test of the coverage at 0.95 (alpha 0.001); the same test flags intervals built at 0.5."""
    boot = lambda x, level, seed: tau_ci(x, level, seed=seed, resamples=2000)
    for level, stated, ok in ((0.95, 0.95, True), (0.5, 0.95, False)):
        cov = _coverage(boot, level)
        p = stats.binomtest(round(cov * 300), 300, stated).pvalue
        assert (p > 1e-3) == ok, (level, cov, p)


def test_ratio_rate_mean_and_apart():
    r, low, high = ratio_ci([4, 5, 3, 4, 5, 4], [1, 2, 1, 1, 2, 1])
    assert low <= r <= high and r == pytest.approx(25 / 8)
    low, high = rate_ci(80, 294)
    assert 0 <= low < 80 / 294 < high <= 1
    m, low, high = mean_ci([1.0, 2.0, 3.0])
    assert (m, low, high) == pytest.approx((2.0, *stats.t.interval(0.95, 2, loc=2.0, scale=stats.sem([1, 2, 3]))))
    assert apart((2, 3), (0, 1)) == 1 and apart((0, 1), (2, 3)) == -1 and apart((0, 2), (1, 3)) == 0


@pytest.mark.parametrize("bad", [[1], [0, 1, 2], "12", [[1, 2], [1, 2]], [1.0, float("nan")]])
def test_bad_steps_are_refused_with_a_clear_error(bad):
    with pytest.raises((ValueError, TypeError)):
        tau_ci(bad)


def test_bad_levels_and_counts_are_refused():
    for level in (0, 1, 1.5, True):
        with pytest.raises(ValueError, match="level"):
            tau_ci([1, 2, 3], level)
    with pytest.raises(ValueError):
        rate_ci(5, 3)
