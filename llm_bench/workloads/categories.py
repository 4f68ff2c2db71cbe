"""The same measured runs with each shipped prompt category (prose, code, JSON)."""

from __future__ import annotations

from llm_bench.engines import Engine
from llm_bench.plan import Protocol
from llm_bench.prompts import shipped_prompt
from llm_bench.results import AliasRecord
from llm_bench.workloads.common import Log, WorkloadInterrupted, chat_request, derive, measured_runs

CATEGORIES = ("prose", "code", "json")


def categories(engine: Engine, alias: str, protocol: Protocol, base: AliasRecord, log: Log) -> list[AliasRecord]:
    records = []
    for category in protocol.categories:
        if category not in CATEGORIES:
            raise ValueError(f"unknown prompt category {category!r}; choose from {', '.join(CATEGORIES)}")
        log(f"  category {category}:")
        record = derive(base, workload="category", category=category, cold_load_s=None)
        request = chat_request(alias, protocol, shipped_prompt(category))
        try:
            measured_runs(engine, request, protocol.runs, record, log, label=f"{category} run",
                          precision=protocol.precision, max_runs=protocol.max_runs)
        except WorkloadInterrupted as e:
            raise WorkloadInterrupted(e.cause, records + e.records) from e.cause
        records.append(record)
    return records
