#!/usr/bin/env python3
"""Draw the sample charts of docs/gpu.md from made-up, test-double-style data (not measurements).

Run from the repository root: .venv/bin/python scripts/doc-charts.py
"""

from __future__ import annotations

import math
from pathlib import Path

from llm_bench.engines.metrics import SpecCounters
from llm_bench.gpu import roofline
from llm_bench.gpu.nvml import GpuSample
from llm_bench.gpu.telemetry import draw_telemetry_chart, summarise
from llm_bench.power.limits import LimitResult, draw_power_chart
from llm_bench.report import Row
from llm_bench.report.chart import draw_chart
from llm_bench.results import AliasRecord, RunRecord
from llm_bench.soak.report import draw_soak_chart
from llm_bench.soak.traffic import SoakRequest, SoakResult, analyse

OUT = Path("docs/img")
NOTE = " (illustrative data from the NVML test double)"


def telemetry() -> None:
    series = []
    for name, base_w, vram in (("qwen-base", 300.0, 19500.0), ("qwen-mtp2", 330.0, 20400.0)):
        samples = [GpuSample(0, t * 0.5, vram + 40 * math.sin(t / 3), base_w + 15 * math.sin(t / 2),
                             1000.0 + base_w * t * 0.5, 1900 - 60 * (t > 20), 9501.0, 55 + min(t, 30) * 0.5)
                   for t in range(60)]
        series.append((name, summarise(samples, 1536, 0.0)))
    draw_telemetry_chart(series, OUT / "gpu-telemetry.png", "GPU telemetry during measured runs" + NOTE)


def power() -> None:
    rows = [(200, 37.0, 59), (250, 39.6, 64), (300, 40.0, 68), (350, 40.4, 71)]
    results = [LimitResult(w, decode_tps=tps, tokens_per_joule=tps / (w * 0.92), max_temperature_c=c)
               for w, tps, c in rows]
    draw_power_chart(results, OUT / "power-sweep.png", "Power sweep" + NOTE)


def roofline_chart() -> None:
    def rec(alias, tps, spec=None, args=()):
        r = AliasRecord(alias=alias, runs=[RunRecord(decode_tps=tps * f) for f in (0.98, 1.0, 1.02)], spec=spec,
                        preset_args=list(args))
        roofline.apply(r, 936.1, 17_000_000_000)
        return Row(alias, r, "", "llama-cpp")

    rows = [rec("qwen-base", 41.0), rec("qwen-fit-cpu-layers", 15.0),
            rec("qwen-mtp2", 61.0, SpecCounters(1000.0, 700.0), ["--spec-draft-n-max", "2"])]
    draw_chart(rows, OUT / "roofline-chart.png", rows[0], "Decode t/s with roofline markers" + NOTE)


def soak() -> None:
    result = SoakResult(duration_s=900.0, stopped_by="duration")
    kinds = ("prose", "code", "json", "long", "concurrent")
    for i in range(120):
        t = i * 7.5
        result.requests.append(SoakRequest(t, kinds[i % 5], i != 77, 180 + (900 if i % 5 == 3 else 0) + (i % 7) * 5,
                                           40.0 - (i % 4) * 0.3, 128, 3.5, None if i != 77 else "timeout",
                                           vram_mib=20400 + 1.2 * i))
    analyse(result)
    draw_soak_chart(result, OUT / "soak.png", "Soak: 120 requests, 1 failed" + NOTE)


if __name__ == "__main__":
    OUT.mkdir(parents=True, exist_ok=True)
    telemetry()
    power()
    roofline_chart()
    soak()
    print("\n".join(str(p) for p in sorted(OUT.glob("*.png"))))
