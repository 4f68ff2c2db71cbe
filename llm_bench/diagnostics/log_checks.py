"""Checks of a llama-server log: layers left on the CPU (the offload line, a build or a machine without
CUDA), and the FlashAttention fallback for quantised K/V types. Pure functions from log text to findings."""

from __future__ import annotations

import re

from llm_bench.diagnostics.findings import ERROR, INFO, Finding

# llama.cpp src/llama-model.cpp: LLAMA_LOG_INFO("%s: offloaded %d/%d layers to GPU\n", ...)
OFFLOADED = re.compile(r"offloaded (\d+)/(\d+) layers to GPU")
# ggml/src/ggml-cuda/fattn.cu: GGML_LOG_WARN("%s: no FlashAttention vector kernel compiled for K/V types
# %s-%s, converting K and V to f16 instead (slow). Add \"%s-%s\" to GGML_CUDA_FA_QUANTS to compile it.\n")
FA_FALLBACK = re.compile(r"no FlashAttention vector kernel compiled for K/V types (\S+)-(\S+), converting K and V "
                         r"to f16 instead")
# router: "load: spawning server instance with name=ALIAS on port PORT"; instance lines start "[PORT] ", the port
# printed "[%5d]" (tools/server/server-models.cpp): a port under 10000 is space-padded, "[ 8080] "
SPAWN = re.compile(r"spawning server instance with name=(\S+) on port (\d+)")
INSTANCE_LINE = re.compile(r"^\[ *(\d+)\] ")
MODEL_LOADING = re.compile(r"load_model: loading model '([^']+)'")
# ggml/src/ggml-cuda/ggml-cuda.cu, ggml_cuda_init: "failed to initialize CUDA: %s" or
# "found %d CUDA devices (Total VRAM: %zu MiB):"
CUDA_INIT_FAILED = re.compile(r"ggml_cuda_init: failed to initialize CUDA")
CUDA_FOUND = re.compile(r"ggml_cuda_init: found \d+ CUDA devices")


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
