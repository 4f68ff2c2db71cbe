"""One streamed chat completion: the request llm-bench sends and what it measures of the answer.

``measure_stream`` is pure: it reads time-stamped events, so every rule can be tested without a server;
``server_sent_events`` turns a response's bytes into those events.
"""

from __future__ import annotations

import codecs
import json
import time
import uuid
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass, replace
from typing import Any

from httpx_sse import EventSource, SSEError

from llm_bench.engines.errors import ServerError, StreamBroken

THINKING = ("off", "on", "server")


def thinking_kwargs(thinking: str) -> dict[str, Any]:
    """How a request asks for thinking (one of ``THINKING``): ``chat_template_kwargs.enable_thinking``, which
    llama-server (--jinja) and vLLM hand to the chat template; "server" sends nothing (the server's default)."""
    if thinking == "server":
        return {}
    return {"chat_template_kwargs": {"enable_thinking": thinking == "on"}}


@dataclass(frozen=True)
class ChatRequest:
    """One benchmark request: a single user message (or a whole conversation: ``messages`` and ``tools`` in
    OpenAI format), generated to exactly max_tokens unless ``ignore_eos`` is off."""

    model: str
    prompt: str
    max_tokens: int
    temperature: float
    seed: int
    ignore_eos: bool = True
    # False: the server must process the whole prompt (no reuse of a cached prefix); how to ask for
    # that is each engine's business (llama.cpp: cache_prompt; an OpenAI server: a unique first line).
    prompt_cache: bool = True
    thinking: str = "server"  # one of THINKING; "server": the request says nothing about thinking
    # A conversation replayed as it is (the session workload); then ``prompt`` is not sent.
    messages: tuple[dict[str, Any], ...] | None = None
    tools: tuple[dict[str, Any], ...] | None = None

    def with_unique_start(self) -> ChatRequest:
        """This request with a first line no other request has ("3f9c0a1b2d4e5f60."), so no server can
        reuse a cached prefix of its prompt beyond the chat template's opening tokens, whatever cache
        switches it ignores. The line starts with the random part: a fixed word before it would be a
        prefix every such request shares."""
        return replace(self, prompt=f"{uuid.uuid4().hex[:16]}.\n\n{self.prompt}")

    def body(self) -> dict[str, Any]:
        return {
            "model": self.model,
            "messages": list(self.messages) if self.messages is not None else [{"role": "user", "content": self.prompt}],
            **({"tools": list(self.tools)} if self.tools else {}),
            **thinking_kwargs(self.thinking),
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
    # when the request's last byte went onto a connection, after any wait for a free one in the pool
    written_at: float | None = None
    first_event_at: float | None = None  # the first event of any kind (e.g. the role-only chunk)
    first_token_at: float | None = None  # the first generated token: reasoning or answer
    first_answer_at: float | None = None  # the first answer token: content or a tool call
    last_token_at: float | None = None
    done_at: float | None = None
    token_chunks: int = 0
    reasoning_chunks: int = 0  # chunks that carried reasoning (reasoning_content / reasoning)
    finish_reason: str | None = None
    usage: dict[str, Any] | None = None
    timings: dict[str, Any] | None = None
    # Through a LiteLLM proxy: the backend that answered (its x-litellm-model-api-base header) and the
    # proxy's own time on the request (x-litellm-overhead-duration-ms).
    backend: str | None = None
    proxy_overhead_ms: float | None = None
    proxy_fallbacks: int | None = None  # x-litellm-attempted-fallbacks: 1 when a fallback group answered

    @property
    def ttft_s(self) -> float | None:
        return None if self.first_token_at is None else self.first_token_at - self.sent_at

    @property
    def first_event_s(self) -> float | None:
        return None if self.first_event_at is None else self.first_event_at - self.sent_at

    @property
    def first_answer_s(self) -> float | None:
        return None if self.first_answer_at is None else self.first_answer_at - self.sent_at

    @property
    def reasoning(self) -> tuple[int, str] | None:
        """Reasoning tokens and where the count comes from: the server's
        ``usage.completion_tokens_details.reasoning_tokens`` ("server"), else the chunks that carried
        reasoning ("deltas"); None when the answer carried no reasoning by either count."""
        details = (self.usage or {}).get("completion_tokens_details") or {}
        if details.get("reasoning_tokens"):
            return int(details["reasoning_tokens"]), "server"
        return (self.reasoning_chunks, "deltas") if self.reasoning_chunks else None

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


@dataclass(frozen=True)
class Event:
    """One server-sent event's data, with the moment the bytes that completed it arrived."""

    data: str
    arrived_at: float
    name: str = ""


class _Arrivals:
    """What httpx-sse's EventSource reads (``headers`` and ``iter_text``), taken from a response's raw
    bytes with the clock read as each piece arrives, before any decoding or parsing."""

    def __init__(self, response: Any, clock: Callable[[], float]):
        self.headers = response.headers
        self._response = response
        self._clock = clock
        self.arrived_at = clock()

    def iter_text(self) -> Iterator[str]:
        decoder = codecs.getincrementaldecoder("utf-8")(errors="replace")
        for piece in self._response.iter_bytes():
            self.arrived_at = self._clock()
            text = decoder.decode(piece)
            if text:
                yield text
        tail = decoder.decode(b"", final=True)
        if tail:
            yield tail


def server_sent_events(response: Any, clock: Callable[[], float] = time.perf_counter) -> Iterator[Event]:
    """The events of a ``text/event-stream`` response, per the SSE specification (httpx-sse: lines end
    only at CR, LF or CRLF; multi-line data; comments), each stamped with its bytes' arrival time.

    Pieces are read as the socket delivers them (httpx's iter_bytes without a chunk size does not
    re-buffer), so an event's time is when its last byte was read from the socket, before any decoding
    or parsing of it or of the events that came with it."""
    arrivals = _Arrivals(response, clock)
    try:
        for sse in EventSource(arrivals).iter_sse():  # type: ignore[arg-type]  # reads headers and iter_text only
            yield Event(sse.data, arrivals.arrived_at, sse.event)
    except SSEError as e:
        raise StreamBroken(f"the server did not answer with an event stream: {e}") from e


def _has_reasoning(delta: dict[str, Any]) -> bool:
    return bool(delta.get("reasoning_content") or delta.get("reasoning"))


def _has_answer(delta: dict[str, Any]) -> bool:
    """Content, or a tool call being streamed (an agent's answer is often only that)."""
    return bool(delta.get("content") or delta.get("tool_calls"))


def measure_stream(events: Iterable[Event], sent_at: float, clock: Callable[[], float] = time.perf_counter,
                   what: str = "the stream") -> StreamMeasurement:
    """Read an OpenAI chat-completion stream to its end, timing the chunks that carry tokens.

    ``what`` names the request in errors; anything the server sends that is not what the OpenAI
    stream format allows becomes a ServerError saying so."""
    m = StreamMeasurement(sent_at=sent_at)
    finished = False
    for event in events:
        if event.data.strip() == "[DONE]":
            finished = True
            break
        if not event.data.strip():
            continue
        try:
            chunk = json.loads(event.data)
        except json.JSONDecodeError as e:
            raise ServerError(f"{what}: the server sent an event that is not JSON ({e}): {event.data[:200]!r}") from e
        if not isinstance(chunk, dict):
            raise ServerError(f"{what}: the server sent an event that is not a JSON object: {event.data[:200]!r}")
        if "error" in chunk:
            err = chunk["error"]
            raise StreamBroken(f"{what}: error in stream: {err.get('message', err) if isinstance(err, dict) else err}")
        try:
            _take(m, chunk, event.arrived_at)
        except (AttributeError, TypeError, ValueError) as e:
            raise ServerError(f"{what}: the server sent a chunk llm-bench cannot read ({e}): "
                              f"{event.data[:200]!r}") from e
    m.done_at = clock()
    if not finished and m.finish_reason is None:
        raise StreamBroken(
            f"{what}: stream ended without a finish reason after {m.token_chunks} token chunks (dropped connection?)"
        )
    return m


def _take(m: StreamMeasurement, chunk: dict[str, Any], now: float) -> None:
    if m.first_event_at is None:
        m.first_event_at = now
    for choice in chunk.get("choices") or ():
        delta = choice.get("delta") or {}
        reasoning, answer = _has_reasoning(delta), _has_answer(delta)
        if reasoning or answer:
            if m.first_token_at is None:
                m.first_token_at = now
            m.last_token_at = now
            m.token_chunks += 1
        if reasoning:
            m.reasoning_chunks += 1
        if answer and m.first_answer_at is None:
            m.first_answer_at = now
        if choice.get("finish_reason"):
            m.finish_reason = choice["finish_reason"]
    if chunk.get("usage"):
        m.usage = dict(chunk["usage"])
    if chunk.get("timings"):
        m.timings = dict(chunk["timings"])
