"""What a power sweep measures at each limit: streamed runs with telemetry, for energy and heat."""

from __future__ import annotations

import statistics

from llm_bench.engines import Engine
from llm_bench.engines.errors import ServerError
from llm_bench.engines.stream import ChatRequest
from llm_bench.gpu.nvml import Nvml
from llm_bench.gpu.telemetry import TelemetrySampler, summarise
from llm_bench.power.limits import LimitResult, Log, Measure
from llm_bench.results import run_record


def measurer(engine: Engine, request: ChatRequest, runs: int, nvml: Nvml, log: Log, interval_s: float = 0.5) -> Measure:
    """Measure ``runs`` streamed requests at the current limit, with telemetry for energy and heat."""
    def measure(limit_w: float) -> LimitResult:
        result = LimitResult(limit_w)
        sampler = TelemetrySampler(nvml, interval_s)
        with sampler:
            t0 = sampler.mark()
            for i in range(runs):
                try:
                    run = run_record(engine.stream(request), engine)
                except ServerError as e:
                    result.errors.append(str(e))
                    log(f"  run {i + 1}/{runs} failed: {e}")
                    continue
                result.runs.append({k: v for k, v in run.__dict__.items() if v is not None})
            t1 = sampler.mark(end=True)
        tokens = sum(r.get("output_tokens", 0) for r in result.runs)
        rates = [r["decode_tps"] for r in result.runs if r.get("decode_tps") is not None]
        result.decode_tps = statistics.median(rates) if rates else None
        result.output_tokens = tokens
        summary = summarise(sampler.between(t0, t1), tokens, t0, interval_s)
        result.energy_j = summary.get("energy_j")
        result.energy_source = summary.get("energy_source")
        result.tokens_per_joule = summary.get("tokens_per_joule")
        result.mean_power_w = sum(summary["mean_power_w"]) if summary.get("mean_power_w") else None
        result.max_temperature_c = max(summary["max_temperature_c"]) if summary.get("max_temperature_c") else None
        result.mean_sm_clock_mhz = (statistics.mean(summary["mean_sm_clock_mhz"])
                                    if summary.get("mean_sm_clock_mhz") else None)
        return result

    return measure
