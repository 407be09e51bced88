"""The interval statistics the experiments report: Wilson, a t interval over seeds, the paired bootstrap."""

import math

import pytest

from keepsight.metrics import mean_ci, paired_bootstrap, wilson


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
