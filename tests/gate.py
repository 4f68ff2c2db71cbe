"""A TCP gate in front of a real server: each connection's first HTTP request is held until ``expect``
connections have sent theirs (or ``timeout_s`` passed), then every connection is piped through. So no
stream can end before the client has written every request, however slowly a busy machine runs the
client's threads, and ``opened_by_count`` says whether the client really had all of them out at once."""

from __future__ import annotations

import socket
import threading
from typing import Self
from urllib.parse import urlsplit

from llm_bench.testbed.router import free_port
from tests.wiretap import shut_down


def _whole_request(sock: socket.socket) -> bytes:
    """The bytes of one HTTP/1.1 request with a Content-Length body (what httpx sends)."""
    data = b""
    while b"\r\n\r\n" not in data:
        chunk = sock.recv(65536)
        if not chunk:
            return data
        data += chunk
    head, _, body = data.partition(b"\r\n\r\n")
    length = next((int(line.split(b":", 1)[1]) for line in head.split(b"\r\n")
                   if line.lower().startswith(b"content-length:")), 0)
    while len(body) < length:
        chunk = sock.recv(65536)
        if not chunk:
            break
        body += chunk
        data += chunk
    return data


def _pipe(source: socket.socket, sink: socket.socket) -> None:
    try:
        while chunk := source.recv(65536):
            sink.sendall(chunk)
    except OSError:
        pass
    finally:
        shut_down(source, sink)


class RequestGate:
    def __init__(self, upstream_url: str, expect: int, timeout_s: float = 60.0) -> None:
        parts = urlsplit(upstream_url)
        self.upstream = (parts.hostname or "127.0.0.1", parts.port or 80)
        self.expect, self.timeout_s = expect, timeout_s
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.arrived = 0
        self.opened_by_count = False
        self._changed = threading.Condition()
        self._listener = socket.create_server(("127.0.0.1", self.port), backlog=expect + 16)
        self._sockets: list[socket.socket] = []

    def __enter__(self) -> Self:
        threading.Thread(target=self._accept, daemon=True).start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._listener.close()
        for s in self._sockets:
            s.close()

    def _accept(self) -> None:
        while True:
            try:
                client, _ = self._listener.accept()
            except OSError:
                return
            self._sockets.append(client)
            threading.Thread(target=self._serve, args=(client,), daemon=True).start()

    def _serve(self, client: socket.socket) -> None:
        request = _whole_request(client)
        with self._changed:
            self.arrived += 1
            if self.arrived >= self.expect:
                self.opened_by_count = True
                self._changed.notify_all()
            self._changed.wait_for(lambda: self.opened_by_count, timeout=self.timeout_s)
        upstream = socket.create_connection(self.upstream)
        self._sockets.append(upstream)
        upstream.sendall(request)
        threading.Thread(target=_pipe, args=(upstream, client), daemon=True).start()
        _pipe(client, upstream)
