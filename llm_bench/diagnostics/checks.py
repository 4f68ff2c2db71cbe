"""The doctor's checks: pure functions from evidence (log text, command lines, NVML readings,
a measured record) to findings. Gathering the evidence is ``doctor.py``'s and ``in_run.py``'s job."""

from __future__ import annotations

import re
from collections.abc import Sequence
from pathlib import Path

from llm_bench.diagnostics.findings import ERROR, INFO, WARNING, Finding
from llm_bench.engines.metrics import parse_prometheus
from llm_bench.gpu import roofline
from llm_bench.gpu.nvml import Nvml, VramReading
from llm_bench.plan import Checks
from llm_bench.results import AliasRecord
from llm_bench.workloads.common import check_acceptance_trap

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
        offloads = [(line, OFFLOADED.search(line)) for line in lines if OFFLOADED.search(line)]
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
            findings.append(Finding(
                "offload", WARNING,
                f"{who}the model was loaded but {source} never says \"offloaded N/M layers to GPU\" although "
                f"NVML sees {gpu_count} GPU(s): this llama-server was probably built without CUDA.",
                "use a CUDA build of llama.cpp (e.g. the flake's package, or cmake -DGGML_CUDA=ON)"))
    if not saw_load:
        return [Finding("offload", INFO, f"{source} shows no model load, so GPU offload could not be checked.",
                        "load a model (or point --log-file/--log-command at the log of the load) and rerun")]
    return findings


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
    if frac is None or frac >= min_fraction:
        return []
    return [Finding(
        "roofline", WARNING,
        f"{record.configuration}: decode {s.median:.1f} t/s is {frac:.1%} of the memory-bandwidth roofline "
        f"({record.roofline_tps:.1f} t/s = {record.memory_bandwidth_gbs:.0f} GB/s / "
        f"{record.model_bytes / 1e9:.2f} GB per token), below {min_fraction:.0%}.",
        "look for layers on the CPU (offload check), a missing FlashAttention kernel, eager mode, a low power limit, "
        "or a CPU-bound sampler; a healthy single-stream decode reaches well over half the roofline")]


def check_acceptance(record: AliasRecord) -> list[Finding]:
    """The workloads' acceptance-trap check, turned into a finding."""
    before = len(record.warnings)
    check_acceptance_trap(record, lambda message: None)
    return [Finding("acceptance", ERROR, w.removeprefix("ACCEPTANCE TRAP: "),
                    "serve the target in the dtype its drafter was trained with (bfloat16, not --dtype half), "
                    "use a drafter made for this model, or turn speculative decoding off")
            for w in record.warnings[before:]]
