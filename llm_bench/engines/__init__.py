"""The server-facing side: the ``Engine`` interface and the two kinds of server llm-bench measures.

``llama-cpp``: a llama.cpp router (``llama_cpp.py``). ``openai``: any OpenAI-compatible server
(``openai.py``). Below them: ``client.py`` (HTTP), ``stream.py`` (one streamed completion),
``metrics.py`` (Prometheus counters), ``switch.py`` (bringing a container engine up and down).
"""

from __future__ import annotations

from llm_bench.engines.base import Capabilities, Engine
from llm_bench.engines.client import DEFAULT_STREAMS
from llm_bench.engines.errors import UnknownAlias
from llm_bench.engines.llama_cpp import LlamaCppEngine
from llm_bench.engines.openai import OpenAIEngine

KINDS: dict[str, type[LlamaCppEngine] | type[OpenAIEngine]] = {LlamaCppEngine.kind: LlamaCppEngine,
                                                               OpenAIEngine.kind: OpenAIEngine}
ENGINES = tuple(KINDS)
DEFAULT_ENGINE = LlamaCppEngine.kind


def capabilities_of(kind: str) -> Capabilities:
    """What a kind of engine can do, before any is opened (a plan's targets)."""
    return KINDS[kind].capabilities


def open_engine(kind: str, url: str, *, timeout: float, api_key: str | None = None,
                metrics_url: str | None = None, load_timeout: float = 900.0, streams: int = DEFAULT_STREAMS,
                metrics_key: bool = False) -> Engine:
    """``streams``: the most simultaneous streams the caller will open (the connection pool's size)."""
    if kind == LlamaCppEngine.kind:
        return LlamaCppEngine(url, timeout, api_key, load_timeout, streams=streams)
    if kind == OpenAIEngine.kind:
        return OpenAIEngine(url, timeout, api_key, metrics_url, streams=streams, metrics_key=metrics_key)
    raise ValueError(f"unknown engine {kind!r}; choose one of {', '.join(ENGINES)}")


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

