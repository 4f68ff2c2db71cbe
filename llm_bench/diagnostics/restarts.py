"""Counting server restarts over a span of time (a soak): systemd's restart counter for the unit,
a container's restart count, and a llama.cpp router's model instances that exit on their own."""

from __future__ import annotations

import json
import socket
import subprocess
import threading
import time
from dataclasses import dataclass, field
from typing import Protocol

import httpx
from httpx_sse import EventSource, SSEError


@dataclass(frozen=True)
class Restart:
    source: str  # e.g. "llama-cpp.service (systemd NRestarts)"
    count: int
    evidence: str


class RestartWatch(Protocol):
    def start(self) -> None: ...

    def stop(self) -> Restart | None:
        """The restarts since start(), or None when this source could not be read (``unavailable``)."""
        ...

    unavailable: str | None


@dataclass
class CounterWatch:
    """A restart counter read by a command before and after: systemd's NRestarts, docker's RestartCount."""

    source: str
    command: list[str]
    unavailable: str | None = None
    _first: int | None = None

    @classmethod
    def systemd(cls, unit: str) -> CounterWatch:
        return cls(f"{unit} (systemd NRestarts)", ["systemctl", "show", "-p", "NRestarts", "--value", unit])

    @classmethod
    def container(cls, name: str) -> CounterWatch:
        return cls(f"container {name} (docker RestartCount)", ["docker", "inspect", "--format",
                                                               "{{.RestartCount}}", name])

    def _read(self) -> int | None:
        try:
            result = subprocess.run(self.command, capture_output=True, text=True, timeout=30)
        except (OSError, subprocess.SubprocessError) as e:
            self.unavailable = f"`{' '.join(self.command)}` could not run: {e}"
            return None
        try:
            return int(result.stdout.strip())
        except ValueError:
            self.unavailable = (f"`{' '.join(self.command)}` gave no count (exit {result.returncode}: "
                                f"{(result.stderr or result.stdout).strip()[:200]})")
            return None

    def start(self) -> None:
        self._first = self._read()

    def stop(self) -> Restart | None:
        last = self._read()
        if self._first is None or last is None:
            return None
        return Restart(self.source, max(0, last - self._first), f"{self._first} -> {last}")


@dataclass
class RouterInstanceWatch:
    """A llama.cpp router's ``/models/sse``: a model instance that goes ``unloaded`` with a non-zero
    exit code died (crashed or was killed); a router whose event stream breaks and comes back restarted."""

    base_url: str
    headers: dict[str, str] = field(default_factory=dict)
    unavailable: str | None = None
    exits: list[str] = field(default_factory=list)
    router_restarts: int = 0
    _stop: threading.Event = field(default_factory=threading.Event)
    _connected: threading.Event = field(default_factory=threading.Event)
    _thread: threading.Thread | None = None
    _socket: socket.socket | None = None
    _reached: bool = False

    def _run(self) -> None:
        lost = False
        while not self._stop.is_set():
            try:
                with httpx.Client(base_url=self.base_url, headers=self.headers,
                                  timeout=httpx.Timeout(None, connect=2.0)) as client:
                    with client.stream("GET", "/models/sse") as response:
                        stream = response.extensions.get("network_stream")
                        self._socket = stream.get_extra_info("socket") if stream is not None else None
                        if self._stop.is_set():
                            return
                        if response.status_code != 200:
                            self.unavailable = f"/models/sse answered HTTP {response.status_code}"
                            self._connected.set()
                            return
                        if lost:
                            self.router_restarts += 1
                            lost = False
                        self._reached = True
                        self._connected.set()
                        for sse in EventSource(response).iter_sse():
                            self._event(json.loads(sse.data))
            except (httpx.HTTPError, SSEError, json.JSONDecodeError, RuntimeError):
                pass
            if self._stop.is_set():
                return
            lost = lost or self._reached  # a router never reached has not restarted when it answers
            self._connected.set()
            self._stop.wait(0.5)

    def _event(self, event: dict) -> None:
        data = event.get("data") or {}
        if event.get("event") == "status_change" and data.get("status") == "unloaded" and data.get("exit_code"):
            self.exits.append(f"{event.get('model')} exited with code {data['exit_code']}")

    def start(self) -> None:
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()
        self._connected.wait(5.0)

    def stop(self) -> Restart | None:
        time.sleep(0.2)  # an exit just before the end is at most one event in flight
        self._stop.set()
        # The stream's read blocks until the router sends an event, which may be never: shutting the
        # socket down ends it now (closing the client from this thread would not).
        if self._socket is not None:
            try:
                self._socket.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass
        if self._thread is not None:
            self._thread.join(5.0)
        if not self._reached and not self.unavailable:
            self.unavailable = f"the router's /models/sse at {self.base_url} could not be reached"
        if self.unavailable:
            return None
        evidence = list(self.exits) + (["the router's event stream broke and came back"] * self.router_restarts)
        return Restart("llama.cpp router (/models/sse)", len(evidence), "; ".join(evidence) or "no instance exited")
