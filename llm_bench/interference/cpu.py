"""Foreign CPU time on the engine's cores over a window: pure, from /proc snapshots (``procs.Snapshot``).

What counts (docs/protocol.md, "What a run watches"):

- the engine's cores: every core a process of the engine's tree may run on (its CPU affinity);
- foreign time = the busy time of those cores by /proc/stat (user, nice, system, irq, softirq and steal: the
  last is time the host gave the core to another virtual machine) minus the engine tree's own CPU time minus
  llm-bench's (the measuring process; its time counted in proportion to its cores that are the engine's).
  Processes that start and end inside the window, and the kernel's own work, are in it too;
- the share: foreign time / (window x the engine's cores), so 0.5 is half of those cores' time, which one
  process spinning on one of two cores takes;
- named: each other process's time from /proc/PID/stat, weighted by the share of its allowed cores that are
  the engine's (a process allowed on all 2 cores of which the engine has 1 counts half), largest first.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field

from llm_bench.interference.procs import TICKS_PER_S, Snapshot


@dataclass(frozen=True)
class Foreign:
    """One other process's CPU time counted against the engine's cores."""

    pid: int
    name: str
    cpu_s: float

    def to_toml(self) -> dict[str, object]:
        return {"pid": self.pid, "name": self.name, "cpu_s": round(self.cpu_s, 3)}


@dataclass(frozen=True)
class CpuWindow:
    window_s: float
    cores: tuple[int, ...]  # the engine's cores
    foreign_s: float  # CPU-seconds others took on them
    steal_s: float  # of which the host gave to another virtual machine
    processes: list[Foreign] = field(default_factory=list)  # named, largest first

    @property
    def share(self) -> float:
        capacity = self.window_s * len(self.cores)
        return self.foreign_s / capacity if capacity > 0 else 0.0

    def to_toml(self) -> dict[str, object]:
        return {"window_s": round(self.window_s, 3), "cores": list(self.cores), "foreign_cpu_s": round(self.foreign_s, 3),
                "foreign_share": round(self.share, 4), "steal_s": round(self.steal_s, 3),
                "processes": [p.to_toml() for p in self.processes]}


def foreign_cpu(snapshots: Sequence[Snapshot], engine: set[int], own: int, engine_cores: frozenset[int],
                affinity: Callable[[int], frozenset[int] | None], top: int = 5) -> CpuWindow:
    """``snapshots``: the window's first and last reading and those between (a process seen only between still
    counts up to its last sighting); ``engine``: every pid of the engine's tree seen in the window."""
    first, last = snapshots[0], snapshots[-1]
    window_s = last.t - first.t
    cores = tuple(sorted(c for c in engine_cores if c in first.cores and c in last.cores))
    busy = sum(last.cores[c].busy - first.cores[c].busy for c in cores)
    steal = sum(last.cores[c].steal - first.cores[c].steal for c in cores)
    used = _ticks_used(snapshots)
    names = {pid: p.name for s in snapshots for pid, p in s.processes.items()}

    def weight(pid: int) -> float:
        allowed = affinity(pid)
        if not allowed:  # gone before it could be asked: it may have run anywhere
            allowed = frozenset(first.cores)
        return len(allowed & engine_cores) / len(allowed)

    engine_ticks = sum(t for pid, t in used.items() if pid in engine)
    own_ticks = used.get(own, 0) * weight(own)
    foreign_ticks = max(0.0, busy - engine_ticks - own_ticks)
    named = sorted((Foreign(pid, names[pid], t * weight(pid) / TICKS_PER_S) for pid, t in used.items()
                    if pid not in engine and pid != own and t > 0), key=lambda f: -f.cpu_s)
    return CpuWindow(window_s, cores, foreign_ticks / TICKS_PER_S, steal / TICKS_PER_S,
                     [f for f in named[:top] if f.cpu_s > 0])


def _ticks_used(snapshots: Sequence[Snapshot]) -> Mapping[int, int]:
    """Each process's CPU ticks in the window: its last sighting minus its first, or minus nothing where it
    started inside the window (absent from the first snapshot)."""
    first = snapshots[0].processes
    seen_last: dict[int, int] = {}
    for s in snapshots:
        for pid, p in s.processes.items():
            seen_last[pid] = p.ticks
    return {pid: ticks - (first[pid].ticks if pid in first else 0) for pid, ticks in seen_last.items()}
