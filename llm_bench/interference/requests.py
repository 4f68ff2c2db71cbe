"""Requests the server answered during a window that were not ours: the server's own count against what the
client sent (``OpenAIClient.generations_sent``: every chat and completion POST).

- **llama.cpp** (a router's model instance, ``GET /slots?model=ALIAS``): every task the server queues gets the
  next number of one counter (``get_new_id``): each completion request one, each ``GET /slots`` one. A slot
  shows the number of the last task it ran (``id_task``). Between the highest number at the window's start and
  at its end lie our requests, our own ``/slots`` read at the start, and everything else: the rest is foreign
  (another client's request, or a ``/slots`` or ``/metrics`` read by something else).
- **vLLM** (``/metrics``): ``vllm:request_success_total`` (summed over its ``finished_reason`` labels) and the
  requests still running (``vllm:num_requests_running``) against ours.
- Anything else: not counted, with the reason.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from llm_bench.engines import Engine
from llm_bench.engines.errors import ServerError
from llm_bench.engines.metrics import parse_prometheus

VLLM_FINISHED = "vllm:request_success_total"
VLLM_RUNNING = "vllm:num_requests_running"


@dataclass(frozen=True)
class Count:
    """The server's counter and our requests sent at one moment; ``why`` where the server's cannot be read."""

    server: float | None
    ours: int
    why: str | None = None


def _sent(engine: Engine) -> int:
    # both engines talk through an OpenAIClient (engines/client.py), which counts what it sends
    client = getattr(engine, "client", None)
    return int(getattr(client, "generations_sent", 0))


def highest_task(slots: Any) -> int | None:
    """The highest ``id_task`` any slot of a ``/slots`` answer ran; None when no slot ran one."""
    ids = [s["id_task"] for s in slots if isinstance(s, dict) and isinstance(s.get("id_task"), int)] \
        if isinstance(slots, list) else []
    return max(ids) if ids else None


def vllm_finished(text: str) -> float | None:
    samples = parse_prometheus(text)
    finished = [s.value for s in samples if s.name == VLLM_FINISHED]
    running = [s.value for s in samples if s.name == VLLM_RUNNING]
    return sum(finished) + sum(running) if finished else None


class RequestCounter:
    """Reads the server's counter for one alias; ``foreign(start, end)`` is what was not ours."""

    def __init__(self, engine: Engine, alias: str):
        self.engine = engine
        self.alias = alias
        self.slots = engine.capabilities.presets  # a llama.cpp router: its instances have /slots

    def read(self) -> Count:
        ours = _sent(self.engine)
        if self.slots:
            client = getattr(self.engine, "client", None)
            if client is None:
                return Count(None, ours, "this engine has no client to read /slots with")
            try:
                slots = client.get_json("/slots", model=self.alias, autoload="false")
            except ServerError as e:
                return Count(None, ours, f"GET /slots: {e} (the server may run with --no-slots)")
            task = highest_task(slots)
            return Count(None if task is None else float(task), ours, None if task is not None else
                         "GET /slots showed no task")
        text = self.engine.metrics_text()
        if text is None:
            return Count(None, ours, "the server has no /metrics page to count requests with")
        finished = vllm_finished(text)
        if finished is None:
            return Count(None, ours, f"its /metrics page has no {VLLM_FINISHED}")
        return Count(finished, ours)

    def foreign(self, start: Count, end: Count) -> tuple[int | None, str | None]:
        """Requests in the window that were not ours (None, why: not counted)."""
        if start.server is None or end.server is None:
            return None, start.why or end.why
        ours = end.ours - start.ours
        # llama.cpp: the start's own /slots read took a number after the highest it showed
        own_reads = 1 if self.slots else 0
        return max(0, int(round(end.server - start.server)) - ours - own_reads), None
