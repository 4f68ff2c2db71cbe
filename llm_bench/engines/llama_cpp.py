"""A llama.cpp router: presets are unloaded between aliases, so a cold load is measured; decode
speed and drafting come from the server's own per-request ``timings``, draft rounds and per-position
acceptance from the instance's ``/metrics`` where the preset turns it on."""

from __future__ import annotations

from typing import Any

from llm_bench.engines.base import LOADED_STATES, SLEEPING, Capabilities, Connection, EngineKind
from llm_bench.engines.client import DEFAULT_STREAMS, RouterClient, StatusWatcher
from llm_bench.engines.completion import Completion, CompletionRequest, parse_completion
from llm_bench.engines.logprobs import LlamaServerLogprobs
from llm_bench.engines.metrics import (
    LLAMA_CPP_PREFIX,
    PrefixCacheCounters,
    SpecCounters,
    parse_prometheus,
    spec_counters,
)
from llm_bench.engines.stream import ChatRequest, StreamMeasurement


class LlamaCppEngine:
    kind = "llama-cpp"
    capabilities = Capabilities(unload=True, server_decode_rate=True, presets=True, model_events=True,
                                top_logprobs="teacher-forced")
    cold_prompt = "cache_prompt = false"

    def __init__(self, url: str, timeout: float, api_key: str | None = None, load_timeout: float = 900.0,
                 streams: int = DEFAULT_STREAMS):
        self.client = RouterClient(url, api_key=api_key, timeout=timeout, streams=streams)
        self.base_url = self.client.base_url
        self.load_timeout = load_timeout
        self._load_stages: dict[str, float] = {}  # the last warm-up's load, stage by stage (/models/sse)

    def close(self) -> None:
        self.client.close()

    def models(self) -> list[str]:
        return [m.id for m in self.client.models()]

    def loaded_models(self) -> list[str]:
        # not the sleeping: their model's memory is freed (sleeping_models names them)
        return [m.id for m in self.client.models() if m.status in LOADED_STATES]

    def sleeping_models(self) -> list[str]:
        return [m.id for m in self.client.models() if m.status == SLEEPING]

    def speculation(self, alias: str) -> str | None:
        # Per slot (tools/server/server-context.cpp, the slot's to_json): "speculative" is can_speculate(), and
        # params["speculative.types"] the types comma-joined ("none,draft-simple" on b11434). Not /props: its
        # default_generation_settings carry the sampling settings only, and say "none" whatever runs.
        slots = self.client.slots(alias)
        if not slots or not isinstance(slots[0], dict):
            return None
        types = [t for t in str((slots[0].get("params") or {}).get("speculative.types") or "").split(",")
                 if t and t != "none"]
        if slots[0].get("speculative") is False or not types:
            return "none"
        return ",".join(types)

    def sources(self) -> dict[str, str]:
        # a router older than the model cache listing names no source: every entry is then a preset
        return {m.id: m.source or "preset" for m in self.client.models()}

    def metrics_text(self) -> str | None:
        return None  # the router's per-request timings carry what llm-bench reads

    def make_cold(self, alias: str) -> bool:
        """Unload the alias and wait until the router says so; True: a cold load can be timed. A sleeping
        instance is unloaded too: its wake-up is a reload inside a running process, not the cold load."""
        if self.client.model(alias).status != "unloaded":
            self.client.unload(alias)
            # an unload ends within tens of milliseconds, and every alias waits for one before its cold load
            self.client.wait_for_status(alias, "unloaded", self.load_timeout, poll=0.02)
        return True

    def warm_up(self, request: ChatRequest) -> tuple[StreamMeasurement, list[str]]:
        with StatusWatcher(self.base_url, request.model, self.client.http.headers) as watcher:
            measurement = self.stream(request)
        self._load_stages = watcher.stages
        return measurement, watcher.transitions

    def load_stages(self) -> dict[str, float]:
        return dict(self._load_stages)

    def stream(self, request: ChatRequest) -> StreamMeasurement:
        # cache_prompt false: the slot's cached tokens are not reused, the whole prompt is processed
        # (the server then reports timings.cache_n = 0).
        return self.client.stream_chat(request, extra={"cache_prompt": request.prompt_cache})

    def complete(self, request: CompletionRequest) -> Completion:
        body = {**request.body(), "cache_prompt": False}
        return parse_completion(self.client.post_json("/v1/chat/completions", body))

    def context_length(self, alias: str) -> int | None:
        n_ctx = (self.client.props(alias).get("default_generation_settings") or {}).get("n_ctx")
        return int(n_ctx) if n_ctx else None

    def describe(self, alias: str) -> tuple[list[str], str | None]:
        return list(self.client.model(alias).args), self.client.props(alias).get("build_info")

    def server_build(self) -> str | None:
        return self.client.props().get("build_info")

    def preset_args(self) -> dict[str, list[str]]:
        return {m.id: list(m.args) for m in self.client.models()}

    def model_props(self, alias: str) -> dict[str, Any] | None:
        return self.client.props(alias)

    def chat(self, body: dict[str, Any]) -> dict[str, Any]:
        return self.client.post_json("/v1/chat/completions", body)

    def auth_headers(self) -> dict[str, str]:
        return dict(self.client.http.headers)

    def spec_counters(self, alias: str) -> SpecCounters | None:
        """The instance's speculative counters from its /metrics (a preset with ``metrics = true``): draft
        rounds and per-position acceptance, beside the draft_n / draft_n_accepted every response's timings
        carry. None without them (metrics off, an older build): the runs' own timings are used."""
        text = self.client.metrics(alias)
        if text is None:
            return None
        samples = parse_prometheus(text)
        counters = spec_counters(samples, prefix=LLAMA_CPP_PREFIX)
        # a build before the families (b11434) lists no draft rounds: its counters add nothing to the timings
        return counters if counters is not None and counters.drafts is not None else None

    def prefix_counters(self, alias: str) -> PrefixCacheCounters | None:
        return None  # timings.cache_n confirms a hit per request

    def logprobs(self) -> LlamaServerLogprobs:
        return LlamaServerLogprobs(self.client)

    def release(self, alias: str) -> None:
        self.make_cold(alias)


def _open(c: Connection) -> LlamaCppEngine:
    return LlamaCppEngine(c.url, c.timeout, c.api_key, c.load_timeout, streams=c.streams)


ENGINE = EngineKind(LlamaCppEngine.kind, "a llama.cpp router", LlamaCppEngine.capabilities, _open)
