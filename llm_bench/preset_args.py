"""What a preset's llama-server arguments (as the router reports them) say: context, KV cache types,
speculative decoding. Read by the report's columns and by the quality workload's choice of a control."""

from __future__ import annotations

from collections.abc import Sequence

# Long and short spellings llama-server accepts for the preset facts the table shows.
ARG_NAMES = {
    "ctx": ("--ctx-size", "-c"),
    "cache_k": ("--cache-type-k", "-ctk"),
    "cache_v": ("--cache-type-v", "-ctv"),
    "spec_type": ("--spec-type",),
    "draft_max": ("--spec-draft-n-max",),
    "model_draft": ("--spec-draft-model", "--model-draft", "-md"),
}


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


def preset_facts(args: Sequence[str]) -> dict[str, str]:
    parsed = parse_args(args)
    facts = {}
    for fact, names in ARG_NAMES.items():
        for name in names:
            if name in parsed:
                facts[fact] = parsed[name]
                break
    return facts


def kv_types(args: Sequence[str]) -> str:
    """K/V cache types, llama-server's default f16 where a preset leaves one out."""
    facts = preset_facts(args)
    return f"{facts.get('cache_k', 'f16')}/{facts.get('cache_v', 'f16')}"


def speculation(args: Sequence[str]) -> str:
    """The speculative-decoding setting: type and depth, "draft model", or "-" for none."""
    facts = preset_facts(args)
    spec = facts.get("spec_type")
    if spec and spec != "none":
        return f"{spec}" + (f" n={facts['draft_max']}" if "draft_max" in facts else "")
    return "draft model" if "model_draft" in facts else "-"


def describe_preset(args: Sequence[str]) -> str:
    facts = preset_facts(args)
    parts = []
    if "cache_k" in facts or "cache_v" in facts:
        parts.append(f"KV {kv_types(args)}")
    spec = speculation(args)
    if spec != "-":
        parts.append(spec if spec == "draft model" else f"spec {spec}")
    return ", ".join(parts) or "-"
