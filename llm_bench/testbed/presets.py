"""Render a llama.cpp router presets INI (``--models-preset``) from Python data: the one renderer.

The NixOS module has its own renderer in Nix; this one serves ``llm-bench tune``, the demo and the
tests. No ``version`` line: routers built from older llama.cpp read a top-level key as a phantom
preset. The ``*`` section (global settings) comes first, the others in the order given.
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path

Value = str | int | float | bool

# A line break ends the line, and llama.cpp's INI reader takes ';' or '#' as the start of a comment.
FORBIDDEN = "\n\r;#"


class PresetError(ValueError):
    """A preset name or value the INI cannot hold."""


def _value(section: str, key: str, value: Value) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, (int, float, str, Path)):
        text = str(value)
        if any(c in text for c in FORBIDDEN):
            raise PresetError(f"preset {section!r}, key {key!r}: {text!r} holds a line break, ';' or '#'")
        return text
    raise PresetError(f"preset {section!r}, key {key!r}: unsupported value type {type(value).__name__}")


def _check_name(name: str) -> None:
    if not name or name != name.strip() or any(c in name for c in "]" + FORBIDDEN):
        raise PresetError(f"preset name {name!r} cannot be empty, hold ']', ';', '#' or a line break, "
                          "or start/end blank")
    if name != "*" and ":" in name:
        # common/preset.cpp (load_from_ini) reads what follows the last ':' as a quantisation tag, as in
        # owner/repo:Q8_0, and lists the preset under the tag upper-cased: the alias then matches nothing.
        head, _, tag = name.rpartition(":")
        raise PresetError(f"preset name {name!r} holds ':': llama.cpp's router reads what follows it as a "
                          f"quantisation tag and lists the preset as {head + ':' + tag.upper()!r} (or shorter), so "
                          f"requests for {name!r} would not find it; use '-' instead ({name.replace(':', '-')!r})")


def _check_key(section: str, key: str) -> None:
    if not key or key != key.strip() or any(c in key for c in "=[" + FORBIDDEN):
        raise PresetError(f"preset {section!r}: key {key!r} cannot be empty, hold '=', '[', ';', '#' or a "
                          "line break, or start/end blank")


def render_presets_ini(presets: Mapping[str, Mapping[str, Value]]) -> str:
    """``presets`` maps section name to key/value; the ``*`` section holds global settings."""
    lines: list[str] = []
    ordered = [name for name in presets if name == "*"] + [name for name in presets if name != "*"]
    for name in ordered:
        _check_name(name)
        lines.append(f"[{name}]")
        for key, value in presets[name].items():
            _check_key(name, key)
            lines.append(f"{key} = {_value(name, key, value)}")
        lines.append("")
    return "\n".join(lines)
