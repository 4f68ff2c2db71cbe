"""Figures per backend: a run through a LiteLLM proxy records which backend answered each request
(RunRecord.backend); a configuration answered by more than one is shown as one row per backend."""

from __future__ import annotations

from dataclasses import replace

import httpx

from llm_bench.results import AliasRecord
from llm_bench.workloads.concurrency import ConcurrencyLevel


def backend_label(api_base: str) -> str:
    """``host:port`` of the backend's URL, the part that tells boxes apart."""
    try:
        url = httpx.URL(api_base)
    except httpx.InvalidURL:
        return api_base
    if not url.host:
        return api_base
    return f"{url.host}:{url.port}" if url.port else url.host


def split_by_backend(record: AliasRecord) -> list[tuple[str | None, AliasRecord]]:
    """(backend label, its runs' record) for each backend that answered; (None, the record) when one or none did.

    Whole-record figures (the drafting counters' growth, the batch throughput) cannot be split by request,
    so the parts leave them out."""
    backends = sorted({run.backend for run in record.runs if run.backend})
    if len(backends) < 2:
        return [(None, record)]
    parts: list[tuple[str | None, AliasRecord]] = []
    for backend in backends:
        runs = [run for run in record.runs if run.backend == backend]
        level = record.part
        if isinstance(level, ConcurrencyLevel):  # a batch's throughput is the whole batch's
            level = replace(level, total_tps=None)
        part = replace(record, runs=runs, spec=None, part=level, warnings=[
            *record.warnings, f"{len(runs)} of {len(record.runs)} requests, answered by {backend}"])
        parts.append((backend_label(backend), part))
    return parts
