"""The number check every config, sampler and command-line option uses: a value of the right kind (an integer, or
a finite real number; never a bool) within its bounds, or a ValueError naming the field and what it accepts."""

from __future__ import annotations

import math
import numbers


def bounds(low=None, high=None, *, open_low: bool = False, open_high: bool = False) -> str:
    """The range in words: ``>= 1``, ``> 0.0``, ``<= 1.0``, ``in [0, 1]``, ``in (0.0, 1.0)``; '' when unbounded."""
    if low is not None and high is not None:
        return f"in {'(' if open_low else '['}{low}, {high}{')' if open_high else ']'}"
    if low is not None:
        return f"{'>' if open_low else '>='} {low}"
    if high is not None:
        return f"{'<' if open_high else '<='} {high}"
    return ""


def requirement(low=None, high=None, *, integer: bool = False, open_low: bool = False,
                open_high: bool = False) -> str:
    """What a value must be, in words: ``an integer >= 1``, ``a finite number in [0.0, 1.0]``."""
    kind = "an integer" if integer else "a finite number"
    return f"{kind} {bounds(low, high, open_low=open_low, open_high=open_high)}".strip()


def number(name: str, value, low=None, high=None, *, integer: bool = False, open_low: bool = False,
           open_high: bool = False):
    """``value`` as an int (``integer``) or a float, checked to lie in ``[low, high]`` (``open_low`` /
    ``open_high``: the bound itself is excluded).

    A value of the wrong kind (a bool, a string, 3.0 for an integer, NaN, inf) is an error saying what the field
    accepts (``steps must be an integer >= 1, got '4'``); one out of range says the range (``steps must be >= 1,
    got 0``)."""
    kind = numbers.Integral if integer else numbers.Real
    if isinstance(value, bool) or not isinstance(value, kind) or not math.isfinite(value):
        need = requirement(low, high, integer=integer, open_low=open_low, open_high=open_high)
        raise ValueError(f"{name} must be {need}, got {value!r}")
    out = int(value) if integer else float(value)
    below = low is not None and (out <= low if open_low else out < low)
    above = high is not None and (out >= high if open_high else out > high)
    if below or above:
        raise ValueError(f"{name} must be {bounds(low, high, open_low=open_low, open_high=open_high)}, got {value!r}")
    return out


def layer_indices(name: str, layers, n_layers: int, *, from_end: bool = True) -> list[int]:
    """Decoder-layer indices of the field ``name``, in the order given, each an integer in ``[0, n_layers)``
    (``from_end``: negative ones count from the end, -1 the last layer); an empty list, a repeat or an index out of
    range is a ValueError naming the field and the model's depth."""
    out = []
    for i in layers:
        j = number(name, i, integer=True)
        if from_end and j < 0:
            j += n_layers
        if not 0 <= j < n_layers:
            raise ValueError(f"{name}: layer {i} is out of range for a model with {n_layers} decoder layers")
        out.append(j)
    if not out:
        raise ValueError(f"{name}: the list is empty")
    if len(set(out)) != len(out):
        raise ValueError(f"{name}: layer indices repeat: {list(layers)}")
    return out
