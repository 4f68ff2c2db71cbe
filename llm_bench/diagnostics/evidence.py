"""Evidence about the server that several checks share: the router's presets and their arguments,
the NixOS marker, the llamAmpere fork, and the config files a container engine was started with."""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from pathlib import Path

from llm_bench.diagnostics.checks import fork_build
from llm_bench.engines import Engine
from llm_bench.engines.errors import ServerError

MARKER = Path("/etc/llama-cpp/active.json")  # written by the flake's llama-cpp module


def router_presets(engine: Engine) -> dict[str, list[str]]:
    """Each preset's llama-server arguments as the router's /models reports them (no model is loaded);
    empty for a server that is not a llama.cpp router."""
    try:
        return engine.preset_args()
    except ServerError:
        return {}


def read_marker(path: Path = MARKER) -> dict | None:
    try:
        data = json.loads(path.read_text())
    except (OSError, ValueError):
        return None
    return data if isinstance(data, dict) else None


def detect_fork(engine: Engine, presets: Mapping[str, Sequence[str]], named: str | None = None,
                marker: Path = MARKER) -> str | None:
    """Where the llamAmpere fork shows: --build, the marker, /props build_info, or a preset's binary path."""
    try:
        build = engine.server_build()
    except ServerError:
        build = None
    binary = next((args[0] for args in presets.values() if args), None)
    return fork_build(read_marker(marker), build, binary, named)


def read_config_files(paths: Sequence[Path]) -> dict[str, str]:
    """compose files and .env files, by name; an unreadable one is an error the user must fix."""
    return {str(p): p.read_text(errors="replace") for p in paths}
