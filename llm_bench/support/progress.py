"""How far a long run is and about how long it has left: the mean time of the finished steps times the
steps left (steps of one run are alike: the same protocol on each alias)."""

from __future__ import annotations

from collections.abc import Sequence


def duration_text(seconds: float) -> str:
    seconds = max(0, round(seconds))
    if seconds < 60:
        return f"{seconds} s"
    minutes, seconds = divmod(seconds, 60)
    if minutes < 60:
        return f"{minutes} min {seconds:02d} s"
    hours, minutes = divmod(minutes, 60)
    return f"{hours} h {minutes:02d} min"


def eta_seconds(finished: Sequence[float], left: int) -> float | None:
    """Estimated seconds for ``left`` more steps; None before any step has finished."""
    if not finished:
        return None
    return sum(finished) / len(finished) * left


def progress(n: int, total: int, finished: Sequence[float]) -> str:
    """'3/8, about 2 min 10 s left' before step n of total, given the durations of the steps finished."""
    eta = eta_seconds(finished, total - n + 1)
    return f"{n}/{total}" + ("" if eta is None else f", about {duration_text(eta)} left")
