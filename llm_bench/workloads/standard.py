"""The reference protocol's workload: the fixed prompt, ``runs`` times, one stream at a time."""

from __future__ import annotations

from llm_bench.engines import Engine
from llm_bench.results import STANDARD as STANDARD_RECORDS
from llm_bench.results import AliasRecord
from llm_bench.workloads.base import Keep, Log, NoSettings, RunParameters, Workload
from llm_bench.workloads.common import chat_request, derive, measured_runs


def standard(engine: Engine, alias: str, protocol: RunParameters, base: AliasRecord, log: Log, keep: Keep) -> None:
    record = derive(base, workload=STANDARD.record_name)
    measured_runs(engine, chat_request(alias, protocol, protocol.prompt), protocol.runs, record, log, keep,
                  precision=protocol.precision, max_runs=protocol.max_runs)
    keep(record)


STANDARD: Workload[NoSettings] = Workload("standard", NoSettings, standard, record=STANDARD_RECORDS, speed=True)
