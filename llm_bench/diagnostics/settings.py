"""The settings of the doctor's checks that run during every measurement (``[checks]`` in a plan)."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

from llm_bench.interference.window import Limits
from llm_bench.validation import check_fields


@dataclass(frozen=True)
class Checks:
    """Settings of the doctor's checks that run during every measurement (see docs/gpu.md)."""

    log_file: Path | None = None  # a file with the server's log
    log_command: str | None = None  # or a command printing it; neither: the journal when it exists
    power_floor_w: float | None = field(default=None, metadata={"min": 0.0})  # warn when a GPU's limit is below this
    # warn when decode reaches less than this fraction of the roofline
    roofline_min: float = field(default=0.25, metadata={"min": 0.0, "max": 1.0})
    # the llama.cpp build's name (e.g. "llamampere") when neither the marker nor /props says which it is
    build: str | None = None
    marker: Path = Path("/etc/llama-cpp/active.json")  # the NixOS module's note of the active package
    kernel_log: Path | None = None  # kernel log lines to watch for Xid errors; default: journalctl -k or dmesg
    # Interference during an alias's measured runs (llm_bench.interference.window; docs/protocol.md): the share
    # of the engine's cores' time other processes may take, the requests not ours the server may answer, and a
    # foreign process's share of a GPU's SMs, in percent; above any of them the alias is disturbed
    foreign_cpu_max: float = field(default=0.20, metadata={"min": 0.0, "max": 1.0})
    foreign_cpu_min_s: float = field(default=0.5, metadata={"min": 0.0})  # and at least this many CPU-seconds
    foreign_requests_max: int = field(default=0, metadata={"min": 0})
    foreign_gpu_max_pct: float = field(default=5.0, metadata={"min": 0.0, "max": 100.0})
    # re-measure the run's first alias (standard workload) after the last, so that a machine that slowed down
    # (or sped up) during the run is told from a slower preset: one alias's load and runs more per run
    drift: bool = False
    engine_container: str | None = None  # the engine runs in this docker/podman container (its processes are its own)

    def __post_init__(self) -> None:
        check_fields(self)

    def interference_limits(self) -> Limits:
        return Limits(self.foreign_cpu_max, self.foreign_requests_max, self.foreign_gpu_max_pct, self.foreign_cpu_min_s)
