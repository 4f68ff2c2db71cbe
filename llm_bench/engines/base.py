"""What the runner needs of a server, whichever kind it is: the ``Engine`` interface."""

from __future__ import annotations

from typing import Any, Protocol, runtime_checkable

from llm_bench.engines.completion import Completion, CompletionRequest
from llm_bench.engines.metrics import PrefixCacheCounters, SpecCounters
from llm_bench.engines.stream import ChatRequest, StreamMeasurement


@runtime_checkable
class Engine(Protocol):
    """A server llm-bench measures. ``kind`` names it in results; ``decode_source`` says where
    the decode rate comes from (the server's timings or the client's clock); ``cold_prompt`` how it
    makes the server process a whole prompt (recorded in results as meta.protocol.cold_prompt)."""

    kind: str
    decode_source: str
    cold_prompt: str
    base_url: str

    def close(self) -> None: ...

    def models(self) -> list[str]:
        """The aliases (router presets) or model ids the server serves."""
        ...

    def loaded_models(self) -> list[str]:
        """The models that hold memory now."""
        ...

    def metrics_text(self) -> str | None:
        """The server's Prometheus metrics, where it has them."""
        ...

    def make_cold(self, alias: str) -> bool:
        """Unload the alias if the server can; True when a cold load can then be timed."""
        ...

    def warm_up(self, request: ChatRequest) -> tuple[StreamMeasurement, list[str]]:
        """The first request after ``make_cold``, and the load transitions seen during it."""
        ...

    def stream(self, request: ChatRequest) -> StreamMeasurement: ...

    def complete(self, request: CompletionRequest) -> Completion:
        """One non-streamed greedy answer with the prompt cache off (the quality workload)."""
        ...

    def context_length(self, alias: str) -> int | None:
        """The loaded model's context in tokens, where the server reports it."""
        ...

    def describe(self, alias: str) -> tuple[list[str], str | None]:
        """The preset's server arguments and the server build, where the server reports them."""
        ...

    def server_build(self) -> str | None: ...

    def preset_args(self) -> dict[str, list[str]]:
        """Each preset's server arguments as the server reports them, without loading anything;
        empty where the server has no presets (an OpenAI server)."""
        ...

    def model_props(self, alias: str) -> dict[str, Any] | None:
        """What the server says of a loaded model (llama.cpp's /props: chat template, modalities);
        None where it says nothing."""
        ...

    def chat(self, body: dict[str, Any]) -> dict[str, Any]:
        """One non-streamed chat completion with this exact body; the server's error as a ServerError."""
        ...

    def auth_headers(self) -> dict[str, str]:
        """The headers a side connection to the server (an event stream) needs."""
        ...

    def spec_counters(self, alias: str) -> SpecCounters | None: ...

    def prefix_counters(self, alias: str) -> PrefixCacheCounters | None: ...

    def release(self, alias: str) -> None:
        """Give the alias's memory back (unload), where the server can."""
        ...
