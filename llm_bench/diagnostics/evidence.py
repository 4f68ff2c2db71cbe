"""Evidence about the server that several checks share: the router's presets and their arguments,
the NixOS marker, the llamAmpere fork, and the config files a container engine was started with."""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from pathlib import Path
from urllib.parse import urlsplit

from llm_bench.diagnostics.fork import fork_build
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


LOOPBACK = {"localhost", "127.0.0.1", "::1"}


def _endpoint(url: str) -> tuple[str, int | None]:
    parts = urlsplit(url)
    host = parts.hostname or ""
    return ("127.0.0.1" if host in LOOPBACK else host), parts.port or {"http": 80, "https": 443}.get(parts.scheme)


def marker_package(marker: dict | None, server_url: str) -> dict | None:
    """The llama.cpp build the NixOS marker says serves `server_url`: its specialisation, package name,
    version, store path and source revision (the fork's commit); None when the marker describes
    another server or there is none."""
    marker = marker or {}
    package, url = marker.get("package"), marker.get("url")
    if not isinstance(package, dict) or not isinstance(url, str) or _endpoint(url) != _endpoint(server_url):
        return None
    facts = {"specialisation": marker.get("specialisation"), "name": package.get("name"),
             "version": package.get("version"), "rev": package.get("rev"), "path": package.get("path")}
    return {k: v for k, v in facts.items() if isinstance(v, str)} or None


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
