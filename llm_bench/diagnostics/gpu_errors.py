"""Evidence of GPU errors gathered over a span of time (a run, a soak, a doctor's probe).

The kernel log comes from a given file or command, else the journal (`journalctl -k`), else
`dmesg --time-format iso`; new NVIDIA Xid lines are those after the start. NVML adds critical
Xid events and the PCIe link, sampled while the GPU works (an idle GPU lowers its link).
"""

from __future__ import annotations

import shutil
import subprocess
import threading
from dataclasses import dataclass, field
from datetime import datetime, timezone
from pathlib import Path

from llm_bench.diagnostics.checks import XidLine, xid_lines
from llm_bench.gpu.nvml import Nvml, PcieLink, XidEvent, XidWatch


class KernelLogError(OSError):
    """The kernel log could not be read; the message says why."""


def _run(command: list[str] | str) -> subprocess.CompletedProcess:
    return subprocess.run(command, shell=isinstance(command, str), capture_output=True, text=True,
                          errors="replace", timeout=60)


@dataclass(frozen=True)
class KernelLog:
    file: Path | None = None
    command: str | None = None  # a shell command printing kernel log lines

    def describe(self) -> str:
        if self.file:
            return str(self.file)
        return f"`{self.command}`" if self.command else "the kernel log (journalctl -k, or dmesg)"

    def read(self, since: datetime | None = None) -> str:
        """The log's text; from the journal or dmesg only what is newer than ``since`` (or this boot)."""
        if self.file is not None:
            return self.file.read_text(errors="replace")
        if self.command:
            result = _run(self.command)
            if result.returncode != 0 and not result.stdout:
                raise KernelLogError(f"`{self.command}` failed: {result.stderr.strip()[:300]}")
            return result.stdout
        errors = []
        if shutil.which("journalctl"):
            window = ["--since", f"@{int(since.timestamp())}"] if since else ["-b"]
            result = _run(["journalctl", "-k", "-o", "short-iso", "--no-pager", "-q", *window])
            if result.returncode == 0 and result.stdout.strip():
                return result.stdout
            errors.append(f"journalctl -k: {(result.stderr or 'no entries').strip()[:200]}")
        if shutil.which("dmesg"):
            result = _run(["dmesg", "--time-format", "iso"])
            if result.returncode == 0:
                return result.stdout
            errors.append(f"dmesg: {result.stderr.strip()[:200]} (kernel.dmesg_restrict? run as root)")
        raise KernelLogError("; ".join(errors) or "neither journalctl nor dmesg is installed")


@dataclass
class GpuErrorWatch:
    """New GPU errors since ``start()``: Xid lines in the kernel log and critical Xid events from NVML."""

    nvml: Nvml
    log: KernelLog = field(default_factory=KernelLog)
    started: datetime | None = None
    unavailable: list[str] = field(default_factory=list)  # why a source could not be watched
    _mark: int = 0
    _watch: XidWatch | None = None
    _log_read: bool = False  # the kernel log's last reading succeeded
    events: list[XidEvent] = field(default_factory=list)

    def start(self) -> None:
        self.started = datetime.now(timezone.utc)
        if self.log.file is not None or self.log.command:
            try:  # lines without a timestamp are new when they come after what is there now
                self._mark = len(self.log.read())
            except OSError as e:
                self.unavailable.append(f"kernel log {self.log.describe()}: {e}")
        self._watch = self.nvml.xid_watch()
        if self._watch.unavailable:
            self.unavailable.append(f"NVML Xid events: {self._watch.unavailable}")

    def poll(self) -> None:
        """Drain NVML's event queue (call it now and then during a long run)."""
        if self._watch is not None:
            self.events += self._watch.poll()

    def new_xid_lines(self) -> list[XidLine]:
        try:
            text = self.log.read(self.started)
        except OSError as e:
            reason = f"kernel log {self.log.describe()}: {e}"
            if reason not in self.unavailable:
                self.unavailable.append(reason)
            self._log_read = False
            return []
        self._log_read = True
        if (self.log.file is not None or self.log.command) and len(text) >= self._mark:
            text = text[self._mark:]
        return xid_lines(text, self.started)

    def watched(self) -> list[str]:
        """The sources that were read (after ``stop()``): an empty list means no GPU error could have been seen."""
        return ([self.log.describe()] if self._log_read else []) + \
            (["NVML Xid events"] if self._watch is not None and not self._watch.unavailable else [])

    def stop(self) -> tuple[list[XidLine], list[XidEvent]]:
        self.poll()
        lines = self.new_xid_lines()
        if self._watch is not None:
            self._watch.close()
        return lines, self.events


class PcieWatch:
    """Samples every GPU's PCIe link on a thread: the first reading, the busiest per GPU, the last."""

    def __init__(self, nvml: Nvml, interval_s: float = 0.25):
        self.nvml = nvml
        self.interval_s = interval_s
        self.first: list[PcieLink] = []
        self.busiest: dict[int, PcieLink] = {}
        self.last: list[PcieLink] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def _read(self) -> list[PcieLink]:
        links = self.nvml.pcie_links()
        for link in links:
            best = self.busiest.get(link.index)
            if best is None or (link.busy_pct or 0) > (best.busy_pct or 0):
                self.busiest[link.index] = link
        return links

    def _run(self) -> None:
        while not self._stop.wait(self.interval_s):
            self._read()

    def __enter__(self) -> PcieWatch:
        if self.nvml.available:
            self.first = self._read()
            self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        if self._thread.is_alive():
            self._stop.set()
            self._thread.join()
            self.last = self._read()
