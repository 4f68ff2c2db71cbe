"""Any OpenAI-compatible server (vLLM, HyperQwen, a LiteLLM proxy, llama-server's ``/v1``).

Nothing can be unloaded; decode speed is measured from the stream and drafting is read from
Prometheus ``/metrics`` counters where the server has them.
"""

from __future__ import annotations

import uuid
from typing import Any

import httpx

from llm_bench.engines.base import Capabilities, Connection, EngineKind
from llm_bench.engines.client import DEFAULT_STREAMS, OpenAIClient, same_origin
from llm_bench.engines.completion import Completion, CompletionRequest, parse_completion
from llm_bench.engines.logprobs import VllmLogprobs
from llm_bench.engines.metrics import (
    PrefixCacheCounters,
    SpecCounters,
    parse_prometheus,
    prefix_cache_counters,
    spec_counters,
)
from llm_bench.engines.stream import ChatRequest, StreamMeasurement


class OpenAIEngine:
    kind = "openai"
    capabilities = Capabilities(unload=False, server_decode_rate=False, presets=False, model_events=False,
                                top_logprobs="prompt")
    cold_prompt = "a unique first line (nonce) and a unique cache_salt per request"

    def __init__(self, url: str, timeout: float, api_key: str | None = None, metrics_url: str | None = None,
                 streams: int = DEFAULT_STREAMS, metrics_key: bool = False):
        self.client = OpenAIClient(url, api_key=api_key, timeout=timeout, streams=streams)
        self.base_url = self.client.base_url
        self.metrics_path = metrics_url or "/metrics"
        # The bearer key goes to the metrics URL only on the server's own origin, or when asked for:
        # a key must not leak to whatever host --metrics-url names.
        self._metrics_http = (self.client.http if metrics_key or same_origin(self.metrics_path, self.base_url)
                              else httpx.Client(timeout=httpx.Timeout(30.0, connect=10.0)))

    def close(self) -> None:
        if self._metrics_http is not self.client.http:
            self._metrics_http.close()
        self.client.close()

    def models(self) -> list[str]:
        return [m["id"] for m in self.client.get_json("/v1/models").get("data", [])]

    def loaded_models(self) -> list[str]:
        return self.models()  # an OpenAI server serves only what it has loaded

    def make_cold(self, model: str) -> bool:
        return False  # an OpenAI server keeps its model loaded: there is no cold load to time

    def warm_up(self, request: ChatRequest) -> tuple[StreamMeasurement, list[str]]:
        return self.stream(request), []

    def stream(self, request: ChatRequest) -> StreamMeasurement:
        if request.prompt_cache:
            return self.client.stream_chat(request)
        # Which server (or proxy) answers is unknown, and many ignore every cache switch (llama-server's /v1
        # ignores cache_salt and caches by default): a first line no other request has leaves no prefix to
        # reuse. The salt stays for vLLM, which keys its prefix cache by it.
        return self.client.stream_chat(request.with_unique_start(), extra={"cache_salt": uuid.uuid4().hex})

    def complete(self, request: CompletionRequest) -> Completion:
        body = {**request.body(), "cache_salt": uuid.uuid4().hex}  # see stream(): no reused prefix
        return parse_completion(self.client.post_json("/v1/chat/completions", body))

    def context_length(self, model: str) -> int | None:
        for item in self.client.get_json("/v1/models").get("data", []):
            if item.get("id") == model and item.get("max_model_len"):  # vLLM's field
                return int(item["max_model_len"])
        return None

    def describe(self, model: str) -> tuple[list[str], str | None]:
        return [], None

    def server_build(self) -> str | None:
        return None

    def preset_args(self) -> dict[str, list[str]]:
        return {}

    def model_props(self, model: str) -> dict[str, Any] | None:
        return None  # the OpenAI API reports no model capabilities

    def chat(self, body: dict[str, Any]) -> dict[str, Any]:
        return self.client.post_json("/v1/chat/completions", body)

    def auth_headers(self) -> dict[str, str]:
        return dict(self.client.http.headers)

    def metrics_text(self) -> str | None:
        """The Prometheus text at the metrics URL; None where the server has none."""
        try:
            response = self._metrics_http.get(self.metrics_path)
        except httpx.HTTPError:
            return None
        return response.text if response.status_code == 200 else None

    def _metrics(self):
        text = self.metrics_text()
        return None if text is None else parse_prometheus(text)

    def spec_counters(self, model: str) -> SpecCounters | None:
        samples = self._metrics()
        return None if samples is None else spec_counters(samples, model)

    def prefix_counters(self, model: str) -> PrefixCacheCounters | None:
        samples = self._metrics()
        return None if samples is None else prefix_cache_counters(samples, model)

    def logprobs(self) -> VllmLogprobs:
        return VllmLogprobs(self.client)

    def release(self, model: str) -> None:
        pass


def _open(c: Connection) -> OpenAIEngine:
    return OpenAIEngine(c.url, c.timeout, c.api_key, c.metrics_url, streams=c.streams, metrics_key=c.metrics_key)


ENGINE = EngineKind(OpenAIEngine.kind, "any OpenAI-compatible server", OpenAIEngine.capabilities, _open)
