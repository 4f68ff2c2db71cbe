"""The two kinds of server llm-bench measures, behind one small interface.

``llama-cpp``: a llama.cpp router. Models can be unloaded, so a cold load is measured, and
decode speed and drafting come from the server's own ``timings``.

``openai``: any OpenAI-compatible server (vLLM, HyperQwen, a LiteLLM proxy, llama-server's
``/v1``). Nothing can be unloaded; decode speed is measured from the stream and drafting is
read from Prometheus ``/metrics`` counters where the server has them.
"""

from __future__ import annotations

from llm_bench.client import (
    ChatRequest,
    OpenAIClient,
    RouterClient,
    StatusWatcher,
    StreamMeasurement,
    UnknownAlias,
)
from llm_bench.metrics import (
    PrefixCacheCounters,
    SpecCounters,
    parse_prometheus,
    prefix_cache_counters,
    spec_counters,
)

ENGINES = ("llama-cpp", "openai")


class LlamaCppEngine:
    kind = "llama-cpp"
    decode_source = "server timings"

    def __init__(self, url: str, timeout: float, api_key: str | None = None, load_timeout: float = 900.0):
        self.client = RouterClient(url, api_key=api_key, timeout=timeout)
        self.base_url = self.client.base_url
        self.load_timeout = load_timeout

    def close(self) -> None:
        self.client.close()

    def models(self) -> list[str]:
        return [m.id for m in self.client.models()]

    def make_cold(self, alias: str) -> bool:
        """Unload the alias and wait until the router says so; True: a cold load can be timed."""
        if self.client.model(alias).status != "unloaded":
            self.client.unload(alias)
            self.client.wait_for_status(alias, "unloaded", self.load_timeout)
        return True

    def warm_up(self, request: ChatRequest) -> tuple[StreamMeasurement, list[str]]:
        with StatusWatcher(self.base_url, request.model, self.client.http.headers) as watcher:
            measurement = self.client.stream_chat(request)
        return measurement, watcher.transitions

    def stream(self, request: ChatRequest) -> StreamMeasurement:
        return self.client.stream_chat(request)

    def describe(self, alias: str) -> tuple[list[str], str | None]:
        return list(self.client.model(alias).args), self.client.props(alias).get("build_info")

    def server_build(self) -> str | None:
        return self.client.props().get("build_info")

    def spec_counters(self, alias: str) -> SpecCounters | None:
        return None  # per-request timings carry draft_n / draft_n_accepted instead

    def prefix_counters(self, alias: str) -> PrefixCacheCounters | None:
        return None  # timings.cache_n confirms a hit per request

    def release(self, alias: str) -> None:
        self.make_cold(alias)


class OpenAIEngine:
    kind = "openai"
    decode_source = "stream"

    def __init__(self, url: str, timeout: float, api_key: str | None = None, metrics_url: str | None = None):
        self.client = OpenAIClient(url, api_key=api_key, timeout=timeout)
        self.base_url = self.client.base_url
        self.metrics_path = metrics_url or "/metrics"

    def close(self) -> None:
        self.client.close()

    def models(self) -> list[str]:
        return [m["id"] for m in self.client.get_json("/v1/models").get("data", [])]

    def make_cold(self, model: str) -> bool:
        return False  # an OpenAI server keeps its model loaded: there is no cold load to time

    def warm_up(self, request: ChatRequest) -> tuple[StreamMeasurement, list[str]]:
        return self.client.stream_chat(request), []

    def stream(self, request: ChatRequest) -> StreamMeasurement:
        return self.client.stream_chat(request)

    def describe(self, model: str) -> tuple[list[str], str | None]:
        return [], None

    def server_build(self) -> str | None:
        return None

    def _metrics(self):
        try:
            response = self.client.http.get(self.metrics_path)
        except Exception:
            return None
        if response.status_code != 200:
            return None
        return parse_prometheus(response.text)

    def spec_counters(self, model: str) -> SpecCounters | None:
        samples = self._metrics()
        return None if samples is None else spec_counters(samples, model)

    def prefix_counters(self, model: str) -> PrefixCacheCounters | None:
        samples = self._metrics()
        return None if samples is None else prefix_cache_counters(samples, model)

    def release(self, model: str) -> None:
        pass


Engine = LlamaCppEngine | OpenAIEngine


def open_engine(kind: str, url: str, *, timeout: float, api_key: str | None = None,
                metrics_url: str | None = None, load_timeout: float = 900.0) -> Engine:
    if kind == "llama-cpp":
        return LlamaCppEngine(url, timeout, api_key, load_timeout)
    if kind == "openai":
        return OpenAIEngine(url, timeout, api_key, metrics_url)
    raise ValueError(f"unknown engine {kind!r}; choose one of {', '.join(ENGINES)}")


def select_models(engine: Engine, wanted: tuple[str, ...]) -> list[str]:
    listed = engine.models()
    if not wanted:
        if not listed:
            raise UnknownAlias(f"the server at {engine.base_url} lists no models")
        return listed
    unknown = [a for a in wanted if a not in listed]
    if unknown:
        what = "preset(s)" if engine.kind == "llama-cpp" else "model(s)"
        raise UnknownAlias(
            f"unknown {what} {', '.join(unknown)}; the server at {engine.base_url} lists: {', '.join(listed)}"
        )
    return list(wanted)

