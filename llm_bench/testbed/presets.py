"""Render a llama.cpp router presets INI (``--models-preset``) from Python data.

The NixOS module has its own renderer in Nix; this one serves the demo and the tests.
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path

Value = str | int | float | bool


def _value(section: str, key: str, value: Value) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, (int, float, str, Path)):
        text = str(value)
        if "\n" in text:
            raise ValueError(f"preset [{section}] key {key!r}: a value cannot contain a newline")
        return text
    raise ValueError(f"preset [{section}] key {key!r}: unsupported value type {type(value).__name__}")


def render_presets_ini(presets: Mapping[str, Mapping[str, Value]]) -> str:
    """``presets`` maps section name to key/value; the ``*`` section holds global settings."""
    lines = ["version = 1", ""]
    ordered = sorted(presets, key=lambda name: (name != "*", name))
    for name in ordered:
        if "\n" in name or "]" in name or not name:
            raise ValueError(f"preset name {name!r} cannot be empty or contain ']' or a newline")
        lines.append(f"[{name}]")
        for key, value in presets[name].items():
            lines.append(f"{key} = {_value(name, key, value)}")
        lines.append("")
    return "\n".join(lines)
