"""Small exact statistics over a handful of runs: the median's distribution-free interval and the
precision it gives. Used by the runner's stopping rule and by the report's verdicts."""

from __future__ import annotations

import math
import statistics
from collections.abc import Sequence
from math import comb

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
