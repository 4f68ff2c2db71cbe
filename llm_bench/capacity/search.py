"""Which level to measure next: doubling until the objective breaks, then bisection.

Pure functions of the outcomes so far (level -> met or not), so the search can be tested without a
server. A level that meets the objective above one that broke it (noise) is not believed: the answer
is the largest level that met it below the smallest that broke it.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

# The open loop goes down by halving when its first rate breaks the objective, at most this many times.
MAX_HALVINGS = 4


@dataclass(frozen=True)
class Bracket:
    carried: float | None  # the largest level that met the objective below ``broken_at``
    broken_at: float | None  # the smallest level that broke it


def bracket(outcomes: Mapping[float, bool]) -> Bracket:
    broken = min((level for level, met in outcomes.items() if not met), default=None)
    carried = max((level for level, met in outcomes.items() if met and (broken is None or level < broken)),
                  default=None)
    return Bracket(carried, broken)


def next_streams(outcomes: Mapping[float, bool], ceiling: int) -> tuple[int | None, str]:
    """The closed loop's next N, or None with why the search is over: "found" (N and N + 1 bracket the
    answer), "ceiling" (N met the objective at the ceiling) or "none-meets" (even 1 stream breaks it)."""
    b = bracket(outcomes)
    if b.broken_at is None:
        if b.carried is None:
            return 1, ""
        if b.carried >= ceiling:
            return None, "ceiling"
        return min(int(b.carried) * 2, ceiling), ""
    low = int(b.carried or 0)
    if int(b.broken_at) - low <= 1:
        return None, "found" if low else "none-meets"
    return (low + int(b.broken_at)) // 2, ""


def next_rate(outcomes: Mapping[float, bool], start: float, resolution: float) -> tuple[float | None, str]:
    """The open loop's next rate (requests per minute), or None with why the search is over: "found"
    (the met and the broken rate are within ``resolution`` of each other) or "none-meets" (the start
    rate halved MAX_HALVINGS times still breaks it)."""
    b = bracket(outcomes)
    if b.broken_at is None:
        return (start if b.carried is None else b.carried * 2), ""
    if b.carried is None:
        lowest = start / 2 ** MAX_HALVINGS
        if b.broken_at <= lowest * 1.01:  # (rounding to three digits may leave it a hair above)
            return None, "none-meets"
        return _round(max(b.broken_at / 2, lowest)), ""
    if b.broken_at / b.carried - 1 <= resolution + 1e-9:
        return None, "found"
    middle = _round((b.carried + b.broken_at) / 2)
    if middle in (b.carried, b.broken_at):  # closer than three digits can tell apart
        return None, "found"
    return middle, ""


def _round(rate: float) -> float:
    """Three significant digits: a rate is a setting people read and type again."""
    return float(f"{rate:.3g}")
