"""What was seen in one alias's measured window, and whether it disturbed the measurement: pure.

The limits (``[checks]`` in a plan; docs/protocol.md, "What a run watches"):

- ``foreign_cpu_max`` (default 0.20): the share of the engine's cores' time that other processes may take
  in the window (``cpu.CpuWindow.share``); one process spinning on one of the engine's two cores is 0.5;
  ``foreign_cpu_min_s`` (default 0.5): and the CPU-seconds they must reach for it to count;
- ``foreign_requests_max`` (default 0): requests the server answered in the window that were not ours;
- ``foreign_gpu_max_pct`` (default 5): a foreign process's mean share of a GPU's SMs (``gpu.py``).

A disturbed alias is not comparable; its records say by what (``disturbed_by``) and how much.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from llm_bench.interference.cpu import CpuWindow
from llm_bench.interference.gpu import GpuWindow

DISTURBED = "disturbed by"


@dataclass(frozen=True)
class Limits:
    foreign_cpu_max: float = 0.20
    foreign_requests_max: int = 0
    foreign_gpu_max_pct: float = 5.0
    # and at least this many foreign CPU-seconds: in a window of a fraction of a second a few 10 ms clock ticks
    # (or a host's steal) make any share, and are too little to move a measurement
    foreign_cpu_min_s: float = 0.5


@dataclass
class Interference:
    """One alias's window: what was watched, what was not (and why), and what disturbed it."""

    window_s: float
    cpu: CpuWindow | None = None
    gpu: GpuWindow | None = None
    foreign_requests: int | None = None
    not_watched: list[str] = field(default_factory=list)  # "CPU: ..." with why
    engine: str | None = None  # how the engine's processes were found: "pid 123 (llama-server) and 2 children"

    def disturbed_by(self, limits: Limits) -> list[str]:
        out = []
        if (self.cpu is not None and self.cpu.share > limits.foreign_cpu_max
                and self.cpu.foreign_s >= limits.foreign_cpu_min_s):
            named = ", ".join(f"{p.name} (pid {p.pid}, {p.cpu_s:.1f} CPU-s)" for p in self.cpu.processes[:3])
            steal = f", {self.cpu.steal_s:.1f} s stolen by the host for another VM" if self.cpu.steal_s >= 0.05 else ""
            cores = ",".join(map(str, self.cpu.cores))
            out.append(f"other processes on the engine's cores ({self.cpu.share:.0%} of core{'s' * (len(self.cpu.cores) > 1)} "
                       f"{cores} over {self.cpu.window_s:.1f} s, limit {limits.foreign_cpu_max:.0%}"
                       f"{': ' + named if named else ''}{steal})")
        if self.foreign_requests is not None and self.foreign_requests > limits.foreign_requests_max:
            out.append(f"{self.foreign_requests} request{'s' * (self.foreign_requests != 1)} the server answered "
                       "that were not ours")
        if self.gpu is not None:
            out += [p.describe() for p in self.gpu.processes if p.disturbs(limits.foreign_gpu_max_pct)]
        return out

    def to_toml(self, limits: Limits) -> dict[str, Any]:
        out: dict[str, Any] = {"window_s": round(self.window_s, 3), "disturbed": bool(self.disturbed_by(limits))}
        if out["disturbed"]:
            out["disturbed_by"] = self.disturbed_by(limits)
        if self.engine:
            out["engine"] = self.engine
        if self.cpu is not None:
            out["cpu"] = self.cpu.to_toml() | {"limit": limits.foreign_cpu_max}
        if self.foreign_requests is not None:
            out["foreign_requests"] = self.foreign_requests
        if self.gpu is not None:
            out["gpu"] = self.gpu.to_toml() | {"limit_sm_pct": limits.foreign_gpu_max_pct}
        if self.not_watched:
            out["not_watched"] = list(self.not_watched)
        return out

    def apply(self, records: list[Any], limits: Limits) -> list[str]:
        """Put the window on each of the alias's records (``AliasRecord.interference``); a disturbed one is made
        not comparable, saying by what. Returns what disturbed it."""
        disturbed = self.disturbed_by(limits)
        table = self.to_toml(limits)
        for record in records:
            record.interference = table
            if disturbed:
                record.comparable = False
                reason = f"{DISTURBED} " + "; ".join(disturbed)
                record.not_comparable_reason = (reason if not record.not_comparable_reason
                                                else f"{record.not_comparable_reason}; {reason}")
        return disturbed


def disturbance(record: Any) -> str | None:
    """``disturbed by ...`` for a record whose window was disturbed (as the results file keeps it), else None."""
    table = getattr(record, "interference", None)
    if not isinstance(table, dict) or not table.get("disturbed"):
        return None
    return f"{DISTURBED} " + "; ".join(table.get("disturbed_by", []) or ["something else (see the results file)"])
