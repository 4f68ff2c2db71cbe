"""Workloads run against a model that the protocol has already loaded and warmed up.

Each returns finished ``AliasRecord``s that share the alias's provenance (VRAM before the
load, cold load, preset arguments) and add their own figures.
"""

from __future__ import annotations

import copy
import threading
import time
import uuid
from collections.abc import Callable
from dataclasses import replace

from llm_bench.client import ChatRequest, ServerError, StreamMeasurement
from llm_bench.engines import Engine
from llm_bench.metrics import SpecCounters
from llm_bench.plan import Protocol, shipped_prompt
from llm_bench.results import AliasRecord, RunRecord
from llm_bench.telemetry import recording

Log = Callable[[str], None]

CATEGORIES = {"prose": "prose", "code": "code", "json": "json"}
# Below this acceptance rate a drafting server is rejecting (nearly) every draft token.
ACCEPTANCE_TRAP_RATE = 0.01


def derive(base: AliasRecord, **changes) -> AliasRecord:
    """A fresh record carrying the base's provenance; nothing mutable is shared."""
    return replace(copy.deepcopy(base), **changes)


def chat_request(alias: str, protocol: Protocol, prompt: str, max_tokens: int | None = None) -> ChatRequest:
    return ChatRequest(alias, prompt, max_tokens or protocol.max_tokens, protocol.temperature, protocol.seed)


def run_record(m: StreamMeasurement, engine_kind: str) -> RunRecord:
    timings = m.timings or {}
    server_tps = timings.get("predicted_per_second")
    return RunRecord(
        ttft_ms=None if m.ttft_s is None else m.ttft_s * 1000.0,
        # llama.cpp's router reports its own decode rate; other engines are measured from the stream.
        decode_tps=server_tps if engine_kind == "llama-cpp" else m.client_decode_tps,
        server_decode_tps=server_tps,
        decode_ms=timings.get("predicted_ms"),
        client_decode_tps=m.client_decode_tps,
        prompt_tps=timings.get("prompt_per_second"),
        prompt_tokens=m.prompt_tokens,
        output_tokens=m.output_tokens,
        token_chunks=m.token_chunks,
        finish_reason=m.finish_reason,
        draft_n=timings.get("draft_n"),
        draft_n_accepted=timings.get("draft_n_accepted"),
        wall_s=None if m.done_at is None else m.done_at - m.sent_at,
        cache_n=m.cached_tokens,
    )


def _fmt(value: float | None) -> str:
    return "n/a" if value is None else f"{value:.1f}"


def describe_run(run: RunRecord) -> str:
    text = (f"{_fmt(run.decode_tps)} t/s decode, {_fmt(run.client_decode_tps)} t/s client, "
            f"TTFT {_fmt(run.ttft_ms)} ms, {run.output_tokens} tokens")
    if run.draft_n:
        text += f", drafted {run.draft_n} accepted {run.draft_n_accepted}"
    return text


def spec_from_runs(runs: list[RunRecord]) -> SpecCounters | None:
    drafted = sum(r.draft_n or 0 for r in runs)
    if not drafted:
        return None
    return SpecCounters(float(drafted), float(sum(r.draft_n_accepted or 0 for r in runs)))


def check_length(record: AliasRecord, run: RunRecord, wanted: int) -> None:
    if run.finish_reason != "length":
        record.comparable = False
        record.not_comparable_reason = (
            f"a run stopped on {run.finish_reason!r} after {run.output_tokens} tokens instead of generating "
            f"all {wanted}: the server did not honour ignore_eos"
        )


def check_acceptance_trap(record: AliasRecord, log: Log) -> None:
    spec = record.spec
    if spec is None or not spec.draft_tokens or (spec.acceptance_rate or 0.0) >= ACCEPTANCE_TRAP_RATE:
        return
    length = spec.mean_acceptance_length
    message = (
        f"ACCEPTANCE TRAP: the server drafted {spec.draft_tokens:.0f} tokens and accepted "
        f"{spec.accepted_tokens:.0f} ({spec.acceptance_rate:.1%}"
        + (f", mean acceptance length {length:.2f}" if length is not None else "")
        + "): speculative decoding only costs time here. Known cause: the target runs in a different dtype "
        "from the one the drafter was trained with (e.g. vLLM --dtype half instead of bfloat16); also check "
        "that the drafter belongs to this target model."
    )
    record.warnings.append(message)
    log("  !!! " + message)


def measured_runs(engine: Engine, request: ChatRequest, runs: int, record: AliasRecord, log: Log,
                  label: str = "Run") -> None:
    before = engine.spec_counters(request.model)
    with recording(record):
        for i in range(runs):
            run = run_record(engine.stream(request), engine.kind)
            record.runs.append(run)
            log(f"  {label} {i + 1}/{runs}: {describe_run(run)}")
            check_length(record, run, request.max_tokens)
    after = engine.spec_counters(request.model)
    record.spec = after.minus(before) if before and after else spec_from_runs(record.runs)
    log("  " + describe_summary(record))
    check_acceptance_trap(record, log)


def describe_summary(record: AliasRecord) -> str:
    """hyperfine-style: the median, then the spread, of what the table will show."""
    decode, ttft = record.summary("decode_tps"), record.summary("ttft_ms")
    if decode is None:
        return "no decode rate measured"
    text = f"Decode: {decode.median:.1f} t/s median [min {decode.min:.1f}, max {decode.max:.1f}]"
    if ttft is not None:
        text += f", TTFT {ttft.median:.0f} ms median [min {ttft.min:.0f}, max {ttft.max:.0f}]"
    if record.spec is not None and record.spec.acceptance_rate is not None:
        text += f", draft acceptance {record.spec.acceptance_rate:.1%}"
    return text


def standard(engine: Engine, alias: str, protocol: Protocol, base: AliasRecord, log: Log) -> list[AliasRecord]:
    record = derive(base, workload="protocol")
    measured_runs(engine, chat_request(alias, protocol, protocol.prompt), protocol.runs, record, log)
    return [record]


def categories(engine: Engine, alias: str, protocol: Protocol, base: AliasRecord, log: Log) -> list[AliasRecord]:
    records = []
    for category in protocol.categories:
        if category not in CATEGORIES:
            raise ValueError(f"unknown prompt category {category!r}; choose from {', '.join(CATEGORIES)}")
        log(f"  category {category}:")
        record = derive(base, workload="category", category=category, cold_load_s=None)
        request = chat_request(alias, protocol, shipped_prompt(CATEGORIES[category]))
        measured_runs(engine, request, protocol.runs, record, log, label=f"{category} run")
        records.append(record)
    return records


def _simultaneous(engine: Engine, request: ChatRequest, n: int) -> tuple[list[StreamMeasurement], list[str], float]:
    results: list[StreamMeasurement | None] = [None] * n
    errors: list[str] = []
    start = threading.Barrier(n)

    def worker(i: int) -> None:
        try:
            start.wait()
            results[i] = engine.stream(request)
        except ServerError as e:
            errors.append(f"request {i + 1}/{n}: {e}")

    threads = [threading.Thread(target=worker, args=(i,)) for i in range(n)]
    t0 = time.perf_counter()
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    return [m for m in results if m is not None], errors, time.perf_counter() - t0


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
        record.spec = after.minus(before) if before and after else spec_from_runs(record.runs)
        log(f"  x{n}: {_fmt(record.total_tps)} t/s total, per request median "
            f"{_fmt(record.percentile('decode_tps', 50))} t/s, TTFT p50 {_fmt(record.percentile('ttft_ms', 50))} ms"
            f" p90 {_fmt(record.percentile('ttft_ms', 90))} ms" + (f", {len(errors)} failed" if errors else ""))
        check_acceptance_trap(record, log)
        records.append(record)
    return records


def long_prompt(target_tokens: int, chars_per_token: float) -> str:
    """A long document with a unique first line, so its first sending cannot hit any cache."""
    base = shipped_prompt("prose")
    nonce = f"Reference document {uuid.uuid4()}.\n\n"
    wanted = int(target_tokens * chars_per_token)
    parts = [nonce]
    n = 1
    while sum(map(len, parts)) < wanted:
        parts.append(f"Section {n}. {base}\n")
        n += 1
    return "".join(parts)[:wanted] + "\n\nSummarise the document above in three sentences."


def prefix_cache(engine: Engine, alias: str, protocol: Protocol, base: AliasRecord, log: Log) -> list[AliasRecord]:
    record = derive(base, workload="prefix-cache", cold_load_s=None)
    request = chat_request(alias, protocol, long_prompt(protocol.prefix_prompt_tokens, protocol.prefix_chars_per_token),
                           max_tokens=protocol.prefix_max_tokens)
    cold = run_record(engine.stream(request), engine.kind)
    before = engine.prefix_counters(alias)
    warm = run_record(engine.stream(request), engine.kind)
    after = engine.prefix_counters(alias)
    record.runs = [cold, warm]
    record.prefix_cold_ttft_ms = cold.ttft_ms
    record.prefix_warm_ttft_ms = warm.ttft_ms
    if warm.cache_n:
        record.prefix_cached_tokens = warm.cache_n
        record.prefix_evidence = f"server reported {warm.cache_n} of {warm.prompt_tokens} prompt tokens from cache"
    elif before and after and after.minus(before).hits > 0:
        hits = after.minus(before).hits
        record.prefix_cached_tokens = int(hits)
        record.prefix_evidence = f"vllm:prefix_cache_hits_total grew by {hits:.0f} tokens during the repeat"
    else:
        record.warnings.append(
            "prefix cache hit NOT confirmed: the server reported no cached prompt tokens for the repeated prompt "
            "(is prefix caching enabled, e.g. vLLM --enable-prefix-caching or llama.cpp cache_prompt?)"
        )
    log(f"  prefix cache: {cold.prompt_tokens} prompt tokens, TTFT cold {_fmt(cold.ttft_ms)} ms, "
        f"repeated {_fmt(warm.ttft_ms)} ms; " + (record.prefix_evidence or "hit not confirmed"))
    return [record]


RUNNERS = {"protocol": standard, "categories": categories, "concurrency": concurrency, "prefix-cache": prefix_cache}
