"""``llm-bench doctor``: gather every piece of evidence a server and this machine offer, and run the checks.

The evidence: VRAM and power limits (NVML), the server's log (``server_log.py``), vLLM's command
line (``/proc`` or given) and ``/metrics``, and one short probe request per model (drafting and the
memory-bandwidth roofline). Each check is a pure function in ``checks.py``.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass

from llm_bench.diagnostics import checks
from llm_bench.diagnostics.findings import ERROR, INFO, WARNING, Finding
from llm_bench.diagnostics.server_log import LogSource
from llm_bench.engines import Engine
from llm_bench.engines.errors import ServerError
from llm_bench.engines.stream import ChatRequest
from llm_bench.gpu import roofline
from llm_bench.gpu.nvml import Nvml
from llm_bench.results import AliasRecord
from llm_bench.workloads.common import run_record, spec_delta

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


def probe_alias(engine: Engine, alias: str, max_tokens: int = 64, log: Log = lambda m: None) -> AliasRecord:
    """One short streamed request: drafting figures and a decode rate for the acceptance and roofline checks."""
    record = AliasRecord(alias=alias, engine=engine.kind, decode_source=engine.decode_source)
    before = engine.spec_counters(alias)
    run = run_record(engine.stream(ChatRequest(alias, "Write a Python function that merges two sorted lists.",
                                               max_tokens, 1.0, 42)), engine.kind)
    after = engine.spec_counters(alias)
    record.runs.append(run)
    record.spec = spec_delta(before, after, record.runs)
    record.preset_args, record.server_build = engine.describe(alias)
    return record


def diagnose(engine: Engine, nvml: Nvml, source: LogSource | None, settings: DoctorSettings,
             log: Log = lambda m: None) -> list[Finding]:
    """Every check the evidence allows; raises ServerError only when the server cannot be asked at all."""
    loaded = engine.loaded_models()
    findings = checks.check_vram(nvml.vram_used(), settings.vram_threshold_mib, loaded)
    findings += checks.check_power_floor(nvml, settings.power_floor_w)
    if source is not None:
        where = f"the server log ({source.describe()})"
        try:
            text = source.read()
            findings += checks.check_offload(text, nvml.count(), where)
            findings += checks.check_fa_fallback(text, where)
        except OSError as e:
            findings.append(Finding("log", WARNING, f"could not read {where}: {e}", "give --log-file or --log-command"))
    else:
        findings.append(Finding("log", INFO, "no server log to read (not under systemd, and no "
                                "--log-file/--log-command), so GPU offload and FlashAttention kernels "
                                "were not checked.", "give --log-file FILE or --log-command CMD"))
    lines = [settings.vllm_cmdline] if settings.vllm_cmdline else checks.vllm_command_lines()
    findings += checks.check_enforce_eager(lines, engine.metrics_text())
    bandwidth = nvml.memory_bandwidth_gbs(0)
    for alias in settings.aliases or tuple(loaded):
        log(f"probing {alias} with one {settings.max_tokens}-token request ...")
        try:
            record = probe_alias(engine, alias, settings.max_tokens)
        except ServerError as e:
            findings.append(Finding("probe", ERROR, f"{alias}: the probe request failed: {e}",
                                    "check the server's log for the failure"))
            continue
        findings += checks.check_acceptance(record)
        if bandwidth:
            roofline.apply(record, bandwidth, settings.model_bytes)
            findings += checks.check_roofline(record, settings.roofline_min)
            if record.roofline_tps:
                s = record.summary("decode_tps")
                log(f"  {alias}: {s.median if s else 0:.1f} t/s of a {record.roofline_tps:.1f} t/s roofline")
    return findings
