"""A raw-socket HTTP server whose streamed answers leave at known moments, for pinning timed figures.

Each chat completion is answered from a script: the response head and every event leave at a fixed
offset from the moment the request was fully read, Nagle off, one TCP segment each, and the server
notes when each left (``time.perf_counter``, the clock llm-bench itself reads). So a test knows the
truth exactly: the first content token left 550 ms after the request arrived, whatever the client
makes of it. Each moment is noted just before its send, the earliest the client can read it, so a
client's figure is never below the truth however the threads are scheduled. GET requests are answered
from a table of JSON bodies (404 otherwise).
"""

from __future__ import annotations

import json
import socket
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any


def event(payload: dict[str, Any] | str) -> bytes:
    data = payload if isinstance(payload, str) else json.dumps(payload)
    return f"data: {data}\n\n".encode()


def delta(content: str | None = None, role: str | None = None, finish: str | None = None, **extra: Any) -> bytes:
    """One chat-completion chunk event."""
    d: dict[str, Any] = {}
    if role is not None:
        d["role"] = role
    if content is not None:
        d["content"] = content
    return event({"choices": [{"index": 0, "delta": d, "finish_reason": finish}], **extra})


DONE = event("[DONE]")


@dataclass
class Reply:
    """One answer: the head at ``head_at`` s, then each (offset s, bytes) piece, offsets counted from the
    moment the request was read. A status other than 200 sends ``body`` as JSON instead of a stream."""

    pieces: list[tuple[float, bytes]] = field(default_factory=list)
    head_at: float = 0.0
    status: int = 200
    body: dict[str, Any] | None = None


@dataclass
class Exchange:
    """What the server saw and did for one request (perf_counter times)."""

    method: str
    path: str
    body: dict[str, Any] | None
    read_at: float
    head_sent_at: float | None = None
    sent_at: list[float] = field(default_factory=list)  # one per piece of the reply, in order


def stream_reply(token_times: list[float], tokens: list[int] | None = None, head_at: float = 0.0,
                 role_at: float | None = None, timings: dict[str, Any] | None = None,
                 usage: dict[str, Any] | None = None) -> Reply:
    """Content chunks at ``token_times`` (chunk i carries ``tokens[i]`` words), the last with
    finish_reason "length" and the timings, then a usage chunk and [DONE]; an optional role-only chunk
    (no content: not a token) at ``role_at``."""
    tokens = tokens or [1] * len(token_times)
    pieces: list[tuple[float, bytes]] = []
    if role_at is not None:
        pieces.append((role_at, delta(role="assistant", content="")))
    last = len(token_times) - 1
    for i, (at, n) in enumerate(zip(token_times, tokens)):
        extra = {"timings": timings} if i == last and timings else {}
        pieces.append((at, delta(" w" * n, finish="length" if i == last else None, **extra)))
    pieces.append((token_times[-1], event({"choices": [], "usage": usage or {
        "prompt_tokens": 10, "completion_tokens": sum(tokens)}})))
    pieces.append((token_times[-1], DONE))
    return Reply(pieces, head_at=head_at)


class ScriptedServer:
    """Serves one connection at a time (``Connection: close`` on every answer); chat completions are
    answered with ``replies`` in order, GETs from ``gets``."""

    def __init__(self, replies: list[Reply], gets: dict[str, Any] | None = None):
        self.replies = list(replies)
        self.gets = gets or {}
        self.exchanges: list[Exchange] = []
        self._listener = socket.create_server(("127.0.0.1", 0))
        self.url = f"http://127.0.0.1:{self._listener.getsockname()[1]}"
        self._closed = threading.Event()
        self._thread = threading.Thread(target=self._serve, daemon=True)

    def start(self) -> ScriptedServer:
        self._thread.start()
        return self

    def close(self) -> None:
        """Stop answering: later connections are refused, as from a server that went away."""
        self._closed.set()
        try:
            self._listener.shutdown(socket.SHUT_RDWR)
        except OSError:
            pass
        self._listener.close()
        self._thread.join(10)

    @property
    def chats(self) -> list[Exchange]:
        return [e for e in self.exchanges if e.method == "POST"]

    def _serve(self) -> None:
        while not self._closed.is_set():
            try:
                conn, _ = self._listener.accept()
            except OSError:
                return
            with conn:
                conn.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
                try:
                    self._answer(conn)
                except OSError:
                    pass  # the client went away mid-answer

    def _answer(self, conn: socket.socket) -> None:
        data = b""
        while b"\r\n\r\n" not in data:
            piece = conn.recv(65536)
            if not piece:
                return
            data += piece
        head, _, body = data.partition(b"\r\n\r\n")
        lines = head.decode("latin-1").split("\r\n")
        method, path, _ = lines[0].split(" ", 2)
        headers = {k.strip().lower(): v.strip() for k, _, v in (line.partition(":") for line in lines[1:])}
        length = int(headers.get("content-length", "0"))
        while len(body) < length:
            body += conn.recv(65536)
        read_at = time.perf_counter()
        exchange = Exchange(method, path.partition("?")[0], json.loads(body) if body else None, read_at)
        self.exchanges.append(exchange)
        if method == "GET":
            found = exchange.path in self.gets
            self._send_json(conn, exchange, 200 if found else 404,
                            self.gets[exchange.path] if found else {"error": {"message": "not found"}})
            return
        reply = self.replies.pop(0)
        if reply.status != 200:
            self._send_json(conn, exchange, reply.status, reply.body or {})
            return
        self._wait_until(read_at + reply.head_at)
        exchange.head_sent_at = time.perf_counter()
        conn.sendall(b"HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\nConnection: close\r\n\r\n")
        for at, piece in reply.pieces:
            self._wait_until(read_at + at)
            # noted before the send: the client may read the piece before this thread runs again
            exchange.sent_at.append(time.perf_counter())
            conn.sendall(piece)

    @staticmethod
    def _wait_until(moment: float) -> None:
        # the script's own clock: a piece leaves at its moment, not "after some sleep"
        delay = moment - time.perf_counter()
        if delay > 0:
            time.sleep(delay)

    @staticmethod
    def _send_json(conn: socket.socket, exchange: Exchange, status: int, body: Any) -> None:
        payload = json.dumps(body).encode()
        exchange.head_sent_at = time.perf_counter()
        conn.sendall(f"HTTP/1.1 {status} X\r\nContent-Type: application/json\r\nContent-Length: {len(payload)}\r\n"
                     f"Connection: close\r\n\r\n".encode() + payload)


@contextmanager
def scripted_server(replies: list[Reply], gets: dict[str, Any] | None = None) -> Iterator[ScriptedServer]:
    server = ScriptedServer(replies, gets).start()
    try:
        yield server
    finally:
        server.close()
