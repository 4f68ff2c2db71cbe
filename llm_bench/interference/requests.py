"""Requests the server answered during a window that were not ours: the server's own count against what the
client sent (``OpenAIClient.generations_sent``: every chat and completion POST).

- **llama.cpp**: its log. Every request a model instance starts is one line ``slot launch_slot_: id 0 | task 17 |
  processing task, is_child = 0`` (child tasks of one request say ``is_child = 1`` and are not counted); the
  lines the log gained in the window, less our requests, are the others'. Its ``/slots`` cannot count them:
  a slot's ``id_task`` comes from the server's one counter of queued tasks, which every decoding step takes a
  number from too (``SERVER_TASK_TYPE_NEXT_RESPONSE``).
- **vLLM** (``/metrics``): ``vllm:request_success_total`` (summed over its ``finished_reason`` labels) and the
  requests still running (``vllm:num_requests_running``) against ours.
- Anything else: not counted, with the reason.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from dataclasses import dataclass

from llm_bench.engines import Engine
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


STARTED = re.compile(r"\| processing task, is_child = 0")


def started_in_log(text: str) -> int:
    """Requests the llama.cpp log says its model instances started."""
    return len(STARTED.findall(text))


def vllm_finished(text: str) -> float | None:
    samples = parse_prometheus(text)
    finished = [s.value for s in samples if s.name == VLLM_FINISHED]
    running = [s.value for s in samples if s.name == VLLM_RUNNING]
    return sum(finished) + sum(running) if finished else None


class RequestCounter:
    """Reads the server's count for one alias; ``foreign(start, end)`` is what was not ours. ``server_log`` gives the
    server's log as it is now (None where it cannot be read; llama.cpp only)."""

    def __init__(self, engine: Engine, server_log: Callable[[], str | None] | None = None):
        self.engine = engine
        self.server_log = server_log
        self.from_log = engine.capabilities.presets  # a llama.cpp router

    def read(self) -> Count:
        ours = _sent(self.engine)
        if self.from_log:
            text = None if self.server_log is None else self.server_log()
            if text is None:
                return Count(None, ours, "the server's log cannot be read ([checks] log_file or log_command)")
            return Count(float(started_in_log(text)), ours)
        text = self.engine.metrics_text()
        if text is None:
            return Count(None, ours, "the server has no /metrics page to count requests with")
        finished = vllm_finished(text)
        if finished is None:
            return Count(None, ours, f"its /metrics page has no {VLLM_FINISHED}")
        return Count(finished, ours)

    @staticmethod
    def foreign(start: Count, end: Count) -> tuple[int | None, str | None]:
        """Requests in the window that were not ours (None, why: not counted). A log that started over (rotated)
        counts less at the end: not counted either."""
        if start.server is None or end.server is None:
            return None, start.why or end.why
        if end.server < start.server:
            return None, "the server's log started over during the window"
        return max(0, int(round(end.server - start.server)) - (end.ours - start.ours)), None
