"""The server-facing side: the ``Engine`` interface and the two kinds of server llm-bench measures.

``llama-cpp``: a llama.cpp router (``llama_cpp.py``). ``openai``: any OpenAI-compatible server
(``openai.py``). Below them: ``client.py`` (HTTP), ``stream.py`` (one streamed completion),
``metrics.py`` (Prometheus counters), ``switch.py`` (bringing a container engine up and down).
"""

from __future__ import annotations

from collections.abc import Callable

from llm_bench.engines import llama_cpp, openai
from llm_bench.engines.base import PRESET_SOURCE, Capabilities, Connection, Engine, EngineKind, RouterListing
from llm_bench.engines.client import DEFAULT_STREAMS
from llm_bench.engines.errors import UnknownAlias
from llm_bench.engines.llama_cpp import LlamaCppEngine
from llm_bench.engines.openai import OpenAIEngine

__all__ = ["DEFAULT_ENGINE", "DEFAULT_STREAMS", "ENGINES", "REGISTRY", "Capabilities", "Connection", "Engine",
           "EngineKind", "LlamaCppEngine", "OpenAIEngine", "capabilities_of", "engine_help", "open_engine",
           "select_models"]

# Every kind of server, by its --engine name: adding one is its module (an Engine and its EngineKind) and
# one entry here. The first is the default.
REGISTRY: dict[str, EngineKind] = {kind.name: kind for kind in (llama_cpp.ENGINE, openai.ENGINE)}
ENGINES = tuple(REGISTRY)
DEFAULT_ENGINE = ENGINES[0]


def engine_help() -> str:
    """--engine's help, from the registry."""
    return "; ".join(f"{k.name}: {k.describe}" + (" (default)" if k.name == DEFAULT_ENGINE else "")
                     for k in REGISTRY.values()) + "."


def capabilities_of(kind: str) -> Capabilities:
    """What a kind of engine can do, before any is opened (a plan's targets)."""
    return _kind(kind).capabilities


def _kind(kind: str) -> EngineKind:
    if kind not in REGISTRY:
        raise ValueError(f"unknown engine {kind!r}; choose one of {', '.join(ENGINES)}")
    return REGISTRY[kind]


def open_engine(kind: str, url: str, *, timeout: float, api_key: str | None = None,
                metrics_url: str | None = None, load_timeout: float = 900.0, streams: int = DEFAULT_STREAMS,
                metrics_key: bool = False) -> Engine:
    """``streams``: the most simultaneous streams the caller will open (the connection pool's size)."""
    return _kind(kind).open(Connection(url, timeout, api_key, metrics_url, load_timeout, streams, metrics_key))


SOURCE_WHY = {
    "cache": "a download in the router's model cache (LLAMA_CACHE), listed under no preset's settings",
    "models_dir": "a file of the router's --models-dir, under no preset's settings",
}


def left_out(engine: Engine) -> dict[str, str]:
    """The entries a run measures only when named: a router's listing beyond its presets (llama.cpp lists
    every model of its cache beside the presets, once a preset has downloaded one), each with why."""
    if not isinstance(engine, RouterListing):
        return {}
    return {alias: SOURCE_WHY.get(source, f"source {source!r}, not a preset")
            for alias, source in engine.sources().items() if source != PRESET_SOURCE}


def select_models(engine: Engine, wanted: tuple[str, ...], log: Callable[[str], None] | None = None) -> list[str]:
    """The aliases named, each one the server lists; none named: every preset the server lists (what was
    left out said through ``log``)."""
    listed = engine.models()
    if not wanted:
        if not listed:
            raise UnknownAlias(f"the server at {engine.base_url} lists no models")
        skipped = left_out(engine)
        measured = [a for a in listed if a not in skipped]
        if not measured:
            raise UnknownAlias(f"the server at {engine.base_url} lists no preset, only {', '.join(skipped)}; "
                               "name what to measure (--alias ALIAS)")
        if skipped and log is not None:
            for alias, why in skipped.items():
                log(f"Not measured: {alias} ({why}); name it (--alias {alias}) to measure it")
        return measured
    unknown = [a for a in wanted if a not in listed]
    if unknown:
        what = "preset(s)" if engine.capabilities.presets else "model(s)"
        raise UnknownAlias(
            f"unknown {what} {', '.join(unknown)}; the server at {engine.base_url} lists: {', '.join(listed)}"
        )
    return list(wanted)
