"""keepsight.checks.number: the kind, the bounds (closed and open), and messages that name the field and the range."""

import math

import numpy as np
import pytest

from keepsight.checks import bounds, layer_indices, number, requirement


def test_returns_python_numbers_of_the_asked_kind():
    assert number("k", np.int64(3), 1, integer=True) == 3 and type(number("k", np.int64(3), integer=True)) is int
    assert type(number("lam", 1, 0.0, 1.0)) is float
    assert number("x", -2.5) == -2.5  # unbounded


@pytest.mark.parametrize("value", [True, "3", 3.0, None, [3]])
def test_integer_fields_refuse_other_kinds_saying_what_they_take(value):
    with pytest.raises(ValueError, match=r"^steps must be an integer >= 1, got "):
        number("steps", value, 1, integer=True)


@pytest.mark.parametrize("value", [math.nan, math.inf, -math.inf, False, "0.5"])
def test_real_fields_refuse_non_finite_and_non_numbers(value):
    with pytest.raises(ValueError, match=r"^lam must be a finite number in \[0.0, 1.0\], got "):
        number("lam", value, 0.0, 1.0)


@pytest.mark.parametrize(("value", "kwargs", "message"), [
    (0, dict(low=1, integer=True), r"^n must be >= 1, got 0$"),
    (0.0, dict(low=0.0, open_low=True), r"^n must be > 0.0, got 0.0$"),
    (1.0, dict(low=0.0, high=1.0, open_high=True), r"^n must be in \[0.0, 1.0\), got 1.0$"),
    (1.5, dict(high=1.0), r"^n must be <= 1.0, got 1.5$"),
    (9, dict(low=0, high=8, integer=True), r"^n must be in \[0, 8\], got 9$"),
])
def test_out_of_range_names_the_range(value, kwargs, message):
    with pytest.raises(ValueError, match=message):
        number("n", value, **kwargs)


def test_bounds_themselves_pass_unless_open():
    assert number("n", 1, 1, 8, integer=True) == 1 and number("n", 8, 1, 8, integer=True) == 8
    assert number("p", 1.0, 0.0, 1.0, open_low=True) == 1.0
    with pytest.raises(ValueError):
        number("p", 0.0, 0.0, 1.0, open_low=True)


def test_words():
    assert bounds() == "" and requirement() == "a finite number"
    assert requirement(0.0, 1.0, open_low=True) == "a finite number in (0.0, 1.0]"
    assert requirement(1, integer=True) == "an integer >= 1"


def test_layer_indices_one_rule_and_one_message():
    assert layer_indices("layers", [2, -1, 0], 4) == [2, 3, 0]  # in the order given; -1 is the last layer
    with pytest.raises(ValueError, match=r"layers: layer -1 is out of range for a model with 4 decoder layers"):
        layer_indices("layers", [-1], 4, from_end=False)
    with pytest.raises(ValueError, match=r"inject_layer: layer 4 is out of range for a model with 4 decoder layers"):
        layer_indices("inject_layer", [4], 4)
    with pytest.raises(ValueError, match=r"layers: layer indices repeat: \[1, -3\]"):
        layer_indices("layers", [1, -3], 4)
    with pytest.raises(ValueError, match="layers: the list is empty"):
        layer_indices("layers", [], 4)
    with pytest.raises(ValueError, match=r"layers must be an integer, got 1.5"):
        layer_indices("layers", [1.5], 4)
