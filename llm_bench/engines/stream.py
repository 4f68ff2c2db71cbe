"""One streamed chat completion: the request llm-bench sends and what it measures of the answer.

Pure: it reads an iterator of SSE lines and a clock, so every path can be tested without a server.
"""

from __future__ import annotations

import json
import time
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

from llm_bench.engines.errors import ServerError


@dataclass(frozen=True)
class ChatRequest:
    """One benchmark request: a single user message, generated to exactly max_tokens."""

    model: str
    prompt: str
    max_tokens: int
    temperature: float
    seed: int
    ignore_eos: bool = True

    def body(self) -> dict[str, Any]:
        return {
            "model": self.model,
            "messages": [{"role": "user", "content": self.prompt}],
            "max_tokens": self.max_tokens,
            "temperature": self.temperature,
            "seed": self.seed,
            # llama.cpp and vLLM both honour ignore_eos: the run must produce max_tokens tokens.
            "ignore_eos": self.ignore_eos,
            "stream": True,
            "stream_options": {"include_usage": True},
        }


@dataclass
class StreamMeasurement:
    """Wall-clock facts about one streamed completion, plus what the server reported."""

    sent_at: float
    first_token_at: float | None = None
    last_token_at: float | None = None
    done_at: float | None = None
    token_chunks: int = 0
    finish_reason: str | None = None
    usage: dict[str, Any] | None = None
    timings: dict[str, Any] | None = None

    @property
    def ttft_s(self) -> float | None:
        return None if self.first_token_at is None else self.first_token_at - self.sent_at

    @property
    def output_tokens(self) -> int | None:
        if self.usage and "completion_tokens" in self.usage:
            return int(self.usage["completion_tokens"])
        if self.timings and "predicted_n" in self.timings:
            return int(self.timings["predicted_n"])
        return None

    @property
    def prompt_tokens(self) -> int | None:
        if self.usage and "prompt_tokens" in self.usage:
            return int(self.usage["prompt_tokens"])
        if self.timings and "prompt_n" in self.timings:
            return int(self.timings["prompt_n"]) + int(self.timings.get("cache_n", 0))
        return None

    @property
    def cached_tokens(self) -> int | None:
        """Prompt tokens the server reused from its cache, where it says so."""
        if self.timings and "cache_n" in self.timings:
            return int(self.timings["cache_n"])
        details = (self.usage or {}).get("prompt_tokens_details") or {}
        return None if details.get("cached_tokens") is None else int(details["cached_tokens"])

    @property
    def client_decode_tps(self) -> float | None:
        """Tokens after the first over the time from the first to the last token chunk."""
        tokens = self.output_tokens
        if tokens is None or self.first_token_at is None or self.last_token_at is None:
            return None
        span = self.last_token_at - self.first_token_at
        if tokens < 2 or span <= 0:
            return None
        return (tokens - 1) / span

def iter_sse_data(lines: Iterator[str]) -> Iterator[str]:
    """The data payloads of a server-sent event stream; comments (': keep-alive') are skipped."""
    data: list[str] = []
    for line in lines:
        if line == "":
            if data:
                yield "\n".join(data)
                data = []
        elif line.startswith(":"):
            continue
        elif line.startswith("data:"):
            data.append(line[5:].lstrip(" "))
    if data:
        yield "\n".join(data)


def _has_token(delta: dict[str, Any]) -> bool:
    return bool(delta.get("content") or delta.get("reasoning_content") or delta.get("reasoning"))


def measure_stream(lines: Iterator[str], sent_at: float, clock=time.perf_counter) -> StreamMeasurement:
    """Read an OpenAI chat-completion stream to its end, timing the chunks that carry tokens."""
    m = StreamMeasurement(sent_at=sent_at)
    finished = False
    for payload in iter_sse_data(lines):
        now = clock()
        if payload.strip() == "[DONE]":
            finished = True
            break
        chunk = json.loads(payload)
        if "error" in chunk:
            err = chunk["error"]
            raise ServerError(f"error in stream: {err.get('message', err) if isinstance(err, dict) else err}")
        for choice in chunk.get("choices") or ():
            if _has_token(choice.get("delta") or {}):
                if m.first_token_at is None:
                    m.first_token_at = now
                m.last_token_at = now
                m.token_chunks += 1
            if choice.get("finish_reason"):
                m.finish_reason = choice["finish_reason"]
        if chunk.get("usage"):
            m.usage = chunk["usage"]
        if chunk.get("timings"):
            m.timings = chunk["timings"]
    m.done_at = clock()
    if not finished and m.finish_reason is None:
        raise ServerError(
            f"stream ended without a finish reason after {m.token_chunks} token chunks (dropped connection?)"
        )
    return m
