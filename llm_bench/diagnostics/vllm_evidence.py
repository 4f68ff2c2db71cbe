"""vLLM's configuration as the evidence gives it (local command lines, compose and .env files, /metrics
labels): dtype, speculative decoding and its method, prefix caching, eager mode; and the checks on it.
Pure functions, but for reading /proc."""

from __future__ import annotations

import json
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

from llm_bench.diagnostics.findings import ERROR, WARNING, Finding
from llm_bench.engines.metrics import parse_prometheus
from llm_bench.preset_args import VLLM_SPEC_CONFIG, VLLM_SPEC_MODEL, VLLM_SPECULATION


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


HALF_DTYPES = {"half", "float16", "fp16"}
OFF_VALUES = {"0", "false", "off", "no", "none", ""}
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
SPEC_CONFIG_AT = re.compile("(?:" + "|".join(map(re.escape, VLLM_SPEC_CONFIG)) + r"""|\bSPECULATIVE_CONFIG)["']?"""
                            r"""(?:\s*,\s*|\s*[=:]\s*|\s+)["']?(?=\{)""", re.IGNORECASE)


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
    model = flag_value(text, *VLLM_SPEC_MODEL)
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
        if has_flag(line, *VLLM_SPECULATION):
            speculative = f"command line: {line[:300]}"
            method = speculative_method(line) or method
        if has_flag(line, "--no-enable-prefix-caching") or flag_value(line, "--enable-prefix-caching") in (
                "False", "false", "0"):
            prefix_off = f"command line: {line[:300]}"
    for name, text in (files or {}).items():
        value = flag_value(text, "--dtype")
        if value:
            dtype = (value, f"{name}: --dtype {value}")
        found = next((flag for flag in VLLM_SPECULATION if has_flag(text, flag)), None)
        if found:
            speculative = f"{name}: {found}"
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
