"""The quality verdict's rule on hand-made figures: "near-lossless" needs the whole 95 % interval of the
mean KLD at or below 0.01 nats, not just its point value; "lossless" needs a mean of zero and the same
answers; answers that are worse make any configuration lossy."""

from __future__ import annotations

from llm_bench.quality.divergence import Divergence, Estimate
from llm_bench.quality.paired import WITHIN_NOISE, WORSE, PairedVerdict
from llm_bench.workloads.quality.score import (
    LOSSLESS,
    LOSSY,
    NEAR_LOSSLESS,
    NEAR_LOSSLESS_KLD,
    Distributions,
    quality_verdict,
)


def dist(mean: float, low: float | None, high: float | None) -> Distributions:
    zero = Estimate(0.0, 0.0, 0.0)
    return Distributions(Divergence(400, Estimate(mean, low, high), zero, Estimate(1.0, 1.0, 1.0), 4, 2000, 0.95, 0))


def test_a_mean_below_the_mark_whose_interval_reaches_above_it_is_lossy() -> None:
    assert NEAR_LOSSLESS_KLD == 0.01
    assert quality_verdict(dist(0.006, 0.002, 0.013), None, True) == LOSSY


def test_an_interval_wholly_at_or_below_the_mark_is_near_lossless() -> None:
    assert quality_verdict(dist(0.006, 0.002, 0.009), None, True) == NEAR_LOSSLESS
    assert quality_verdict(dist(0.006, 0.002, 0.01), None, True) == NEAR_LOSSLESS  # at the mark
    # without an interval (too few positions) the point value is all there is
    assert quality_verdict(dist(0.006, None, None), None, True) == NEAR_LOSSLESS
    assert quality_verdict(dist(0.011, None, None), None, True) == LOSSY


def test_lossless_needs_zero_divergence_and_the_same_answers() -> None:
    assert quality_verdict(dist(0.0, 0.0, 0.0), None, True) == LOSSLESS
    assert quality_verdict(dist(0.0, 0.0, 0.0), None, False) == NEAR_LOSSLESS


def test_worse_answers_make_even_a_tiny_divergence_lossy() -> None:
    worse = PairedVerdict(WORSE, 40, 30, 8, 1, 1, 0.02)
    noise = PairedVerdict(WITHIN_NOISE, 40, 30, 2, 1, 7, 0.9)
    assert quality_verdict(dist(0.0, 0.0, 0.0), worse, True) == LOSSY
    assert quality_verdict(dist(0.006, 0.002, 0.009), noise, True) == NEAR_LOSSLESS


def test_no_distributions_no_verdict() -> None:
    assert quality_verdict(None, None, True) is None
    assert quality_verdict(Distributions(None, "the reference has no token distributions"), None, True) is None
