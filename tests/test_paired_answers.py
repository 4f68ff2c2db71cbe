"""The paired verdict on exact answers: McNemar's exact test against hand-computed binomial tails."""

from __future__ import annotations

import pytest

from llm_bench.quality.paired import BETTER, WITHIN_NOISE, WORSE, mcnemar_exact, paired_verdict


def test_exact_p_values_are_twice_the_smaller_binomial_tail() -> None:
    # 1 against 9: 2 * (C(10,0) + C(10,1)) / 2^10 = 22 / 1024
    assert mcnemar_exact(9, 1) == pytest.approx(22 / 1024, abs=1e-15)
    assert mcnemar_exact(1, 9) == mcnemar_exact(9, 1)
    # 2 against 8: 2 * (1 + 10 + 45) / 1024
    assert mcnemar_exact(8, 2) == pytest.approx(112 / 1024, abs=1e-15)
    # 6 against 0: 2 / 64
    assert mcnemar_exact(6, 0) == pytest.approx(2 / 64)
    assert mcnemar_exact(0, 0) == 1.0 and mcnemar_exact(5, 5) == 1.0


def pairs(both_right: int, lost: int, gained: int, both_wrong: int) -> tuple[list[bool], list[bool]]:
    reference = [True] * both_right + [True] * lost + [False] * gained + [False] * both_wrong
    configuration = [True] * both_right + [False] * lost + [True] * gained + [False] * both_wrong
    return reference, configuration


def test_verdicts_with_their_counts() -> None:
    worse = paired_verdict(*pairs(150, 12, 2, 36))
    assert (worse.kind, worse.items, worse.lost, worse.gained, worse.both_right, worse.both_wrong) == \
        (WORSE, 200, 12, 2, 150, 36)
    assert (worse.reference_right, worse.configuration_right) == (162, 152)
    assert worse.p_value == pytest.approx(2 * (1 + 14 + 91) / 2 ** 14)
    assert "152/200 right against the reference's 162/200 (12 lost, 2 gained" in worse.describe()

    assert paired_verdict(*pairs(150, 2, 12, 36)).kind == BETTER
    noise = paired_verdict(*pairs(150, 5, 3, 42))
    assert noise.kind == WITHIN_NOISE and noise.p_value > 0.05


def test_identical_answers_are_within_noise_with_p_one() -> None:
    same = paired_verdict(*pairs(120, 0, 0, 80))
    assert (same.kind, same.p_value, same.lost, same.gained) == (WITHIN_NOISE, 1.0, 0, 0)


def test_a_comparison_of_different_item_counts_is_refused() -> None:
    with pytest.raises(ValueError, match="same items"):
        paired_verdict([True, False], [True])
