"""Checks of a GPU's readings around a measurement: VRAM held before a load, a power limit below its
floor, a decode rate far below the memory-bandwidth roofline. Pure functions from NVML readings and a
measured record to findings."""

from __future__ import annotations

from collections.abc import Sequence

from llm_bench.diagnostics.findings import ERROR, INFO, WARNING, Finding
from llm_bench.diagnostics.settings import Checks
from llm_bench.gpu import roofline
from llm_bench.gpu.nvml import Nvml, VramReading
from llm_bench.results import AliasRecord


def check_vram(reading: VramReading, threshold_mib: float, loaded: Sequence[str] = (),
               sleeping: Sequence[str] = ()) -> list[Finding]:
    """``sleeping``: the router's instances asleep (--sleep-idle-seconds): each a process that freed its
    model's memory but keeps its GPU context, and reloads the model at the next request."""
    if reading.used_mib is None:
        return [Finding("vram", INFO, f"VRAM in use could not be read ({reading.unavailable}).",
                        "install the NVIDIA driver and pynvml to let llm-bench check VRAM before loads")]
    busy = reading.over(threshold_mib)
    if not busy:
        return []
    where = ", ".join(f"GPU{i} {reading.used_mib[i]:.0f} MiB" for i in busy)
    asleep = (f" ({', '.join(sleeping)} asleep: a process each, which keeps its GPU context, not its model)"
              if sleeping else "")
    if loaded:
        return [Finding("vram", WARNING,
                        f"VRAM in use above {threshold_mib:.0f} MiB ({where}) while the server has "
                        f"{', '.join(loaded)} loaded{asleep}; that model's own memory counts here.",
                        "unload the server's models (or stop other GPU processes) before measuring a cold load")]
    if sleeping:
        return [Finding("vram", WARNING,
                        f"VRAM in use above {threshold_mib:.0f} MiB ({where}) with no model of the server loaded, "
                        f"and {', '.join(sleeping)} asleep: a sleeping instance freed its model's memory but keeps "
                        "its GPU context; more than that is another process's.",
                        "unload the sleeping instances (POST /models/unload), then look again; past that, find the "
                        "process with `nvidia-smi --query-compute-apps=pid,name,used_memory --format=csv`")]
    return [Finding("vram", ERROR,
                    f"VRAM in use above {threshold_mib:.0f} MiB before a load ({where}) with no model of the "
                    "server loaded: another process holds it, and llama.cpp's --fit may then put layers on the CPU.",
                    "find the process with `nvidia-smi --query-compute-apps=pid,name,used_memory --format=csv` "
                    "and stop it (a desktop session, another server, a stuck container)")]


def check_power_floor(nvml: Nvml, floor_w: float | None) -> list[Finding]:
    if not floor_w or not nvml.available:
        return []
    findings = []
    for i in range(nvml.count()):
        limits = nvml.power_limits(i)
        if limits is not None and limits.current_w < floor_w:
            findings.append(Finding(
                "power-limit", WARNING,
                f"GPU{i} power limit is {limits.current_w:.0f} W, below the floor of {floor_w:.0f} W"
                + (f" (default {limits.default_w:.0f} W)" if limits.default_w else "")
                + "; decode will be slower than this card can do (a leftover power sweep?).",
                f"raise it: sudo nvidia-smi -i {i} -pl {limits.default_w or floor_w:.0f} "
                "(or run any llm-bench command to restore limits a killed power sweep left behind)"))
    return findings


def check_roofline(record: AliasRecord, min_fraction: float = Checks.roofline_min) -> list[Finding]:
    s = record.summary("decode_tps")
    frac = roofline.fraction(s.median if s else None, record.roofline_tps)
    if s is None or frac is None or frac >= min_fraction or not record.roofline_tps or not record.model_bytes:
        return []
    return [Finding(
        "roofline", WARNING,
        f"{record.configuration}: decode {s.median:.1f} t/s is {frac:.1%} of the memory-bandwidth roofline "
        f"({record.roofline_tps:.1f} t/s = {record.memory_bandwidth_gbs:.0f} GB/s / "
        f"{record.model_bytes / 1e9:.2f} GB per token), below {min_fraction:.0%}.",
        "look for layers on the CPU (offload check), a missing FlashAttention kernel, eager mode, a low power limit, "
        "or a CPU-bound sampler; a healthy single-stream decode reaches well over half the roofline")]
