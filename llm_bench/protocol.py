"""The measurement protocol: the fixed sequence of steps applied to every preset.

For each alias: unload it, read VRAM in use, time a cold-load warm-up, take N measured
runs, unload again. Each alias's record is saved before the next alias starts.
"""

from __future__ import annotations

import platform
import time
from collections.abc import Callable
from datetime import datetime, timezone

from llm_bench import __version__
from llm_bench.client import (
    ChatRequest,
    RouterClient,
    ServerError,
    ServerUnreachable,
    StatusWatcher,
    StreamMeasurement,
    UnknownAlias,
)
from llm_bench.gpu import Nvml, VramReading
from llm_bench.plan import Plan, Protocol
from llm_bench.results import FORMAT, AliasRecord, ResultSet, ResultsWriter, RunRecord, results_stem

Log = Callable[[str], None]


class RunAborted(RuntimeError):
    """The run cannot go on (the server went away); what was measured is already saved."""


def run_record(m: StreamMeasurement) -> RunRecord:
    timings = m.timings or {}
    return RunRecord(
        ttft_ms=None if m.ttft_s is None else m.ttft_s * 1000.0,
        decode_tps=timings.get("predicted_per_second"),
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
    )


def describe_vram(reading: VramReading) -> str:
    if reading.used_mib is None:
        return f"unavailable ({reading.unavailable})"
    return ", ".join(f"GPU{i} {used:.0f} MiB" for i, used in enumerate(reading.used_mib))


def check_vram(record: AliasRecord, reading: VramReading, protocol: Protocol) -> None:
    if reading.used_mib is None:
        record.vram_unavailable = reading.unavailable
        return
    record.vram_used_mib_before = list(reading.used_mib)
    busy = reading.over(protocol.vram_threshold_mib)
    if busy:
        record.comparable = False
        record.not_comparable_reason = (
            f"VRAM in use before the load above {protocol.vram_threshold_mib:.0f} MiB on "
            + ", ".join(f"GPU{i} ({reading.used_mib[i]:.0f} MiB)" for i in busy)
            + ": another process may push layers off the GPU"
        )


def ensure_unloaded(client: RouterClient, alias: str, protocol: Protocol) -> None:
    if client.model(alias).status not in ("unloaded",):
        client.unload(alias)
        client.wait_for_status(alias, "unloaded", protocol.load_timeout_s)


def measure_alias(client: RouterClient, alias: str, protocol: Protocol, nvml: Nvml, log: Log,
                  target: str = "") -> AliasRecord:
    record = AliasRecord(alias=alias, target=target)
    request = ChatRequest(alias, protocol.prompt, protocol.max_tokens, protocol.temperature, protocol.seed)
    try:
        ensure_unloaded(client, alias, protocol)
        reading = nvml.vram_used()
        log(f"  VRAM in use before load: {describe_vram(reading)}")
        check_vram(record, reading, protocol)
        if not record.comparable:
            log(f"  NOT COMPARABLE: {record.not_comparable_reason}")
            if protocol.strict:
                record.errors.append(f"not measured (--strict): {record.not_comparable_reason}")
                return record

        with StatusWatcher(client.base_url, alias) as watcher:
            warmup = client.stream_chat(request)
        record.cold_load_s = warmup.ttft_s
        record.load_transitions = watcher.transitions
        log(f"  Cold load (warm-up to first token): {warmup.ttft_s:.2f} s"
            + (f"  [{' -> '.join(watcher.transitions)}]" if watcher.transitions else ""))

        info = client.model(alias)
        record.preset_args = list(info.args)
        record.server_build = client.props(alias).get("build_info")

        for i in range(protocol.runs):
            run = run_record(client.stream_chat(request))
            record.runs.append(run)
            log(f"  Run {i + 1}/{protocol.runs}: {_fmt(run.decode_tps)} t/s decode (server), "
                f"{_fmt(run.client_decode_tps)} t/s (client), TTFT {_fmt(run.ttft_ms)} ms, "
                f"{run.output_tokens} tokens"
                + (f", drafted {run.draft_n} accepted {run.draft_n_accepted}" if run.draft_n else ""))
            if run.finish_reason != "length":
                record.comparable = False
                record.not_comparable_reason = (
                    f"run {i + 1} stopped on {run.finish_reason!r} after {run.output_tokens} tokens instead of "
                    f"generating all {protocol.max_tokens}: the server did not honour ignore_eos"
                )
    except ServerUnreachable:
        raise
    except ServerError as e:
        record.errors.append(str(e))
        log(f"  FAILED: {e}")
    finally:
        if protocol.unload_after and not _unreachable(client):
            record.unloaded_after = _unload_and_confirm(client, alias, protocol, record, log)
    return record


def _unreachable(client: RouterClient) -> bool:
    try:
        client.models()
        return False
    except ServerError:
        return True


def _unload_and_confirm(client: RouterClient, alias: str, protocol: Protocol, record: AliasRecord,
                        log: Log) -> bool:
    try:
        ensure_unloaded(client, alias, protocol)
        return True
    except ServerError as e:
        record.errors.append(f"unload failed: {e}")
        log(f"  unload failed: {e}")
        return False


def _fmt(value: float | None) -> str:
    return "n/a" if value is None else f"{value:.1f}"


def select_aliases(client: RouterClient, wanted: tuple[str, ...]) -> list[str]:
    listed = [m.id for m in client.models()]
    if not wanted:
        if not listed:
            raise UnknownAlias(f"the router at {client.base_url} lists no presets")
        return listed
    unknown = [a for a in wanted if a not in listed]
    if unknown:
        raise UnknownAlias(
            f"unknown preset(s) {', '.join(unknown)}; the router at {client.base_url} lists: {', '.join(listed)}"
        )
    return list(wanted)


def provenance(plan: Plan, client: RouterClient, nvml: Nvml, started_at: datetime,
               engine: str = "llama-cpp") -> dict:
    try:
        router_build = client.props().get("build_info")
    except ServerError:
        router_build = None
    gpus = [{"index": g.index, "name": g.name, "memory_total_mib": g.memory_total_mib} for g in nvml.gpus()]
    return {
        "format": FORMAT,
        "llm_bench_version": __version__,
        "started_at": started_at.isoformat(timespec="seconds"),
        "complete": False,
        "host": platform.node(),
        "label": plan.label,
        "engine": engine,
        "server_url": plan.url,
        "server_build": router_build,
        "gpu_driver": nvml.driver_version(),
        "gpus": gpus,
        "nvml_unavailable": None if nvml.available else nvml.unavailable,
        "protocol": plan.protocol.to_toml(),
    }


def run_plan(plan: Plan, log: Log, nvml: Nvml | None = None, target: str = "") -> ResultsWriter:
    """Measure every alias of the plan; the results file is on disk from the first moment."""
    protocol = plan.protocol.with_prompt()
    started_at = datetime.now(timezone.utc)
    with RouterClient(plan.url, timeout=protocol.request_timeout_s) as client, (nvml or Nvml()) as gpus:
        aliases = select_aliases(client, plan.aliases)
        writer = ResultsWriter(
            plan.output_dir,
            ResultSet(provenance(plan, client, gpus, started_at)),
            results_stem(started_at, plan.label or "run"),
        )
        log(f"Results: {writer.path}")
        for n, alias in enumerate(aliases, 1):
            log(f"Benchmark {n}/{len(aliases)}: {alias}")
            t0 = time.perf_counter()
            try:
                record = measure_alias(client, alias, protocol, gpus, log, target=target or plan.label)
            except ServerUnreachable as e:
                writer.add(AliasRecord(alias=alias, target=target or plan.label, errors=[str(e)]))
                raise RunAborted(f"{e}; results so far are in {writer.path}") from e
            writer.add(record)
            log(f"  done in {time.perf_counter() - t0:.1f} s")
        writer.finish(datetime.now(timezone.utc))
    return writer
