"""Adopting the winner: the ``services.llama-cpp.presets`` snippet (Nix) and the command that re-measures it.

The snippet states every setting the candidate was measured with (the base preset and its axis
values), so it does not depend on the tune's base; keys of the machine's ``"*"`` preset still apply
to it, as to every preset.
"""

from __future__ import annotations

import json
import re
import shlex
from collections.abc import Mapping

from llm_bench.plan import DEFAULT_URL, Protocol
from llm_bench.tune.grid import Value

NIX_IDENTIFIER = re.compile(r"[a-zA-Z_][a-zA-Z0-9_'-]*")
NIX_KEYWORDS = {"if", "then", "else", "assert", "with", "let", "in", "rec", "inherit", "or"}


def nix_string(text: str) -> str:
    """A Nix string literal: JSON's escapes are Nix's, plus ``${`` must not start an interpolation."""
    return json.dumps(text).replace("${", "\\${")


def nix_name(name: str) -> str:
    return name if NIX_IDENTIFIER.fullmatch(name) and name not in NIX_KEYWORDS else nix_string(name)


def nix_value(value: Value) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, int):
        return str(value)
    if isinstance(value, float):
        return repr(value)  # shortest round-trip spelling; the module renders floats without loss
    return nix_string(str(value))


def nix_snippet(presets: Mapping[str, Mapping[str, Value]], comments: Mapping[str, str] | None = None) -> str:
    """``services.llama-cpp.presets."NAME" = { ... };`` per preset, ready to paste into a NixOS configuration."""
    lines: list[str] = []
    for name, settings in presets.items():
        comment = (comments or {}).get(name, "")
        lines += [f"# {line}" for line in comment.splitlines()]
        lines.append(f"services.llama-cpp.presets.{nix_string(name)} = {{")
        lines += [f"  {nix_name(key)} = {nix_value(value)};" for key, value in settings.items()]
        lines.append("};")
    return "\n".join(lines) + "\n"


def remeasure_command(winner: str, control: str, protocol: Protocol, url: str = DEFAULT_URL,
                      label: str = "after-tune") -> str:
    """``llm-bench run`` measuring the winner and the control on the main router after a rebuild."""
    argv = ["llm-bench", "run", "--url", url, "--alias", winner]
    if control != winner:
        argv += ["--alias", control]
    argv += ["--runs", str(protocol.runs), "--max-tokens", str(protocol.max_tokens), "--label", label]
    return shlex.join(argv)
