#!/usr/bin/env python3
"""Exercise llm-bench's real pynvml paths on a machine with an NVIDIA GPU and print what they return.

For a session lent a GPU: run it as one short script and keep its output with the issue notes.

    .venv/bin/python scripts/gpu-check.py            # read-only: telemetry, details, limits
    sudo .venv/bin/python scripts/gpu-check.py --set  # also lower GPU0's limit by 10% for 3 s and restore it

It never leaves a limit changed: the original is saved to the same restore file the power sweep
uses (so a kill is repaired by the next llm-bench start) and set back in a finally block.
"""

from __future__ import annotations

import json
import os
import sys
import time

from llm_bench.gpu.nvml import NVML_MODULE_ENV, Nvml, PowerLimitError
from llm_bench.gpu.telemetry import TelemetrySampler, summarise
from llm_bench.power.limits import restore, save_originals, state_path


def main() -> int:
    if os.environ.get(NVML_MODULE_ENV):
        print(f"{NVML_MODULE_ENV} is set: this would test a stand-in, not the GPU; unset it", file=sys.stderr)
        return 2
    import pynvml

    print("pynvml from", pynvml.__file__)
    with Nvml() as nvml:
        if not nvml.available:
            print("NVML unavailable:", nvml.unavailable)
            return 1
        print("driver:", nvml.driver_version())
        print("details:", json.dumps(nvml.details(), indent=1))
        print("vram:", nvml.vram_used())
        print("one sample:", nvml.sample())
        for i in range(nvml.count()):
            print(f"GPU{i} limits:", nvml.power_limits(i), "bandwidth GB/s:", nvml.memory_bandwidth_gbs(i))
        sampler = TelemetrySampler(nvml, 0.2)
        with sampler:
            t0 = sampler.mark()
            time.sleep(2.0)
            t1 = sampler.mark(end=True)
        summary = summarise(sampler.between(t0, t1), 100, t0, 0.2)
        print("2 s idle telemetry summary:", json.dumps({k: v for k, v in summary.items() if k != "samples"}))
        print("samples:", len(summary["samples"]), "energy source:", summary.get("energy_source"))
        if "--set" in sys.argv:
            limits = nvml.power_limits(0)
            if limits is None:
                print("GPU0 reports no power limit")
                return 1
            target = max(limits.min_w or 0, round(limits.current_w * 0.9))
            path = state_path()
            save_originals(path, {0: limits.current_w})
            try:
                nvml.set_power_limit(0, target)
                print(f"GPU0 limit set to {target} W; reads back as {nvml.power_limits(0).current_w} W")
                time.sleep(3)
            except PowerLimitError as e:
                print("set failed:", e)
            finally:
                failures = restore(nvml, {0: limits.current_w}, print)
                if not failures:
                    path.unlink(missing_ok=True)
            print("GPU0 limit after restore:", nvml.power_limits(0).current_w, "W")
    return 0


if __name__ == "__main__":
    sys.exit(main())
