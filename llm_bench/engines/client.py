"""HTTP clients for a llama.cpp router and OpenAI-compatible servers.

Everything here talks to a server and returns plain measurements; deciding what to
measure, and in which order, is the runner's job.
"""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any, Self, TypeVar

import httpx

from llm_bench.engines.errors import (
    RequestRefused,
    RequestTimeout,
    ServerError,
    ServerUnreachable,
    StreamBroken,
    UnknownAlias,
)
from llm_bench.engines.stream import ChatRequest, StreamMeasurement, measure_stream, server_sent_events
from llm_bench.support.poll import poll_until


@dataclass(frozen=True)
class ModelInfo:
    id: str
    status: str
    args: tuple[str, ...] = ()
    failed: bool = False
    exit_code: int | None = None
    # Where the router found it (llama.cpp's server-models.cpp): "preset" (the presets INI), "cache" (a
    # Hugging Face download in LLAMA_CACHE, listed under no preset's settings), "models_dir"; None from a
    # router that does not say.
    source: str | None = None

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
            source=item.get("source") if isinstance(item.get("source"), str) else None,
        )


def _body_kind(response: httpx.Response) -> str:
    kind = response.headers.get("content-type", "").partition(";")[0].strip()
    return {"text/html": "an HTML page", "": "a body without a content type"}.get(kind, kind)


def error_message(response: httpx.Response) -> str:
    """The server's own words: OpenAI-style {"error": {"message": ...}}, a short plain text, or what kind
    of body it was (never a whole HTML page)."""
    try:
        body = response.json()
    except (json.JSONDecodeError, UnicodeDecodeError):
        text = response.text.strip()
        if "html" in _body_kind(response) or "<html" in text[:200].lower():
            return f"HTTP {response.status_code} ({_body_kind(response)}, not JSON)"
        return f"HTTP {response.status_code}: {' '.join(text.split())[:300]}"
    if isinstance(body, dict) and isinstance(body.get("error"), dict):
        return f"HTTP {response.status_code}: {body['error'].get('message', body['error'])}"
    return f"HTTP {response.status_code}: {json.dumps(body)[:300]}"


def refused_hint(response: httpx.Response) -> str:
    if response.status_code in (401, 403):
        return " (the server wants an API key: give --api-key-file or --api-key-env, or api_key_file in the plan)"
    return ""


def same_origin(url: str, base_url: str) -> bool:
    """Whether ``url`` (absolute, or a path on the server) is on the server's own scheme, host and port."""
    target, base = httpx.URL(url), httpx.URL(base_url)
    if not target.is_absolute_url:
        return True
    return (target.scheme, target.host, target.port) == (base.scheme, base.host, base.port)


def _number(text: str | None) -> float | None:
    try:
        return None if text is None else float(text)
    except ValueError:
        return None


def proxy_route(headers: httpx.Headers) -> tuple[str | None, float | None, int | None]:
    """What a LiteLLM proxy says of a request: the backend it went to, the proxy's own overhead in ms, and
    how many fallback groups it tried (all None from a server that is not a proxy)."""
    fallbacks = _number(headers.get("x-litellm-attempted-fallbacks"))
    return (headers.get("x-litellm-model-api-base") or None, _number(headers.get("x-litellm-overhead-duration-ms")),
            None if fallbacks is None else int(fallbacks))


# The connection pool of a caller that does not say how many streams it will open at once (the runner
# says: its largest concurrency level). More simultaneous streams than this fail fast, never queue.
DEFAULT_STREAMS = 32


class OpenAIClient:
    """The OpenAI-compatible chat endpoint: enough for any engine that streams."""

    def __init__(self, base_url: str, *, api_key: str | None = None, timeout: float = 600.0,
                 streams: int = DEFAULT_STREAMS):
        headers = {"Authorization": f"Bearer {api_key}"} if api_key else {}
        self.base_url = base_url.rstrip("/")
        # One connection per simultaneous stream, plus a few for the calls around them (models, metrics),
        # so no stream waits for a connection; a pool that still runs dry fails fast instead of queueing.
        connections = streams + 4
        self._settings: dict[str, Any] = {
            "base_url": self.base_url, "headers": headers,
            "timeout": httpx.Timeout(timeout, connect=10.0, pool=10.0),
            "limits": httpx.Limits(max_connections=connections, max_keepalive_connections=connections),
            "event_hooks": {"request": [self._count]}}
        # Generation requests sent (chat, completion): what a server's own task or request counters are compared
        # with to find requests it answered that were not ours (llm_bench.interference.requests).
        self.generations_sent = 0
        self.http = httpx.Client(**self._settings)

    def _count(self, request: httpx.Request) -> None:
        if request.method == "POST" and "completion" in request.url.path:
            self.generations_sent += 1

    def close(self) -> None:
        self.http.close()

    def __enter__(self) -> Self:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def _send(self, what: str, send: Callable[[], T], *, again: bool) -> T:
        """``send()`` with its transport errors typed; where ``again``, a request the server dropped before
        answering is sent once more. llama.cpp's router closes a kept-alive connection after a few requests
        and sometimes drops the request it proxies over such a stale connection before any byte of a
        response: nothing was generated, so sending it again is safe (for a GET, a completion or a stream;
        not for a load or unload, which may have started)."""
        try:
            return self._send_again_if_dropped(what, send, again=again)
        except KeyboardInterrupt:
            # Ctrl-C can land inside httpcore after it took its pool's lock and before the block that releases
            # it (ThreadLock.__enter__), and then nothing ever releases it: the unload that follows a Ctrl-C
            # waited on it for ever. What follows gets a pool of its own; the old one is left as it is, since
            # closing it takes the same lock.
            self.http = httpx.Client(**self._settings)
            raise

    def _send_again_if_dropped(self, what: str, send: Callable[[], T], *, again: bool) -> T:
        try:
            with transport_errors(what, self.base_url):
                return send()
        except _NoResponse as first:
            if not again:
                raise ServerError(f"{what}: the server closed the connection without answering: {first}") from first
        try:
            with transport_errors(what, self.base_url):
                return send()
        except _NoResponse as e:
            raise ServerError(f"{what}: the server closed the connection twice without answering: {e}") from e

    def _request(self, method: str, path: str, **kwargs: Any) -> httpx.Response:
        return self._send(f"{method} {path}", lambda: self.http.request(method, path, **kwargs),
                          again=method == "GET")

    def get_json(self, path: str, **params: Any) -> Any:
        response = self._request("GET", path, params=params or None)
        if response.status_code != 200:
            raise RequestRefused(f"GET {self.base_url}{path}: {error_message(response)}{refused_hint(response)}",
                                 response.status_code)
        try:
            return response.json()
        except (json.JSONDecodeError, UnicodeDecodeError) as e:
            raise ServerError(f"GET {self.base_url}{path} answered HTTP 200 with {_body_kind(response)}, "
                              "not JSON: is --url the server's address?") from e

    def post(self, path: str, body: dict[str, Any]) -> httpx.Response:
        """A non-streamed request answered HTTP 200 (its headers too: a proxy names its backend there); the
        server's error as a ServerError."""
        response = self._send(f"POST {path} for {body.get('model')!r}", lambda: self.http.post(path, json=body),
                              again=True)
        if response.status_code != 200:
            raise RequestRefused(f"POST {path} for {body.get('model')!r}: {error_message(response)}"
                                 f"{refused_hint(response)}", response.status_code)
        return response

    def post_json(self, path: str, body: dict[str, Any]) -> Any:
        """A non-streamed request's JSON answer (the quality workload's greedy answers)."""
        response = self.post(path, body)
        try:
            return response.json()
        except (json.JSONDecodeError, UnicodeDecodeError) as e:
            raise ServerError(f"POST {self.base_url}{path} answered HTTP 200 with {_body_kind(response)}, "
                              "not JSON") from e

    def stream_chat(self, request: ChatRequest, path: str = "/v1/chat/completions",
                    extra: dict[str, Any] | None = None) -> StreamMeasurement:
        """One streamed completion; ``extra`` adds engine-specific fields to the request body."""
        body = {**request.body(), **(extra or {})}
        return self._send(f"POST {path} for {request.model!r}", lambda: self._stream_chat_once(request, body, path),
                          again=True)

    def _stream_chat_once(self, request: ChatRequest, body: dict[str, Any], path: str) -> StreamMeasurement:
        what = f"POST {path} for {request.model!r}"
        written: list[float] = []

        def trace(event: str, _info: dict[str, Any]) -> None:  # httpcore's trace extension
            if event == "http11.send_request_body.complete":
                written.append(time.perf_counter())

        sent_at = time.perf_counter()
        with self.http.stream("POST", path, json=body, extensions={"trace": trace}) as response:
            if response.status_code != 200:
                response.read()
                raise RequestRefused(f"{what}: {error_message(response)}{refused_hint(response)}",
                                     response.status_code)
            with transport_errors(what, self.base_url, streaming=True):
                measurement = measure_stream(server_sent_events(response), sent_at, what=what)
            measurement.written_at = written[0] if written else None
            measurement.backend, measurement.proxy_overhead_ms, measurement.proxy_fallbacks = (
                proxy_route(response.headers))
            return measurement


class _NoResponse(Exception):
    """The connection closed before any response arrived (never seen outside ``OpenAIClient._send``)."""


T = TypeVar("T")


@contextmanager
def transport_errors(what: str, base_url: str, *, streaming: bool = False) -> Iterator[None]:
    """The one place httpx's transport errors become the typed errors of engines/errors.py, each message
    naming ``what`` was sent. ``streaming``: inside an answer's body, where any break is the stream's
    (StreamBroken, or RequestTimeout when the server stopped sending); before it, a connection closed
    without an answer is _NoResponse, which ``OpenAIClient._send`` may send again."""
    started = time.perf_counter()
    try:
        yield
    except httpx.TransportError as e:
        raise _typed(e, what, base_url, streaming, time.perf_counter() - started) from e


def _typed(e: httpx.TransportError, what: str, base_url: str, streaming: bool, elapsed: float) -> Exception:
    said = f"{type(e).__name__}: {e}"
    if streaming:
        broke = f"{what}: stream broke: {said}"
        return RequestTimeout(broke) if isinstance(e, httpx.TimeoutException) else StreamBroken(broke)
    if isinstance(e, httpx.ConnectError):
        return ServerUnreachable(f"cannot connect to {base_url} ({e}); is the server running, and is --url right?")
    if isinstance(e, httpx.RemoteProtocolError):
        return _NoResponse(said)
    if isinstance(e, httpx.PoolTimeout):
        return ServerError(f"{what}: no free connection in the client's pool (more streams than it was sized for)")
    if isinstance(e, httpx.TimeoutException):
        return RequestTimeout(f"{what}: timed out after {elapsed:.1f} s ({said})")
    return ServerError(f"{what} failed: {said}")


class RouterClient(OpenAIClient):
    """llama.cpp's router API on top of the OpenAI routes."""

    def models(self) -> list[ModelInfo]:
        response = self._request("GET", "/models")
        try:
            body = response.json() if response.status_code == 200 else None
        except (json.JSONDecodeError, UnicodeDecodeError):
            body = None
        if not isinstance(body, dict) or not isinstance(body.get("data"), list):
            found = (error_message(response) if response.status_code != 200
                     else f"HTTP 200 with {_body_kind(response)}, not the router's model list")
            if response.status_code not in (200, 404, 405):  # a router that answers with an error of its own
                raise RequestRefused(f"GET {self.base_url}/models: {found}{refused_hint(response)}",
                                     response.status_code)
            raise ServerError(f"{self.base_url} does not speak the llama.cpp router API: GET /models answered "
                              f"{found}; for an OpenAI-compatible server (vLLM, HyperQwen) use --engine openai")
        try:
            return [ModelInfo.from_json(item) for item in body["data"]]
        except (KeyError, TypeError, AttributeError) as e:
            raise ServerError(f"{self.base_url}/models lists models llm-bench cannot read ({e!r})") from e

    def model(self, alias: str) -> ModelInfo:
        for info in self.models():
            if info.id == alias:
                return info
        raise UnknownAlias(f"the router at {self.base_url} has no preset named {alias!r}")

    def _post_model(self, action: str, alias: str) -> None:
        response = self._request("POST", f"/models/{action}", json={"model": alias})
        if response.status_code != 200:
            raise RequestRefused(f"{action} {alias!r}: {error_message(response)}", response.status_code)

    def load(self, alias: str) -> None:
        self._post_model("load", alias)

    def unload(self, alias: str) -> None:
        self._post_model("unload", alias)

    def wait_for_status(self, alias: str, wanted: str, timeout: float, poll: float = 0.1) -> ModelInfo:
        last: list[ModelInfo] = []

        def reached() -> ModelInfo | None:
            info = self.model(alias)
            last[:] = [info]
            if info.status == wanted:
                return info
            if info.failed and wanted == "loaded":
                raise ServerError(f"{alias!r} failed to load (exit code {info.exit_code})")
            return None

        info = poll_until(reached, timeout=timeout, interval=poll)
        if info is None:
            raise ServerError(f"{alias!r} is still {last[0].status!r} after {timeout:.0f} s (wanted {wanted!r})")
        return info

    def slots(self, alias: str) -> list[Any] | None:
        """The instance's slots (``/slots?model=ALIAS``), without loading it; None where it has none to show
        (started with ``--no-slots``, not running)."""
        response = self._request("GET", "/slots", params={"model": alias, "autoload": "false"})
        try:
            body = response.json() if response.status_code == 200 else None
        except (json.JSONDecodeError, UnicodeDecodeError):
            return None
        return body if isinstance(body, list) else None

    def metrics(self, alias: str) -> str | None:
        """The instance's Prometheus page (``/metrics?model=ALIAS``, proxied by the router to it), without
        loading it; None when it has none: started without ``metrics = true`` (HTTP 501), not running."""
        response = self._request("GET", "/metrics", params={"model": alias, "autoload": "false"})
        return response.text if response.status_code == 200 else None

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
        # a loading instance's progress names its stage (tools/server/server-context.cpp, load_model:
        # "text_model", then "spec_model" for a drafter, "mmproj_model"), each from 0 to 1: when each was
        # first and last seen
        self._stage_seen: dict[str, list[float]] = {}
        self._client = httpx.Client(base_url=base_url, headers=headers, timeout=httpx.Timeout(None, connect=5.0))
        self._ready = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def _run(self) -> None:
        try:
            with self._client.stream("GET", "/models/sse") as response:
                self._ready.set()
                for sse in server_sent_events(response):
                    event = json.loads(sse.data)
                    if not isinstance(event, dict):
                        continue
                    if event.get("model") != self.alias or event.get("event") not in ("model_status", "status_change"):
                        continue
                    status = (event.get("data") or {}).get("status")
                    progress = (event.get("data") or {}).get("progress")
                    stage = progress.get("current") if isinstance(progress, dict) else None
                    if isinstance(stage, str):
                        now = time.monotonic()
                        self._stage_seen.setdefault(stage, [now, now])[1] = now
                    if status and (not self.transitions or self.transitions[-1] != status):
                        self.transitions.append(status)
                    if status == "loaded" or (status == "unloaded" and len(self.transitions) > 1):
                        return
        except (httpx.HTTPError, json.JSONDecodeError, ServerError, RuntimeError):
            pass  # a router without /models/sse gives no transitions
        finally:
            self._ready.set()
            self._client.close()

    @property
    def stages(self) -> dict[str, float]:
        """Seconds each load stage took, from its first progress event to its last (its 100 %); empty from a
        router that reports no stages."""
        return {stage: round(last - first, 4) for stage, (first, last) in self._stage_seen.items()}

    def __enter__(self) -> StatusWatcher:
        self._thread.start()
        self._ready.wait(5.0)
        return self

    def __exit__(self, *exc: object) -> None:
        self._thread.join(1.0)  # the load is over by now; its final event is at most in flight
