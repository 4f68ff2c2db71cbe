"""Errors every server-facing module raises, one class per kind of failure (as httpx's own hierarchy
does), so that a caller tells them apart by type and never by reading the message. Each message says
what the server (or the transport) said.

    ServerError
    ├── ServerUnreachable    nothing answers at the server's address
    ├── RequestTimeout       the server took longer than the request's timeout
    ├── RequestRefused       the server answered with an HTTP error status (``status``)
    ├── StreamBroken         a streamed answer broke off, or carried an error instead of tokens
    └── UnknownAlias         the server does not serve the preset or model asked for
"""

from __future__ import annotations


class ServerError(RuntimeError):
    """A request failed; the message carries what the server (or the transport) said."""


class ServerUnreachable(ServerError):
    pass


class RequestTimeout(ServerError):
    pass


class RequestRefused(ServerError):
    def __init__(self, message: str, status: int):
        super().__init__(message)
        self.status = status


class StreamBroken(ServerError):
    pass


class UnknownAlias(ServerError):
    pass
