"""Waiting for something to become true, with a deadline."""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import TypeVar

T = TypeVar("T")


def poll_until(check: Callable[[], T | None], *, timeout: float, interval: float,
               clock: Callable[[], float] = time.monotonic,
               sleep: Callable[[float], None] = time.sleep) -> T | None:
    """Call ``check`` until it returns something other than None, and return that; None when
    ``timeout`` seconds pass first. ``check`` runs at least once; it stops the wait early by raising.
    The caller raises its own error on None, since only it can say what was awaited."""
    deadline = clock() + timeout
    while True:
        result = check()
        if result is not None:
            return result
        now = clock()
        if now >= deadline:
            return None
        sleep(min(interval, deadline - now))
