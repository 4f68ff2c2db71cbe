"""The doctor's check of what else runs on this machine now (issue 55): the processes on the GPUs and on the
engine's cores over a short look, and which of them would disturb a benchmark (``interference.window.Limits``)."""

from __future__ import annotations

import time

from llm_bench.diagnostics.findings import INFO, WARNING, Finding
from llm_bench.engines import Engine
from llm_bench.gpu.nvml import Nvml
from llm_bench.interference.watch import InterferenceWatch
from llm_bench.interference.window import Interference, Limits

CHECK = "interference"
LOOK_S = 0.5  # 50 clock ticks a core: enough to see what runs now, little to add to every doctor


def look(engine: Engine, nvml: Nvml, seconds: float = LOOK_S, container: str | None = None) -> Interference | None:
    """What else used the engine's cores and the GPUs over ``seconds`` now (the server is not sent anything)."""
    watch = InterferenceWatch(engine, "", nvml, engine.base_url, container, interval_s=min(0.5, seconds))
    watch.start()
    time.sleep(seconds)
    return watch.stop()


def check_busy(seen: Interference | None, limits: Limits | None = None) -> list[Finding]:
    if seen is None:
        return []
    limits = limits or Limits()
    findings: list[Finding] = []
    if seen.cpu is not None:
        cpu = seen.cpu
        named = ", ".join(f"{p.name} (pid {p.pid}, {p.cpu_s / max(cpu.window_s, 1e-9):.0%} of a core)"
                          for p in cpu.processes) or "nothing named"
        cores = ",".join(map(str, cpu.cores))
        text = (f"other processes took {cpu.share:.0%} of the engine's cores ({cores}) over {cpu.window_s:.1f} s: "
                f"{named}" + (f"; {cpu.steal_s:.2f} s stolen by the host for another VM" if cpu.steal_s else ""))
        if cpu.share > limits.foreign_cpu_max:  # over half a second: the share alone (the CPU-seconds floor is a run's)
            findings.append(Finding(CHECK, WARNING, text + f" (above the {limits.foreign_cpu_max:.0%} a run allows: "
                                    "an alias measured now would be marked disturbed)",
                                    "stop or pause them (or pin them to other cores) before measuring"))
        else:
            findings.append(Finding(CHECK, INFO, text, "nothing to do"))
    if seen.gpu is not None:
        for p in seen.gpu.processes:
            disturbs = p.disturbs(limits.foreign_gpu_max_pct)
            findings.append(Finding(
                CHECK, WARNING if disturbs else INFO,
                p.describe() + (": it will disturb a benchmark" if disturbs else ": holding memory, idle"),
                "stop it while measuring" if disturbs else "nothing, unless its memory pushes layers off the GPU"))
        if seen.gpu.clock_reasons:
            findings.append(Finding(CHECK, INFO, "clocks held down now by " + ", ".join(seen.gpu.clock_reasons),
                                    "thermal slowdown: check cooling; a power cap is the power limit at work"))
    for why in seen.not_watched:
        if not why.startswith("requests"):
            findings.append(Finding(CHECK, INFO, f"not watched: {why}", "run llm-bench on the server's machine, "
                                    "as root for a server of another user"))
    return findings
