"""Several streams of the fixed prompt at once, ``runs`` batches per level: total throughput and
per-request percentiles (a tail percentile only where the samples are enough for it)."""

from __future__ import annotations

import statistics

from llm_bench.engines import Engine
from llm_bench.engines.stream import ChatRequest, StreamMeasurement
from llm_bench.gpu.telemetry import recording
from llm_bench.plan import Protocol
from llm_bench.results import AliasRecord
from llm_bench.support.fanout import fan_out
from llm_bench.workloads.common import (
    Log, chat_request, check_acceptance_trap, check_length, check_prompt_reuse, check_thinking, derive, fmt, run_record,
    spec_delta,
)


def simultaneous(engine: Engine, request: ChatRequest, n: int) -> tuple[list[StreamMeasurement], list[str], float]:
    """n streams released together; every failure is kept against its own request, whatever it raised.
    Returns the finished streams, one error line per failed request, and the batch's wall time."""
    outcomes, wall = fan_out([lambda: engine.stream(request)] * n)
    errors = [f"request {i + 1}/{n}: {type(o.error).__name__}: {o.error}" for i, o in enumerate(outcomes) if not o.ok]
    return [o.value for o in outcomes if o.ok and o.value is not None], errors, wall


def concurrency(engine: Engine, alias: str, protocol: Protocol, base: AliasRecord, log: Log) -> list[AliasRecord]:
    records = []
    request = chat_request(alias, protocol, protocol.prompt)
    for n in protocol.concurrency:
        record = derive(base, workload="concurrency", concurrency=n, cold_load_s=None)
        before = engine.spec_counters(alias)
        totals: list[float] = []
        with recording(record):
            for batch in range(1, protocol.runs + 1):
                measurements, errors, wall = simultaneous(engine, request, n)
                runs = [run_record(m, engine.kind) for m in measurements]
                for run in runs:
                    run.batch = batch
                    check_length(record, run, request.max_tokens)
                    check_prompt_reuse(record, run, request, f"batch {batch}")
                record.runs.extend(runs)
                record.errors.extend(f"batch {batch}, {e}" for e in errors)
                tokens = sum(r.output_tokens or 0 for r in runs)
                if runs and wall > 0:
                    totals.append(tokens / wall)
                if errors:
                    record.warnings.append(
                        f"batch {batch}: {len(errors)} of {n} requests failed; its total t/s counts only the "
                        f"{len(runs)} streams measured")
                log(f"  x{n} batch {batch}/{protocol.runs}: {fmt(tokens / wall if wall > 0 else None)} t/s total"
                    + (f", {len(errors)} of {n} failed" if errors else ""))
        after = engine.spec_counters(alias)
        # the median batch: each batch's total is its measured tokens over its wall time
        record.total_tps = statistics.median(totals) if totals else None
        record.spec = spec_delta(before, after, record.runs)
        p90 = record.tail("ttft_ms", 90)
        log(f"  x{n}: {fmt(record.total_tps)} t/s total (median of {len(totals)} batches), per request median "
            f"{fmt(record.percentile('decode_tps', 50))} t/s, TTFT p50 {fmt(record.percentile('ttft_ms', 50))} ms"
            + (f", {p90.label} {fmt(p90.value)} ms" if p90 else "")
            + (f", {len(record.errors)} failed" if record.errors else ""))
        check_acceptance_trap(record, log)
        check_thinking(record, protocol.thinking, record.runs, log)
        records.append(record)
    return records
