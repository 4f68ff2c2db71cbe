"""Small exact statistics over a handful of runs: the median's distribution-free interval and the
precision it gives (the runner's stopping rule and the report's verdicts), and a least-squares slope with
its t-interval (the soak's drift); percentiles and the tail rule every results file and command shares
(a percentile only where the samples are enough for it, else the max, so labelled)."""

from __future__ import annotations

import math
import statistics
from collections.abc import Sequence
from dataclasses import dataclass
from math import comb

import numpy

CONFIDENCE = 0.95


def clean(values: Sequence[float | None]) -> list[float]:
    """The positive, finite values (rates and times); a missing figure is not a zero."""
    return [float(v) for v in values if v is not None and math.isfinite(v) and v > 0]


def median_interval(values: Sequence[float | None], confidence: float = CONFIDENCE
                    ) -> tuple[float, float, float] | None:
    """The exact distribution-free interval of the median from order statistics, [x_(k), x_(n+1-k)],
    with its binomial coverage; None when n runs cannot reach ``confidence`` (fewer than 6 at 95 %)."""
    xs = sorted(clean(values))
    n = len(xs)
    best = None
    cumulative = 0.0
    for k in range(1, n // 2 + 1):
        cumulative += comb(n, k - 1) / 2.0 ** n  # P(Bin(n, 1/2) <= k - 1)
        coverage = 1.0 - 2.0 * cumulative
        if coverage < confidence:
            break
        best = (xs[k - 1], xs[n - k], coverage)
    return best


def relative_precision(values: Sequence[float | None], confidence: float = CONFIDENCE) -> float | None:
    """Half the width of the median's confidence interval, relative to the median: 0.02 means the
    median is known to +-2 % at ``confidence``. None when the runs are too few for the interval."""
    interval = median_interval(values, confidence)
    present = clean(values)
    if interval is None or not present:
        return None
    low, high, _ = interval
    return (high - low) / 2.0 / statistics.median(present)


def t_cdf(t: float, df: int) -> float:
    """P(T <= t) for Student's t with ``df`` (a whole number >= 1) degrees of freedom, exactly: the
    closed forms of Abramowitz & Stegun 26.7.3 (odd df) and 26.7.4 (even df), finite sums of powers of
    cos(theta) with theta = atan(t / sqrt(df))."""
    if df < 1:
        raise ValueError(f"degrees of freedom must be at least 1, not {df}")
    theta = math.atan(t / math.sqrt(df))
    cos2 = math.cos(theta) ** 2
    if df % 2:
        term = total = math.cos(theta) if df > 1 else 0.0
        for k in range(3, df - 1, 2):  # (2/3) cos^3, (2*4)/(3*5) cos^5, ... up to cos^(df-2)
            term *= cos2 * (k - 1) / k
            total += term
        both_sides = 2.0 / math.pi * (theta + math.sin(theta) * total)
    else:
        term = total = 1.0
        for k in range(2, df - 1, 2):  # (1/2) cos^2, (1*3)/(2*4) cos^4, ... up to cos^(df-2)
            term *= cos2 * (k - 1) / k
            total += term
        both_sides = math.sin(theta) * total
    return 0.5 + both_sides / 2.0  # both_sides = P(|T| < |t|), signed like t


def t_quantile(p: float, df: int) -> float:
    """The t with P(T <= t) = p for Student's t with ``df`` degrees of freedom (bisection on t_cdf)."""
    if not 0.0 < p < 1.0:
        raise ValueError(f"p must be between 0 and 1, not {p}")
    if p < 0.5:
        return -t_quantile(1.0 - p, df)
    low, high = 0.0, 1.0
    while t_cdf(high, df) < p:
        low, high = high, high * 2.0
    for _ in range(200):
        mid = (low + high) / 2.0
        if t_cdf(mid, df) < p:
            low = mid
        else:
            high = mid
        if high - low <= 1e-12 * high:
            break
    return (low + high) / 2.0


@dataclass(frozen=True)
class Slope:
    """A least-squares slope with its confidence interval [low, high] and the fit's R^2."""

    slope: float
    low: float
    high: float
    r2: float


def slope_interval(xs: Sequence[float], ys: Sequence[float], confidence: float = CONFIDENCE) -> Slope | None:
    """The ordinary least-squares slope of ys on xs with its t-interval (standard error from the residuals,
    n - 2 degrees of freedom); None for fewer than 3 points or xs all equal."""
    n = len(xs)
    if n < 3 or len(set(xs)) < 2:
        return None
    slope, _ = statistics.linear_regression(xs, ys)
    mx, my = statistics.fmean(xs), statistics.fmean(ys)
    sxx = sum((x - mx) ** 2 for x in xs)
    syy = sum((y - my) ** 2 for y in ys)
    residual = max(syy - slope * slope * sxx, 0.0)  # the sum of squared residuals of the fitted line
    half = t_quantile(0.5 + confidence / 2.0, n - 2) * math.sqrt(residual / (n - 2) / sxx)
    r2 = 1.0 if syy == 0 else min(slope * slope * sxx / syy, 1.0)
    return Slope(slope, slope - half, slope + half, r2)


def percentile(values: list[float], q: float) -> float:
    """numpy's percentile (linear interpolation between closest ranks)."""
    return float(numpy.percentile(values, q))


def min_samples(q: float) -> int:
    """Samples needed before the q-th percentile is reported: enough that at least one sample lies above
    it (10 for p90, 100 for p99; p50 needs 1). With fewer, "p99" would be an interpolation toward the
    largest value, i.e. the max under another name."""
    return 1 if q <= 50 else math.ceil(round(100.0 / (100.0 - q), 9))


@dataclass(frozen=True)
class Tail:
    value: float
    label: str  # "p90", "p99", ... or "max" when the samples are too few for that percentile
    samples: int


def tail_of(values: Sequence[float], q: float) -> Tail:
    """The q-th percentile of values where they are enough for it (see min_samples), else their max, so labelled."""
    if len(values) >= min_samples(q):
        return Tail(percentile(list(values), q), f"p{q:g}", len(values))
    return Tail(max(values), "max", len(values))
