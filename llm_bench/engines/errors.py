"""Errors every server-facing module raises; each message says what the server (or the transport) said."""

from __future__ import annotations


class ServerError(RuntimeError):
    """A request failed; the message carries what the server (or the transport) said."""


class ServerUnreachable(ServerError):
    pass


class UnknownAlias(ServerError):
    pass
