"""A TCP gate in front of a real server: each connection's first HTTP request is held until ``expect``
connections have sent theirs (or ``timeout_s`` passed), then every connection is piped through. So no
stream can end before the client has written every request, however slowly a busy machine runs the
client's threads, and ``opened_by_count`` says whether the client really had all of them out at once."""

from __future__ import annotations

import socket
import threading
from typing import Self
from urllib.parse import urlsplit

from tests.wiretap import accept_each, http_head, relay


def _whole_request(sock: socket.socket) -> bytes:
    """The bytes of one HTTP/1.1 request with a Content-Length body (what httpx sends)."""
    data = b""
    while (head := http_head(data, 0)) is None:
        if not (chunk := sock.recv(65536)):
            return data
        data += chunk
    _, headers, body_at = head
    while len(data) < body_at + int(headers.get("content-length", 0)):
        if not (chunk := sock.recv(65536)):
            break
        data += chunk
    return data


class RequestGate:
    def __init__(self, upstream_url: str, expect: int, timeout_s: float = 60.0) -> None:
        parts = urlsplit(upstream_url)
        self.upstream = (parts.hostname or "127.0.0.1", parts.port or 80)
        self.expect, self.timeout_s = expect, timeout_s
        self.arrived = 0
        self.opened_by_count = False
        self._changed = threading.Condition()
        self._listener = socket.create_server(("127.0.0.1", 0), backlog=expect + 16)
        self.url = f"http://127.0.0.1:{self._listener.getsockname()[1]}"
        self._sockets: list[socket.socket] = []

    def __enter__(self) -> Self:
        threading.Thread(target=accept_each, args=(self._listener, self._connected), daemon=True).start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._listener.close()
        for s in self._sockets:
            s.close()

    def _connected(self, client: socket.socket) -> None:
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
        threading.Thread(target=relay, args=(upstream, client), daemon=True).start()
        relay(client, upstream)
