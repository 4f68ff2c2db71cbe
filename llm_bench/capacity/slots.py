"""The server's own view of its slots during a level: llama.cpp's ``/slots`` (which slots are processing)
and, where the preset has ``metrics`` on, ``/metrics`` ``llamacpp:requests_deferred`` (requests waiting
for a slot). This is how a level that breaks the TTFT objective is told apart: queued for a slot, or slowed.

Read on a connection of its own with ``autoload=false`` (asking must not load a model), from a sampling
thread, so a request of the level never waits for it. A server without these endpoints gives no evidence.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

import httpx

from llm_bench.capacity.records import SlotEvidence
from llm_bench.engines.metrics import parse_prometheus

DEFERRED = "llamacpp:requests_deferred"


class SlotWatch:
    def __init__(self, base_url: str, headers: dict[str, str], alias: str, interval_s: float):
        self.alias = alias
        self.interval_s = interval_s
        self._http = httpx.Client(base_url=base_url, headers=headers, timeout=httpx.Timeout(10.0, connect=2.0))
        self._params = {"model": alias, "autoload": "false"}

    def close(self) -> None:
        self._http.close()

    def _get(self, path: str) -> httpx.Response | None:
        try:
            response = self._http.get(path, params=self._params)
        except httpx.HTTPError:
            return None
        return response if response.status_code == 200 else None

    def slots(self) -> list[dict[str, Any]] | None:
        response = self._get("/slots")
        try:
            body = None if response is None else response.json()
        except ValueError:
            return None
        return body if isinstance(body, list) and all(isinstance(s, dict) for s in body) else None

    def deferred(self) -> int | None:
        response = self._get("/metrics")
        if response is None:
            return None
        values = [s.value for s in parse_prometheus(response.text) if s.name == DEFERRED]
        return int(values[0]) if values else None

    def slot_count(self) -> int | None:
        slots = self.slots()
        return len(slots) if slots else None

    @contextmanager
    def watching(self, in_flight: Callable[[], int]) -> Iterator[SlotEvidence]:
        """Samples until the block ends; the evidence fills in as it goes."""
        evidence = SlotEvidence()
        stop = threading.Event()

        def sample() -> None:
            while not stop.is_set():
                slots = self.slots()
                if slots is not None:
                    deferred = self.deferred()
                    flying = in_flight()
                    busy = sum(1 for s in slots if s.get("is_processing"))
                    evidence.slots = len(slots)
                    evidence.samples += 1
                    evidence.busy_max = max(evidence.busy_max, busy)
                    if deferred is not None:
                        evidence.deferred_max = max(evidence.deferred_max or 0, deferred)
                    if busy == len(slots):
                        evidence.all_busy_samples += 1
                        waiting = max(flying - busy, deferred or 0)
                        evidence.waiting_max = max(evidence.waiting_max, waiting)
                        evidence.queued_samples += waiting > 0
                stop.wait(self.interval_s)

        thread = threading.Thread(target=sample, daemon=True, name=f"slots-{self.alias}")
        thread.start()
        try:
            yield evidence
        finally:
            stop.set()
            thread.join(15.0)
