"""Spread of a measurement (standard library only): binomial intervals for a rate on a test set, t intervals
for a mean over seeds, order-statistic intervals for a median of timing repeats, and a paired bootstrap for the
difference of two conditions on the same items."""

from __future__ import annotations

import math
import random
import statistics
from collections.abc import Sequence

# two-sided 95% quantiles of Student's t by degrees of freedom (1 .. 30); 1.96 beyond
_T95 = (12.706, 4.303, 3.182, 2.776, 2.571, 2.447, 2.365, 2.306, 2.262, 2.228, 2.201, 2.179, 2.160, 2.145, 2.131,
        2.120, 2.110, 2.101, 2.093, 2.086, 2.080, 2.074, 2.069, 2.064, 2.060, 2.056, 2.052, 2.048, 2.045, 2.042)


def t95(df: int) -> float:
    """The two-sided 95% quantile of Student's t with ``df`` degrees of freedom."""
    if df < 1:
        raise ValueError(f"df must be >= 1, got {df}")
    return _T95[df - 1] if df <= len(_T95) else 1.96


def wilson(successes: int, n: int, z: float = 1.96) -> tuple[float, float]:
    """Wilson score interval of a binomial rate ``successes / n`` (95% by default); (nan, nan) for n = 0."""
    if n == 0:
        return math.nan, math.nan
    p = successes / n
    centre = (p + z * z / (2 * n)) / (1 + z * z / n)
    half = z * math.sqrt(p * (1 - p) / n + z * z / (4 * n * n)) / (1 + z * z / n)
    # the interval always holds p; min / max keep that exact where rounding does not (p = 1: 0.9999999999999999)
    return max(0.0, min(p, centre - half)), min(1.0, max(p, centre + half))


def median_ci(values: Sequence[float], level: float = 0.95) -> dict:
    """Median of ``values`` (independent repeats) with a distribution-free interval from order statistics: the
    ``k``-th smallest and largest values, ``k`` the largest with ``P(Binomial(n, 1/2) < k) <= (1 - level) / 2``, so it
    covers the population median with at least ``level``: ``{"median", "low", "high", "n", "coverage"}`` (low / high
    None when ``n`` is too small for ``level``: 6 values at 95%)."""
    vals = sorted(float(v) for v in values)
    n = len(vals)
    if n == 0:
        return {"median": None, "low": None, "high": None, "n": 0, "coverage": None}
    tail, k = 0.0, 0
    while True:  # tail = P(X <= k) for X ~ Binomial(n, 1/2)
        nxt = tail + math.comb(n, k) / 2**n
        if nxt > (1 - level) / 2:
            break
        tail, k = nxt, k + 1
    if k == 0:
        return {"median": statistics.median(vals), "low": None, "high": None, "n": n, "coverage": None}
    return {"median": statistics.median(vals), "low": vals[k - 1], "high": vals[n - k], "n": n,
            "coverage": 1 - 2 * tail}


def mean_ci(values: Sequence[float]) -> dict:
    """Mean of ``values`` (one per seed) with a 95% t interval: ``{"mean", "low", "high", "n", "values"}``
    (low = high = mean for a single value: no spread can be estimated from one run)."""
    vals = [float(v) for v in values if v is not None and not math.isnan(float(v))]
    if not vals:
        return {"mean": None, "low": None, "high": None, "n": 0, "values": []}
    m = statistics.fmean(vals)
    if len(vals) == 1:
        return {"mean": m, "low": m, "high": m, "n": 1, "values": vals}
    half = t95(len(vals) - 1) * statistics.stdev(vals) / math.sqrt(len(vals))
    return {"mean": m, "low": m - half, "high": m + half, "n": len(vals), "values": vals}


def paired_bootstrap(a: Sequence[float], b: Sequence[float], n_boot: int = 2000, seed: int = 0) -> dict:
    """Mean of ``a - b`` over paired items (the same items under two conditions) with a 95% percentile
    bootstrap interval: ``{"diff", "low", "high", "n"}``."""
    if len(a) != len(b):
        raise ValueError(f"paired samples differ in length: {len(a)} vs {len(b)}")
    d = [float(x) - float(y) for x, y in zip(a, b)]
    if not d:
        return {"diff": None, "low": None, "high": None, "n": 0}
    rng = random.Random(seed)
    n = len(d)
    means = sorted(statistics.fmean(rng.choices(d, k=n)) for _ in range(n_boot))
    return {"diff": statistics.fmean(d), "low": means[int(0.025 * n_boot)], "high": means[int(0.975 * n_boot) - 1],
            "n": n}


def least_squares_slope(xs: Sequence[float], ys: Sequence[float]) -> float | None:
    """Slope of the least-squares line through (xs, ys); None with < 2 points or no spread in x."""
    if len(xs) != len(ys):
        raise ValueError(f"{len(xs)} x values but {len(ys)} y values")
    if len(xs) < 2:
        return None
    mx, my = sum(xs) / len(xs), sum(ys) / len(ys)
    den = sum((x - mx) ** 2 for x in xs)
    return sum((x - mx) * (y - my) for x, y in zip(xs, ys)) / den if den else None
