"""The memory-bandwidth roofline of decoding.

Generating one token reads (nearly) every weight once, so decode speed cannot exceed

    bound (t/s) = memory bandwidth (bytes/s) / bytes read per token

Bandwidth comes from NVML (``llm_bench.gpu.memory_bandwidth_gbs``: max memory clock x 2 x bus
width / 8); the bytes read per token are approximated by the model file's size (GGUF weights
as stored, so quantisation counts; the KV cache read and the draft model are ignored, which
makes the bound slightly optimistic). With speculative decoding the target reads its weights
once per verification step and emits the mean acceptance length in tokens, so the bound is
multiplied by that length.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from pathlib import Path

from llm_bench.preset_args import draft_max

MODEL_FLAGS = ("--model", "-m")
_SPLIT = re.compile(r"^(?P<stem>.*)-(?P<n>\d{5})-of-(?P<total>\d{5})\.gguf$")


def model_path(args: Sequence[str]) -> str | None:
    """The ``--model`` path of a llama-server argument list (as the router reports it)."""
    for i, token in enumerate(args):
        if token in MODEL_FLAGS and i + 1 < len(args):
            return args[i + 1]
        for flag in MODEL_FLAGS:
            if token.startswith(flag + "="):
                return token.split("=", 1)[1]
    return None


def model_bytes(path: str | Path) -> int | None:
    """Size of a GGUF model on disk; a split model (``-00001-of-00003.gguf``) counts every part."""
    p = Path(path)
    match = _SPLIT.match(p.name)
    try:
        if match:
            parts = [p.with_name(f"{match['stem']}-{n:05d}-of-{match['total']}.gguf")
                     for n in range(1, int(match["total"]) + 1)]
            return sum(part.stat().st_size for part in parts)
        return p.stat().st_size
    except OSError:
        return None


def bound_tps(bandwidth_gbs: float | None, bytes_per_token: int | None,
              mean_acceptance_length: float | None = None) -> float | None:
    if not bandwidth_gbs or not bytes_per_token:
        return None
    bound = bandwidth_gbs * 1e9 / bytes_per_token
    if mean_acceptance_length and mean_acceptance_length > 0:
        bound *= mean_acceptance_length
    return bound


def fraction(decode_tps: float | None, bound: float | None) -> float | None:
    if decode_tps is None or not bound:
        return None
    return decode_tps / bound


def apply(record, bandwidth_gbs: float | None, size_bytes: int | None = None) -> None:
    """Fill a record's roofline fields from its preset arguments (or a given model size)."""
    if size_bytes is None:
        path = model_path(record.preset_args)
        size_bytes = model_bytes(path) if path else None
    record.model_bytes = size_bytes
    record.memory_bandwidth_gbs = bandwidth_gbs
    record.roofline_tps = bound_tps(bandwidth_gbs, size_bytes, acceptance_length(record))


def acceptance_length(record) -> float | None:
    """Tokens per target forward pass: 1 + accepted / draft rounds, measured where the server counts its
    rounds (vLLM; llama.cpp from b11434 on a preset with ``metrics = true``: ``spec_decode_num_drafts_total``).

    Else estimated: per-request timings give drafted and accepted tokens but not rounds; with a draft depth of
    N (the preset's ``draft_max``) each round drafts (at most) N tokens, so rounds ~ drafted / N and the length
    ~ 1 + rate x N (an upper estimate: a round that drafts fewer than N tokens counts as less than one).
    """
    spec = record.spec
    if spec is None or not spec.draft_tokens:
        return None
    if spec.mean_acceptance_length is not None:
        return spec.mean_acceptance_length
    n = draft_max(record.preset_args)
    return None if n is None else 1.0 + (spec.acceptance_rate or 0.0) * n
