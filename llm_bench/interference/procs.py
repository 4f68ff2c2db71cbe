"""The /proc edge: what every process and every core has used, read at one moment, and which processes are the
engine's. Readers take the /proc root so that the parsing is tested on written files; nothing here judges.

- ``/proc/stat``'s ``cpuN`` lines: each core's time in clock ticks by state (user, nice, system, idle, iowait,
  irq, softirq, steal, ...). ``steal`` is time the hypervisor gave this virtual CPU's core to another virtual
  machine: the one trace another VM on the same host leaves inside this one.
- ``/proc/PID/stat``: a process's name, parent and CPU time (utime + stime, all its threads, in ticks).
- ``/proc/net/tcp`` and ``tcp6`` with ``/proc/PID/fd``: which process listens on the server's port. A process
  of another user cannot have its descriptors read without root, so it may not be found.
"""

from __future__ import annotations

import os
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path

PROC = Path("/proc")
TICKS_PER_S = float(os.sysconf("SC_CLK_TCK")) if hasattr(os, "sysconf") else 100.0
# /proc/stat's per-core states that are time a core spent on something (idle and iowait are not)
BUSY_STATES = ("user", "nice", "system", "irq", "softirq", "steal")
STATES = ("user", "nice", "system", "idle", "iowait", "irq", "softirq", "steal")


@dataclass(frozen=True)
class ProcessTimes:
    pid: int
    name: str  # /proc/PID/comm, as /proc/PID/stat has it
    ppid: int
    ticks: int  # utime + stime of all its threads


@dataclass(frozen=True)
class CoreTimes:
    busy: int  # ticks on everything but idle and iowait, steal included
    steal: int


@dataclass(frozen=True)
class Snapshot:
    """Everything read at one moment: per core and per process."""

    t: float  # time.monotonic()
    cores: Mapping[int, CoreTimes]
    processes: Mapping[int, ProcessTimes]


def parse_proc_stat(text: str) -> dict[int, CoreTimes]:
    cores: dict[int, CoreTimes] = {}
    for line in text.splitlines():
        name, _, rest = line.partition(" ")
        if not name.startswith("cpu") or name == "cpu":
            continue
        values = dict(zip(STATES, (int(v) for v in rest.split()), strict=False))
        cores[int(name[3:])] = CoreTimes(sum(values.get(s, 0) for s in BUSY_STATES), values.get("steal", 0))
    return cores


def parse_pid_stat(pid: int, text: str) -> ProcessTimes | None:
    """/proc/PID/stat: ``pid (comm) state ppid ... utime stime ...``; the name may hold spaces and parentheses,
    so the fields are counted from the last ')'."""
    head, close, tail = text.rpartition(")")
    if not close:
        return None
    name = head.partition("(")[2]
    fields = tail.split()
    try:  # after ')': state is field 3 of the man page, ppid 4, utime 14, stime 15
        return ProcessTimes(pid, name, int(fields[1]), int(fields[11]) + int(fields[12]))
    except (IndexError, ValueError):
        return None


def read_processes(proc: Path = PROC) -> dict[int, ProcessTimes]:
    out: dict[int, ProcessTimes] = {}
    for entry in proc.iterdir():
        if not entry.name.isdigit():
            continue
        try:
            parsed = parse_pid_stat(int(entry.name), (entry / "stat").read_text())
        except OSError:  # it ended between the listing and the read
            continue
        if parsed is not None:
            out[parsed.pid] = parsed
    return out


def read_cores(proc: Path = PROC) -> dict[int, CoreTimes]:
    return parse_proc_stat((proc / "stat").read_text())


def snapshot(t: float, proc: Path = PROC) -> Snapshot:
    return Snapshot(t, read_cores(proc), read_processes(proc))


def descendants(roots: Iterable[int], processes: Mapping[int, ProcessTimes]) -> set[int]:
    """The roots and every process below them."""
    children: dict[int, list[int]] = {}
    for p in processes.values():
        children.setdefault(p.ppid, []).append(p.pid)
    found: set[int] = set()
    todo = [r for r in roots]
    while todo:
        pid = todo.pop()
        if pid in found:
            continue
        found.add(pid)
        todo.extend(children.get(pid, ()))
    return found


def listening_inodes(port: int, proc: Path = PROC) -> set[str]:
    """The socket inodes listening on ``port`` (TCP, IPv4 and IPv6; state 0A is LISTEN)."""
    inodes: set[str] = set()
    for table in ("net/tcp", "net/tcp6"):
        try:
            lines = (proc / table).read_text().splitlines()[1:]
        except OSError:
            continue
        for line in lines:
            fields = line.split()
            if len(fields) > 9 and fields[3] == "0A" and int(fields[1].rpartition(":")[2], 16) == port:
                inodes.add(fields[9])
    return inodes


def listeners(port: int, proc: Path = PROC) -> set[int]:
    """The processes with a socket listening on ``port`` open, among those whose descriptors can be read."""
    wanted = {f"socket:[{inode}]" for inode in listening_inodes(port, proc)}
    found: set[int] = set()
    if not wanted:
        return found
    for entry in proc.iterdir():
        if not entry.name.isdigit():
            continue
        try:
            for fd in (entry / "fd").iterdir():
                if os.readlink(fd) in wanted:
                    found.add(int(entry.name))
                    break
        except OSError:  # another user's process, or it ended
            continue
    return found


def affinity(pid: int) -> frozenset[int] | None:
    """The cores ``pid`` may run on (any user's process can be asked); None when it is gone."""
    try:
        return frozenset(os.sched_getaffinity(pid))
    except OSError:
        return None
