"""HTTP clients for a llama.cpp router and OpenAI-compatible servers.

Everything here talks to a server and returns plain measurements; deciding what to
measure, and in which order, is the runner's job.
"""

from __future__ import annotations

import json
import threading
import time
from dataclasses import dataclass
from typing import Any

import httpx

from llm_bench.engines.errors import ServerError, ServerUnreachable, UnknownAlias
from llm_bench.engines.stream import ChatRequest, StreamMeasurement, iter_sse_data, measure_stream


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

def error_message(response: httpx.Response) -> str:
    """The server's own words: OpenAI-style {"error": {"message": ...}} or the raw body."""
    try:
        body = response.json()
    except (json.JSONDecodeError, UnicodeDecodeError):
        return f"HTTP {response.status_code}: {response.text.strip()[:500]}"
    if isinstance(body, dict) and isinstance(body.get("error"), dict):
        return f"HTTP {response.status_code}: {body['error'].get('message', body['error'])}"
    return f"HTTP {response.status_code}: {json.dumps(body)[:500]}"


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
