"""What a preset's llama-server arguments (as the router reports them) say: context, KV cache types,
speculative decoding. Read by the report's columns, the quality workload's choice of a control, the
diagnostics, tune's grid and the roofline.

Speculative decoding has one table here, ``SPECULATION``: every llama-server flag that concerns it, in
every spelling llama.cpp's ``common/arg.cpp`` accepts, and the questions asked of it
(``is_speculative``, ``drafts_from_context``, ``draft_max``, ``without_speculation``, ...). No other
module names a speculative flag (vLLM's few, ``VLLM_SPECULATION``, are kept here too);
tests/test_speculation_flags.py checks the table against the pinned arg.cpp.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import TypeVar

# Long and short spellings llama-server accepts for the preset facts the table shows.
ARG_NAMES = {
    "ctx": ("--ctx-size", "-c"),
    "cache_k": ("--cache-type-k", "-ctk"),
    "cache_v": ("--cache-type-v", "-ctv"),
}

# --- speculative decoding: the one table ------------------------------------------------------------
# Each entry is one llama-server option, all its spellings as common/arg.cpp lists them (the router
# reports the last one). A preset INI names an option by any spelling without its leading dashes
# (common/preset.cpp), so ``md``, ``model-draft`` and ``spec-draft-model`` are one key.

SPEC_TYPE = ("--spec-type",)
# The drafter, as a file or as a source to download; with no --spec-type llama-server works out the type
# from the drafter (a draft GGUF's metadata, the sidecars its Hugging Face repo ships), so a drafter alone
# counts as speculation.
DRAFT_MODEL = ("--spec-draft-model", "-md", "--model-draft")
DRAFT_SOURCE = ("--spec-draft-hf", "-hfd", "-hfrd", "--hf-repo-draft")
# How many tokens a round drafts; --draft, --draft-n and --draft-max are the spellings of builds before the
# rename (llama.cpp now refuses them with "the argument has been removed").
DRAFT_MAX = ("--spec-draft-n-max", "--draft", "--draft-n", "--draft-max")
# Turns on llama.cpp's default speculation (n-gram-mod drafting from the context).
SPEC_DEFAULT = ("--spec-default",)
# Everything else that only concerns speculation: the drafter's threads, CPUs, devices, layers, KV types
# and tensors, the draft sampling, the n-gram drafters' sizes, synthetic acceptance.
SPEC_SETTINGS: tuple[tuple[str, ...], ...] = (
    ("--spec-draft-threads", "-td", "--threads-draft"),
    ("--spec-draft-threads-batch", "-tbd", "--threads-batch-draft"),
    ("--spec-draft-cpu-mask", "-Cd", "--cpu-mask-draft"),
    ("--spec-draft-cpu-range", "-Crd", "--cpu-range-draft"),
    ("--spec-draft-cpu-strict", "--cpu-strict-draft"),
    ("--spec-draft-prio", "--prio-draft"),
    ("--spec-draft-poll", "--poll-draft"),
    ("--spec-draft-cpu-mask-batch", "-Cbd", "--cpu-mask-batch-draft"),
    ("--spec-draft-cpu-range-batch", "-Crbd", "--cpu-range-batch-draft"),
    ("--spec-draft-cpu-strict-batch", "--cpu-strict-batch-draft"),
    ("--spec-draft-prio-batch", "--prio-batch-draft"),
    ("--spec-draft-poll-batch", "--poll-batch-draft"),
    ("--spec-draft-type-k", "-ctkd", "--cache-type-k-draft"),
    ("--spec-draft-type-v", "-ctvd", "--cache-type-v-draft"),
    ("--spec-draft-override-tensor", "-otd", "--override-tensor-draft"),
    ("--spec-draft-cpu-moe", "-cmoed", "--cpu-moe-draft"),
    ("--spec-draft-n-cpu-moe", "--spec-draft-ncmoe", "-ncmoed", "--n-cpu-moe-draft"),
    ("--spec-draft-n-min", "--draft-min", "--draft-n-min"),
    ("--spec-synth-len",),
    ("--spec-synth-rates",),
    ("--spec-draft-p-split", "--draft-p-split"),
    ("--spec-draft-p-min", "--draft-p-min"),
    ("--spec-draft-backend-sampling", "--no-spec-draft-backend-sampling"),
    ("--spec-draft-sampling",),
    ("--spec-draft-device", "-devd", "--device-draft"),
    ("--spec-draft-ngl", "-ngld", "--gpu-layers-draft", "--n-gpu-layers-draft"),
    ("--spec-ngram-mod-n-min",),
    ("--spec-ngram-mod-n-max",),
    ("--spec-ngram-mod-n-match",),
    ("--spec-ngram-simple-size-n",),
    ("--spec-ngram-simple-size-m",),
    ("--spec-ngram-simple-min-hits",),
    ("--spec-ngram-map-k-size-n",),
    ("--spec-ngram-map-k-size-m",),
    ("--spec-ngram-map-k-min-hits",),
    ("--spec-ngram-map-k4v-size-n",),
    ("--spec-ngram-map-k4v-size-m",),
    ("--spec-ngram-map-k4v-min-hits",),
    ("--spec-ngram-size-n",),
    ("--spec-ngram-size-m",),
    ("--spec-ngram-min-hits",),
)
SPECULATION: tuple[tuple[str, ...], ...] = (SPEC_TYPE, DRAFT_MODEL, DRAFT_SOURCE, DRAFT_MAX, SPEC_DEFAULT,
                                             *SPEC_SETTINGS)
SPECULATIVE_FLAGS = frozenset(flag for option in SPECULATION for flag in option)
# llama.cpp names every speculative option it adds --spec-...: a flag of a newer build than the pinned one
# still counts.
SPEC_PREFIX = "--spec-"
# --spec-type values that turn drafting off, and the prefix of the types that draft from the context (no
# drafter whose dtype or vocabulary could be wrong).
NO_SPEC_TYPES = ("", "none")
CONTEXT_TYPE_PREFIX = "ngram"
DRAFT_MODEL_LABEL = "draft model"

# vLLM's speculative decoding, another server's vocabulary kept beside llama.cpp's so that this stays the one
# place that names a speculative flag: diagnostics/vllm_evidence.py reads vLLM's command lines and files by
# these (argparse takes either word separator).
VLLM_SPEC_CONFIG = ("--speculative-config", "--speculative_config", "-sc")  # JSON, or dotted: -sc.method ngram
VLLM_SPEC_MODEL = ("--speculative-model", "--speculative_model")  # vLLM before --speculative-config
# vLLM 0.32's shorthands for three keys of the config (EngineArgs.create_speculative_config)
VLLM_SPEC_KEYS = {"method": ("--spec-method", "--spec_method"), "model": ("--spec-model", "--spec_model"),
                  "num_speculative_tokens": ("--spec-tokens", "--spec_tokens")}
VLLM_SPECULATION = (*VLLM_SPEC_CONFIG, *VLLM_SPEC_MODEL, *(flag for flags in VLLM_SPEC_KEYS.values() for flag in flags))


def parse_args(args: Sequence[str]) -> dict[str, str]:
    """Flag -> value for a llama-server argument list; bare flags map to ''."""
    parsed: dict[str, str] = {}
    i = 0
    while i < len(args):
        token = args[i]
        if token.startswith("-"):
            value = ""
            if i + 1 < len(args) and not _is_flag(args[i + 1]):
                value = args[i + 1]
                i += 1
            parsed[token] = value
        i += 1
    return parsed


def _is_flag(token: str) -> bool:
    return token.startswith("-") and not token.lstrip("-").replace(".", "", 1).isdigit()


def _first(parsed: Mapping[str, str], names: Sequence[str]) -> str | None:
    return next((parsed[name] for name in names if name in parsed), None)


def preset_facts(args: Sequence[str]) -> dict[str, str]:
    parsed = parse_args(args)
    facts = {}
    for fact, names in ARG_NAMES.items():
        value = _first(parsed, names)
        if value is not None:
            facts[fact] = value
    return facts


def kv_types(args: Sequence[str]) -> str:
    """K/V cache types, llama-server's default f16 where a preset leaves one out."""
    facts = preset_facts(args)
    return f"{facts.get('cache_k', 'f16')}/{facts.get('cache_v', 'f16')}"


def is_speculative_flag(flag: str) -> bool:
    """A flag that only concerns speculative decoding (--spec-type among them)."""
    return flag in SPECULATIVE_FLAGS or flag.startswith(SPEC_PREFIX)


def names_speculation(args: Sequence[str]) -> bool:
    """Any speculative-decoding flag at all, --spec-type none included."""
    return any(is_speculative_flag(flag) for flag in parse_args(args))


def _types(parsed: Mapping[str, str]) -> list[str] | None:
    """The --spec-type values (comma-separated, as llama-server takes them), the "off" ones dropped; None
    when no type is given."""
    value = _first(parsed, SPEC_TYPE)
    if value is None:
        return None
    return [t for t in (t.strip() for t in value.split(",")) if t not in NO_SPEC_TYPES]


def _has_drafter(parsed: Mapping[str, str]) -> bool:
    return any(name in parsed for name in DRAFT_MODEL + DRAFT_SOURCE)


def _speculates(parsed: Mapping[str, str]) -> bool:
    """--spec-default drafts whatever else is given; else an explicit --spec-type decides (``none`` keeps
    a drafter unused); else a drafter alone makes llama-server draft."""
    if any(name in parsed for name in SPEC_DEFAULT):
        return True
    types = _types(parsed)
    return bool(types) if types is not None else _has_drafter(parsed)


def is_speculative(args: Sequence[str]) -> bool:
    """Whether the preset drafts: the Speculation column, the speculation check and the control choice ask this."""
    return _speculates(parse_args(args))


def draft_max(args: Sequence[str]) -> int | None:
    """Tokens drafted per round, where the preset sets it as a whole number."""
    value = _first(parse_args(args), DRAFT_MAX)
    try:
        return None if value is None else int(value)
    except ValueError:
        return None


def drafts_from_context(args: Sequence[str]) -> bool | None:
    """True for llama.cpp's n-gram drafting (no drafter whose dtype or vocabulary could be wrong), False for
    a drafter; None where the server reports no arguments (an OpenAI server), so how it drafts is unknown."""
    if not args:
        return None
    parsed = parse_args(args)
    if _has_drafter(parsed):
        return False
    types = _types(parsed)
    if types:
        return all(t.startswith(CONTEXT_TYPE_PREFIX) for t in types)
    return any(name in parsed for name in SPEC_DEFAULT)


def speculation(args: Sequence[str]) -> str:
    """The speculative-decoding setting: type and depth, "draft model" (a drafter, the type left to the
    server), "default" (--spec-default), or "-" for none."""
    parsed = parse_args(args)
    if not _speculates(parsed):
        return "-"
    depth = _first(parsed, DRAFT_MAX)
    types = _types(parsed)
    if types:
        return ",".join(types) + (f" n={depth}" if depth is not None else "")
    return DRAFT_MODEL_LABEL if _has_drafter(parsed) else "default"


def without_speculation(args: Sequence[str]) -> dict[str, str]:
    """The preset's other arguments (flag -> value): what must match between a speculative preset and its
    control."""
    return {k: v for k, v in parse_args(args).items() if not is_speculative_flag(k)}


# --- the same questions of a preset's INI settings (tune's grid) ------------------------------------

V = TypeVar("V")


def ini_flag(key: str) -> str:
    """The command-line flag of an INI key (``md`` -> ``-md``, ``model-draft`` -> ``--model-draft``)."""
    return next((flag for flag in SPECULATIVE_FLAGS if flag.lstrip("-") == key), "--" + key)


def ini_args(settings: Mapping[str, object]) -> list[str]:
    """INI settings as the llama-server arguments they stand for: true as a bare flag, false left out (as
    the router does for a flag without a negative spelling)."""
    args: list[str] = []
    for key, value in settings.items():
        if value is False:
            continue
        args.append(ini_flag(key))
        if value is not True:
            args.append(str(value))
    return args


def settings_speculate(settings: Mapping[str, object]) -> bool:
    return is_speculative(ini_args(settings))


def settings_without_speculation(settings: Mapping[str, V]) -> dict[str, V]:
    """INI settings with every speculation-only key dropped but the type: a control keeps an explicit
    ``spec-type = none`` (a fork that defaults the type to auto would draft without it)."""
    return {k: v for k, v in settings.items() if ini_flag(k) in SPEC_TYPE or not is_speculative_flag(ini_flag(k))}


def describe_preset(args: Sequence[str]) -> str:
    facts = preset_facts(args)
    parts = []
    if "cache_k" in facts or "cache_v" in facts:
        parts.append(f"KV {kv_types(args)}")
    spec = speculation(args)
    if spec != "-":
        parts.append(spec if spec == DRAFT_MODEL_LABEL else f"spec {spec}")
    return ", ".join(parts) or "-"
