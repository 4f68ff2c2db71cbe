"""Several streams of the fixed prompt at once: total throughput and per-request percentiles."""

from __future__ import annotations

from llm_bench.engines import Engine
from llm_bench.plan import Protocol
from llm_bench.results import AliasRecord
from llm_bench.support.fanout import fan_out
from llm_bench.engines.stream import ChatRequest, StreamMeasurement
from llm_bench.gpu.telemetry import recording
from llm_bench.workloads.common import Log, chat_request, check_acceptance_trap, check_length, derive, fmt, run_record, spec_delta


def _simultaneous(engine: Engine, request: ChatRequest, n: int) -> tuple[list[StreamMeasurement], list[str], float]:
    """n streams released together; every failure is kept against its own request, whatever it raised."""
    outcomes, wall = fan_out([lambda: engine.stream(request)] * n)
    errors = [f"request {i + 1}/{n}: {o.error}" for i, o in enumerate(outcomes) if not o.ok]
    return [o.value for o in outcomes if o.ok], errors, wall


def concurrency(engine: Engine, alias: str, protocol: Protocol, base: AliasRecord, log: Log) -> list[AliasRecord]:
    records = []
    request = chat_request(alias, protocol, protocol.prompt)
    for n in protocol.concurrency:
        record = derive(base, workload="concurrency", concurrency=n, cold_load_s=None)
        before = engine.spec_counters(alias)
        with recording(record):
            measurements, errors, wall = _simultaneous(engine, request, n)
            record.runs = [run_record(m, engine.kind) for m in measurements]
        after = engine.spec_counters(alias)
        record.errors.extend(errors)
        for run in record.runs:
            check_length(record, run, request.max_tokens)
        tokens = sum(r.output_tokens or 0 for r in record.runs)
        record.total_tps = tokens / wall if wall > 0 and not errors else None
        record.spec = spec_delta(before, after, record.runs)
        log(f"  x{n}: {fmt(record.total_tps)} t/s total, per request median "
            f"{fmt(record.percentile('decode_tps', 50))} t/s, TTFT p50 {fmt(record.percentile('ttft_ms', 50))} ms"
            f" p90 {fmt(record.percentile('ttft_ms', 90))} ms" + (f", {len(errors)} failed" if errors else ""))
        check_acceptance_trap(record, log)
        records.append(record)
    return records
