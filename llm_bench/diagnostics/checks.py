"""The doctor's checks: pure functions from evidence (log text, command lines, NVML readings,
a measured record) to findings. Gathering the evidence is ``doctor.py``'s and ``in_run.py``'s job."""

from __future__ import annotations

import json
import re
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path

from llm_bench.diagnostics.findings import ERROR, INFO, WARNING, Finding
from llm_bench.diagnostics.settings import Checks
from llm_bench.engines.metrics import parse_prometheus
from llm_bench.gpu import roofline
from llm_bench.gpu.nvml import Nvml, PcieLink, VramReading, XidEvent
from llm_bench.preset_args import drafts_from_context, names_speculation
from llm_bench.results import AliasRecord

# llama.cpp src/llama-model.cpp: LLAMA_LOG_INFO("%s: offloaded %d/%d layers to GPU\n", ...)
OFFLOADED = re.compile(r"offloaded (\d+)/(\d+) layers to GPU")
# ggml/src/ggml-cuda/fattn.cu: GGML_LOG_WARN("%s: no FlashAttention vector kernel compiled for K/V types
# %s-%s, converting K and V to f16 instead (slow). Add \"%s-%s\" to GGML_CUDA_FA_QUANTS to compile it.\n")
FA_FALLBACK = re.compile(r"no FlashAttention vector kernel compiled for K/V types (\S+)-(\S+), converting K and V "
                         r"to f16 instead")
# router: "load: spawning server instance with name=ALIAS on port PORT"; instance lines start "[PORT] "
SPAWN = re.compile(r"spawning server instance with name=(\S+) on port (\d+)")
INSTANCE_LINE = re.compile(r"^\[(\d+)\] ")
MODEL_LOADING = re.compile(r"load_model: loading model '([^']+)'")
# ggml/src/ggml-cuda/ggml-cuda.cu, ggml_cuda_init: "failed to initialize CUDA: %s" or
# "found %d CUDA devices (Total VRAM: %zu MiB):"
CUDA_INIT_FAILED = re.compile(r"ggml_cuda_init: failed to initialize CUDA")
CUDA_FOUND = re.compile(r"ggml_cuda_init: found \d+ CUDA devices")


def check_vram(reading: VramReading, threshold_mib: float, loaded: Sequence[str] = ()) -> list[Finding]:
    if reading.used_mib is None:
        return [Finding("vram", INFO, f"VRAM in use could not be read ({reading.unavailable}).",
                        "install the NVIDIA driver and pynvml to let llm-bench check VRAM before loads")]
    busy = reading.over(threshold_mib)
    if not busy:
        return []
    where = ", ".join(f"GPU{i} {reading.used_mib[i]:.0f} MiB" for i in busy)
    if loaded:
        return [Finding("vram", WARNING,
                        f"VRAM in use above {threshold_mib:.0f} MiB ({where}) while the server has "
                        f"{', '.join(loaded)} loaded; that model's own memory counts here.",
                        "unload the server's models (or stop other GPU processes) before measuring a cold load")]
    return [Finding("vram", ERROR,
                    f"VRAM in use above {threshold_mib:.0f} MiB before a load ({where}) with no model of the "
                    "server loaded: another process holds it, and llama.cpp's --fit may then put layers on the CPU.",
                    "find the process with `nvidia-smi --query-compute-apps=pid,name,used_memory --format=csv` "
                    "and stop it (a desktop session, another server, a stuck container)")]


def instance_lines(log_text: str) -> dict[str, list[str]]:
    """Log lines per alias: a router's instance lines carry ``[port]``; other lines go under ''."""
    port_alias: dict[str, str] = {}
    out: dict[str, list[str]] = {}
    for line in log_text.splitlines():
        spawn = SPAWN.search(line)
        if spawn:
            port_alias[spawn[2]] = spawn[1]
        inst = INSTANCE_LINE.match(line)
        alias = port_alias.get(inst[1], f"port {inst[1]}") if inst else ""
        out.setdefault(alias, []).append(line)
    return out


def check_offload(log_text: str, gpu_count: int, source: str = "the server log") -> list[Finding]:
    findings = []
    saw_load = False
    for alias, lines in instance_lines(log_text).items():
        who = f"{alias}: " if alias else ""
        offloads = [(line, found) for line in lines if (found := OFFLOADED.search(line))]
        saw_load = saw_load or any(MODEL_LOADING.search(line) for line in lines) or bool(offloads)
        if offloads:
            line, m = offloads[-1]
            done, total = int(m[1]), int(m[2])
            if done < total:
                findings.append(Finding(
                    "offload", ERROR,
                    f"{who}only {done} of {total} layers are on the GPU ({source}: \"{line.strip()}\"); "
                    "the rest run on the CPU, several times slower.",
                    "free VRAM (see the vram check), lower --ctx-size or use a smaller KV type, and set "
                    "--n-gpu-layers 999 (or -ngl all) instead of relying on --fit"))
        elif gpu_count and any(MODEL_LOADING.search(line) for line in lines):
            findings.append(no_gpu(who, source, gpu_count, log_text))
    if not saw_load:
        return [Finding("offload", INFO, f"{source} shows no model load, so GPU offload could not be checked.",
                        "load a model (or point --log-file/--log-command at the log of the load) and rerun")]
    return findings


def no_gpu(who: str, source: str, gpu_count: int, log_text: str) -> Finding:
    """A model loaded with no layer on a GPU although NVML sees one: every figure measures the CPU."""
    failed = next((line.strip() for line in log_text.splitlines() if CUDA_INIT_FAILED.search(line)), None)
    if failed:
        why = f"CUDA could not start (\"{failed}\")"
    elif not CUDA_FOUND.search(log_text):
        why = (f"{source} names no CUDA device (no \"ggml_cuda_init: found N CUDA devices\"): this llama-server "
               "was built without CUDA")
    else:
        why = "no layer was placed on it"
    return Finding(
        "no-gpu", ERROR,
        f"{who}the router runs without a GPU: the model was loaded but {source} never says \"offloaded N/M layers "
        f"to GPU\" although NVML sees {gpu_count} GPU(s); {why}. Every figure measures the CPU.",
        "use a CUDA build (the flake's packages, or cmake -DGGML_CUDA=ON); on NixOS check that `llama-server "
        "--list-devices` shows CUDA0 (services.llama-cpp.cuda refuses to start without it: NVIDIA driver, "
        "nvidia_uvm loaded, the unit's DeviceAllow)")


def check_fa_fallback(log_text: str, source: str = "the server log") -> list[Finding]:
    findings = []
    seen = set()
    for alias, lines in instance_lines(log_text).items():
        for line in lines:
            m = FA_FALLBACK.search(line)
            if m and (alias, m[1], m[2]) not in seen:
                seen.add((alias, m[1], m[2]))
                who = f"{alias}: " if alias else ""
                findings.append(Finding(
                    "flash-attention", ERROR,
                    f"{who}no FlashAttention kernel is compiled for K/V types {m[1]}-{m[2]}, so llama.cpp converts "
                    f"K and V to f16 on every step ({source}: \"{line.strip()[:200]}\").",
                    f"use the same type for K and V (e.g. --cache-type-k {m[1]} --cache-type-v {m[1]}), or rebuild "
                    f"with GGML_CUDA_FA_QUANTS including \"{m[1]}-{m[2]}\" (or -DGGML_CUDA_FA_ALL_QUANTS=ON)"))
    return findings


def vllm_command_lines(proc: Path = Path("/proc")) -> list[str]:
    """Command lines of local processes that run vLLM (also those in containers on this host)."""
    lines = []
    for entry in proc.glob("[0-9]*/cmdline"):
        try:
            argv = entry.read_bytes().split(b"\0")
        except OSError:
            continue
        text = " ".join(a.decode(errors="replace") for a in argv if a)
        if "vllm" in text and ("serve" in text or "api_server" in text):
            lines.append(text)
    return lines


def check_enforce_eager(command_lines: Sequence[str] = (), metrics_text: str | None = None) -> list[Finding]:
    fix = ("remove --enforce-eager (and enforce_eager from any config file) so vLLM captures CUDA graphs and "
           "compiles the model; if it was a workaround for a bug, check that the bug still exists")
    for line in command_lines:
        if re.search(r"(^|\s)--enforce-eager(\s|=true|=True|$)", line):
            return [Finding("vllm-eager", ERROR, f"vLLM runs with --enforce-eager (command line: {line[:300]}); "
                            "eager mode decodes several times slower.", fix)]
    if metrics_text:
        for sample in parse_prometheus(metrics_text):
            if sample.labels.get("enforce_eager", "").lower() == "true":
                return [Finding("vllm-eager", ERROR,
                                f"vLLM reports enforce_eager=\"{sample.labels['enforce_eager']}\" in {sample.name}.",
                                fix)]
    return []


def check_power_floor(nvml: Nvml, floor_w: float | None) -> list[Finding]:
    if not floor_w or not nvml.available:
        return []
    findings = []
    for i in range(nvml.count()):
        limits = nvml.power_limits(i)
        if limits is not None and limits.current_w < floor_w:
            findings.append(Finding(
                "power-limit", WARNING,
                f"GPU{i} power limit is {limits.current_w:.0f} W, below the floor of {floor_w:.0f} W"
                + (f" (default {limits.default_w:.0f} W)" if limits.default_w else "")
                + "; decode will be slower than this card can do (a leftover power sweep?).",
                f"raise it: sudo nvidia-smi -i {i} -pl {limits.default_w or floor_w:.0f} "
                "(or run any llm-bench command to restore limits a killed power sweep left behind)"))
    return findings


def check_roofline(record: AliasRecord, min_fraction: float = Checks.roofline_min) -> list[Finding]:
    s = record.summary("decode_tps")
    frac = roofline.fraction(s.median if s else None, record.roofline_tps)
    if s is None or frac is None or frac >= min_fraction or not record.roofline_tps or not record.model_bytes:
        return []
    return [Finding(
        "roofline", WARNING,
        f"{record.configuration}: decode {s.median:.1f} t/s is {frac:.1%} of the memory-bandwidth roofline "
        f"({record.roofline_tps:.1f} t/s = {record.memory_bandwidth_gbs:.0f} GB/s / "
        f"{record.model_bytes / 1e9:.2f} GB per token), below {min_fraction:.0%}.",
        "look for layers on the CPU (offload check), a missing FlashAttention kernel, eager mode, a low power limit, "
        "or a CPU-bound sampler; a healthy single-stream decode reaches well over half the roofline")]


# Below this acceptance rate a drafting server is rejecting (nearly) every draft token.
ACCEPTANCE_TRAP_RATE = 0.01


NGRAM_CAUSE = ("N-gram drafting proposes what repeats the context, and this output repeats little of it; it pays "
               "off where answers copy their context (code edits, agents' tool results).")
DTYPE_CAUSE = ("the target runs in a different dtype from the one the drafter was trained with "
               "(e.g. vLLM --dtype half instead of bfloat16); also check that the drafter belongs to this target model.")
EITHER_CAUSE = (f"Known causes: with a drafter (EAGLE, MTP, a draft model), {DTYPE_CAUSE} With n-gram or suffix "
                "drafting (no drafter), the output repeats little of its context.")
NGRAM_FIX = "turn n-gram drafting off for this workload, or measure it where outputs repeat their context"
DTYPE_FIX = ("serve the target in the dtype its drafter was trained with (bfloat16, not --dtype half), "
             "use a drafter made for this model, or turn speculative decoding off")
EITHER_FIX = f"{DTYPE_FIX}; for n-gram or suffix drafting: {NGRAM_FIX}"


def trap_cause(drafts_from_context: bool | None) -> tuple[str, str]:
    """What an acceptance trap is blamed on, and its fix: n-gram's cause, a drafter's, or both where the
    evidence does not say how the server drafts."""
    if drafts_from_context is None:
        return EITHER_CAUSE, EITHER_FIX
    return (NGRAM_CAUSE, NGRAM_FIX) if drafts_from_context else ("Known cause: " + DTYPE_CAUSE, DTYPE_FIX)


def check_acceptance_trap(record: AliasRecord, log: Callable[[str], None]) -> None:
    """A drafting server that accepts (nearly) nothing: a warning on the record, and said at once."""
    spec = record.spec
    if spec is None or not spec.draft_tokens or (spec.acceptance_rate or 0.0) >= ACCEPTANCE_TRAP_RATE:
        return
    length = spec.mean_acceptance_length
    message = (
        f"ACCEPTANCE TRAP: the server drafted {spec.draft_tokens:.0f} tokens and accepted "
        f"{spec.accepted_tokens:.0f} ({spec.acceptance_rate:.1%}"
        + (f", mean acceptance length {length:.2f}" if length is not None else "")
        + "): speculative decoding only costs time here. "
        + trap_cause(drafts_from_context(record.preset_args))[0]
    )
    record.warnings.append(message)
    log("  !!! " + message)


def check_acceptance(record: AliasRecord) -> list[Finding]:
    """The workloads' acceptance-trap check, turned into a finding."""
    before = len(record.warnings)
    check_acceptance_trap(record, lambda message: None)
    fix = trap_cause(drafts_from_context(record.preset_args))[1]
    return [Finding("acceptance", ERROR, w.removeprefix("ACCEPTANCE TRAP: "), fix) for w in record.warnings[before:]]


# --- vLLM: the dtype trap, the acceptance trap in its log, prefix caching ---------------------------

HALF_DTYPES = {"half", "float16", "fp16"}
OFF_VALUES = {"0", "false", "off", "no", "none", ""}
# vllm/v1/spec_decode/metrics.py SpecDecodingLogging.log(): "SpecDecoding metrics: Mean acceptance length: %.2f,
# Accepted throughput: %.2f tokens/s, Drafted throughput: %.2f tokens/s, Accepted: %d tokens, Drafted: %d tokens, ..."
VLLM_SPEC_LOG = re.compile(r"Mean acceptance length: ([\d.]+), Accepted throughput: ([\d.]+) tokens/s, "
                           r"Drafted throughput: ([\d.]+) tokens/s(?:, Accepted: (\d+) tokens, Drafted: (\d+) tokens)?")
# vLLM's v0 engine: "SpecDecoding metrics: Draft acceptance rate: %.1f%%, Accepted: %d tokens, Drafted: %d tokens"
VLLM_SPEC_LOG_V0 = re.compile(r"SpecDecoding metrics: Draft acceptance rate: ([\d.]+)%, Accepted: (\d+) tokens, "
                              r"Drafted: (\d+) tokens")
# a KEY=VALUE (.env, compose `environment:` list) or KEY: VALUE (compose mapping) line
SETTING = re.compile(r"""^\s*(?:-\s*)?(?:export\s+)?["']?([A-Za-z_][A-Za-z0-9_]*)["']?\s*[=:]\s*["']?([^"'#\s]*)""")


def flag_value(text: str, *flags: str) -> str | None:
    """The value after the last of ``flags`` in a command line, a compose ``command:`` string or list."""
    found = None
    for flag in flags:
        for m in re.finditer(re.escape(flag) + r"""["']?(?:\s*,\s*|\s+|=)["']?([^\s"',\]]+)""", text):
            found = m[1]
    return found


def has_flag(text: str, *flags: str) -> bool:
    return any(re.search(re.escape(flag) + r"""(?=["'\s=,\]]|$)""", text) for flag in flags)


def settings_in(text: str) -> dict[str, str]:
    """KEY=VALUE and KEY: VALUE lines of an .env or compose file (the last one wins)."""
    out = {}
    for line in text.splitlines():
        m = SETTING.match(line)
        if m and not line.lstrip().startswith("#"):
            out[m[1]] = m[2]
    return out


# vLLM's SpeculativeConfig.method values that propose from the context instead of a drafter's weights
# (ngram, ngram_gpu, suffix)
def _method_drafts_from_context(method: str) -> bool:
    return method.startswith("ngram") or method == "suffix"


@dataclass(frozen=True)
class ServerConfig:
    """How a vLLM server was started, as far as the evidence says: each value with where it was seen."""

    dtype: tuple[str, str] | None = None  # (value, evidence)
    speculative: str | None = None  # evidence that speculative decoding is on
    prefix_caching_off: str | None = None  # evidence that prefix caching is off
    speculative_method: str | None = None  # vLLM's method (eagle3, mtp, ngram, ...), where the evidence names it

    @property
    def drafts_from_context(self) -> bool | None:
        """n-gram or suffix drafting (no drafter, so no drafter dtype that could be wrong); None: unknown."""
        return None if self.speculative_method is None else _method_drafts_from_context(self.speculative_method)


# where a --speculative-config JSON starts: on a command line, in a compose list, as SPECULATIVE_CONFIG= in a .env
SPEC_CONFIG_AT = re.compile(r"""(?:--speculative[-_]config|\bSPECULATIVE_CONFIG)["']?(?:\s*,\s*|\s*[=:]\s*|\s+)["']?(?=\{)""",
                            re.IGNORECASE)


def speculative_method(text: str) -> str | None:
    """vLLM's speculative method as a command line or file gives it: --speculative-config's JSON (its
    ``method``; a ``model`` of "ngram" where no method is given, as vLLM reads it), or the older
    ``--speculative-model [ngram]``."""
    method = None
    for at in SPEC_CONFIG_AT.finditer(text):
        try:
            config, _ = json.JSONDecoder().raw_decode(text, at.end())
        except ValueError:
            continue
        if isinstance(config, dict):
            if config.get("method"):
                method = _method_name(config["method"])
            elif _method_name(config.get("model", "")) == "ngram":
                method = "ngram"
    model = flag_value(text, "--speculative-model", "--speculative_model")
    if method is None and model and _method_name(model) == "ngram":
        method = "ngram"
    return method


def _method_name(value: object) -> str:
    # vLLM reads "[ngram]" (its older spelling) as ngram
    return str(value).strip("[]").lower()


def vllm_config(command_lines: Sequence[str] = (), files: dict[str, str] | None = None,
                metrics_text: str | None = None) -> ServerConfig:
    """Read dtype, speculative decoding and prefix caching from every source given."""
    dtype = speculative = prefix_off = method = None
    for line in command_lines:
        value = flag_value(line, "--dtype")
        if value:
            dtype = (value, f"command line: {line[:300]}")
        if has_flag(line, "--speculative-config", "--speculative_config", "--speculative-model",
                    "--speculative_model"):
            speculative = f"command line: {line[:300]}"
            method = speculative_method(line) or method
        if has_flag(line, "--no-enable-prefix-caching") or flag_value(line, "--enable-prefix-caching") in (
                "False", "false", "0"):
            prefix_off = f"command line: {line[:300]}"
    for name, text in (files or {}).items():
        value = flag_value(text, "--dtype")
        if value:
            dtype = (value, f"{name}: --dtype {value}")
        if has_flag(text, "--speculative-config", "--speculative_config", "--speculative-model"):
            speculative = f"{name}: --speculative-config"
        if has_flag(text, "--no-enable-prefix-caching"):
            prefix_off = f"{name}: --no-enable-prefix-caching"
        for key, value in settings_in(text).items():
            upper = key.upper()
            if upper.endswith("DTYPE") and "KV" not in upper and "CACHE" not in upper and value:
                dtype = (value, f"{name}: {key}={value}")
            if (upper == "SPEC" or "SPECULATIVE" in upper) and value.lower() not in OFF_VALUES:
                speculative = f"{name}: {key}={value}"
                if value.isidentifier() and value.lower() not in ("true", "on", "yes"):
                    method = value.lower()  # HyperQwen's SPEC=dflash2, SPEC=ngram
            if upper in ("PREFIX_CACHE", "ENABLE_PREFIX_CACHING", "PREFIX_CACHING") and value.lower() in OFF_VALUES:
                prefix_off = f"{name}: {key}={value}"
        method = speculative_method(text) or method  # a JSON config: on a compose command, in SPECULATIVE_CONFIG=
    if metrics_text:
        for sample in parse_prometheus(metrics_text):
            labels = sample.labels
            for key in ("dtype", "model_dtype"):
                if labels.get(key) and not dtype:
                    dtype = (labels[key], f"metrics: {sample.name}{{{key}=\"{labels[key]}\"}}")
            if labels.get("enable_prefix_caching", "").lower() == "false":
                prefix_off = f"metrics: {sample.name}{{enable_prefix_caching=\"{labels['enable_prefix_caching']}\"}}"
            if labels.get("speculative_config", "").lower() not in OFF_VALUES and "speculative_config" in labels:
                speculative = f"metrics: {sample.name}{{speculative_config=...}}"
            if sample.name == "vllm:spec_decode_num_drafts_total" and sample.value > 0 and not speculative:
                speculative = f"metrics: vllm:spec_decode_num_drafts_total {sample.value:.0f}"
    return ServerConfig(dtype, speculative, prefix_off, method)


def check_dtype_with_speculation(config: ServerConfig) -> list[Finding]:
    if (config.dtype is None or config.dtype[0].lower().removeprefix("torch.") not in HALF_DTYPES
            or config.speculative is None or config.drafts_from_context):
        return []
    value, where = config.dtype
    return [Finding(
        "vllm-dtype", ERROR,
        f"the target runs in dtype {value} ({where}) with speculative decoding on ({config.speculative}): "
        "a target in float16 rejects the drafts of a drafter trained in bfloat16, so speculation silently does "
        "nothing (vLLM logs \"Mean acceptance length: 1.00\" and no error).",
        "serve the target with --dtype bfloat16 (or auto for a bf16 checkpoint), or turn speculative decoding off")]


def check_acceptance_log(log_text: str, source: str = "the server log",
                         drafts_from_context: bool | None = None) -> list[Finding]:
    """vLLM's periodic SpecDecoding line: drafting at a rate while accepting nothing is the trap.
    ``drafts_from_context``: how the server drafts, where its configuration says (the line does not)."""
    latest = None
    trapped = 0
    for line in log_text.splitlines():
        m = VLLM_SPEC_LOG.search(line)
        if m:
            length, drafted = float(m[1]), float(m[3])
            bad = drafted > 0 and length <= 1.01
        else:
            m = VLLM_SPEC_LOG_V0.search(line)
            if not m:
                continue
            bad = int(m[3]) > 0 and float(m[1]) < 1.0
        trapped += bad
        latest = (line.strip(), bad)
    if latest is None or not latest[1]:
        return []
    cause, fix = trap_cause(drafts_from_context)
    return [Finding(
        "acceptance-log", ERROR,
        f"vLLM drafts tokens and accepts none ({source}, latest of {trapped} such line(s): \"{latest[0][-300:]}\"). "
        + cause, fix)]


def check_prefix_caching(config: ServerConfig, preset_args: Mapping[str, Sequence[str]] | None = None) -> list[Finding]:
    """Prefix caching off: every repeated prompt (the runs of one alias, the prefix-cache workload, a chat
    with a growing history) is prefilled from scratch."""
    fix_vllm = ("remove --no-enable-prefix-caching (vLLM >= 0.6 caches prefixes by default; HyperQwen: "
                "PREFIX_CACHE=1)")
    findings = []
    if config.prefix_caching_off:
        findings.append(Finding(
            "prefix-cache", WARNING,
            f"prefix caching is off ({config.prefix_caching_off}): repeated prompts are prefilled again "
            "(the report's 11k-token prompt took 7 s instead of 0.86 s).", fix_vllm))
    for alias, args in (preset_args or {}).items():
        if "--no-cache-prompt" in args:
            findings.append(Finding(
                "prefix-cache", WARNING,
                f"{alias}: the preset runs llama-server with --no-cache-prompt (preset arguments the router "
                "reports): a repeated prompt is prefilled again every time.",
                f"remove cache-prompt = false (or --no-cache-prompt) from the preset {alias}"))
    return findings


# --- GPU errors: Xid lines in the kernel log, Xid events from NVML, the PCIe link --------------------

# The NVIDIA driver: "NVRM: Xid (PCI:0000:01:00): 13, pid=1234, name=python3, Graphics SM Warp Exception ..."
XID_LINE = re.compile(r"NVRM: Xid \(PCI:([0-9a-fA-F]{4}):([0-9a-fA-F]{2}):([0-9a-fA-F]{2})(?:\.\d)?\): (\d+),? ?(.*)")
ISO_STAMP = re.compile(r"^(\d{4}-\d{2}-\d{2}[T ]\d{2}:\d{2}:\d{2})(?:[.,](\d+))?(Z|[+-]\d{2}:?\d{2})?")
XID_MEANING = {
    13: "Graphics Engine Exception (an illegal memory access or instruction in a kernel; also unstable clocks "
        "or memory)",
    31: "GPU memory page fault",
    43: "GPU stopped processing",
    45: "preemptive cleanup after an earlier error",
    48: "double-bit ECC error",
    61: "internal micro-controller breakpoint",
    62: "internal micro-controller halt",
    63: "ECC page retirement or row remapping",
    64: "ECC page retirement or row remapping failure",
    74: "NVLink error",
    79: "GPU has fallen off the bus",
    92: "high single-bit ECC error rate",
    94: "contained ECC error",
    95: "uncontained ECC error",
    119: "GSP RPC timeout",
    120: "GSP error",
}


@dataclass(frozen=True)
class XidLine:
    pci: tuple[int, int, int]  # (domain, bus, device)
    xid: int
    line: str
    at: datetime | None  # the line's timestamp, when it carries one

    @property
    def pci_text(self) -> str:
        return f"{self.pci[0]:04x}:{self.pci[1]:02x}:{self.pci[2]:02x}"


def line_time(line: str) -> datetime | None:
    """The ISO timestamp that starts a `journalctl -o short-iso` or `dmesg --time-format iso` line."""
    m = ISO_STAMP.match(line)
    if not m:
        return None
    zone = (m[3] or "").replace("Z", "+00:00")
    try:
        at = datetime.fromisoformat(m[1].replace(" ", "T") + (f".{m[2][:6]}" if m[2] else "") + zone)
    except ValueError:
        return None
    return at if at.tzinfo else at.astimezone()


def xid_lines(text: str, since: datetime | None = None) -> list[XidLine]:
    """The driver's Xid lines; with ``since``, those whose timestamp is earlier are left out."""
    out = []
    for line in text.splitlines():
        m = XID_LINE.search(line)
        if not m:
            continue
        at = line_time(line)
        if since is not None and at is not None and at < since:
            continue
        out.append(XidLine((int(m[1], 16), int(m[2], 16), int(m[3], 16)), int(m[4]), line.strip(), at))
    return out


def _xid_fix(xid: int) -> str:
    if xid == 79:
        return ("the card dropped off the PCIe bus: reseat it and its riser, check the PSU and its cables, "
                "and lower the power limit; the GPU needs a reboot to come back")
    if xid in (48, 63, 64, 92, 94, 95):
        return "check `nvidia-smi -q -d ECC,ROW_REMAPPER`; a card that keeps retiring memory needs replacing"
    return ("look at what ran at that moment (pid/name in the line); repeated Xid 13/31/43 under load point at "
            "unstable clocks or memory (undo an overclock or undervolt, lower the power limit), a riser, or a "
            "driver/CUDA bug: update the driver and rerun")


def check_xid(lines: Sequence[XidLine], pci_index: dict[tuple[int, int, int], int],
              source: str = "the kernel log") -> list[Finding]:
    """One error per GPU and Xid code, with how often it occurred and its first line."""
    groups: dict[tuple[tuple[int, int, int], int], list[XidLine]] = {}
    for x in lines:
        groups.setdefault((x.pci, x.xid), []).append(x)
    findings = []
    for (pci, xid), seen in groups.items():
        index = pci_index.get(pci)
        gpu = f"GPU{index} (PCI {seen[0].pci_text})" if index is not None else f"the GPU at PCI {seen[0].pci_text}"
        meaning = XID_MEANING.get(xid, "see NVIDIA's Xid catalogue")
        findings.append(Finding(
            "gpu-xid", ERROR,
            f"{gpu} logged Xid {xid} ({meaning}) {len(seen)} time(s) ({source}: \"{seen[0].line[:300]}\").",
            _xid_fix(xid)))
    return findings


def check_xid_events(events: Sequence[XidEvent]) -> list[Finding]:
    counts: dict[tuple[int | None, int], int] = {}
    for e in events:
        counts[(e.index, e.xid)] = counts.get((e.index, e.xid), 0) + 1
    return [Finding("gpu-xid", ERROR,
                    f"{'GPU' + str(index) if index is not None else 'a GPU'} reported critical Xid {xid} "
                    f"({XID_MEANING.get(xid, 'see NVIDIA Xid catalogue')}) {n} time(s) (NVML event "
                    "nvmlEventTypeXidCriticalError).", _xid_fix(xid))
            for (index, xid), n in counts.items()]


BUSY_PCT = 30  # an idle GPU lowers its link generation to save power; judge the link only above this load


def check_pcie(busiest: Sequence[PcieLink], before: Sequence[PcieLink] = (),
               after: Sequence[PcieLink] = ()) -> list[Finding]:
    """A link below the card's maximum while it works, and replays (corrected link errors) that grew."""
    findings = []
    for link in busiest:
        if link.busy_pct is None or link.busy_pct < BUSY_PCT:
            continue
        slow_gen = link.gen is not None and link.max_gen is not None and link.gen < link.max_gen
        narrow = link.width is not None and link.max_width is not None and link.width < link.max_width
        if slow_gen or narrow:
            findings.append(Finding(
                "pcie-link", WARNING,
                f"GPU{link.index}'s PCIe link runs at Gen{link.gen} x{link.width} while {link.busy_pct}% busy; "
                f"the card supports Gen{link.max_gen} x{link.max_width}.",
                "check the slot (some are wired for fewer lanes or share them), the riser or cable (a poor riser "
                "makes the link fall back), and the BIOS's PCIe generation setting"))
    start = {link.index: link.replays for link in before if link.replays is not None}
    for link in after:
        if link.replays is not None and link.index in start and link.replays > start[link.index]:
            findings.append(Finding(
                "pcie-replay", WARNING,
                f"GPU{link.index}'s PCIe replay counter grew by {link.replays - start[link.index]} during the run "
                f"({start[link.index]} -> {link.replays}): the link is retransmitting corrupted packets.",
                "reseat the card, replace or shorten the riser, or force a lower PCIe generation in the BIOS"))
    return findings


# --- the llamAmpere fork: a control preset needs an explicit spec-type = none ---------------------------

FORK_NAMES = ("llamampere",)


def fork_build(marker: dict | None = None, build_info: str | None = None, binary: str | None = None,
               named: str | None = None) -> str | None:
    """Where the llamAmpere fork was recognised (its evidence), or None."""
    package = ((marker or {}).get("package") or {}).get("name") if isinstance(marker, dict) else None
    for evidence, value in ((f"--build {named}", named),
                            (f"/etc/llama-cpp/active.json package {package}", package),
                            (f"/props build_info {build_info}", build_info),
                            (f"server binary {binary}", binary)):
        if value and any(name in value.lower() for name in FORK_NAMES):
            return evidence
    return None


def is_control(args: Sequence[str]) -> bool:
    """A preset with no speculative-decoding argument at all: meant as the no-speculation control."""
    return not names_speculation(args)


def check_fork_control(fork: str | None, preset_args: Mapping[str, Sequence[str]]) -> list[Finding]:
    if fork is None:
        return []
    return [Finding(
        "fork-control", WARNING,
        f"{alias}: the server is the llamAmpere fork ({fork}), which defaults --spec-type to auto, and this preset "
        "sets no spec-type: it is not a no-speculation control there.",
        f"add `spec-type = none` to the preset {alias} (Nix: spec-type = \"none\";)")
        for alias, args in preset_args.items() if is_control(args)]
