"""The doctor's checks around each alias of ``llm-bench run``: findings become warnings on its records."""

from __future__ import annotations

import subprocess
from collections.abc import Callable, Sequence
from dataclasses import dataclass

from llm_bench.diagnostics.acceptance import check_acceptance_log
from llm_bench.diagnostics.evidence import detect_fork, router_presets
from llm_bench.diagnostics.findings import INFO, Finding
from llm_bench.diagnostics.fork import check_fork_control
from llm_bench.diagnostics.gpu_checks import check_power_floor, check_roofline
from llm_bench.diagnostics.gpu_errors import (
    GpuErrorWatch,
    KernelLog,
    PcieWatch,
    check_pcie,
    check_xid,
    check_xid_events,
)
from llm_bench.diagnostics.log_checks import check_fa_fallback, check_offload
from llm_bench.diagnostics.server_log import log_source
from llm_bench.diagnostics.settings import Checks
from llm_bench.diagnostics.vllm_evidence import (
    ServerConfig,
    check_dtype_with_speculation,
    check_prefix_caching,
    serving,
    vllm_command_lines,
    vllm_config,
)
from llm_bench.engines import Engine
from llm_bench.engines.metrics import SpecCounters
from llm_bench.gpu import roofline
from llm_bench.gpu.nvml import Nvml
from llm_bench.results import AliasRecord

Log = Callable[[str], None]


@dataclass(frozen=True)
class BeforeTheRun:
    """Findings by alias, and how an OpenAI server drafts where its command line says (None: unknown), so
    that an acceptance trap in its log is blamed on the right cause; ``config``: all that the server's
    evidence says of it (its speculation, recorded on every record by ``describe_served``)."""

    findings: dict[str, list[Finding]]
    drafts_from_context: bool | None = None
    config: ServerConfig = ServerConfig()


def _log_text(settings: Checks, log: Log) -> str | None:
    source = log_source(settings.log_file, settings.log_command)
    if source is None:
        return None
    try:
        return source.read()
    except (OSError, subprocess.SubprocessError) as e:
        log(f"doctor: could not read the server log from {source.describe()}: {e}")
        return None


def describe_served(engine: Engine, alias: str, record: AliasRecord, config: ServerConfig | None) -> None:
    """What an OpenAI server says of itself, where no preset arguments do: its speculation (command line, the
    log's config line, /metrics) and its context (/v1/models), each with where it was read."""
    if record.preset_args or engine.capabilities.presets:
        return
    config = config or ServerConfig()
    record.speculation = config.speculation
    if config.speculative:
        record.server_evidence.append(f"speculation {config.speculation}: {config.speculative}")
    context = engine.context_length(alias)
    if context is not None:
        record.context = context
        record.server_evidence.append(f"context {context}: max_model_len in /v1/models")
    elif config.context is not None:
        record.context = config.context[0]
        record.server_evidence.append(f"context {config.context[0]}: {config.context[1]}")


def before_the_run(engine: Engine, aliases: Sequence[str], settings: Checks, log: Log) -> BeforeTheRun:
    """What can be said of the aliases before any is measured: a control preset on the llamAmpere fork
    without ``spec-type = none`` (the fork defaults --spec-type to auto, so it would speculate); for an
    OpenAI server, vLLM's dtype with a drafter and prefix caching (local command lines, /metrics)."""
    presets = router_presets(engine)
    fork = detect_fork(engine, presets, settings.build, settings.marker)
    server: list[Finding] = []
    config = ServerConfig()
    if not engine.capabilities.presets:
        config = vllm_config(serving(vllm_command_lines(), engine.base_url), None, engine.metrics_text(),
                             _log_text(settings, log))
        server = check_dtype_with_speculation(config) + check_prefix_caching(config)
    for finding in server:
        log(f"!!! {finding.text()}")
    out: dict[str, list[Finding]] = {}
    for alias in aliases:
        own = check_fork_control(fork, {alias: presets[alias]} if alias in presets else {})
        for finding in own:
            log(f"!!! {finding.text()}")
        if server or own:
            out[alias] = server + own
    return BeforeTheRun(out, config.drafts_from_context, config)


def _run_counters(records: Sequence[AliasRecord]) -> SpecCounters | None:
    """The /metrics counters of the alias's measured requests, summed over its records."""
    specs = [r.spec for r in records if r.spec is not None and r.spec.drafts is not None]
    if not specs:
        return None
    return SpecCounters(sum(s.draft_tokens for s in specs), sum(s.accepted_tokens for s in specs),
                        sum(s.drafts or 0.0 for s in specs))


class InRunChecks:
    """The doctor's checks around one alias of ``llm-bench run``; findings become record warnings."""

    def __init__(self, nvml: Nvml, log: Log, settings: Checks = Checks(), carried: Sequence[Finding] = (),
                 drafts_from_context: bool | None = None):
        self.nvml = nvml
        self.log = log
        self.drafts_from_context = drafts_from_context
        self.source = log_source(settings.log_file, settings.log_command)
        self.floor_w = settings.power_floor_w
        self.min_fraction = settings.roofline_min
        self.carried = list(carried)  # found before the run (before_the_run), attached to this alias's records
        self.gpu_errors = GpuErrorWatch(nvml, KernelLog(file=settings.kernel_log))
        self.pcie = PcieWatch(nvml)
        self._mark = 0

    def _read(self) -> str | None:
        if self.source is None:
            return None
        try:
            return self.source.read()
        except (OSError, subprocess.SubprocessError) as e:
            self.log(f"  doctor: could not read the server log from {self.source.describe()}: {e}")
            return None

    def read_log(self) -> str | None:
        """The server's log as it is now (None where there is none or it cannot be read)."""
        return self._read()

    def start(self) -> None:
        """Before the alias is loaded: remember where its part of the logs begins; watch the GPUs."""
        text = self._read()
        self._mark = len(text) if text is not None else 0
        self.gpu_errors.start()
        self.pcie.__enter__()

    def _gpu_findings(self) -> list[Finding]:
        self.pcie.__exit__(None, None, None)
        findings = check_pcie(list(self.pcie.busiest.values()), self.pcie.first, self.pcie.last)
        lines, events = self.gpu_errors.stop()
        findings += check_xid(lines, self.nvml.pci_indexes(), self.gpu_errors.log.describe())
        return findings + check_xid_events(events)

    def finish(self, records: list[AliasRecord], caching: Sequence[AliasRecord] = ()) -> list[Finding]:
        """``caching``: the records of workloads that measure the server's prompt cache."""
        findings: list[Finding] = self.carried + check_power_floor(self.nvml, self.floor_w) + self._gpu_findings()
        text = self._read()
        if text is not None and self.source is not None:
            since = text[self._mark:] if len(text) >= self._mark else text  # a rotated log starts over
            where = f"the server log ({self.source.describe()})"
            findings += [f for f in check_offload(since, self.nvml.count(), where) if f.severity != INFO]
            findings += check_fa_fallback(since, where)
            findings += check_acceptance_log(since, where, self.drafts_from_context, _run_counters(records),
                                             "the part logged while this alias was measured")
        # a workload that depends on a cached prefix, measured on a preset that turned the cache off
        findings += check_prefix_caching(ServerConfig(), {r.alias: r.preset_args for r in caching if r.preset_args})
        bandwidth = self.nvml.memory_bandwidth_gbs(0) if self.nvml.available else None
        for record in records:
            if bandwidth and record.preset_args:
                roofline.apply(record, bandwidth)
            own = check_roofline(record, self.min_fraction)
            for finding in own:
                self.log(f"  !!! {finding.text()}")
            for finding in findings + own:
                if finding.warning() not in record.warnings:
                    record.warnings.append(finding.warning())
        for finding in findings[len(self.carried):]:
            self.log(f"  !!! {finding.text()}")
        return findings
