"""Progress lines of long runs: how far, and the time left from the mean of the finished steps."""

from llm_bench.support.progress import duration_text, eta_seconds, progress


def test_no_estimate_before_the_first_step_finishes():
    assert progress(1, 8, []) == "1/8"
    assert eta_seconds([], 3) is None


def test_estimate_is_the_mean_step_times_the_steps_left_including_this_one():
    assert eta_seconds([10.0, 30.0], 6) == 120.0
    assert progress(3, 8, [10.0, 30.0]) == "3/8, about 2 min 00 s left"
    assert progress(8, 8, [5.0] * 7) == "8/8, about 5 s left"


def test_durations_read_naturally():
    assert duration_text(42.4) == "42 s"
    assert duration_text(75) == "1 min 15 s"
    assert duration_text(3 * 3600 + 5 * 60) == "3 h 05 min"
