"""Several streams of the fixed prompt at once, ``runs`` batches per level: total throughput and
per-request percentiles (a tail percentile only where the samples are enough for it)."""

from __future__ import annotations

import statistics
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any, ClassVar

from llm_bench.diagnostics.acceptance import check_acceptance_trap
from llm_bench.engines import Engine
from llm_bench.engines.stream import ChatRequest, StreamMeasurement
from llm_bench.gpu.telemetry import recording
from llm_bench.results import AliasRecord, known, run_record
from llm_bench.support.fanout import fan_out
from llm_bench.support.numbers import fmt as figure
from llm_bench.tables import Cell, Row, Table, acceptance_cell, notes_of
from llm_bench.validation import check_fields
from llm_bench.workloads.base import Flag, Keep, Log, RunParameters, Workload
from llm_bench.workloads.common import (
    chat_request,
    check_length,
    check_prompt_reuse,
    check_thinking,
    derive,
    fmt,
    spec_delta,
)


@dataclass
class ConcurrencyLevel:
    """The concurrency workload's part of a record (``[aliases.concurrency]``): the level, and the median
    batch's total throughput (each batch's measured tokens over its wall time)."""

    streams: int
    total_tps: float | None = None
    tails: ClassVar[bool] = True  # p50/p90/p99 of the runs, where the samples are enough for them

    @property
    def distinction(self) -> str:
        return f"x{self.streams}"

    def to_toml(self) -> dict[str, Any]:
        return {"streams": self.streams, "total_tps": self.total_tps}

    @classmethod
    def from_toml(cls, data: dict[str, Any]) -> ConcurrencyLevel:
        return cls(**known(cls, data))

    @staticmethod
    def legacy(record: dict[str, Any]) -> dict[str, Any] | None:
        """Files written before the part was the workload's kept ``concurrency = 4`` and ``total_tps`` in the
        record."""
        if not isinstance(record.get("concurrency"), int):
            return None
        return {"streams": record["concurrency"], "total_tps": record.get("total_tps")}


def level_of(record: AliasRecord) -> ConcurrencyLevel | None:
    return record.part if isinstance(record.part, ConcurrencyLevel) else None


@dataclass(frozen=True)
class ConcurrencySettings:
    levels: tuple[int, ...] = field(default=(1, 2, 4, 8), metadata={"min": 1})  # simultaneous streams

    def __post_init__(self) -> None:
        check_fields(self)


def simultaneous(engine: Engine, request: ChatRequest, n: int) -> tuple[list[StreamMeasurement], list[str], float]:
    """n streams released together; every failure is kept against its own request, whatever it raised.
    Returns the finished streams, one error line per failed request, and the batch's wall time."""
    outcomes, wall = fan_out([lambda: engine.stream(request)] * n)
    errors = [f"request {i + 1}/{n}: {type(o.error).__name__}: {o.error}" for i, o in enumerate(outcomes) if not o.ok]
    return [o.value for o in outcomes if o.ok and o.value is not None], errors, wall


def concurrency(engine: Engine, alias: str, protocol: RunParameters, base: AliasRecord, log: Log, keep: Keep) -> None:
    request = chat_request(alias, protocol, protocol.prompt)
    for n in CONCURRENCY.settings_in(protocol).levels:
        level = ConcurrencyLevel(n)
        record = derive(base, workload=CONCURRENCY.record_name, part=level, cold_load_s=None)
        before = engine.spec_counters(alias)
        totals: list[float] = []
        with recording(record):
            for batch in range(1, protocol.runs + 1):
                measurements, errors, wall = simultaneous(engine, request, n)
                runs = [run_record(m, engine) for m in measurements]
                for run in runs:
                    run.batch = batch
                    check_length(record, run, request.max_tokens)
                record.runs.extend(runs)
                check_prompt_reuse(record, request)
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
        level.total_tps = statistics.median(totals) if totals else None
        record.spec = spec_delta(before, after, record.runs)
        p90 = record.tail("ttft_ms", 90)
        log(f"  x{n}: {fmt(level.total_tps)} t/s total (median of {len(totals)} batches), per request median "
            f"{fmt(record.percentile('decode_tps', 50))} t/s, TTFT p50 {fmt(record.percentile('ttft_ms', 50))} ms"
            + (f", {p90.label} {fmt(p90.value)} ms" if p90 else "")
            + (f", {len(record.errors)} failed" if record.errors else ""))
        check_acceptance_trap(record, log)
        check_thinking(record, protocol.thinking, record.runs, log)
        keep(record)


def _tail_cell(record: AliasRecord, metric: str, q: int) -> Cell:
    tail = record.tail(metric, q)
    if tail is None:
        return Cell("-", {f"{metric}_p{q}": None})
    if tail.label == "max":
        return Cell(f"max {tail.value:.0f} (n={tail.samples})", {f"{metric}_p{q}": None})
    return Cell(f"{tail.value:.0f}", {f"{metric}_p{q}": tail.value})


def _streams(record: AliasRecord) -> int:
    at = level_of(record)
    return at.streams if at is not None else 0


def concurrency_tables(rows: Sequence[Row], _baseline: Row | None = None) -> list[Table]:
    chosen = sorted((r for r in rows if r.record.workload == CONCURRENCY.record_name),
                    key=lambda r: (r.label, r.record.alias, _streams(r.record)))
    if not chosen:
        return []
    # p90/p99 only where the samples are enough for them (support.stats.min_samples); else the max, labelled
    header = ["Configuration", "Concurrent", "Total t/s", "Per-request t/s p50", "TTFT ms p50", "TTFT ms p90",
              "TTFT ms p99", "Draft accept", "Notes"]
    lines = []
    for row in chosen:
        r = row.record
        at = level_of(r)
        streams, total = (at.streams, at.total_tps) if at is not None else (None, None)
        values = [total, r.percentile("decode_tps", 50), r.percentile("ttft_ms", 50)]
        keys = ["total_tps", "decode_tps_p50", "ttft_ms_p50"]
        digits = [1, 1, 0]
        lines.append([Cell(row.configuration, {"configuration": row.configuration}),
                      Cell(str(streams), {"concurrency": streams})]
                     + [Cell(figure(v, d), {k: v}) for v, k, d in zip(values, keys, digits, strict=True)]
                     + [_tail_cell(r, "ttft_ms", 90), _tail_cell(r, "ttft_ms", 99)]
                     + [acceptance_cell(r), Cell(notes_of(r), {"errors": list(r.errors)})])
    return [Table("Concurrency", "concurrency", header, lines)]


CONCURRENCY: Workload[ConcurrencySettings] = Workload(
    "concurrency", ConcurrencySettings, concurrency, legacy={"concurrency": "levels"},
    flags=(Flag("--concurrency", "levels", "Simultaneous requests for the concurrency workload", item=int, many=True,
                example="1,2,4,8"),),
    streams=lambda settings: max(settings.levels), tables=concurrency_tables, part=ConcurrencyLevel)
