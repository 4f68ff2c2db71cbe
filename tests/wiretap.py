"""A TCP relay between llm-bench and a real server that notes every byte with the moment it passed.

What crosses it is the server's own account, read without llm-bench's code: the ``timings`` and ``usage``
each answer carries, and when each event went by. A request's first byte passes after llm-bench started
its clock, and an event passes before llm-bench can read it, so (first content event - request) is a
strict lower bound of llm-bench's TTFT, and not far below it.
"""

from __future__ import annotations

import bisect
import json
import socket
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any


@dataclass
class Flow:
    """One direction of one connection: the bytes and, per recv, when they arrived."""

    starts: list[int] = field(default_factory=list)  # offset of each piece in ``data``
    times: list[float] = field(default_factory=list)
    data: bytearray = field(default_factory=bytearray)

    def add(self, piece: bytes, at: float) -> None:
        self.starts.append(len(self.data))
        self.times.append(at)
        self.data += piece

    def time_of(self, offset: int) -> float:
        """When the byte at ``offset`` passed."""
        return self.times[bisect.bisect_right(self.starts, offset) - 1]


@dataclass(frozen=True)
class Event:
    data: str
    at: float  # when the byte that completed it passed

    def json(self) -> Any:
        return json.loads(self.data)


@dataclass
class Exchange:
    method: str
    path: str
    body: bytes
    requested_at: float  # when the request's first byte passed
    status: int | None = None
    answer: bytes = b""  # the answer's body
    answered_at: float | None = None  # when its last byte passed
    events: list[Event] = field(default_factory=list)  # a text/event-stream answer's events

    @property
    def request(self) -> dict[str, Any]:
        return json.loads(self.body) if self.body else {}

    def json(self) -> Any:
        """The answer's body as JSON."""
        return json.loads(self.answer)

    def chunks(self) -> list[dict[str, Any]]:
        return [e.json() for e in self.events if e.data.strip() != "[DONE]"]

    def content_events(self) -> list[Event]:
        """The events that carry a token (content or reasoning), as docs/protocol.md defines TTFT's end."""
        out = []
        for e in self.events:
            if e.data.strip() == "[DONE]":
                continue
            for choice in e.json().get("choices") or ():
                d = choice.get("delta") or {}
                if d.get("content") or d.get("reasoning_content") or d.get("reasoning"):
                    out.append(e)
                    break
        return out

    def last(self, key: str) -> dict[str, Any]:
        """The answer's ``timings`` or ``usage`` (from the chunk that carries it)."""
        found = [c[key] for c in self.chunks() if c.get(key)]
        assert found, f"the server sent no {key} for {self.method} {self.path}"
        return found[-1]


def http_head(data: bytes, at: int) -> tuple[str, dict[str, str], int] | None:
    end = data.find(b"\r\n\r\n", at)
    if end < 0:
        return None
    lines = data[at:end].decode("latin-1").split("\r\n")
    headers = {k.strip().lower(): v.strip() for k, _, v in (line.partition(":") for line in lines[1:])}
    return lines[0], headers, end + 4


def _body(data: bytes, at: int, headers: dict[str, str], request: bool) -> tuple[list[tuple[int, bytes]], int]:
    """The body's pieces as (offset of their first byte in ``data``, bytes), and where the message ends
    (a request without a length has no body; an answer without one runs to the connection's end)."""
    if "chunked" in headers.get("transfer-encoding", "").lower():
        pieces = []
        while True:
            line_end = data.find(b"\r\n", at)
            if line_end < 0:
                return pieces, len(data)
            size = int(data[at:line_end].split(b";")[0], 16)
            if size == 0:
                trailer = data.find(b"\r\n\r\n", line_end)
                return pieces, len(data) if trailer < 0 else trailer + 4
            pieces.append((line_end + 2, bytes(data[line_end + 2:line_end + 2 + size])))
            at = line_end + 2 + size + 2
    if "content-length" in headers:
        n = int(headers["content-length"])
        return [(at, bytes(data[at:at + n]))], at + n
    if request:
        return [], at
    return [(at, bytes(data[at:]))], len(data)


def _events(pieces: list[tuple[int, bytes]], flow: Flow) -> list[Event]:
    body = b"".join(p for _, p in pieces)
    # body offset -> wire offset, piece by piece
    body_starts, wire_starts, n = [], [], 0
    for wire, piece in pieces:
        body_starts.append(n)
        wire_starts.append(wire)
        n += len(piece)
    events, at = [], 0
    text = body.replace(b"\r\n", b"\n")
    assert len(text) == len(body), "this relay reads events separated by LF only (llama-server's)"
    while True:
        end = text.find(b"\n\n", at)
        if end < 0:
            return events
        last = end + 1  # the byte that completes the event
        i = bisect.bisect_right(body_starts, last) - 1
        moment = flow.time_of(wire_starts[i] + last - body_starts[i])
        lines = text[at:end].decode().split("\n")
        data = "\n".join(line[5:].removeprefix(" ") for line in lines if line.startswith("data:"))
        if data:
            events.append(Event(data, moment))
        at = end + 2


def exchanges_of(up: Flow, down: Flow) -> list[Exchange]:
    """The requests on one connection, each with its answer (HTTP/1.1: answers come in order)."""
    out: list[Exchange] = []
    at = 0
    while (head := http_head(up.data, at)) is not None:
        start_line, headers, body_at = head
        pieces, end = _body(up.data, body_at, headers, request=True)
        method, target, _ = start_line.split(" ", 2)
        out.append(Exchange(method, target.partition("?")[0], b"".join(p for _, p in pieces), up.time_of(at)))
        at = end
    at = 0
    for exchange in out:
        head = http_head(down.data, at)
        if head is None:
            break
        status_line, headers, body_at = head
        exchange.status = int(status_line.split(" ")[1])
        pieces, at = _body(down.data, body_at, headers, request=False)
        exchange.answer = b"".join(p for _, p in pieces)
        exchange.answered_at = down.time_of(at - 1)
        if headers.get("content-type", "").startswith("text/event-stream"):
            exchange.events = _events(pieces, down)
    return out


def relay(source: socket.socket, sink: socket.socket, flow: Flow | None = None) -> None:
    """Every byte from ``source`` on to ``sink`` (each piece noted in ``flow`` first, when given, so the
    reader sees it later), then both directions of both sockets closed, whichever side closed first."""
    try:
        while piece := source.recv(65536):
            if flow is not None:
                flow.add(piece, time.perf_counter())
            sink.sendall(piece)
    except OSError:
        pass
    finally:
        for s in (sink, source):
            try:
                s.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass


def accept_each(listener: socket.socket, connected: Callable[[socket.socket], None]) -> None:
    """``connected`` for every connection the listener accepts, until it is closed."""
    while True:
        try:
            client, _ = listener.accept()
        except OSError:
            return
        connected(client)


class Wiretap:
    """Listens on a free loopback port and relays every connection to ``target_port``."""

    def __init__(self, target_port: int):
        self.target_port = target_port
        self._listener = socket.create_server(("127.0.0.1", 0))
        self.url = f"http://127.0.0.1:{self._listener.getsockname()[1]}"
        self._flows: list[tuple[Flow, Flow]] = []
        self._lock = threading.Lock()
        self._threads: list[threading.Thread] = []
        threading.Thread(target=accept_each, args=(self._listener, self._connected), daemon=True).start()

    def _connected(self, client: socket.socket) -> None:
        server = socket.create_connection(("127.0.0.1", self.target_port))
        for s in (client, server):
            s.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        up, down = Flow(), Flow()
        with self._lock:
            self._flows.append((up, down))
        for source, sink, flow in ((client, server, up), (server, client, down)):
            t = threading.Thread(target=relay, args=(source, sink, flow), daemon=True)
            t.start()
            self._threads.append(t)

    def exchanges(self) -> list[Exchange]:
        """Every request so far with its answer, in the order the requests began."""
        with self._lock:
            flows = list(self._flows)
        return sorted((e for up, down in flows for e in exchanges_of(up, down)), key=lambda e: e.requested_at)

    def chats(self) -> list[Exchange]:
        """The chat completions the server answered (a request on a connection the server had closed gets
        no answer; llm-bench sends it again, timed anew)."""
        return [e for e in self.exchanges()
                if e.method == "POST" and e.path == "/v1/chat/completions" and e.status is not None]

    def close(self) -> None:
        self._listener.close()
