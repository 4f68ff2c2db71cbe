"""The KL divergence of top-k next-token distributions, and its block-bootstrap intervals: the arithmetic
against hand-computed values and a direct computation on known distributions, and the intervals'
coverage on series with a known correlation."""

from __future__ import annotations

import math

import numpy as np
import pytest

from llm_bench.quality.divergence import (
    MIN_POSITIONS,
    block_length,
    circular_block_indices,
    compare,
    position_kld,
    side_probabilities,
    summarise,
    top_token,
)

ln = math.log


def test_the_union_rule_matches_a_hand_computation() -> None:
    # ref lists A 0.5, B 0.3 (0.2 unlisted); cfg lists A 0.4, C 0.35 (0.25 unlisted).
    # ref has not listed C: min(0.3, 0.2 / 2) = 0.1, "other" 0.1.
    # cfg has not listed B: min(0.35, 0.25 / 2) = 0.125, "other" 0.125.
    ref = {1: ln(0.5), 2: ln(0.3)}
    cfg = {1: ln(0.4), 3: ln(0.35)}
    expected = 0.5 * ln(0.5 / 0.4) + 0.3 * ln(0.3 / 0.125) + 0.1 * ln(0.1 / 0.35) + 0.1 * ln(0.1 / 0.125)
    assert position_kld(ref, cfg) == pytest.approx(expected, rel=1e-9)
    assert side_probabilities(ref, [1, 2, 3]) == pytest.approx([0.5, 0.3, 0.1, 0.1], abs=1e-9)
    assert side_probabilities(cfg, [1, 2, 3]) == pytest.approx([0.4, 0.125, 0.35, 0.125], abs=1e-9)


def test_an_unlisted_token_never_gets_more_than_the_sides_smallest_listed_probability() -> None:
    # 0.6 unlisted, one token of the union missing: r / 2 = 0.3 would exceed the smallest listed 0.1.
    cfg = {1: ln(0.3), 2: ln(0.1)}
    assert side_probabilities(cfg, [1, 2, 9]) == pytest.approx([0.3, 0.1, 0.1, 0.5], abs=1e-9)


def test_identical_lists_give_exactly_zero() -> None:
    rng = np.random.default_rng(7)
    for _ in range(50):
        logits = rng.normal(size=40) * 3
        logprobs = logits - np.logaddexp.reduce(logits)
        top = {int(t): float(logprobs[t]) for t in np.argsort(-logprobs)[:10]}
        assert position_kld(top, dict(top)) == 0.0


def test_with_the_whole_vocabulary_listed_it_is_the_exact_divergence() -> None:
    p = np.array([0.5, 0.25, 0.125, 0.0625, 0.0625])
    q = np.array([0.4, 0.3, 0.1, 0.1, 0.1])
    direct = float(np.sum(p * np.log(p / q)))
    as_listed = position_kld({i: ln(v) for i, v in enumerate(p)}, {i: ln(v) for i, v in enumerate(q)})
    assert as_listed == pytest.approx(direct, rel=1e-8)


def test_a_token_one_side_ranks_first_and_the_other_does_not_list_counts_in_full() -> None:
    ref = {1: ln(0.9), 2: ln(0.05)}
    cfg = {3: ln(0.9), 2: ln(0.05)}
    # each side gives the other's top token its smallest listed probability at most: 0.05 against 0.9
    assert position_kld(ref, cfg) > 0.9 * ln(0.9 / 0.05) - 0.1


def test_top_k_divergence_approaches_the_full_divergence_from_below() -> None:
    """Distributions of a 2000-token vocabulary against slightly perturbed copies: with k = 20 the
    estimate is within 5 % of the full-vocabulary divergence and never far above it."""
    rng = np.random.default_rng(3)
    for scale in (0.02, 0.1, 0.5):
        full, estimated = [], []
        for _ in range(30):
            logits = rng.gumbel(size=2000) * 3
            lp = logits - np.logaddexp.reduce(logits)
            perturbed = logits + rng.normal(size=2000) * scale
            lq = perturbed - np.logaddexp.reduce(perturbed)
            full.append(float(np.sum(np.exp(lp) * (lp - lq))))
            top = lambda x: {int(t): float(x[t]) for t in np.argsort(-x)[:20]}  # noqa: E731
            estimated.append(position_kld(top(lp), top(lq)))
        assert np.mean(estimated) == pytest.approx(np.mean(full), rel=0.05)


def test_a_side_whose_top_k_hold_all_the_mass_gives_a_finite_divergence() -> None:
    ref = {1: ln(0.5), 2: ln(0.5)}
    cfg = {1: 0.0, 3: -3.4028234663852886e38}  # llama-server writes probability 0 as the lowest float
    assert math.isfinite(position_kld(ref, cfg)) and position_kld(ref, cfg) > 1.0


def test_top_token_is_the_highest_and_the_first_listed_on_a_tie() -> None:
    assert top_token({5: -2.0, 7: -0.5, 9: -1.0}) == 7
    assert top_token({5: -1.0, 7: -1.0}) == 5


def test_same_top_share_and_mean_over_positions() -> None:
    refs = [{1: ln(0.6), 2: ln(0.3)}] * 40
    cfgs = [{1: ln(0.6), 2: ln(0.3)}] * 30 + [{2: ln(0.6), 1: ln(0.3)}] * 10
    result = compare(refs, cfgs, replicates=200)
    assert result.positions == 40
    assert result.same_top.value == 0.75
    swapped = position_kld(refs[0], cfgs[-1])
    assert result.mean_kld.value == pytest.approx(swapped / 4)
    assert result.mean_kld.low <= result.mean_kld.value <= result.mean_kld.high


def test_identical_configurations_come_out_zero_with_a_zero_interval() -> None:
    refs = [{1: ln(0.6), 2: ln(0.3)}, {4: ln(0.2), 5: ln(0.1)}] * 50
    result = compare(refs, list(refs), replicates=200)
    assert (result.mean_kld.value, result.mean_kld.low, result.mean_kld.high) == (0.0, 0.0, 0.0)
    assert (result.p99_kld.value, result.p99_kld.high) == (0.0, 0.0)
    assert (result.same_top.value, result.same_top.low) == (1.0, 1.0)


def test_too_few_positions_give_no_interval_and_mismatched_texts_are_refused() -> None:
    refs = [{1: ln(0.6), 2: ln(0.3)}] * (MIN_POSITIONS - 1)
    result = compare(refs, list(refs))
    assert result.mean_kld.low is None and result.same_top.high is None
    with pytest.raises(ValueError, match="positions"):
        compare(refs, refs[:-1])
    with pytest.raises(ValueError):
        summarise(np.array([]), np.array([]))


def test_the_bootstrap_is_reproducible_for_a_seed() -> None:
    rng = np.random.default_rng(1)
    kld = rng.exponential(size=300)
    same = (rng.random(300) < 0.9).astype(float)
    assert summarise(kld, same, seed=4) == summarise(kld, same, seed=4)
    assert summarise(kld, same, seed=4).mean_kld != summarise(kld, same, seed=5).mean_kld


def ar1(rng: np.random.Generator, n: int, phi: float) -> np.ndarray:
    noise = rng.normal(size=n)
    x = np.empty(n)
    x[0] = noise[0] / math.sqrt(1 - phi * phi)
    for i in range(1, n):
        x[i] = phi * x[i - 1] + noise[i]
    return x


def test_block_length_grows_with_the_correlation() -> None:
    rng = np.random.default_rng(11)
    independent, weak, strong = (block_length(ar1(rng, 2000, phi)) for phi in (0.0, 0.5, 0.8))
    assert independent <= 2 < weak < strong
    assert block_length(np.zeros(500)) == 1


def test_circular_blocks_are_contiguous_and_wrap() -> None:
    rows = circular_block_indices(10, 4, 50, np.random.default_rng(0))
    assert rows.shape == (50, 10)
    for row in rows:
        for block in (row[0:4], row[4:8]):
            assert all((b - a) % 10 == 1 for a, b in zip(block, block[1:]))


def coverage(phi: float, *, fixed_block: int | None) -> float:
    """How often the 95 % interval of the mean holds the true mean (0) of an AR(1) series."""
    rng = np.random.default_rng(2026)
    n, hits, series = 500, 0, 150
    for s in range(series):
        x = ar1(rng, n, phi)
        if fixed_block is None:
            result = summarise(x, np.ones(n), replicates=400, seed=s)
            low, high = result.mean_kld.low, result.mean_kld.high
        else:
            means = x[circular_block_indices(n, fixed_block, 400, np.random.default_rng(s))].mean(axis=1)
            low, high = np.quantile(means, [0.025, 0.975])
        hits += low <= 0.0 <= high
    return hits / series


def test_block_intervals_cover_the_mean_of_correlated_positions() -> None:
    """On a series whose neighbours correlate (AR(1), phi 0.6: the variance of the mean is 4 times the
    independent one), the block bootstrap keeps close to its 95 %, where resampling single
    positions covers far less."""
    assert coverage(0.6, fixed_block=None) >= 0.87
    assert coverage(0.6, fixed_block=1) <= 0.80


def test_p99_is_the_99th_percentile_not_the_maximum() -> None:
    # 100 positions: 97 at 0, then 1, 2 and 10 nats. The 99th percentile by linear interpolation between
    # order statistics (numpy's default, as the code uses) sits at rank 0.99 * (100 - 1) = 98.01 of the
    # sorted values (counted from 0): 2 + 0.01 * (10 - 2) = 2.08. The maximum would be 10.
    kld = np.array([0.0] * 97 + [1.0, 2.0, 10.0])
    result = summarise(kld, np.ones(100), replicates=200)
    assert result.p99_kld.value == pytest.approx(2.08)
    assert result.mean_kld.value == pytest.approx(13.0 / 100)


def test_p99s_interval_is_of_the_resampled_99th_percentiles_not_their_maxima() -> None:
    # 1000 distinct positions 0.000 .. 0.999 in a shuffled order: the 99th percentile is at rank 989.01,
    # 0.989 + 0.01 * 0.001 = 0.98901. A resample's 99th percentile reaches the top value 0.999 only if
    # that position is drawn 11 times or more, which practically never happens, while most resamples
    # draw it at least once: the interval's upper end lies below the maximum, a maximum's would be on it.
    kld = np.random.default_rng(1).permutation(np.arange(1000) / 1000.0)
    result = summarise(kld, np.ones(1000), replicates=400)
    p99 = result.p99_kld
    assert p99.value == pytest.approx(0.98901)
    assert p99.low is not None and p99.high is not None
    assert p99.low <= p99.value <= p99.high < 0.999
