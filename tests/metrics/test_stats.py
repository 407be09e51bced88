"""The interval statistics the experiments report: Wilson, a t interval over seeds, the paired bootstrap."""

import math

import pytest

from keepsight.metrics import least_squares_slope, mean_ci, paired_bootstrap, wilson


def test_interval_statistics_on_hand_made_cases():
    low, high = wilson(8, 10)  # p = 0.8: the Wilson interval is (0.490, 0.943)
    assert (round(low, 3), round(high, 3)) == (0.490, 0.943)
    assert wilson(0, 0)[0] != wilson(0, 0)[0]  # nan for no trials
    ci = mean_ci([0.70, 0.80, 0.90])  # sd 0.1, t(2) = 4.303: half-width 0.248
    assert ci["mean"] == pytest.approx(0.8) and ci["high"] - ci["mean"] == pytest.approx(4.303 * 0.1 / math.sqrt(3))
    assert mean_ci([0.5])["low"] == 0.5 and mean_ci([])["mean"] is None
    boot = paired_bootstrap([1, 1, 1, 0], [0, 0, 1, 0])
    assert boot["diff"] == pytest.approx(0.5) and boot["low"] <= 0.5 <= boot["high"] and boot["n"] == 4
    assert paired_bootstrap([1, 1], [1, 1])["low"] == 0.0


def test_least_squares_slope_is_the_fitted_lines():
    assert least_squares_slope([0, 1, 2], [1.0, 3.0, 5.0]) == pytest.approx(2.0)
    assert least_squares_slope([1], [1.0]) is None and least_squares_slope([2, 2], [1.0, 3.0]) is None
    with pytest.raises(ValueError, match="3 x values but 2 y values"):
        least_squares_slope([0, 1, 2], [1.0, 2.0])
