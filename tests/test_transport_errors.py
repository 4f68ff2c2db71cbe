"""The client's one mapping of transport errors (engines/client.py's transport_errors) and its one retry,
against scripted transports: a connection dropped before any answer (llama.cpp's router closes kept-alive
connections after a few requests) is sent once more where that is safe, and every other failure arrives
as its typed error from engines/errors.py."""

from __future__ import annotations

import json
import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import httpx
import pytest

from llm_bench.engines.client import OpenAIClient
from llm_bench.engines.errors import RequestTimeout, ServerError, ServerUnreachable, StreamBroken
from llm_bench.engines.stream import ChatRequest

URL = "http://127.0.0.1:9"
REQUEST = ChatRequest(model="m", prompt="x", max_tokens=4, temperature=0.0, seed=1)
CHUNK = b'data: {"choices":[{"delta":{"content":"hi"}}]}\n\n'


def client(answers: list[Callable[[httpx.Request], httpx.Response]]) -> tuple[OpenAIClient, list[str]]:
    """A client whose requests are answered in turn by ``answers`` (each may raise); the paths sent."""
    sent: list[str] = []

    def handler(request: httpx.Request) -> httpx.Response:
        sent.append(request.url.path)
        return answers[len(sent) - 1](request)

    c = OpenAIClient(URL)
    c.http.close()
    c.http = httpx.Client(base_url=URL, transport=httpx.MockTransport(handler))
    return c, sent


def raises(error: type[httpx.TransportError]) -> Callable[[httpx.Request], httpx.Response]:
    def answer(request: httpx.Request) -> httpx.Response:
        raise error("scripted", request=request)
    return answer


def ok(request: httpx.Request) -> httpx.Response:
    return httpx.Response(200, json={"data": []})


class Breaks(httpx.SyncByteStream):
    """A streamed answer that sends one chunk, then the connection breaks."""

    def __iter__(self) -> Iterator[bytes]:
        yield CHUNK
        raise httpx.RemoteProtocolError("peer closed connection without sending complete message body")


def breaks(request: httpx.Request) -> httpx.Response:
    return httpx.Response(200, headers={"content-type": "text/event-stream"}, stream=Breaks())


def test_a_get_dropped_before_any_answer_is_sent_once_more() -> None:
    c, sent = client([raises(httpx.RemoteProtocolError), ok])
    assert c.get_json("/v1/models") == {"data": []} and sent == ["/v1/models"] * 2


def test_a_completion_dropped_before_any_answer_is_sent_once_more_and_twice_is_an_error() -> None:
    c, sent = client([raises(httpx.RemoteProtocolError), ok])
    assert c.post_json("/v1/completions", {"model": "m"}) == {"data": []} and len(sent) == 2
    c, sent = client([raises(httpx.RemoteProtocolError)] * 3)
    with pytest.raises(ServerError, match="closed the connection twice without answering"):
        c.stream_chat(REQUEST)
    assert len(sent) == 2


def test_a_load_dropped_before_any_answer_is_not_sent_again() -> None:
    c, sent = client([raises(httpx.RemoteProtocolError), ok])
    with pytest.raises(ServerError, match="POST /models/load: the server closed the connection without answering"):
        c._request("POST", "/models/load", json={"model": "m"})
    assert sent == ["/models/load"]


@pytest.mark.parametrize("error,kind,words", [
    (httpx.ConnectError, ServerUnreachable, f"cannot connect to {URL} (scripted); is the server running"),
    (httpx.ReadTimeout, RequestTimeout, "GET /v1/models: timed out after"),
    (httpx.PoolTimeout, ServerError, "no free connection in the client's pool"),
    (httpx.ReadError, ServerError, "GET /v1/models failed: ReadError: scripted"),
])
def test_each_transport_failure_is_its_typed_error(error: type[httpx.TransportError], kind: type[ServerError],
                                                   words: str) -> None:
    c, sent = client([raises(error)] * 2)
    with pytest.raises(kind, match=words.replace("(", r"\(").replace(")", r"\)")) as caught:
        c.get_json("/v1/models")
    assert type(caught.value) is kind and len(sent) == 1  # none of these is sent again


def test_a_stream_that_breaks_after_it_began_is_stream_broken_and_not_sent_again() -> None:
    c, sent = client([breaks, ok])
    with pytest.raises(StreamBroken, match="POST /v1/chat/completions for 'm': stream broke: RemoteProtocolError"):
        c.stream_chat(REQUEST)
    assert len(sent) == 1


@contextmanager
def models_server() -> Iterator[str]:
    """A real HTTP server on a real socket that answers GET /models."""
    class Handler(BaseHTTPRequestHandler):
        def do_GET(self) -> None:  # noqa: N802 - http.server's name
            body = json.dumps({"data": []}).encode()
            self.send_response(200)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, *args: object) -> None:
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}"
    finally:
        server.shutdown()
        server.server_close()


def test_a_ctrl_c_inside_the_connection_pool_does_not_block_the_next_request() -> None:
    """Ctrl-C can land in httpcore between taking its pool's lock and entering the block that releases it
    (ThreadLock.__enter__ acquires, then returns): the lock stays held, and the unload after a Ctrl-C (the next
    request on the same client) waited on it for ever. Here the first request takes the lock as __enter__ does
    and is interrupted there; the next one must be answered."""
    with models_server() as url:
        c = OpenAIClient(url, timeout=5)
        pool_lock = c.http._transport._pool._optional_thread_lock._lock  # httpcore's, which the real path takes
        real = c.http

        def interrupted(*args: object, **kwargs: object) -> httpx.Response:
            del real.request  # once: what follows goes the real way
            pool_lock.acquire()
            raise KeyboardInterrupt

        real.request = interrupted  # type: ignore[method-assign]
        with pytest.raises(KeyboardInterrupt):
            c.get_json("/models")
        answers: list[object] = []
        after = threading.Thread(target=lambda: answers.append(c.get_json("/models")), daemon=True)
        after.start()
        after.join(timeout=10)
        assert not after.is_alive(), "the request after the Ctrl-C waited on the pool's lock"
        assert answers == [{"data": []}]
        c.close()
