"""Verdicts and the precision rule, against published exact tables and hand-checkable cases."""

from __future__ import annotations

import math

import pytest

from llm_bench.report.verdict import (
    FASTER,
    SLOWER,
    TOO_FEW_RUNS,
    WITHIN_NOISE,
    median_interval,
    relative_precision,
    verdict,
)


@pytest.mark.parametrize(("n", "m", "k"), [(5, 5, 3), (6, 6, 6), (8, 8, 14), (10, 10, 24)])
def test_interval_ranks_match_the_published_mann_whitney_critical_values(n, m, k):
    # Two-sided 5 % critical values of U (reject when U <= c): 2, 5, 13, 23; the interval's rank is c + 1.
    from llm_bench.report.verdict import _rank_for
    rank, coverage = _rank_for(n, m, 0.95)
    assert rank == k
    assert coverage >= 0.95


def test_three_runs_against_three_give_the_range_of_pairwise_ratios_at_90_percent():
    v = verdict([100.0, 102.0, 98.0], [100.0, 101.0, 99.0])
    assert v.kind == WITHIN_NOISE
    assert v.confidence == pytest.approx(0.9)
    assert v.low == pytest.approx(98.0 / 101.0)
    assert v.high == pytest.approx(102.0 / 99.0)
    assert v.low < 1.0 < v.high


def test_clearly_slower_and_faster():
    slow = verdict([50.0, 51.0, 49.5], [100.0, 101.0, 99.0])
    assert slow.kind == SLOWER and slow.high < 1.0
    assert slow.ratio == pytest.approx(0.5, rel=0.02)
    fast = verdict([100.0, 101.0, 99.0], [50.0, 51.0, 49.5])
    assert fast.kind == FASTER and fast.low > 1.0
    assert fast.ratio == pytest.approx(1 / slow.ratio)


def test_a_real_but_tiny_difference_is_within_noise():
    # Every candidate run beats every baseline run, but by half a percent: below MIN_EFFECT.
    v = verdict([100.6, 100.7, 100.8], [100.0, 100.1, 100.2])
    assert v.low > 1.0
    assert v.kind == WITHIN_NOISE
    assert verdict([100.6, 100.7, 100.8], [100.0, 100.1, 100.2], min_effect=0.0).kind == FASTER


def test_overlapping_runs_are_within_noise_even_with_different_medians():
    assert verdict([90.0, 110.0, 100.0, 95.0], [100.0, 105.0, 98.0]).kind == WITHIN_NOISE


def test_one_run_each_is_too_few_and_missing_values_are_ignored():
    assert verdict([50.0], [100.0]).kind == TOO_FEW_RUNS
    assert verdict([], [100.0]).ratio is None
    assert verdict([50.0, None, 51.0, 49.0], [100.0, 99.0, 101.0]).n_candidate == 3


def test_deterministic():
    a, b = [61.0, 60.2, 61.9, 60.8], [58.1, 59.0, 58.7]
    assert verdict(a, b) == verdict(a, b)


def test_median_interval_needs_six_runs_at_95_percent():
    assert median_interval([1.0, 2.0, 3.0, 4.0, 5.0]) is None
    low, high, coverage = median_interval([6.0, 1.0, 2.0, 3.0, 4.0, 5.0])
    assert (low, high) == (1.0, 6.0)
    assert coverage == pytest.approx(1 - 2 / 64)


def test_relative_precision_is_half_width_over_median():
    values = [100.0, 101.0, 99.0, 100.5, 99.5, 100.0]
    assert relative_precision(values) == pytest.approx((101.0 - 99.0) / 2 / 100.0)
    assert relative_precision(values[:5]) is None
    assert math.isclose(relative_precision([10.0] * 8), 0.0)
