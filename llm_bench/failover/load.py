"""The steady load of a failover run: a fixed number of streams, each sending its next request as soon
as the last one ended (a closed loop), with every request's outcome handed over as it ends."""

from __future__ import annotations

import threading
from collections.abc import Callable

from llm_bench.engines.errors import ServerError
from llm_bench.engines.openai import OpenAIEngine
from llm_bench.engines.stream import ChatRequest
from llm_bench.failover.records import Request

# After a failed request a stream waits this long: a proxy that refuses at once would otherwise be
# asked hundreds of times a second, and --max-requests would be spent in a moment.
PAUSE_AFTER_FAILURE_S = 0.2
ERROR_CHARS = 300


def send(engine: OpenAIEngine, request: ChatRequest, now: Callable[[], float]) -> Request:
    """One request; a failure is a record with the proxy's message, never an exception."""
    sent = now()
    try:
        m = engine.stream(request)
    except ServerError as e:
        return Request(sent, now(), ok=False, error=" ".join(str(e).split())[:ERROR_CHARS])
    return Request(sent, now(), ok=True, backend=m.backend, fallbacks=m.proxy_fallbacks,
                   ttft_ms=None if m.ttft_s is None else m.ttft_s * 1000.0, decode_tps=m.client_decode_tps,
                   output_tokens=m.output_tokens, proxy_overhead_ms=m.proxy_overhead_ms)


class SteadyLoad:
    """``streams`` threads sending ``request`` until stopped or ``max_requests`` were sent in all."""

    def __init__(self, engine: OpenAIEngine, request: ChatRequest, now: Callable[[], float], *, streams: int,
                 max_requests: int, on_request: Callable[[Request], None]):
        self._engine, self._request, self._now = engine, request, now
        self._max, self._on_request = max_requests, on_request
        self._lock = threading.Lock()
        self._sent = 0
        self._stop = threading.Event()
        self._threads = [threading.Thread(target=self._stream, daemon=True, name=f"failover-load-{n}")
                         for n in range(streams)]

    def start(self) -> None:
        for thread in self._threads:
            thread.start()

    @property
    def running(self) -> bool:
        return any(thread.is_alive() for thread in self._threads)

    def stop(self, timeout: float) -> None:
        """Send nothing more; wait up to ``timeout`` for the requests in flight (they are recorded when they end)."""
        self._stop.set()
        for thread in self._threads:
            thread.join(timeout)

    def _stream(self) -> None:
        while not self._stop.is_set():
            with self._lock:
                if self._sent >= self._max:
                    return
                self._sent += 1
            outcome = send(self._engine, self._request, self._now)
            with self._lock:
                self._on_request(outcome)
            if not outcome.ok:
                self._stop.wait(PAUSE_AFTER_FAILURE_S)
