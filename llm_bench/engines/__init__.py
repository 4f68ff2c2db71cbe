"""The server-facing side: the ``Engine`` interface and the two kinds of server llm-bench measures.

``llama-cpp``: a llama.cpp router (``llama_cpp.py``). ``openai``: any OpenAI-compatible server
(``openai.py``). Below them: ``client.py`` (HTTP), ``stream.py`` (one streamed completion),
``metrics.py`` (Prometheus counters), ``switch.py`` (bringing a container engine up and down).
"""

from __future__ import annotations

from llm_bench.engines import llama_cpp, openai
from llm_bench.engines.base import Capabilities, Connection, Engine, EngineKind
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


def select_models(engine: Engine, wanted: tuple[str, ...]) -> list[str]:
    listed = engine.models()
    if not wanted:
        if not listed:
            raise UnknownAlias(f"the server at {engine.base_url} lists no models")
        return listed
    unknown = [a for a in wanted if a not in listed]
    if unknown:
        what = "preset(s)" if engine.capabilities.presets else "model(s)"
        raise UnknownAlias(
            f"unknown {what} {', '.join(unknown)}; the server at {engine.base_url} lists: {', '.join(listed)}"
        )
    return list(wanted)

