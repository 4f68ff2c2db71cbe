"""How far a long run is and about how long it has left: the mean time of the finished steps times the
steps left (steps of one run are alike: the same protocol on each alias). ``Steps`` shows it for work of
many steps: a live bar on a terminal, one line per step otherwise."""

from __future__ import annotations

import os
import sys
import time
from collections.abc import Callable, Sequence
from typing import TextIO

from tqdm import tqdm


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


def _screen(stream: TextIO) -> tuple[int, int]:
    """The terminal's columns and lines; 80 x 24 where it reports none (a pseudo-terminal nobody sized says
    0 x 0, and tqdm would then draw nothing)."""
    try:
        size = os.get_terminal_size(stream.fileno())
    except (OSError, ValueError):
        return 80, 24
    return size.columns or 80, size.lines or 24


class Steps:
    """Progress through ``total`` steps of one piece of work. On a terminal a live bar (tqdm) on
    ``stream``; otherwise one line per step through ``log``, as every progress line reads:
    ``  Quality 4/13, about 40 s left: question arithmetic``. ``step(name)`` before each step."""

    def __init__(self, what: str, total: int, log: Callable[[str], None], stream: TextIO | None = None):
        self.what, self.total, self._log = what, total, log
        self.n = 0
        self.finished: list[float] = []
        self._started: float | None = None
        self._stream = stream if stream is not None else sys.stderr
        live = self._stream.isatty()
        columns, lines = _screen(self._stream) if live else (None, None)
        self._bar = tqdm(total=total, desc=f"  {what}", file=self._stream, leave=False, disable=not live,
                         ncols=columns, nrows=lines,
                         bar_format="{desc} {n_fmt}/{total_fmt} {bar:24} {elapsed}, about {remaining} left{postfix}")

    def __enter__(self) -> Steps:
        return self

    def __exit__(self, *exc: object) -> None:
        self._finish_step()
        self._bar.close()

    @property
    def live(self) -> bool:
        return not self._bar.disable

    def _finish_step(self) -> None:
        if self._started is not None:
            self.finished.append(time.perf_counter() - self._started)
            self._started = None
            self._bar.update(1)

    def step(self, name: str) -> None:
        self._finish_step()
        self.n += 1
        self._started = time.perf_counter()
        if self.live:
            self._bar.set_postfix_str(name, refresh=True)
        else:
            self._log(f"  {self.what} {progress(self.n, self.total, self.finished)}: {name}")

    def log(self, message: str) -> None:
        """A line among the steps: above the bar on a terminal (which stays at the bottom), else as usual."""
        if self.live:
            tqdm.write(message, file=self._stream)
        else:
            self._log(message)
