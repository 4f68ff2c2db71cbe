"""The shared helpers in llm_bench/support: waiting with a deadline, fanning out, numbers, chart files, Ctrl-C."""

from __future__ import annotations

import signal
import threading
import time
from pathlib import Path

import click
import pytest
from click.testing import CliRunner

from llm_bench.cli import main
from llm_bench.support.ctrl_c import ctrl_c_not_lost
from llm_bench.support.fanout import fan_out
from llm_bench.support.numbers import fmt
from llm_bench.support.plotting import ChartError, figure
from llm_bench.support.poll import poll_until


def test_poll_until_returns_the_first_value_that_is_not_none() -> None:
    answers = iter([None, None, "ready"])
    assert poll_until(lambda: next(answers), timeout=5, interval=0.001) == "ready"


def test_poll_until_gives_none_at_the_deadline_after_trying_at_least_once() -> None:
    # a clock of its own: on the wall clock, a thread preempted between reading the deadline and the first
    # check's end would see the deadline passed after one call
    now = [0.0]
    calls: list[float] = []

    def sleep(seconds: float) -> None:
        now[0] += seconds

    def check() -> None:
        calls.append(now[0])

    # binary fractions, so the sums are exact: a check at every interval up to and at the deadline
    assert poll_until(check, timeout=0.5, interval=0.125, clock=lambda: now[0], sleep=sleep) is None
    assert calls == [0.0, 0.125, 0.25, 0.375, 0.5]
    # the last sleep stops at the deadline
    calls.clear()
    assert poll_until(check, timeout=0.375, interval=0.25, clock=lambda: now[0], sleep=sleep) is None
    assert calls == [0.5, 0.75, 0.875]
    calls.clear()
    assert poll_until(check, timeout=0, interval=1, clock=lambda: now[0], sleep=sleep) is None
    assert calls == [0.875]


def test_poll_until_stops_early_when_the_check_raises() -> None:
    def check():
        raise RuntimeError("the process died")

    with pytest.raises(RuntimeError, match="died"):
        poll_until(check, timeout=10, interval=1)


def test_fan_out_keeps_every_outcome_in_order_whatever_was_raised() -> None:
    def ok(n):
        return lambda: n * 10

    def boom():
        raise ValueError("malformed JSON")

    def slow():
        time.sleep(0.05)
        return "slow"

    outcomes, wall = fan_out([ok(1), boom, ok(3), lambda: 1 / 0, slow])
    assert [o.ok for o in outcomes] == [True, False, True, False, True]
    assert outcomes[0].value == 10 and outcomes[2].value == 30
    assert isinstance(outcomes[1].error, ValueError) and isinstance(outcomes[3].error, ZeroDivisionError)
    assert outcomes[4].value == "slow" and 0.05 <= wall < 5  # the wall time covers the slowest call


def test_fan_out_runs_the_calls_at_the_same_time() -> None:
    n = 8
    inside = threading.Barrier(n, timeout=5)  # breaks unless all n calls are running at once

    outcomes, _ = fan_out([lambda: inside.wait() is not None] * n)
    assert all(o.ok for o in outcomes)


def test_fmt_never_writes_a_missing_figure_as_zero() -> None:
    assert fmt(None) == "-" and fmt(None, missing="n/a") == "n/a"
    assert fmt(0.0) == "0.0" and fmt(1234.567, 2) == "1234.57" and fmt(2.5, 0) == "2"


def test_figure_refuses_other_file_types_and_writes_png_and_svg(tmp_path: Path) -> None:
    with pytest.raises(ChartError, match=r"\.png or \.svg"):
        with figure(tmp_path / "chart.jpg"):
            pass
    for name in ("chart.png", "nested/chart.svg"):
        with figure(tmp_path / name, figsize=(2, 2)) as (_fig, ax):
            ax.plot([0, 1], [0, 1])
        assert (tmp_path / name).stat().st_size > 0
    assert (tmp_path / "chart.svg").exists() is False and (tmp_path / "nested" / "chart.svg").read_text().lstrip().startswith("<?xml")


def test_figure_writes_nothing_when_drawing_fails(tmp_path: Path) -> None:
    with pytest.raises(KeyError):
        with figure(tmp_path / "chart.png"):
            raise KeyError("no data")
    assert not (tmp_path / "chart.png").exists()


class _CtrlCInFinalizer:
    """A Ctrl-C that arrives while the garbage collector runs a finalizer, as it did in a soak."""

    def __del__(self) -> None:
        # raise_signal runs the handler before it returns, on this thread: its KeyboardInterrupt is raised here,
        # inside __del__, where Python drops it (os.kill could land on another thread and raise it later)
        signal.raise_signal(signal.SIGINT)


def test_a_ctrl_c_that_python_drops_in_a_finalizer_is_sent_again_and_ends_a_blocking_call():
    started = time.monotonic()
    with pytest.raises(KeyboardInterrupt):
        with ctrl_c_not_lost():
            _CtrlCInFinalizer()
            time.sleep(10)  # as a read waiting on the server would: the signal sent again ends it
    assert time.monotonic() - started < 5


def test_nothing_is_sent_again_once_the_block_has_ended():
    with ctrl_c_not_lost():
        _CtrlCInFinalizer()  # dropped just as the command ends: its sending again is due after the block
    try:
        time.sleep(0.5)
    except KeyboardInterrupt:
        pytest.fail("a Ctrl-C dropped inside the block was sent after it had ended")


def test_every_command_gets_a_dropped_ctrl_c_again():
    @click.command("drop-a-ctrl-c")
    def drop() -> None:
        _CtrlCInFinalizer()
        time.sleep(10)

    main.add_command(drop)
    try:
        started = time.monotonic()
        result = CliRunner().invoke(main, ["drop-a-ctrl-c"])
    finally:
        main.commands.pop("drop-a-ctrl-c")
    assert time.monotonic() - started < 5 and "Aborted!" in result.output, result.output  # click's Ctrl-C
