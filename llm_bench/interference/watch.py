"""Watching one alias's measured window: the engine's processes found, /proc and NVML read at its start, every
``interval_s`` in a thread and at its end, the server's request counter at both ends; ``stop()`` gives the
``Interference`` the pure modules make of it."""

from __future__ import annotations

import ipaddress
import os
import shutil
import socket
import subprocess
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

from llm_bench.engines import Engine
from llm_bench.gpu.nvml import GpuProcess, Nvml, ProcessUtilization
from llm_bench.interference.cpu import foreign_cpu
from llm_bench.interference.gpu import foreign_gpu
from llm_bench.interference.procs import PROC, Snapshot, affinity, descendants, listeners, snapshot
from llm_bench.interference.requests import Count, RequestCounter
from llm_bench.interference.window import Interference, Limits

INTERVAL_S = 0.5
Log = Callable[[str], None]


def is_local(host: str) -> bool:
    """Whether ``host`` is an address of this machine: loopback, or one a socket can be bound to."""
    try:
        if ipaddress.ip_address(host).is_loopback:
            return True
    except ValueError:
        if host == "localhost":
            return True
    try:
        infos = socket.getaddrinfo(host, None)
    except OSError:
        return False
    for family, _, _, _, address in infos:
        try:
            with socket.socket(family, socket.SOCK_STREAM) as s:
                s.bind((address[0], 0))
            return True
        except OSError:
            continue
    return False


def container_pid(name: str) -> tuple[int | None, str | None]:
    """The host pid of a container's first process (docker, else podman)."""
    for tool in ("docker", "podman"):
        if shutil.which(tool) is None:
            continue
        try:
            out = subprocess.run([tool, "inspect", "--format", "{{.State.Pid}}", name], capture_output=True,
                                 text=True, timeout=10, check=False)
        except (OSError, subprocess.SubprocessError) as e:
            return None, f"{tool} inspect {name}: {e}"
        if out.returncode == 0 and out.stdout.strip().isdigit() and int(out.stdout.strip()) > 0:
            return int(out.stdout.strip()), None
        return None, f"{tool} inspect {name}: {out.stderr.strip() or 'not running'}"
    return None, "neither docker nor podman is installed"


def engine_roots(url: str, container: str | None, proc: Path = PROC) -> tuple[set[int], str | None]:
    """The engine's top processes (the router, the vLLM server, the container's first process), or why none."""
    if container:
        pid, why = container_pid(container)
        return ({pid}, None) if pid is not None else (set(), f"the engine's container {container!r}: {why}")
    parts = urlsplit(url)
    host, port = parts.hostname or "", parts.port or (443 if parts.scheme == "https" else 80)
    if not is_local(host):
        return set(), f"the server ({host}) is not on this machine"
    found = listeners(port, proc)
    if not found:
        return set(), (f"no process that llm-bench may look at listens on port {port} (a server run by another "
                       "user is seen only by root; or name its container with [checks] engine_container)")
    return found, None


class InterferenceWatch:
    """One alias's window. ``start()`` just before its first measured request, ``stop()`` after its last."""

    def __init__(self, engine: Engine, alias: str, nvml: Nvml, url: str, container: str | None = None,
                 interval_s: float = INTERVAL_S, proc: Path = PROC, server_log: Callable[[], str | None] | None = None):
        self.engine, self.alias, self.nvml, self.url, self.container = engine, alias, nvml, url, container
        self.interval_s = interval_s
        self.proc = proc
        self.own = os.getpid()
        self._roots: set[int] = set()
        self._why_no_engine: str | None = None
        self._snapshots: list[Snapshot] = []
        self._listings: list[list[GpuProcess]] = []
        self._utilization: list[ProcessUtilization] = []
        self._reasons: dict[int, int] = {}
        self._gpu_why: set[str] = set()
        self._proc_why: str | None = None
        self._since_us: dict[int, int] = {}
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._counter = RequestCounter(engine, server_log)
        self._count_start: Count | None = None
        self.started = False

    def start(self) -> None:
        self._roots, self._why_no_engine = engine_roots(self.url, self.container, self.proc)
        self._count_start = self._counter.read()
        self._read()
        self.started = True
        self._thread = threading.Thread(target=self._run, name="llm-bench-interference", daemon=True)
        self._thread.start()

    def _run(self) -> None:
        while not self._stop.wait(self.interval_s):
            self._read()

    def _read(self) -> None:
        try:
            self._snapshots.append(snapshot(time.monotonic(), self.proc))
        except OSError as e:
            self._proc_why = f"CPU: /proc could not be read ({e})"
        if not self.nvml.available:
            return
        listing, why = self.nvml.gpu_processes()
        self._listings.append(listing)
        if why:
            self._gpu_why.add(why)
        for i in range(self.nvml.count()):
            samples, why = self.nvml.process_utilization(i, self._since_us.get(i, 0))
            if why:
                self._gpu_why.add(f"GPU{i}: {why}")
            if i not in self._since_us:  # the first call only sets where the window's samples begin
                self._since_us[i] = max((s.t_us for s in samples), default=0)
                continue
            self._utilization += samples
            if samples:
                self._since_us[i] = max(s.t_us for s in samples)
            mask, why = self.nvml.clock_event_reasons(i)
            if mask is not None:
                self._reasons[i] = self._reasons.get(i, 0) | mask
            elif why:
                self._gpu_why.add(f"GPU{i}: clock reasons: {why}")

    def stop(self) -> Interference | None:
        """The window's interference; None when it was never started (the alias failed before its runs)."""
        if not self.started:
            return None
        self._stop.set()
        if self._thread is not None:
            self._thread.join()
        self._read()
        end = self._counter.read()
        snapshots = self._snapshots
        window_s = snapshots[-1].t - snapshots[0].t if len(snapshots) > 1 else 0.0
        result = Interference(window_s)
        result.foreign_requests, why = self._counter.foreign(self._count_start or end, end)
        if why:
            result.not_watched.append(f"requests: {why}")
        engine: set[int] = set()
        for s in snapshots:
            engine |= descendants(self._roots, s.processes)
        names = {pid: p.name for s in snapshots for pid, p in s.processes.items()}
        if self._roots:
            cores = frozenset(c for pid in engine for c in (affinity(pid) or ()))
            top = ", ".join(f"{names.get(pid, '?')} (pid {pid})" for pid in sorted(self._roots))
            result.engine = f"{top} and {len(engine) - len(self._roots)} processes below"
            if len(snapshots) > 1 and cores:
                result.cpu = foreign_cpu(snapshots, engine, self.own, cores, affinity)
            else:
                result.not_watched.append(self._proc_why or "CPU: /proc could not be read twice")
        else:
            result.not_watched.append(f"CPU: {self._why_no_engine}")
        if self.nvml.available:
            if self._roots:
                gone = {p.pid for listing in self._listings for p in listing if p.pid not in names}
                for pid in gone:  # in a container, or ended: NVML names it
                    names[pid] = self.nvml.process_name(pid) or f"pid {pid}"
                result.gpu = foreign_gpu(self._listings, self._utilization, self._reasons, engine, self.own, names)
                if self._gpu_why:
                    result.gpu = type(result.gpu)(result.gpu.processes, result.gpu.clock_reasons,
                                                  "; ".join(sorted(self._gpu_why)))
            else:
                result.not_watched.append(f"GPU: which processes are the engine's is unknown ({self._why_no_engine})")
        else:
            result.not_watched.append(f"GPU: {self.nvml.unavailable or 'NVML is not available'}")
        return result


class AliasWindow:
    """The runner's window (``runner.Window``) for one alias: the watch started when it opens, stopped when it
    closes; ``apply`` puts what was seen on the alias's records and says so in the log."""

    def __init__(self, engine: Engine, alias: str, nvml: Nvml, url: str, limits: Limits, container: str | None,
                 log: Log, server_log: Callable[[], str | None] | None = None):
        self.watch = InterferenceWatch(engine, alias, nvml, url, container, server_log=server_log)
        self.limits = limits
        self.log = log
        self.result: Interference | None = None

    def opened(self) -> None:
        self.watch.start()

    def closed(self) -> None:
        if self.result is None:
            self.result = self.watch.stop()

    def apply(self, records: list[Any]) -> None:
        if self.result is None:
            return
        disturbed = self.result.apply(records, self.limits)
        cpu = self.result.cpu
        seen = [] if cpu is None else [f"others took {cpu.share:.0%} of the engine's cores"]
        if self.result.foreign_requests is not None:
            seen.append(f"{self.result.foreign_requests} requests not ours")
        if disturbed:
            self.log(f"  NOT COMPARABLE: disturbed by {'; '.join(disturbed)}")
        else:
            self.log(f"  Interference: none above the limits ({', '.join(seen) or 'nothing could be watched'})")
        for why in self.result.not_watched:
            self.log(f"  not watched: {why}")
