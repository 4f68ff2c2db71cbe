"""vLLM's configuration as the evidence gives it (local command lines, compose and .env files, the log's
"with config:" line, /metrics): dtype, speculative decoding with its method and tokens, prefix caching,
compilation off (eager), the context; and the checks on it. Every spelling vLLM 0.32's own argument parser
(``vllm/utils/argparse_utils.py``, ``vllm/engine/arg_utils.py``) turns into one of these is read, and
tests/test_vllm_real.py checks the reading against that parser. Pure functions, but for reading /proc."""

from __future__ import annotations

import json
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from urllib.parse import urlsplit

from llm_bench.diagnostics.findings import ERROR, WARNING, Finding
from llm_bench.engines.metrics import ACCEPTED_PER_POS, DRAFTS, parse_prometheus
from llm_bench.preset_args import VLLM_SPEC_CONFIG, VLLM_SPEC_KEYS, VLLM_SPEC_MODEL, VLLM_SPECULATION


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


def serving(lines: Sequence[str], url: str) -> list[str]:
    """The command lines of the vLLM that serves ``url``'s port, where one does (another local vLLM says nothing
    of it); else all of them (a container's vLLM listens on its own port, mapped to another on the host)."""
    port = urlsplit(url).port
    own = [line for line in lines if port is not None and flag_value(line, "--port") == str(port)]
    return own or list(lines)


# vLLM's compilation switches: --enforce-eager, and what its docs call equivalent (no torch.compile, no CUDA graphs)
EAGER = ("--enforce-eager", "--enforce_eager")
OPTIMIZATION_LEVEL = ("--optimization-level", "--optimization_level")
COMPILATION_CONFIG = ("--compilation-config", "--compilation_config", "-cc")
_TRUE = r"(?:\s*=\s*[\"']?(?:true|1)\b|(?=[\s\"',\]]|$)(?!\s+[\"']?(?:false|0)\b))"


def _alternatives(flags: Sequence[str]) -> str:
    # a flag as a word of its own, not the tail of another (--no-enable-prefix-caching, --kv-cache-dtype)
    return r"(?<![\w-])(?:" + "|".join(map(re.escape, sorted(flags, key=len, reverse=True))) + ")"


def dotted(text: str, flags: Sequence[str]) -> dict[str, str]:
    """The dotted keys of a JSON-valued flag, as vLLM's parser merges them into its JSON
    (``-sc.method ngram``, ``--compilation-config.mode=none``): key -> value, the last one winning."""
    found: dict[str, str] = {}
    for m in re.finditer(_alternatives(flags) + r"""\.([\w.]+)(?:\s*=\s*|["']?(?:\s*,\s*|\s+))["']?([^\s"',\]]+)""", text):
        found[m[1]] = m[2]
    return found


def json_values(text: str, flags: Sequence[str], env_key: str | None = None) -> list[dict]:
    """Every JSON object given to one of ``flags`` (on a command line, in a compose list, or as ``env_key=`` in
    an .env file), in order."""
    name = _alternatives(flags) + (rf"|\b{env_key}" if env_key else "")
    at = re.compile(f"(?:{name})" + r"""["']?(?:\s*,\s*|\s*[=:]\s*|\s+)["']?(?=\{)""", re.IGNORECASE)
    configs = []
    for m in at.finditer(text):
        try:
            config, _ = json.JSONDecoder().raw_decode(text, m.end())
        except ValueError:
            continue
        if isinstance(config, dict):
            configs.append(config)
    return configs


def compilation_off(text: str) -> str | None:
    """The spelling that turns vLLM's compilation and CUDA graphs off, where the text has one:
    --enforce-eager, -O0 (-O 0, -O=0, --optimization-level 0), a compilation config's mode NONE (0), or its
    cudagraph_mode NONE (as JSON after -cc, or dotted: -cc.mode=none)."""
    m = re.search(_alternatives(EAGER) + _TRUE, text, re.IGNORECASE)
    if m:
        return m[0].strip()
    # -O0, -O 0, -O=0 (vLLM rewrites each to --optimization-level 0), and the long flag itself
    level = "|".join(map(re.escape, OPTIMIZATION_LEVEL))
    m = re.search(rf"""(?<![\w-])(?:-O(?:\s*=\s*|\s+)?|(?:{level})["']?(?:\s*=\s*|\s*,\s*|\s+)["']?)0(?![\w.])""", text)
    if m:
        return m[0].strip()
    settings: dict[str, object] = {}
    for config in json_values(text, COMPILATION_CONFIG):
        settings.update(config)
    settings.update(dotted(text, COMPILATION_CONFIG))
    for key in ("mode", "level", "cudagraph_mode"):  # level: vLLM's older name of mode
        if key in settings and str(settings[key]).strip().upper() in ("NONE", "0"):
            return f"compilation config {key}={settings[key]}"
    return None


def check_enforce_eager(command_lines: Sequence[str] = (), log_text: str | None = None) -> list[Finding]:
    """Compilation off: any spelling on a command line, or the log's config line saying so."""
    fix = ("remove --enforce-eager, -O0 (--optimization-level 0) and a compilation config's mode or cudagraph_mode "
           "NONE (also from any config file) so vLLM captures CUDA graphs and compiles the model; if it was a "
           "workaround for a bug, check that the bug still exists")
    for line in command_lines:
        spelling = compilation_off(line)
        if spelling:
            return [Finding("vllm-eager", ERROR, f"vLLM runs with compilation off ({spelling}; command line: "
                            f"{line[:300]}); eager mode decodes several times slower.", fix)]
    said = log_config(log_text or "").eager
    if said:
        return [Finding("vllm-eager", ERROR, f"vLLM runs with compilation off ({said}); eager mode decodes several "
                        "times slower.", fix)]
    return []


HALF_DTYPES = {"half", "float16", "fp16"}
OFF_VALUES = {"0", "false", "off", "no", "none", ""}
# a KEY=VALUE (.env, compose `environment:` list) or KEY: VALUE (compose mapping) line
SETTING = re.compile(r"""^\s*(?:-\s*)?(?:export\s+)?["']?([A-Za-z_][A-Za-z0-9_]*)["']?\s*[=:]\s*["']?([^"'#\s]*)""")


def flag_value(text: str, *flags: str) -> str | None:
    """The value after the last of ``flags`` in a command line, a compose ``command:`` string or list."""
    found = None
    for m in re.finditer(_alternatives(flags) + r"""["']?(?:\s*,\s*|\s+|=)["']?([^\s"',\]]+)""", text):
        found = m[1]
    return found


def has_flag(text: str, *flags: str) -> bool:
    return re.search(_alternatives(flags) + r"""(?=["'\s=,\]]|$)""", text) is not None


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
def method_drafts_from_context(method: str) -> bool:
    return method.startswith("ngram") or method == "suffix"


@dataclass(frozen=True)
class ServerConfig:
    """How a vLLM server was started, as far as the evidence says: each value with where it was seen."""

    dtype: tuple[str, str] | None = None  # (value, evidence)
    speculative: str | None = None  # evidence that speculative decoding is on
    prefix_caching_off: str | None = None  # evidence that prefix caching is off
    speculative_method: str | None = None  # vLLM's method (eagle3, mtp, ngram, ...), where the evidence names it
    speculative_tokens: int | None = None  # tokens drafted per round, where the evidence says
    eager: str | None = None  # evidence that compilation and CUDA graphs are off
    context: tuple[int, str] | None = None  # (max_model_len, evidence)

    @property
    def speculation(self) -> str | None:
        """The Speculation column's text for this server ("ngram n=3"); None where it does not draft."""
        if self.speculative is None:
            return None
        text = self.speculative_method or "on"
        return text + (f" n={self.speculative_tokens}" if self.speculative_tokens else "")

    @property
    def drafts_from_context(self) -> bool | None:
        """n-gram or suffix drafting (no drafter, so no drafter dtype that could be wrong); None: unknown."""
        return None if self.speculative_method is None else method_drafts_from_context(self.speculative_method)


def speculative_settings(text: str) -> dict[str, str] | None:
    """The speculative config a command line or file gives, merged as vLLM merges it: the JSON (also as
    SPECULATIVE_CONFIG= in an .env), its dotted keys (-sc.method ngram), the shorthands for method, model and
    tokens, and the older flag naming a drafter. None where none of them is there."""
    settings: dict[str, str] = {}
    older = flag_value(text, *VLLM_SPEC_MODEL)
    if older:
        settings["model"] = older
    for config in json_values(text, VLLM_SPEC_CONFIG, "SPECULATIVE_CONFIG"):
        settings.update({k: str(v) for k, v in config.items() if v is not None})
    settings.update(dotted(text, VLLM_SPEC_CONFIG))
    for key, flags in VLLM_SPEC_KEYS.items():
        value = flag_value(text, *flags)
        if value:
            settings[key] = value
    return settings or None


def speculative_method(text: str) -> str | None:
    """vLLM's speculative method as a command line or file gives it: the config's ``method``, or a ``model``
    of "ngram" where no method is given, as vLLM reads it."""
    settings = speculative_settings(text) or {}
    if settings.get("method"):
        return _method_name(settings["method"])
    return "ngram" if _method_name(settings.get("model", "")) == "ngram" else None


def speculative_tokens(text: str) -> int | None:
    value = (speculative_settings(text) or {}).get("num_speculative_tokens")
    return int(value) if value and value.isdigit() else None


def _method_name(value: object) -> str:
    # vLLM reads "[ngram]" (its older spelling) as ngram
    return str(value).strip("[]").lower()


@dataclass(frozen=True)
class LogConfig:
    """What vLLM's "Initializing a V1 LLM engine (vX) with config: ..." line says (vllm/config/vllm.py
    VllmConfig.__str__), each value with the line as its evidence."""

    line: str | None = None
    speculative_method: str | None = None
    speculative_tokens: int | None = None
    speculative: bool = False
    dtype: str | None = None
    context: int | None = None
    eager: str | None = None  # compilation off, as the line says it
    prefix_caching: bool | None = None


def log_config(text: str) -> LogConfig:
    """The last config line of a vLLM log (a restarted server logs a new one)."""
    lines = [line for line in text.splitlines() if "LLM engine" in line and "with config:" in line]
    if not lines:
        return LogConfig()
    line = lines[-1]
    quoted = "the server log's config line: " + _quote(line[line.index("with config:"):])
    spec = re.search(r"speculative_config=SpeculativeConfig\(method='?([\w\[\]-]+)'?.*?num_spec_tokens=(\d+)", line)
    dtype = re.search(r"\bdtype=(?:torch\.)?(\w+)", line)
    context = re.search(r"\bmax_seq_len=(\d+)", line)
    prefix = re.search(r"\benable_prefix_caching=(True|False)", line)
    eager = None
    if re.search(r"\benforce_eager=True", line):
        eager = f"enforce_eager=True in {quoted}"
    elif re.search(r"'mode': <CompilationMode\.NONE", line):
        eager = f"compilation mode NONE in {quoted}"
    elif re.search(r"'cudagraph_mode': <CUDAGraphMode\.NONE", line):
        eager = f"cudagraph_mode NONE in {quoted}"
    return LogConfig(quoted, _method_name(spec[1]) if spec else None, int(spec[2]) if spec else None,
                     spec is not None, dtype[1] if dtype else None, int(context[1]) if context else None, eager,
                     None if prefix is None else prefix[1] == "True")


def _quote(text: str, limit: int = 240) -> str:
    """A quote that keeps its start: cut at the end, and said to be cut."""
    text = text.strip()
    return f"\"{text}\"" if len(text) <= limit else f"\"{text[:limit]}...\" (cut)"


def vllm_config(command_lines: Sequence[str] = (), files: dict[str, str] | None = None,
                metrics_text: str | None = None, log_text: str | None = None) -> ServerConfig:
    """Read dtype, speculative decoding, prefix caching, compilation and the context from every source given;
    a command line or file outranks the log's config line, which outranks /metrics."""
    dtype = speculative = prefix_off = method = tokens = eager = context = None
    logged = log_config(log_text or "")
    if logged.line:
        if logged.dtype:
            dtype = (logged.dtype, logged.line)
        if logged.speculative:
            speculative, method, tokens = logged.line, logged.speculative_method, logged.speculative_tokens
        if logged.prefix_caching is False:
            prefix_off = logged.line
        eager = logged.eager
        if logged.context:
            context = (logged.context, logged.line)
    if metrics_text and speculative is None:
        samples = parse_prometheus(metrics_text)
        # vLLM creates its spec_decode counters only with a speculative config, one per-position counter for
        # each token a round drafts (vllm/v1/spec_decode/metrics.py SpecDecodingProm)
        if any(s.name == DRAFTS for s in samples):
            positions = {s.labels.get("position") for s in samples if s.name == ACCEPTED_PER_POS}
            speculative = f"metrics: {DRAFTS} is there, with {len(positions)} per-position counter(s)"
            tokens = len(positions) or None
        for sample in samples:
            if sample.labels.get("enable_prefix_caching", "").lower() == "false":  # vllm:cache_config_info
                prefix_off = f"metrics: {sample.name}{{enable_prefix_caching=\"{sample.labels['enable_prefix_caching']}\"}}"
    for line in command_lines:
        value = flag_value(line, "--dtype")
        if value:
            dtype = (value, f"command line: {line[:300]}")
        settings = speculative_settings(line)
        if settings is not None:
            speculative = f"command line: {line[:300]}"
            method = speculative_method(line) or method
            tokens = speculative_tokens(line) or tokens
        if has_flag(line, "--no-enable-prefix-caching") or flag_value(line, "--enable-prefix-caching") in (
                "False", "false", "0"):
            prefix_off = f"command line: {line[:300]}"
        spelling = compilation_off(line)
        if spelling:
            eager = f"{spelling} on the command line: {line[:300]}"
        value = flag_value(line, "--max-model-len", "--max_model_len")
        if value and value.isdigit() and context is None:
            context = (int(value), f"command line: --max-model-len {value}")
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
        settings = speculative_settings(text)
        if settings is not None:  # a JSON config on a compose command or in SPECULATIVE_CONFIG=, the shorthands
            speculative = speculative or f"{name}: {', '.join(f'{k}={v}' for k, v in settings.items())}"
            method = speculative_method(text) or method
            tokens = speculative_tokens(text) or tokens
        spelling = compilation_off(text)
        if spelling:
            eager = f"{spelling} in {name}"
    return ServerConfig(dtype, speculative, prefix_off, method, tokens, eager, context)


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
