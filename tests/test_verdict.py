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


# --- every decision both ways, on data where the wrong answer shows -----------------------------------------

def test_faster_needs_the_whole_interval_above_1_not_just_a_large_ratio():
    # Every candidate run beats every baseline run: the 90 % interval (3 against 3: the range of the nine
    # pairwise ratios) lies above 1.
    fast = verdict([200.0, 204.0, 198.0], [100.0, 101.0, 99.0])
    assert fast.kind == FASTER
    assert (fast.low, fast.high) == (pytest.approx(198.0 / 101.0), pytest.approx(204.0 / 99.0))
    # Three times faster by the estimate, but one candidate run is half the baseline's: the interval spans 1.
    # Ratios 0.5 x3, 3.0 x3, 3.1 x3: the Hodges-Lehmann estimate is the fifth of nine, 3.0.
    wide = verdict([50.0, 300.0, 310.0], [100.0, 100.0, 100.0])
    assert wide.ratio == pytest.approx(3.0)
    assert (wide.low, wide.high) == (pytest.approx(0.5), pytest.approx(3.1))
    assert wide.kind == WITHIN_NOISE


def test_slower_needs_the_whole_interval_below_1_not_just_a_small_ratio():
    slow = verdict([100.0, 101.0, 99.0], [200.0, 204.0, 198.0])
    assert slow.kind == SLOWER
    assert (slow.low, slow.high) == (pytest.approx(99.0 / 204.0), pytest.approx(101.0 / 198.0))
    # a third of the baseline by the estimate, but one candidate run is twice the baseline's
    wide = verdict([100.0, 100.0, 100.0], [50.0, 300.0, 310.0])
    assert wide.ratio == pytest.approx(1 / 3.0)
    assert wide.high == pytest.approx(2.0)
    assert wide.kind == WITHIN_NOISE


def test_an_interval_that_touches_1_is_within_noise():
    # The lowest candidate run equals the highest baseline run: the interval's end is exactly 1.
    touching = verdict([100.0, 150.0, 160.0], [90.0, 95.0, 100.0])
    assert touching.low == 1.0 and touching.ratio > 1.5
    assert touching.kind == WITHIN_NOISE
    below = verdict([90.0, 95.0, 100.0], [100.0, 150.0, 160.0])
    assert below.high == 1.0 and below.ratio < 0.7
    assert below.kind == WITHIN_NOISE


def test_a_real_but_tiny_slowdown_is_within_noise():
    v = verdict([99.4, 99.3, 99.2], [100.0, 100.1, 100.2])
    assert v.high < 1.0 and v.kind == WITHIN_NOISE  # every run slower, by less than MIN_EFFECT
    assert verdict([99.4, 99.3, 99.2], [100.0, 100.1, 100.2], min_effect=0.0).kind == SLOWER
    # the effect asked for is honoured both ways: 2x faster is not faster beyond a 150 % minimum effect
    assert verdict([200.0, 204.0, 198.0], [100.0, 101.0, 99.0], min_effect=1.5).kind == WITHIN_NOISE


def test_two_runs_against_three_reach_80_percent_and_two_against_two_do_not():
    # P(U = 0) = 1 / C(5, 2) = 1/10 on each side: exactly MIN_CONFIDENCE
    v = verdict([200.0, 201.0], [100.0, 101.0, 99.0])
    assert v.kind == FASTER and v.confidence == pytest.approx(0.8)
    few = verdict([200.0, 201.0], [100.0, 101.0])  # 1 - 2/6: 67 %
    assert few.kind == TOO_FEW_RUNS and few.low is None and few.confidence is None
    assert few.ratio == pytest.approx(math.sqrt(200.0 / 101.0 * 201.0 / 100.0))  # the middle two of four ratios


def test_five_against_five_interval_by_hand():
    # Candidate 2^(5a), baseline 2^b (a, b = 0..4): the 25 log2-ratios 5a - b are -4..20, each once. At 95 %
    # the rank is 3 (published critical value 2): the interval is the 3rd smallest and 3rd largest, 2^-2 and
    # 2^18; the estimate is the 13th, 2^8. A ratio of 256 and still within noise: the runs overlap.
    cand = [2.0 ** (5 * a) for a in range(5)]
    base = [2.0 ** b for b in range(5)]
    v = verdict(cand, base)
    assert v.ratio == pytest.approx(2.0 ** 8)
    assert (v.low, v.high) == (pytest.approx(2.0 ** -2), pytest.approx(2.0 ** 18))
    assert v.confidence == pytest.approx(1 - 2 * 4 / 252)  # the coverage reached, not the 95 % asked
    assert v.kind == WITHIN_NOISE
    assert v.describe() == "within noise (256.00x, 0.25-262144.00 at 97%)"


def test_the_estimate_is_the_median_of_pairwise_ratios_not_their_mean():
    # One candidate run 1024 times the baseline: the 25 log2-ratios are 0, 1, 2, 3 and 10, five times each;
    # their median is 2 (ratio 4), their mean 3.2 (ratio 9.2).
    v = verdict([1.0, 2.0, 4.0, 8.0, 1024.0], [1.0, 1.0, 1.0, 1.0, 1.0])
    assert v.ratio == pytest.approx(4.0)
    # and asymmetric 3 against 3: ratios 1 x6 and 4 x3; the median is 1
    assert verdict([100.0, 100.0, 400.0], [100.0, 100.0, 100.0]).ratio == pytest.approx(1.0)


# --- the verdict as the report shows it: always with its interval --------------------------------------------

def _report_rows():
    from llm_bench.report import rows_from_sets
    from llm_bench.results import AliasRecord, ResultSet, RunRecord

    def record(alias: str, rates: list[float], errors: list[str] | None = None) -> AliasRecord:
        return AliasRecord(alias=alias, runs=[RunRecord(decode_tps=r, finish_reason="length") for r in rates],
                           errors=errors or [])

    result = ResultSet({"format": "llm-bench/1", "label": "x"}, [
        record("base", [100.0, 101.0, 99.0]),
        record("fast", [200.0, 204.0, 198.0]),
        record("wide", [50.0, 300.0, 310.0]),
        record("slow", [50.0, 51.0, 49.5]),
        record("broken", [400.0, 404.0, 396.0], errors=["run 4 of 4 failed (3 finished): HTTP 500"]),
    ])
    return result, rows_from_sets([result], qualify=False)


def test_table_json_and_html_carry_each_verdict_with_its_interval():
    import json

    from llm_bench.report import find_baseline, markdown_table
    from llm_bench.report.export import to_json
    from llm_bench.report.html import render_html

    result, rows = _report_rows()
    base = find_baseline(rows, "base")
    expected = {"fast": verdict([200.0, 204.0, 198.0], [100.0, 101.0, 99.0]),
                "wide": verdict([50.0, 300.0, 310.0], [100.0, 101.0, 99.0]),
                "slow": verdict([50.0, 51.0, 49.5], [100.0, 101.0, 99.0])}
    assert [expected[k].kind for k in ("fast", "wide", "slow")] == [FASTER, WITHIN_NOISE, SLOWER]

    table = markdown_table(rows, base)
    cells = {line.split(" | ")[0].strip("| "): line for line in table.splitlines() if line.startswith("| ")}
    for name, v in expected.items():
        text = f"{v.kind} ({v.low:.2f}-{v.high:.2f}x, 90%)"
        assert f"| {text} |" in cells[name], cells[name]
    assert "| faster (1.96-2.06x, 90%) |" in cells["fast"]  # by hand: 198/101, 204/99
    assert "| baseline |" in cells["base"]
    # a failed configuration keeps its figures but gets no verdict of speed, however fast it measured
    assert "| not comparable (" in cells["broken"] and "faster" not in cells["broken"]

    data = {r["configuration"]: r for r in json.loads(to_json(rows, base))["main"]}
    for name, v in expected.items():
        assert data[name]["verdict"] == v.kind
        assert (data[name]["ratio"], data[name]["ratio_low"], data[name]["ratio_high"]) == \
            (pytest.approx(v.ratio), pytest.approx(v.low), pytest.approx(v.high))
        assert data[name]["confidence"] == pytest.approx(0.9)
    assert data["broken"]["verdict"] == "not comparable" and data["base"]["verdict"] == "baseline"

    page = render_html([result], "base", rows=rows)
    for v in expected.values():
        css = {FASTER: "v-faster", SLOWER: "v-slower", WITHIN_NOISE: "v-noise"}[v.kind]
        assert f'<td class="{css}">{v.kind} ({v.low:.2f}-{v.high:.2f}x, 90%)</td>' in page
