"""``llm-bench doctor``: gather every piece of evidence a server and this machine offer, and run the checks.

The evidence: VRAM, power limits, the PCIe link and Xid events (NVML), the kernel log (Xid lines),
the server's log (``server_log.py``), vLLM's command line (``/proc`` or given), compose/.env files,
``/metrics``, the router's preset arguments and build (the llamAmpere fork), and one short probe
request per model (drafting and the memory-bandwidth roofline). Each check is a pure function in the
module of its subject: ``log_checks.py``, ``gpu_checks.py``, ``gpu_errors.py``, ``acceptance.py``,
``vllm_evidence.py``, ``fork.py``.
"""

from __future__ import annotations

import subprocess
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import datetime
from pathlib import Path

from llm_bench.diagnostics import acceptance, busy, fork, gpu_checks, gpu_errors, log_checks, vllm_evidence
from llm_bench.diagnostics.evidence import (
    MARKER,
    detect_fork,
    read_config_files,
    router_presets,
)
from llm_bench.diagnostics.findings import ERROR, INFO, WARNING, Finding
from llm_bench.diagnostics.gpu_errors import KernelLog, PcieWatch
from llm_bench.diagnostics.server_log import LogSource
from llm_bench.engines import Engine
from llm_bench.engines.base import RouterListing
from llm_bench.engines.errors import ServerError
from llm_bench.engines.stream import ChatRequest
from llm_bench.gpu import roofline
from llm_bench.gpu.nvml import Nvml
from llm_bench.results import AliasRecord, run_record, spec_from_runs

Log = Callable[[str], None]


@dataclass(frozen=True)
class DoctorSettings:
    aliases: tuple[str, ...] = ()  # models to probe; empty: those already loaded
    vllm_cmdline: str | None = None  # default: read local processes from /proc
    vram_threshold_mib: float = 2048.0
    power_floor_w: float | None = None
    roofline_min: float = 0.25
    model_bytes: int | None = None  # bytes read per token for the roofline; default: the model file size
    max_tokens: int = 64  # tokens per probe request
    config_files: tuple[Path, ...] = ()  # compose files and .env files the engine was started with
    kernel_log: KernelLog = field(default_factory=KernelLog)
    since: datetime | None = None  # Xid lines before this are old news; None: this boot
    build: str | None = None  # the llama.cpp build's name, when neither the marker nor /props tells
    marker: Path = MARKER


def probe_alias(engine: Engine, alias: str, max_tokens: int = 64, log: Log = lambda m: None) -> AliasRecord:
    """One short streamed request: drafting figures and a decode rate for the acceptance and roofline checks."""
    record = AliasRecord(alias=alias, engine=engine.kind, decode_source=engine.capabilities.decode_source)
    before = engine.spec_counters(alias)
    run = run_record(engine.stream(ChatRequest(alias, "Write a Python function that merges two sorted lists.",
                                               max_tokens, 1.0, 42)), engine)
    after = engine.spec_counters(alias)
    record.runs.append(run)
    record.spec = after.minus(before) if before and after else spec_from_runs(record.runs)
    record.preset_args, record.server_build = engine.describe(alias)
    return record


def log_findings(source: LogSource | None, gpu_count: int, drafts_from_context: bool | None) -> list[Finding]:
    if source is None:
        return [Finding("log", INFO, "no server log to read (not under systemd, and no --log-file/--log-command), "
                        "so GPU offload, FlashAttention kernels and vLLM's acceptance line were not checked.",
                        "give --log-file FILE or --log-command CMD")]
    where = f"the server log ({source.describe()})"
    try:
        text = source.read()
    except (OSError, subprocess.SubprocessError) as e:
        return [Finding("log", WARNING, f"could not read {where}: {e}", "give --log-file or --log-command")]
    return (log_checks.check_offload(text, gpu_count, where) + log_checks.check_fa_fallback(text, where)
            + acceptance.check_acceptance_log(text, where, drafts_from_context, span="the whole log read"))


def _read_quietly(source: LogSource | None) -> str | None:
    """The log for the configuration it logs at startup; a log that cannot be read is log_findings' to say."""
    if source is None:
        return None
    try:
        return source.read()
    except (OSError, subprocess.SubprocessError):
        return None


def kernel_findings(nvml: Nvml, settings: DoctorSettings) -> list[Finding]:
    try:
        text = settings.kernel_log.read(settings.since)
    except OSError as e:
        return [Finding("gpu-xid", INFO, f"could not read {settings.kernel_log.describe()}: {e}",
                        "run as root, or give --kernel-log FILE (e.g. saved `journalctl -k` output)")]
    return gpu_errors.check_xid(gpu_errors.xid_lines(text, settings.since), nvml.pci_indexes(),
                            settings.kernel_log.describe())


def run_doctor(engine: Engine, settings: DoctorSettings, source: LogSource | None, log: Log) -> list[Finding]:
    """``llm-bench doctor``: every check on this server and this machine's GPUs."""
    with Nvml() as nvml:
        return diagnose(engine, nvml, source, settings, log)


def diagnose(engine: Engine, nvml: Nvml, source: LogSource | None, settings: DoctorSettings,
             log: Log = lambda m: None) -> list[Finding]:
    """Every check the evidence allows; raises ServerError only when the server cannot be asked at all,
    OSError when a config file given cannot be read."""
    files = read_config_files(settings.config_files)
    loaded = engine.loaded_models()
    # asleep: not probed by default (a probe would wake it: a reload, not what the server is serving now)
    sleeping = engine.sleeping_models() if isinstance(engine, RouterListing) else []
    findings = gpu_checks.check_vram(nvml.vram_used(), settings.vram_threshold_mib, loaded, sleeping)
    findings += gpu_checks.check_power_floor(nvml, settings.power_floor_w)
    findings += kernel_findings(nvml, settings)
    xids = nvml.xid_watch()
    metrics = engine.metrics_text()
    lines = ([settings.vllm_cmdline] if settings.vllm_cmdline
             else vllm_evidence.serving(vllm_evidence.vllm_command_lines(), engine.base_url))
    startup = _read_quietly(source)  # the log's config line (read again after the probes for the log checks)
    findings += vllm_evidence.check_enforce_eager(lines, startup)
    config = vllm_evidence.vllm_config(lines, files, metrics, startup)
    findings += vllm_evidence.check_dtype_with_speculation(config)
    presets = router_presets(engine)
    findings += vllm_evidence.check_prefix_caching(config, presets)
    findings += fork.check_fork_control(detect_fork(engine, presets, settings.build, settings.marker), presets)
    # before the probes: what else runs now, while the server is sent nothing
    findings += busy.check_busy(busy.look(engine, nvml))
    bandwidth = nvml.memory_bandwidth_gbs(0)
    with PcieWatch(nvml) as pcie:
        for alias in settings.aliases or tuple(loaded):
            findings += probe_findings(engine, alias, settings, bandwidth, log, config.drafts_from_context)
    # After the probes: a probe may load a model, and its load lines are what the log checks read.
    findings += log_findings(source, nvml.count(), config.drafts_from_context)
    findings += gpu_errors.check_pcie(list(pcie.busiest.values()), pcie.first, pcie.last)
    findings += gpu_errors.check_xid_events(xids.poll())
    xids.close()
    return findings


def probe_findings(engine: Engine, alias: str, settings: DoctorSettings, bandwidth: float | None,
                   log: Log, drafts_from_context: bool | None = None) -> list[Finding]:
    """``drafts_from_context``: how the server drafts as its evidence says (an OpenAI server's command line, log,
    /metrics), so that an acceptance trap is blamed on n-gram or on a drafter as it should be."""
    log(f"probing {alias} with one {settings.max_tokens}-token request ...")
    try:
        record = probe_alias(engine, alias, settings.max_tokens)
    except ServerError as e:
        return [Finding("probe", ERROR, f"{alias}: the probe request failed: {e}",
                        "check the server's log for the failure")]
    findings = acceptance.check_acceptance(record, drafts_from_context)
    if bandwidth:
        roofline.apply(record, bandwidth, settings.model_bytes)
        findings += gpu_checks.check_roofline(record, settings.roofline_min)
        if record.roofline_tps:
            s = record.summary("decode_tps")
            log(f"  {alias}: {s.median if s else 0:.1f} t/s of a {record.roofline_tps:.1f} t/s roofline")
    return findings
