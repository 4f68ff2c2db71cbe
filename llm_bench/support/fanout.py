"""Running several calls at the same moment on threads, keeping every outcome.

Each call's exception is kept against that call, never lost with its thread, so a batch always
has one outcome per call and the caller decides what a failure means.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Generic, TypeVar

T = TypeVar("T")


@dataclass(frozen=True)
class Outcome(Generic[T]):
    value: T | None = None
    error: BaseException | None = None

    @property
    def ok(self) -> bool:
        return self.error is None


def fan_out(calls: Sequence[Callable[[], T]]) -> tuple[list[Outcome[T]], float]:
    """Start every call together (a barrier releases them at once); return their outcomes in order
    and the wall time from the release until the last one ended."""
    if not calls:
        return [], 0.0
    outcomes: list[Outcome[T]] = [Outcome(error=RuntimeError("never ran"))] * len(calls)
    started: list[float] = []
    barrier = threading.Barrier(len(calls), action=lambda: started.append(time.perf_counter()))

    def worker(i: int) -> None:
        try:
            barrier.wait()
            outcomes[i] = Outcome(value=calls[i]())
        except BaseException as e:  # noqa: BLE001 - kept against its call; the caller reports it
            outcomes[i] = Outcome(error=e)

    threads = [threading.Thread(target=worker, args=(i,), daemon=True) for i in range(len(calls))]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    return outcomes, time.perf_counter() - (started[0] if started else time.perf_counter())
