#!/usr/bin/env python3
"""Exercise llm-bench's real pynvml paths on a machine with an NVIDIA GPU and print what they return.

For a session lent a GPU: run it as one short script and keep its output with the issue notes
(scripts/gpu-proof.sh does more, and runs this first).

    python3 scripts/gpu-check.py            # read-only: telemetry, details, limits

Read-only: a lent machine's settings are never changed (issue #56), so there is no --set path; it is
refused. Setting power limits is tested against tests/fake_nvml.py and belongs on your own machine
(`sudo llm-bench power`).
"""

from __future__ import annotations

import json
import os
import sys
import time

from llm_bench.gpu.nvml import NVML_MODULE_ENV, Nvml
from llm_bench.gpu.telemetry import TelemetrySampler, summarise


def main() -> int:
    if any(arg == "--set" or arg.startswith("--set=") for arg in sys.argv[1:]):
        print("gpu-check: refused --set: it changes no accelerator setting on a lent machine; it has no --set path "
              "(power limits are tested against tests/fake_nvml.py; use `sudo llm-bench power` on your own machine)",
              file=sys.stderr)
        return 2
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
    return 0


if __name__ == "__main__":
    sys.exit(main())
