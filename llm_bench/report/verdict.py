"""Is a configuration faster than the baseline, slower, or within noise? And how many runs are enough?

Pure functions over the per-run values; no I/O. The public API:

- ``verdict(candidate, baseline) -> Verdict(kind, ratio, low, high, confidence)``
- ``median_interval(values)`` and ``relative_precision(values)`` (from ``llm_bench.support.stats``, where the
  runner's precision rule uses them)

The method (see docs/report.md, "Verdicts"): the Hodges-Lehmann estimate of the ratio candidate/baseline with
its exact distribution-free (Mann-Whitney) confidence interval, computed on log values so that the
effect is a ratio. With 3-10 runs per side a normal-theory or bootstrap interval has no footing (a
bootstrap of 3 values can only resample those 3), while this interval's coverage is exact for any
continuous distribution under the shift model: it needs no assumption about the spread. Being
exact, it cannot claim more confidence than the runs hold: 3 runs against 3 give at most 90 %.
No random numbers are drawn, so a report is reproducible to the last digit.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from functools import lru_cache
from math import comb

import numpy as np

from llm_bench.support.stats import (
    CONFIDENCE,
    clean,
    median_interval,
    relative_precision,
)

__all__ = ["KINDS", "Verdict", "median_interval", "relative_precision", "verdict"]

FASTER = "faster"
SLOWER = "slower"
WITHIN_NOISE = "within noise"
TOO_FEW_RUNS = "too few runs"
KINDS = (FASTER, SLOWER, WITHIN_NOISE, TOO_FEW_RUNS)

# Below this achievable coverage (1 run against 1 or 2) an interval says nothing worth reporting.
MIN_CONFIDENCE = 0.8
# A measured difference smaller than this is called "within noise" even when the interval excludes 1:
# runs within one load cannot show load-to-load effects (memory placement, clocks), which on GPUs are
# of this order.
MIN_EFFECT = 0.02


@dataclass(frozen=True)
class Verdict:
    """candidate / baseline decode rate: ``ratio`` (Hodges-Lehmann estimate) within [``low``, ``high``]
    at ``confidence`` (the exact coverage reached with these run counts, at least the one asked for
    when the runs allow it)."""

    kind: str
    ratio: float | None
    low: float | None
    high: float | None
    confidence: float | None
    n_candidate: int
    n_baseline: int
    # why no verdict is given on these runs ("disturbed by ..."); a verdict with one is never faster or slower
    reason: str | None = None
    # the run's machine drifted (its first alias re-measured at the end disagreed with its start): said beside
    # every verdict of that run
    drift: str | None = None

    def describe(self) -> str:
        return self._describe() + (f"; {self.drift}" if self.drift else "")

    def _describe(self) -> str:
        if self.reason is not None:
            return f"{self.kind}: {self.reason}"
        if self.ratio is None:
            return self.kind
        if self.low is None or self.high is None:
            return f"{self.kind} ({self.ratio:.2f}x)"
        return f"{self.kind} ({self.ratio:.2f}x, {self.low:.2f}-{self.high:.2f} at {self.confidence:.0%})"


@lru_cache(maxsize=256)
def _mann_whitney_cdf(n: int, m: int) -> tuple[float, ...]:
    """P(U <= u) for u = 0..n*m under the null hypothesis, from the exact count of rank arrangements."""
    # counts[k][u]: arrangements of k candidate values among the first positions with statistic u;
    # the standard recursion over (n, m): N(n, m, u) = N(n-1, m, u-m) + N(n, m-1, u).
    table: dict[tuple[int, int], list[int]] = {}

    def counts(a: int, b: int) -> list[int]:
        if (a, b) in table:
            return table[(a, b)]
        if a == 0 or b == 0:
            result = [1]
        else:
            with_top = [0] * b + counts(a - 1, b)  # the largest value is a candidate: it beats all b
            without = counts(a, b - 1)
            size = a * b + 1
            result = [(with_top[u] if u < len(with_top) else 0) + (without[u] if u < len(without) else 0)
                      for u in range(size)]
        table[(a, b)] = result
        return result

    freq = counts(n, m)
    total = comb(n + m, n)
    cdf, running = [], 0
    for f in freq:
        running += f
        cdf.append(running / total)
    return tuple(cdf)


def _rank_for(n: int, m: int, confidence: float) -> tuple[int, float]:
    """The largest k whose interval [d_(k), d_(nm+1-k)] covers at least ``confidence``, with its exact
    coverage; k = 1 (the full range of the pairwise differences) when the runs cannot reach it."""
    cdf = _mann_whitney_cdf(n, m)
    best_k, best_cov = 1, 1.0 - 2.0 * cdf[0]
    for k in range(1, (n * m + 1) // 2 + 1):
        coverage = 1.0 - 2.0 * cdf[k - 1]
        if coverage >= confidence:
            best_k, best_cov = k, coverage
        else:
            break
    return best_k, best_cov


def verdict(candidate: Sequence[float | None], baseline: Sequence[float | None], *,
            confidence: float = CONFIDENCE, min_effect: float = MIN_EFFECT) -> Verdict:
    """Faster, slower or within noise: candidate runs against baseline runs (e.g. decode t/s each).

    "faster" when the whole interval lies above 1 and the estimate is at least ``1 + min_effect``;
    "slower" likewise below; "too few runs" when the exact interval cannot reach ``MIN_CONFIDENCE``
    (fewer than 2 runs against 3); otherwise "within noise".
    """
    cand, base = clean(candidate), clean(baseline)
    n, m = len(cand), len(base)
    if n == 0 or m == 0:
        return Verdict(TOO_FEW_RUNS, None, None, None, None, n, m)
    diffs = np.sort(np.subtract.outer(np.log(cand), np.log(base)).ravel())
    ratio = float(np.exp(np.median(diffs)))
    k, coverage = _rank_for(n, m, confidence)
    if coverage < MIN_CONFIDENCE:
        return Verdict(TOO_FEW_RUNS, ratio, None, None, None, n, m)
    low, high = float(np.exp(diffs[k - 1])), float(np.exp(diffs[n * m - k]))
    if low > 1.0 and ratio >= 1.0 + min_effect:
        kind = FASTER
    elif high < 1.0 and ratio <= 1.0 - min_effect:
        kind = SLOWER
    else:
        kind = WITHIN_NOISE
    return Verdict(kind, ratio, low, high, coverage, n, m)
