"""The two load generators. Each measures one level into the ``Level`` its caller holds (``new_level``), so
every request it sent is the caller's as it ends, whatever stops the level.

Closed loop: N streams, each sending its next request the moment its last one ended (it was due then).
Open loop: requests due at Poisson arrival times at R per minute (seeded), each sent on a thread of its
own whatever is still in flight.

Every level runs a warm-up (not counted), then a window of at least ``window_s`` seconds and at least
``min_window_requests`` requests, then a cool-down that keeps the load on until every window request has
ended (so the window's last requests still ran under the full load); only window requests are counted.
Each request records when it was due and when its last byte was written: the client's lag.
"""

from __future__ import annotations

import random
import threading
import time
from collections.abc import Callable
from contextlib import AbstractContextManager
from datetime import datetime, timezone
from typing import Any

from llm_bench.capacity.prompts import NextPrompt, Prompt
from llm_bench.capacity.records import (
    COOLDOWN,
    OVERLOADED,
    WARMUP,
    WINDOW,
    Level,
    RequestRecord,
    SlotEvidence,
    request_record,
)
from llm_bench.capacity.settings import CapacitySettings
from llm_bench.engines.base import Engine
from llm_bench.engines.errors import ServerUnreachable

# engines stamp their streams with time.perf_counter; schedules use the same clock
clock = time.perf_counter

# A slot sampler: given how many requests are in flight, a context manager yielding the level's evidence.
Watch = Callable[[Callable[[], int]], AbstractContextManager[SlotEvidence]]


class Budget:
    """The whole search's bounds: requests sent and a deadline. Thread-safe."""

    def __init__(self, max_requests: int, max_duration_s: float):
        self.max_requests = max_requests
        self.deadline = clock() + max_duration_s
        self.sent = 0
        self._lock = threading.Lock()

    def exhausted(self) -> str | None:
        """Which bound the search has hit, if any (checked before a level starts)."""
        with self._lock:
            if clock() >= self.deadline:
                return "max_duration"
            return "max_requests" if self.sent >= self.max_requests else None

    def take(self, now: float) -> str | None:
        """Count one request; or, when the search is out of requests or time, say which bound it hit."""
        with self._lock:
            if now >= self.deadline:
                return "max_duration"
            if self.sent >= self.max_requests:
                return "max_requests"
            self.sent += 1
            return None


class Phases:
    """Which phase a request due at a given time belongs to, or that no more are to be sent."""

    def __init__(self, origin: float, settings: CapacitySettings, budget: Budget, warmup_s: float | None = None):
        self.origin = origin
        self.warmup_end = origin + (settings.warmup_s if warmup_s is None else warmup_s)
        self.window_min_end = self.warmup_end + settings.window_s
        self.min_requests = settings.min_window_requests
        self.cooldown_limit_s = settings.window_s
        self.budget = budget
        self.window_sent = 0
        self.outstanding = 0  # window requests sent and not yet ended
        self.window_end: float | None = None
        self.stopped: str | None = None  # why sending stopped before the level was done
        self._lock = threading.Lock()

    def next(self, due: float) -> str | None:
        with self._lock:
            if self.stopped:
                return None
            if due < self.warmup_end:
                phase = WARMUP
            elif self.window_end is None and (due < self.window_min_end or self.window_sent < self.min_requests):
                phase = WINDOW
            else:
                if self.window_end is None:
                    self.window_end = due
                if self.outstanding == 0 or due - self.window_end > self.cooldown_limit_s:
                    return None
                phase = COOLDOWN
            bound = self.budget.take(due)
            if bound:
                self.stopped = bound
                return None
            if phase == WINDOW:
                self.window_sent += 1
                self.outstanding += 1
            return phase

    def ended(self, phase: str) -> None:
        with self._lock:
            if phase == WINDOW:
                self.outstanding -= 1

    def stop(self, why: str) -> None:
        with self._lock:
            self.stopped = self.stopped or why

    def finish(self, level: Level, end: float) -> None:
        """The level's window (or why it has none) once every request has ended."""
        if self.window_end is None:
            level.cut_short = self.stopped or "ended before its window closed"
        else:
            level.window = (self.warmup_end - self.origin, self.window_end - self.origin)
        level.duration_s = end - self.origin


class _Requests:
    """The level's records and what is in flight, shared by the threads that send."""

    def __init__(self, level: Level, origin: float, server_decode_rate: bool):
        self.level = level
        self.origin = origin
        self.server_decode_rate = server_decode_rate
        self.in_flight = 0
        self.unreachable: ServerUnreachable | None = None
        self._lock = threading.Lock()

    def send(self, engine: Engine, prompt: Prompt, phase: str, due: float, stream: int | None) -> float:
        """One request, recorded whatever happens; returns when it ended."""
        with self._lock:
            self.in_flight += 1
        called = clock()
        try:
            m = engine.stream(prompt.request)
            record = request_record(m, level=self.level.level, phase=phase, scheduled=due, origin=self.origin,
                                    server_decode_rate=self.server_decode_rate, stream=stream, turn=prompt.turn)
        except Exception as e:  # noqa: BLE001 - every request keeps its own outcome; the level decides what it means
            record = RequestRecord(level=self.level.level, phase=phase, scheduled_s=due - self.origin,
                                   sent_s=called - self.origin, ended_s=clock() - self.origin, stream=stream,
                                   turn=prompt.turn, error=f"{type(e).__name__}: {e}")
            if isinstance(e, ServerUnreachable):
                self.unreachable = self.unreachable or e
        with self._lock:
            self.in_flight -= 1
            self.level.requests.append(record)
        return self.origin + (record.ended_s if record.ended_s is not None else clock() - self.origin)

    def count(self) -> int:
        return self.in_flight


def new_level(loop: str, value: float) -> Level:
    """An empty level of N streams (closed) or R requests per minute (open), started now."""
    return Level(loop=loop, level=value, started_at=datetime.now(timezone.utc).isoformat(timespec="seconds"))


def _wait(threads: list[threading.Thread]) -> None:
    # joined with a timeout so that Ctrl-C reaches the main thread at once
    for thread in threads:
        while thread.is_alive():
            thread.join(0.1)


def closed_level(engine: Engine, prompts: NextPrompt, level: Level, settings: CapacitySettings, budget: Budget,
                 watch: Watch | None = None, spread_s: float = 0.0) -> None:
    """``level.level`` streams back to back, each asking ``prompts`` for its next request. Their first requests
    are spread evenly over ``spread_s`` (one request's duration), so that identical requests do not run in
    lock-step, arriving and queueing together for ever; the warm-up lasts at least that long."""
    streams = int(level.level)
    origin = clock()
    phases = Phases(origin, settings, budget, warmup_s=max(settings.warmup_s, spread_s))
    requests = _Requests(level, origin, engine.capabilities.server_decode_rate)

    def run(i: int) -> None:
        due = origin + spread_s * i / streams
        pause = due - clock()
        if pause > 0:
            time.sleep(pause)
        while requests.unreachable is None:
            phase = phases.next(due)
            if phase is None:
                return
            try:
                due = requests.send(engine, prompts(i), phase, due, i)
            finally:
                phases.ended(phase)
        phases.stop("server-gone")

    threads = [threading.Thread(target=run, args=(i,), daemon=True, name=f"stream-{i}") for i in range(streams)]
    with _watching(watch, requests.count, level), _interruptible(phases, level):
        for thread in threads:
            thread.start()
        _wait(threads)
    phases.finish(level, clock())
    _check_unreachable(requests, level)


def open_level(engine: Engine, prompts: NextPrompt, level: Level, settings: CapacitySettings,
               budget: Budget, watch: Watch | None = None) -> None:
    """Requests due at Poisson arrivals, ``level.level`` per minute, asking ``prompts`` in the order of their
    arrival; the same seed gives every level the same sequence of gaps, scaled to its rate."""
    rate_per_min = level.level
    arrivals = random.Random(settings.arrival_seed)
    origin = clock()
    phases = Phases(origin, settings, budget)
    requests = _Requests(level, origin, engine.capabilities.server_decode_rate)
    threads: list[threading.Thread] = []

    def one(prompt: Prompt, phase: str, due: float) -> None:
        try:
            requests.send(engine, prompt, phase, due, None)
        finally:
            phases.ended(phase)

    due = origin
    with _watching(watch, requests.count, level), _interruptible(phases, level):
        while requests.unreachable is None:
            due += arrivals.expovariate(1.0) * 60.0 / rate_per_min
            phase = phases.next(due)
            if phase is None:
                break
            if requests.count() >= settings.max_in_flight:
                phases.ended(phase)
                phases.stop(OVERLOADED)
                break
            pause = due - clock()
            if pause > 0:
                time.sleep(pause)
            thread = threading.Thread(target=one, args=(prompts(None), phase, due), daemon=True)
            thread.start()
            threads.append(thread)
        _wait(threads)
    phases.finish(level, clock())
    _check_unreachable(requests, level)


class LevelInterrupted(Exception):
    """Ctrl-C during a level; the caller's level holds every request that had ended (those in flight are
    dropped), marked as cut short."""


class _interruptible:
    """Ctrl-C stops the level's sending and marks the level cut short."""

    def __init__(self, phases: Phases, level: Level):
        self._phases, self._level = phases, level

    def __enter__(self) -> None:
        return None

    def __exit__(self, kind, value, traceback) -> None:
        if kind is KeyboardInterrupt:
            self._phases.stop("interrupted")
            self._level.cut_short = "interrupted"
            self._level.duration_s = clock() - self._phases.origin
            raise LevelInterrupted("interrupted") from None


class LevelAborted(Exception):
    """The server went away during a level (``cause``); the caller's level holds every request it sent."""

    def __init__(self, cause: ServerUnreachable):
        super().__init__(str(cause))
        self.cause = cause


def _check_unreachable(requests: _Requests, level: Level) -> None:
    if requests.unreachable is not None:
        level.cut_short = "server-gone"
        raise LevelAborted(requests.unreachable)


class _watching:
    """The slot sampler around a level, when there is one; its evidence lands on the level."""

    def __init__(self, watch: Watch | None, in_flight: Callable[[], int], level: Level):
        self._context = None if watch is None else watch(in_flight)
        self._level = level

    def __enter__(self) -> None:
        if self._context is not None:
            self._level.slots = self._context.__enter__()

    def __exit__(self, *exc: Any) -> None:
        if self._context is not None:
            self._context.__exit__(*exc)
