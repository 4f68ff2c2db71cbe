"""Other processes on the GPUs over a window, and why the clocks were held down: pure, from what the watch read
through read-only NVML (``Nvml.gpu_processes``, ``process_utilization``, ``clock_event_reasons``).

A process holding a GPU that is not in the engine's tree (nor llm-bench) is foreign. It disturbs the window
when its share of the GPU's SMs (NVML's per-process utilization samples, averaged over the window) is above
the limit, or when it is a compute (CUDA) process and the GPU gives no per-process utilization (then nothing
says it was idle). A foreign graphics process with no utilization seen (a desktop's compositor holding a few
hundred MiB) is listed, not counted: the VRAM check before each load covers the memory it holds.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field

from llm_bench.gpu.nvml import GpuProcess, ProcessUtilization

# nvmlClocksEventReason* bits (pynvml), GpuIdle left out: an idle GPU lowering its clocks is no event
CLOCK_REASONS = {
    0x2: "applications clocks setting",
    0x4: "software power cap",
    0x8: "hardware slowdown",
    0x10: "sync boost",
    0x20: "software thermal slowdown",
    0x40: "hardware thermal slowdown",
    0x80: "hardware power brake",
    0x100: "display clock setting",
}


def reason_names(mask: int) -> list[str]:
    return [name for bit, name in CLOCK_REASONS.items() if mask & bit]


@dataclass(frozen=True)
class ForeignGpuProcess:
    index: int
    pid: int
    name: str
    kind: str  # compute or graphics
    used_mib: float | None  # the most it held in the window
    sm_pct: float | None  # its mean SM utilization over its samples; None: the GPU gave none

    def disturbs(self, max_sm_pct: float) -> bool:
        if self.sm_pct is not None:
            return self.sm_pct > max_sm_pct
        return self.kind == "compute"

    def describe(self) -> str:
        held = "" if self.used_mib is None else f", {self.used_mib:.0f} MiB"
        busy = "" if self.sm_pct is None else f", {self.sm_pct:.0f} % of the SMs"
        return f"GPU{self.index}: {self.name} (pid {self.pid}, {self.kind}{held}{busy})"

    def to_toml(self) -> dict[str, object]:
        out: dict[str, object] = {"gpu": self.index, "pid": self.pid, "name": self.name, "kind": self.kind}
        if self.used_mib is not None:
            out["used_mib"] = round(self.used_mib, 1)
        if self.sm_pct is not None:
            out["sm_pct"] = round(self.sm_pct, 1)
        return out


@dataclass(frozen=True)
class GpuWindow:
    processes: list[ForeignGpuProcess] = field(default_factory=list)
    clock_reasons: list[str] = field(default_factory=list)  # every reason seen in the window, GPU by GPU
    unavailable: str | None = None  # what could not be read

    def to_toml(self) -> dict[str, object]:
        out: dict[str, object] = {"processes": [p.to_toml() for p in self.processes],
                                  "clock_reasons": list(self.clock_reasons)}
        if self.unavailable:
            out["unavailable"] = self.unavailable
        return out


def foreign_gpu(listings: Iterable[list[GpuProcess]], utilization: Iterable[ProcessUtilization],
                reasons: Mapping[int, int], engine: set[int], own: int, names: Mapping[int, str]) -> GpuWindow:
    """``listings``: each reading's processes; ``reasons``: GPU index -> the OR of its clock reason masks."""
    held: dict[tuple[int, int], tuple[str, float | None]] = {}
    for listing in listings:
        for p in listing:
            if p.pid in engine or p.pid == own:
                continue
            kind, most = held.get((p.index, p.pid), (p.kind, None))
            if p.used_mib is not None:
                most = p.used_mib if most is None else max(most, p.used_mib)
            held[(p.index, p.pid)] = ("compute" if "compute" in (kind, p.kind) else kind, most)
    sm: dict[tuple[int, int], list[int]] = {}
    for u in utilization:
        sm.setdefault((u.index, u.pid), []).append(u.sm_pct)
    # a process busy on the GPU but gone from the listings still counts (utilization samples name it)
    for key in sm:
        if key not in held and key[1] not in engine and key[1] != own:
            held[key] = ("compute", None)
    processes = [ForeignGpuProcess(index, pid, names.get(pid, f"pid {pid}"), kind, most,
                                   sum(sm[(index, pid)]) / len(sm[(index, pid)]) if (index, pid) in sm else None)
                 for (index, pid), (kind, most) in sorted(held.items())]
    seen = [f"GPU{i}: {name}" for i, mask in sorted(reasons.items()) for name in reason_names(mask)]
    return GpuWindow(processes, seen)
