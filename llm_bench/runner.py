"""The measurement protocol: the fixed sequence of steps applied to every preset or model.

For each alias: make it cold (unload), read VRAM in use, time a cold-load warm-up, run the
plan's workloads, unload again. Each alias's records are saved before the next alias starts.
"""

from __future__ import annotations

import functools
import time
import typing
from collections.abc import Callable
from dataclasses import replace
from datetime import datetime, timezone
from pathlib import Path

from llm_bench.diagnostics.evidence import marker_package, read_marker
from llm_bench.diagnostics.in_run import InRunChecks, before_the_run, describe_served
from llm_bench.diagnostics.vllm_evidence import ServerConfig
from llm_bench.engines import Engine, open_engine, select_models
from llm_bench.engines.base import RouterListing
from llm_bench.engines.errors import ServerError, ServerUnreachable
from llm_bench.fingerprint import Sources
from llm_bench.gpu.nvml import Nvml, VramReading
from llm_bench.gpu.telemetry import sampling
from llm_bench.interference.watch import AliasWindow
from llm_bench.plan import Plan, Protocol
from llm_bench.preset_args import is_speculative
from llm_bench.provenance import provenance, server_build
from llm_bench.results import FORMAT, AliasRecord, ResultSet, ResultsWriter, results_stem
from llm_bench.support.progress import progress
from llm_bench.workloads import of_record, workload
from llm_bench.workloads.base import Keep
from llm_bench.workloads.common import WorkloadInterrupted, chat_request, derive
from llm_bench.workloads.standard import STANDARD

# The warm-up times the load to its first token; a few tokens more have the server build its decode graphs
# (and a drafter draft) before the first measured run. The rest of max_tokens would only cost time: 512
# tokens of a 27B model are 15 s a preset.
WARM_UP_TOKENS = 16

Log = Callable[[str], None]


class Window(typing.Protocol):
    """Told when an alias's measured window opens (after its warm-up) and closes (before its unload)."""

    def opened(self) -> None: ...

    def closed(self) -> None: ...


class RunAborted(RuntimeError):
    """The run cannot go on (the server went away); what was measured is already saved."""


class AliasUnreachable(Exception):
    """The server went away while an alias was measured (``cause``); what was measured of it, and a record
    of the failure, were already kept."""

    def __init__(self, cause: ServerUnreachable):
        super().__init__(str(cause))
        self.cause = cause


class RunInterrupted(KeyboardInterrupt):
    """Ctrl-C during a run; everything measured, the interrupted alias's finished runs too, is in ``path``."""

    def __init__(self, path: Path):
        super().__init__()
        self.path = path


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


def measure_alias(engine: Engine, alias: str, protocol: Protocol, nvml: Nvml, log: Log, keep: Keep,
                  target: str = "", served: ServerConfig | None = None, window: Window | None = None) -> None:
    """Every workload of the protocol for one alias, each record to ``keep`` as it finishes (the alias's
    base record when nothing else was measured); a failure ends the alias, not the run. Ctrl-C ends it (the
    KeyboardInterrupt goes on) with what was measured kept, the finished runs of the workload it stopped
    too; the unload that follows is marked on the kept records, so the caller writes them once more."""
    base = AliasRecord(alias=alias, target=target, engine=engine.kind, decode_source=engine.capabilities.decode_source,
                       thinking=None if protocol.thinking == "off" else protocol.thinking)
    records: list[AliasRecord] = []

    def kept(record: AliasRecord) -> None:
        records.append(record)
        keep(record)

    stop: KeyboardInterrupt | None = None
    try:
        _measure(engine, alias, protocol, nvml, log, base, kept, served, window)
        if not records:
            kept(base)
    except KeyboardInterrupt as e:  # the workload's records are kept, the one it stopped with marked interrupted
        stop = e
    finally:
        if window is not None:
            window.closed()  # after the last measured request, before the unload
        if protocol.unload_after:
            try:
                unloaded = _release(engine, alias, records or [base], log)
            except KeyboardInterrupt as e:  # Ctrl-C (again) during the unload: leave it, keep what was measured
                stop, unloaded = stop or e, None
            for record in records or [base]:
                record.unloaded_after = unloaded
    if stop is not None:
        raise stop


def _measure(engine: Engine, alias: str, protocol: Protocol, nvml: Nvml, log: Log, base: AliasRecord,
             keep: Keep, served: ServerConfig | None = None, window: Window | None = None) -> None:
    """measure_alias's steps, each record to ``keep`` as it finishes (a failure's own record too)."""
    current = STANDARD.name  # the workload a failure is recorded against
    try:
        cold = engine.make_cold(alias)
        reading = nvml.vram_used()
        log(f"  VRAM in use before load: {describe_vram(reading)}")
        check_vram(base, reading, protocol)
        if not base.comparable and isinstance(engine, RouterListing) and (asleep := engine.sleeping_models()):
            # not another process: the router's own sleeping instances, each keeping its GPU context
            base.not_comparable_reason = (f"{base.not_comparable_reason} (the router has {', '.join(asleep)} "
                                          "asleep: a process each, keeping its GPU context; unload it first)")
        if not base.comparable:
            log(f"  NOT COMPARABLE: {base.not_comparable_reason}")
            if protocol.strict:
                base.errors.append(f"not measured (--strict): {base.not_comparable_reason}")
                return

        warmup, transitions = engine.warm_up(chat_request(alias, protocol, protocol.prompt,
                                                          max_tokens=min(protocol.max_tokens, WARM_UP_TOKENS)))
        if warmup.ttft_s is None:
            raise ServerError("the warm-up request finished without streaming a single token")
        if cold:
            base.cold_load_s = warmup.ttft_s
            base.load_transitions = transitions
            base.load_stages_s = (engine.load_stages() or None) if isinstance(engine, RouterListing) else None
            log(f"  Cold load (warm-up to first token): {warmup.ttft_s:.2f} s"
                + (f"  [{' -> '.join(transitions)}]" if transitions else "")
                + (f"; of it {', '.join(f'{k} {v:.2f} s' for k, v in base.load_stages_s.items())}"
                   if base.load_stages_s else ""))
        else:
            log(f"  Warm-up: first token after {warmup.ttft_s:.2f} s (the server keeps its model loaded)")
        base.preset_args, base.server_build = engine.describe(alias)
        check_speculation(engine, alias, base, log)
        describe_served(engine, alias, base, served)  # an OpenAI server: what it says of itself

        if window is not None:
            window.opened()  # just before the first measured request
        for current in protocol.workloads:
            workload(current).run(engine, alias, protocol, base, log, keep)
    except WorkloadInterrupted as e:  # the runs measured before the failure are kept, beside its error
        log(f"  FAILED: {e}")
        if isinstance(e.cause, ServerUnreachable):
            raise AliasUnreachable(e.cause) from e.cause
    except ServerUnreachable as e:
        failed = derive(base, workload=current)
        failed.errors.append(str(e))
        keep(failed)
        raise AliasUnreachable(e) from e
    except ServerError as e:
        failed = derive(base, workload=current)
        failed.errors.append(str(e))
        keep(failed)
        log(f"  FAILED: {e}")
    except Exception as e:  # noqa: BLE001 - a bug of ours must not cost the runs already measured
        failed = derive(base, workload=current)
        failed.errors.append(f"llm-bench failed unexpectedly ({type(e).__name__}: {e}); please report this")
        keep(failed)
        log(f"  FAILED: {failed.errors[-1]}")


def check_speculation(engine: Engine, alias: str, record: AliasRecord, log: Log) -> None:
    """What the instance has in effect (llama.cpp's /slots), against what its preset asks for: a preset that
    drafts and an instance that runs none (a drafter it could not use) measures plain decoding."""
    if not isinstance(engine, RouterListing):
        return
    in_effect = engine.speculation(alias)
    if in_effect is None:
        return
    log(f"  Speculation in effect (/slots): {in_effect}")
    if in_effect == "none" and is_speculative(record.preset_args):
        record.warnings.append("the preset asks for speculative decoding, but the instance runs none "
                               "(its /slots say so): this measures plain decoding")


def _release(engine: Engine, alias: str, records: list[AliasRecord], log: Log) -> bool | None:
    if not engine.capabilities.unload:
        return None
    try:
        engine.release(alias)
        return True
    except ServerUnreachable:
        return False
    except ServerError as e:
        records[-1].errors.append(f"unload failed: {e}")
        log(f"  unload failed: {e}")
        return False


def run_meta(plan: Plan, engine: Engine, nvml: Nvml, started_at: datetime, sources: Sources | None = None) -> dict:
    build = server_build(engine)
    # the fingerprint reads the same marker as the checks (plan.checks.marker) unless told otherwise
    sources = sources or Sources(marker=plan.checks.marker)
    return provenance(FORMAT, nvml, started_at, sources=sources, server_build=build, server_url=plan.url) | {
        "complete": False,
        "label": plan.label,
        "engine": engine.kind,
        "server_url": plan.url,
        "server_build": build,
        # the NixOS marker's account of that build (it describes a llama.cpp router), with the source
        # revision a version cannot give
        "llama_cpp_package": marker_package(read_marker(plan.checks.marker), plan.url)
        if engine.capabilities.presets else None,
        "api_key": plan.api_key.describe(),
        # how this engine makes every measured request process its whole prompt
        "protocol": plan.protocol.to_toml() | ({} if plan.protocol.prompt_cache
                                               else {"cold_prompt": engine.cold_prompt}),
    }


def needs_prompt_cache(record: AliasRecord) -> bool:
    measured = of_record(record.workload)
    return measured is not None and measured.needs_prompt_cache


def streams(protocol: Protocol) -> int:
    """The most simultaneous streams any of the protocol's workloads opens."""
    return max(w.streams(w.settings_in(protocol)) for w in map(workload, protocol.workloads))


def _keep(writer: ResultsWriter, measured: list[AliasRecord], record: AliasRecord) -> None:
    measured.append(record)
    writer.add(record)


def run_plan(plan: Plan, log: Log, nvml: Nvml | None = None, target: str = "",
             skip: Callable[[str], bool] = lambda alias: False, sources: Sources | None = None) -> ResultsWriter:
    """Measure every alias of the plan; the results file is on disk from the first moment.
    ``sources``: where the build-and-rig fingerprint is read (llm_bench.fingerprint)."""
    protocol = plan.protocol.with_prompt()
    started_at = datetime.now(timezone.utc)
    engine = open_engine(plan.engine, plan.url, timeout=protocol.request_timeout_s,
                         api_key=plan.api_key.read(), metrics_url=plan.metrics_url,
                         load_timeout=protocol.load_timeout_s, streams=streams(protocol),
                         metrics_key=plan.metrics_key)
    try:
        with nvml or Nvml() as gpus:
            aliases = [a for a in select_models(engine, plan.aliases, log) if not skip(a)]
            early = before_the_run(engine, aliases, plan.checks, log)
            writer = ResultsWriter(plan.output_dir, ResultSet(run_meta(plan, engine, gpus, started_at, sources)),
                                   results_stem(started_at, plan.label or "run"))
            log(f"Results: {writer.path}")
            durations: list[float] = []
            try:
                for n, alias in enumerate(aliases, 1):
                    log(f"Benchmark {progress(n, len(aliases), durations)}: {alias}")
                    t0 = time.perf_counter()
                    checks = InRunChecks(gpus, log, plan.checks, early.findings.get(alias, ()),
                                         early.drafts_from_context)
                    checks.start()
                    measured: list[AliasRecord] = []  # this alias's records, each in the file as it finishes
                    watched = AliasWindow(engine, alias, gpus, plan.url, plan.checks.interference_limits(),
                                           plan.checks.engine_container, log, checks.read_log)
                    try:
                        with sampling(gpus):
                            measure_alias(engine, alias, protocol, gpus, log, functools.partial(_keep, writer, measured),
                                          target=target or plan.label, served=early.config, window=watched)
                        watched.apply(measured)
                        checks.finish(measured, [r for r in measured if needs_prompt_cache(r)])
                    except AliasUnreachable as e:
                        writer.flush()
                        raise RunAborted(f"{e}; results so far are in {writer.path}") from e.cause
                    writer.flush()  # what the checks and the unload added to the kept records
                    protocol = protocol.carried(measured)
                    durations.append(time.perf_counter() - t0)
                    log(f"  done in {durations[-1]:.1f} s")
                if plan.checks.drift and len(aliases) > 1:
                    check_drift(engine, aliases[0], protocol, gpus, log, writer, plan, target)
            except KeyboardInterrupt as e:  # the alias it was on keeps its finished runs, marked interrupted
                writer.flush()
                raise RunInterrupted(writer.path) from e
            writer.finish(datetime.now(timezone.utc))
    finally:
        engine.close()
    return writer


def check_drift(engine: Engine, alias: str, protocol: Protocol, gpus: Nvml, log: Log, writer: ResultsWriter,
                plan: Plan, target: str = "") -> None:
    """``[checks] drift``: the run's first alias measured again (standard workload) after the last one; its decode
    rates at the start and at the end go on every record of the run, where the report judges them."""
    first = next((r for r in writer.result_set.aliases if r.alias == alias and r.workload == STANDARD.name
                  and r.runs), None)
    if first is None:
        return
    log(f"Drift check: {alias} measured again")
    again: list[AliasRecord] = []
    window = AliasWindow(engine, alias, gpus, plan.url, plan.checks.interference_limits(),
                         plan.checks.engine_container, log)
    try:
        measure_alias(engine, alias, replace(protocol, workloads=(STANDARD.name,)), gpus, log, again.append,
                      target=target or plan.label, window=window)
    except AliasUnreachable as e:
        log(f"  drift check failed: {e}")
        return
    window.apply(again)
    end = next((r for r in again if r.runs and not r.errors), None)
    drift: dict[str, object] = {"alias": alias, "start": [r.decode_tps for r in first.runs if r.decode_tps],
                                "end": [] if end is None else [r.decode_tps for r in end.runs if r.decode_tps]}
    if end is not None and not end.comparable:
        drift["end_not_comparable"] = end.not_comparable_reason or "not comparable"
    writer.result_set.meta["drift"] = drift
    for record in writer.result_set.aliases:
        record.drift = drift
    writer.flush()
