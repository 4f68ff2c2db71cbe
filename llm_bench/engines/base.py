"""What the runner needs of a server, whichever kind it is: the ``Engine`` interface."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Literal, Protocol, runtime_checkable

from llm_bench.engines.client import DEFAULT_STREAMS
from llm_bench.engines.completion import Completion, CompletionRequest
from llm_bench.engines.logprobs import LogprobSource
from llm_bench.engines.metrics import PrefixCacheCounters, SpecCounters
from llm_bench.engines.stream import ChatRequest, StreamMeasurement


@dataclass(frozen=True)
class Capabilities:
    """What a kind of server can do, so that callers ask the engine instead of branching on its kind."""

    # Its models can be unloaded: each alias is made cold first (its load is timed) and unloaded after.
    unload: bool
    # The decode rate comes from the server's own per-request timings; else from the stream's clock.
    server_decode_rate: bool
    # It serves presets and reports each one's server arguments (a llama.cpp router); a server without
    # presets is configured by its own command line (vLLM), which the checks read instead.
    presets: bool
    # An event stream of its model instances (/models/sse): their loads and exits are seen as they happen.
    model_events: bool
    # How the top-k log-probabilities of the tokens of a given text are had, where the server has them:
    # "teacher-forced" (the text's token ids as the prompt, one new position per request with the prompt
    # cache on: llama-server's /completion with n_probs) or "prompt" (every position in one request:
    # vLLM's prompt_logprobs). The token-distribution comparison reads this.
    top_logprobs: Literal["teacher-forced", "prompt"] | None

    @property
    def decode_source(self) -> str:
        """Where a record's decode rate came from, as results files name it."""
        return "server timings" if self.server_decode_rate else "stream"


@runtime_checkable
class Engine(Protocol):
    """A server llm-bench measures. ``kind`` names it in results; ``capabilities`` says what it can do;
    ``cold_prompt`` how it makes the server process a whole prompt (recorded in results as
    meta.protocol.cold_prompt)."""

    kind: str
    capabilities: Capabilities
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

    def logprobs(self) -> LogprobSource | None:
        """Where the top-k log-probabilities of a given text's tokens are had (``capabilities.top_logprobs``
        says how); None where the server has none."""
        ...

    def release(self, alias: str) -> None:
        """Give the alias's memory back (unload), where the server can."""
        ...


# A llama.cpp router's states of a model instance (tools/server/server-models.h). A sleeping instance
# (--sleep-idle-seconds) is still a process: it freed its model's memory, keeps its GPU context, and the next
# request wakes it with a reload; it is neither loaded nor unloaded.
LOADED_STATES = ("loaded", "loading")
SLEEPING = "sleeping"
PRESET_SOURCE = "preset"


@runtime_checkable
class RouterListing(Protocol):
    """What a router says of its entries beyond the ``Engine`` interface (a llama.cpp router)."""

    def sources(self) -> dict[str, str]:
        """Each listed entry's source: "preset", "cache" (a download in its model cache), "models_dir"."""
        ...

    def sleeping_models(self) -> list[str]:
        """The instances asleep: a process without its model's memory, woken by the next request."""
        ...

    def load_stages(self) -> dict[str, float]:
        """The last warm-up's load, stage by stage (seconds of "text_model", "spec_model", ...), where the
        router reports stages."""
        ...

    def speculation(self, alias: str) -> str | None:
        """The speculation a running instance has in effect ("none", "draft-simple", ...), from its /slots;
        None where it does not say (not running, slots hidden)."""
        ...


@dataclass(frozen=True)
class Connection:
    """How to reach a server, as the command line and plans give it; each kind of engine takes what it uses."""

    url: str
    timeout: float  # seconds before one request counts as failed
    api_key: str | None = None
    metrics_url: str | None = None  # an OpenAI server's Prometheus page (default: URL/metrics)
    load_timeout: float = 900.0  # a llama.cpp router's model load
    streams: int = DEFAULT_STREAMS  # the most simultaneous streams the caller opens (the connection pool's size)
    metrics_key: bool = False  # send the API key to a metrics URL of another origin


@dataclass(frozen=True)
class EngineKind:
    """One kind of server llm-bench measures, as the registry (``engines/__init__.py``) lists it: its name
    (``--engine``), what it is (the flag's help), what it can do before one is opened, and how one is opened."""

    name: str
    describe: str
    capabilities: Capabilities
    open: Callable[[Connection], Engine]
