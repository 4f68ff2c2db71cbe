"""HTTP client for a llama.cpp router and OpenAI-compatible servers.

Everything here talks to a server and returns plain measurements; deciding what to
measure, and in which order, is the protocol's job.
"""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import httpx


class ServerError(RuntimeError):
    """A request failed; the message carries what the server (or the transport) said."""


class ServerUnreachable(ServerError):
    pass


class UnknownAlias(ServerError):
    pass


@dataclass(frozen=True)
class ModelInfo:
    id: str
    status: str
    args: tuple[str, ...] = ()
    failed: bool = False
    exit_code: int | None = None

    @classmethod
    def from_json(cls, item: dict[str, Any]) -> ModelInfo:
        status = item.get("status") or {}
        if isinstance(status, str):
            status = {"value": status}
        return cls(
            id=item["id"],
            status=status.get("value", "unknown"),
            args=tuple(str(a) for a in status.get("args", ())),
            failed=bool(status.get("failed", False)),
            exit_code=status.get("exit_code"),
        )


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


def error_message(response: httpx.Response) -> str:
    """The server's own words: OpenAI-style {"error": {"message": ...}} or the raw body."""
    try:
        body = response.json()
    except (json.JSONDecodeError, UnicodeDecodeError):
        return f"HTTP {response.status_code}: {response.text.strip()[:500]}"
    if isinstance(body, dict) and isinstance(body.get("error"), dict):
        return f"HTTP {response.status_code}: {body['error'].get('message', body['error'])}"
    return f"HTTP {response.status_code}: {json.dumps(body)[:500]}"


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


class OpenAIClient:
    """The OpenAI-compatible chat endpoint: enough for any engine that streams."""

    def __init__(self, base_url: str, *, api_key: str | None = None, timeout: float = 600.0):
        headers = {"Authorization": f"Bearer {api_key}"} if api_key else {}
        self.base_url = base_url.rstrip("/")
        self.http = httpx.Client(
            base_url=self.base_url,
            headers=headers,
            timeout=httpx.Timeout(timeout, connect=10.0),
        )

    def close(self) -> None:
        self.http.close()

    def __enter__(self) -> OpenAIClient:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def _request(self, method: str, path: str, **kwargs: Any) -> httpx.Response:
        try:
            return self.http.request(method, path, **kwargs)
        except httpx.ConnectError as e:
            raise ServerUnreachable(
                f"cannot connect to {self.base_url} ({e}); is the server running, and is --url right?"
            ) from e
        except httpx.TransportError as e:
            raise ServerError(f"{method} {path} failed: {type(e).__name__}: {e}") from e

    def get_json(self, path: str, **params: Any) -> Any:
        response = self._request("GET", path, params=params or None)
        if response.status_code != 200:
            raise ServerError(f"GET {path}: {error_message(response)}")
        return response.json()

    def stream_chat(self, request: ChatRequest, path: str = "/v1/chat/completions") -> StreamMeasurement:
        try:
            return self._stream_chat_once(request, path)
        except _NoResponse:
            # llama.cpp's router sometimes drops a request it proxies over a stale connection to a
            # model instance, before any byte of a response: nothing was generated, so it is sent again.
            try:
                return self._stream_chat_once(request, path)
            except _NoResponse as e:
                raise ServerError(f"the server closed the connection twice without answering: {e}") from e

    def _stream_chat_once(self, request: ChatRequest, path: str) -> StreamMeasurement:
        sent_at = time.perf_counter()
        try:
            with self.http.stream("POST", path, json=request.body()) as response:
                if response.status_code != 200:
                    response.read()
                    raise ServerError(error_message(response))
                try:
                    return measure_stream(response.iter_lines(), sent_at)
                except httpx.TransportError as e:
                    raise ServerError(f"stream broke: {type(e).__name__}: {e}") from e
        except httpx.ConnectError as e:
            raise ServerUnreachable(f"cannot connect to {self.base_url} ({e})") from e
        except httpx.RemoteProtocolError as e:
            raise _NoResponse(str(e)) from e
        except httpx.TimeoutException as e:
            raise ServerError(f"request timed out after {time.perf_counter() - sent_at:.1f} s ({type(e).__name__})") from e
        except httpx.TransportError as e:
            raise ServerError(f"request failed: {type(e).__name__}: {e}") from e


class _NoResponse(Exception):
    """The connection closed before any response arrived."""


class RouterClient(OpenAIClient):
    """llama.cpp's router API on top of the OpenAI routes."""

    def models(self) -> list[ModelInfo]:
        body = self.get_json("/models")
        return [ModelInfo.from_json(item) for item in body.get("data", [])]

    def model(self, alias: str) -> ModelInfo:
        for info in self.models():
            if info.id == alias:
                return info
        raise UnknownAlias(f"the router at {self.base_url} has no preset named {alias!r}")

    def _post_model(self, action: str, alias: str) -> None:
        response = self._request("POST", f"/models/{action}", json={"model": alias})
        if response.status_code != 200:
            raise ServerError(f"{action} {alias!r}: {error_message(response)}")

    def load(self, alias: str) -> None:
        self._post_model("load", alias)

    def unload(self, alias: str) -> None:
        self._post_model("unload", alias)

    def wait_for_status(self, alias: str, wanted: str, timeout: float, poll: float = 0.1) -> ModelInfo:
        deadline = time.monotonic() + timeout
        while True:
            info = self.model(alias)
            if info.status == wanted:
                return info
            if info.failed and wanted == "loaded":
                raise ServerError(f"{alias!r} failed to load (exit code {info.exit_code})")
            if time.monotonic() > deadline:
                raise ServerError(f"{alias!r} is still {info.status!r} after {timeout:.0f} s (wanted {wanted!r})")
            time.sleep(poll)

    def props(self, alias: str | None = None) -> dict[str, Any]:
        # autoload=false: asking for properties must not load a model behind the benchmark's back.
        params = {"model": alias, "autoload": "false"} if alias else {}
        return self.get_json("/props", **params)


class StatusWatcher:
    """Records a model's status transitions from the router's /models/sse event stream.

    It stops by itself once the load has ended (loaded, or back to unloaded after a failure),
    so that no event stream is left holding one of the router's connection threads.
    """

    def __init__(self, base_url: str, alias: str, headers: httpx.Headers | None = None):
        self.alias = alias
        self.transitions: list[str] = []
        self._client = httpx.Client(base_url=base_url, headers=headers, timeout=httpx.Timeout(None, connect=5.0))
        self._ready = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def _run(self) -> None:
        try:
            with self._client.stream("GET", "/models/sse") as response:
                self._ready.set()
                for payload in iter_sse_data(response.iter_lines()):
                    event = json.loads(payload)
                    if event.get("model") != self.alias or event.get("event") not in ("model_status", "status_change"):
                        continue
                    status = (event.get("data") or {}).get("status")
                    if status and (not self.transitions or self.transitions[-1] != status):
                        self.transitions.append(status)
                    if status == "loaded" or (status == "unloaded" and len(self.transitions) > 1):
                        return
        except (httpx.HTTPError, json.JSONDecodeError, RuntimeError):
            pass  # a router without /models/sse gives no transitions
        finally:
            self._ready.set()
            self._client.close()

    def __enter__(self) -> StatusWatcher:
        self._thread.start()
        self._ready.wait(5.0)
        return self

    def __exit__(self, *exc: object) -> None:
        self._thread.join(1.0)  # the load is over by now; its final event is at most in flight
