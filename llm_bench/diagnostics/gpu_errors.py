"""GPU errors: NVIDIA Xid lines in the kernel log and Xid events from NVML, the PCIe link's generation,
width and replay counter, parsed and judged (pure functions to findings), and gathered over a span of
time (a run, a soak, a doctor's probe).

The kernel log comes from a given file or command, else the journal (`journalctl -k`), else
`dmesg --time-format iso`; new NVIDIA Xid lines are those after the start. NVML adds critical
Xid events and the PCIe link, sampled while the GPU works (an idle GPU lowers its link).
"""

from __future__ import annotations

import re
import shutil
import subprocess
import threading
from collections.abc import Sequence
from dataclasses import dataclass, field
from datetime import datetime, timezone
from pathlib import Path

from llm_bench.diagnostics.findings import ERROR, WARNING, Finding
from llm_bench.gpu.nvml import Nvml, PcieLink, XidEvent, XidWatch

# --- parsing and judging: Xid lines in the kernel log, Xid events from NVML, the PCIe link ----------

# The NVIDIA driver: "NVRM: Xid (PCI:0000:01:00): 13, pid=1234, name=python3, Graphics SM Warp Exception ..."
XID_LINE = re.compile(r"NVRM: Xid \(PCI:([0-9a-fA-F]{4}):([0-9a-fA-F]{2}):([0-9a-fA-F]{2})(?:\.\d)?\): (\d+),? ?(.*)")
ISO_STAMP = re.compile(r"^(\d{4}-\d{2}-\d{2}[T ]\d{2}:\d{2}:\d{2})(?:[.,](\d+))?(Z|[+-]\d{2}:?\d{2})?")
XID_MEANING = {
    13: "Graphics Engine Exception (an illegal memory access or instruction in a kernel; also unstable clocks "
        "or memory)",
    31: "GPU memory page fault",
    43: "GPU stopped processing",
    45: "preemptive cleanup after an earlier error",
    48: "double-bit ECC error",
    61: "internal micro-controller breakpoint",
    62: "internal micro-controller halt",
    63: "ECC page retirement or row remapping",
    64: "ECC page retirement or row remapping failure",
    74: "NVLink error",
    79: "GPU has fallen off the bus",
    92: "high single-bit ECC error rate",
    94: "contained ECC error",
    95: "uncontained ECC error",
    119: "GSP RPC timeout",
    120: "GSP error",
}


@dataclass(frozen=True)
class XidLine:
    pci: tuple[int, int, int]  # (domain, bus, device)
    xid: int
    line: str
    at: datetime | None  # the line's timestamp, when it carries one

    @property
    def pci_text(self) -> str:
        return f"{self.pci[0]:04x}:{self.pci[1]:02x}:{self.pci[2]:02x}"


def line_time(line: str) -> datetime | None:
    """The ISO timestamp that starts a `journalctl -o short-iso` or `dmesg --time-format iso` line."""
    m = ISO_STAMP.match(line)
    if not m:
        return None
    zone = (m[3] or "").replace("Z", "+00:00")
    try:
        at = datetime.fromisoformat(m[1].replace(" ", "T") + (f".{m[2][:6]}" if m[2] else "") + zone)
    except ValueError:
        return None
    return at if at.tzinfo else at.astimezone()


def xid_lines(text: str, since: datetime | None = None) -> list[XidLine]:
    """The driver's Xid lines; with ``since``, those whose timestamp is earlier are left out."""
    out = []
    for line in text.splitlines():
        m = XID_LINE.search(line)
        if not m:
            continue
        at = line_time(line)
        if since is not None and at is not None and at < since:
            continue
        out.append(XidLine((int(m[1], 16), int(m[2], 16), int(m[3], 16)), int(m[4]), line.strip(), at))
    return out


def _xid_fix(xid: int) -> str:
    if xid == 79:
        return ("the card dropped off the PCIe bus: reseat it and its riser, check the PSU and its cables, "
                "and lower the power limit; the GPU needs a reboot to come back")
    if xid in (48, 63, 64, 92, 94, 95):
        return "check `nvidia-smi -q -d ECC,ROW_REMAPPER`; a card that keeps retiring memory needs replacing"
    return ("look at what ran at that moment (pid/name in the line); repeated Xid 13/31/43 under load point at "
            "unstable clocks or memory (undo an overclock or undervolt, lower the power limit), a riser, or a "
            "driver/CUDA bug: update the driver and rerun")


def check_xid(lines: Sequence[XidLine], pci_index: dict[tuple[int, int, int], int],
              source: str = "the kernel log") -> list[Finding]:
    """One error per GPU and Xid code, with how often it occurred and its first line."""
    groups: dict[tuple[tuple[int, int, int], int], list[XidLine]] = {}
    for x in lines:
        groups.setdefault((x.pci, x.xid), []).append(x)
    findings = []
    for (pci, xid), seen in groups.items():
        index = pci_index.get(pci)
        gpu = f"GPU{index} (PCI {seen[0].pci_text})" if index is not None else f"the GPU at PCI {seen[0].pci_text}"
        meaning = XID_MEANING.get(xid, "see NVIDIA's Xid catalogue")
        findings.append(Finding(
            "gpu-xid", ERROR,
            f"{gpu} logged Xid {xid} ({meaning}) {len(seen)} time(s) ({source}: \"{seen[0].line[:300]}\").",
            _xid_fix(xid)))
    return findings


def check_xid_events(events: Sequence[XidEvent]) -> list[Finding]:
    counts: dict[tuple[int | None, int], int] = {}
    for e in events:
        counts[(e.index, e.xid)] = counts.get((e.index, e.xid), 0) + 1
    return [Finding("gpu-xid", ERROR,
                    f"{'GPU' + str(index) if index is not None else 'a GPU'} reported critical Xid {xid} "
                    f"({XID_MEANING.get(xid, 'see NVIDIA Xid catalogue')}) {n} time(s) (NVML event "
                    "nvmlEventTypeXidCriticalError).", _xid_fix(xid))
            for (index, xid), n in counts.items()]


BUSY_PCT = 30  # an idle GPU lowers its link generation to save power; judge the link only above this load


def check_pcie(busiest: Sequence[PcieLink], before: Sequence[PcieLink] = (),
               after: Sequence[PcieLink] = ()) -> list[Finding]:
    """A link below the card's maximum while it works, and replays (corrected link errors) that grew."""
    findings = []
    for link in busiest:
        if link.busy_pct is None or link.busy_pct < BUSY_PCT:
            continue
        slow_gen = link.gen is not None and link.max_gen is not None and link.gen < link.max_gen
        narrow = link.width is not None and link.max_width is not None and link.width < link.max_width
        if slow_gen or narrow:
            findings.append(Finding(
                "pcie-link", WARNING,
                f"GPU{link.index}'s PCIe link runs at Gen{link.gen} x{link.width} while {link.busy_pct}% busy; "
                f"the card supports Gen{link.max_gen} x{link.max_width}.",
                "check the slot (some are wired for fewer lanes or share them), the riser or cable (a poor riser "
                "makes the link fall back), and the BIOS's PCIe generation setting"))
    start = {link.index: link.replays for link in before if link.replays is not None}
    for link in after:
        if link.replays is not None and link.index in start and link.replays > start[link.index]:
            findings.append(Finding(
                "pcie-replay", WARNING,
                f"GPU{link.index}'s PCIe replay counter grew by {link.replays - start[link.index]} during the run "
                f"({start[link.index]} -> {link.replays}): the link is retransmitting corrupted packets.",
                "reseat the card, replace or shorten the riser, or force a lower PCIe generation in the BIOS"))
    return findings


# --- gathering over a span ---------------------------------------------------------------------------


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
