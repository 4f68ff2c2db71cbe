"""The soak's request kinds beyond a plain streamed prompt: a tool call, thinking, image input.

Each is one non-streamed chat completion judged by what the answer must contain: a parsed tool call
with JSON arguments, reasoning content, or an answer about the image. Whether the model can take a
kind at all comes from what the server says of it (llama.cpp's ``/props``: ``modalities``, the chat
template and its capabilities); a kind it cannot take is skipped with that reason.
"""

from __future__ import annotations

import base64
import io
import json
import time
from dataclasses import dataclass
from typing import Any

from llm_bench.engines import Engine
from llm_bench.engines.errors import ServerError

SPECIAL_KINDS = ("tool", "thinking", "image")

WEATHER_TOOL = {
    "type": "function",
    "function": {
        "name": "get_weather",
        "description": "Get the current weather for a city.",
        "parameters": {"type": "object", "properties": {"city": {"type": "string", "description": "City name"}},
                       "required": ["city"]},
    },
}
THINK_MARKERS = ("<think>", "enable_thinking", "reasoning_content", "thinking")


@dataclass(frozen=True)
class Capabilities:
    """What the server says the model takes; None: it does not say (then the kind is tried)."""

    vision: bool | None = None
    thinking: bool | None = None
    tool_calls: bool | None = None
    source: str = ""

    def skip_reason(self, kind: str) -> str | None:
        if kind == "image" and self.vision is False:
            return f"the model accepts no images ({self.source}: modalities.vision = false)"
        if kind == "thinking" and self.thinking is False:
            return (f"the model does not think ({self.source}: the chat template has no <think> or "
                    "enable_thinking)")
        return None

    def note(self, kind: str) -> str:
        """Said with a failure, so that a reader knows whether the server expected the kind to work."""
        if kind == "tool" and self.tool_calls is False:
            return (f" (the chat template declares no tool-call support: {self.source} "
                    "chat_template_caps.supports_tool_calls = false)")
        return ""


def capabilities(engine: Engine, model: str) -> Capabilities | None:
    """From a llama.cpp router's /props for the loaded model (None when it cannot be read now, e.g. the
    model is not loaded: ask again later); an OpenAI server says nothing (every field None)."""
    try:
        props = engine.model_props(model)
    except ServerError:
        return None
    if props is None:
        return Capabilities(source="the server does not report model capabilities")
    template = str(props.get("chat_template") or "")
    caps = props.get("chat_template_caps") or {}
    modalities = props.get("modalities") or {}
    return Capabilities(
        vision=bool(modalities.get("vision")) if "vision" in modalities else None,
        thinking=any(marker in template for marker in THINK_MARKERS) if template else None,
        tool_calls=bool(caps["supports_tool_calls"]) if "supports_tool_calls" in caps else None,
        source=f"/props?model={model}")


def tiny_png() -> str:
    """A 32x32 image (red left half, blue right half) as a data URL."""
    import numpy as np  # noqa: PLC0415 - only the image kind needs them
    from matplotlib import image  # noqa: PLC0415

    pixels = np.zeros((32, 32, 3), dtype=np.uint8)
    pixels[:, :16, 0] = 255
    pixels[:, 16:, 2] = 255
    buffer = io.BytesIO()
    image.imsave(buffer, pixels, format="png")
    return "data:image/png;base64," + base64.b64encode(buffer.getvalue()).decode()


def body(kind: str, model: str, max_tokens: int, temperature: float, seed: int) -> dict[str, Any]:
    common = {"model": model, "max_tokens": max_tokens, "temperature": temperature, "seed": seed, "stream": False}
    if kind == "tool":
        return common | {
            "messages": [{"role": "user", "content": "What is the weather in Paris right now? Use the tool."}],
            "tools": [WEATHER_TOOL], "tool_choice": "required"}
    if kind == "thinking":
        return common | {
            "messages": [{"role": "user", "content": "A train leaves at 9:40 and arrives at 11:05. "
                                                     "How long is the trip? Think it through."}],
            # llama.cpp and vLLM pass these to the chat template (Qwen3: thinking on)
            "chat_template_kwargs": {"enable_thinking": True}}
    if kind == "image":
        return common | {"messages": [{"role": "user", "content": [
            {"type": "text", "text": "What two colours does this image show?"},
            {"type": "image_url", "image_url": {"url": tiny_png()}}]}]}
    raise ValueError(f"unknown request kind {kind!r}")


@dataclass(frozen=True)
class Reply:
    ok: bool
    wall_s: float
    output_tokens: int | None = None
    decode_tps: float | None = None
    failure: str | None = None
    message: str | None = None


def judge(kind: str, answer: dict[str, Any]) -> tuple[str | None, str | None]:
    """(failure, message) for an answer that lacks what its kind must produce; (None, None) when good."""
    choice = (answer.get("choices") or [{}])[0]
    message = choice.get("message") or {}
    if kind == "tool":
        calls = message.get("tool_calls") or []
        if not calls:
            text = (message.get("content") or "").strip().replace("\n", " ")
            return "no-tool-call", (f"no tool call in the answer (finish_reason {choice.get('finish_reason')!r}, "
                                    f"content {text[:120]!r})")
        arguments = (calls[0].get("function") or {}).get("arguments")
        try:
            parsed = json.loads(arguments) if isinstance(arguments, str) else arguments
        except json.JSONDecodeError as e:
            return "bad-tool-arguments", f"tool call arguments are not JSON ({e}): {str(arguments)[:120]!r}"
        if not isinstance(parsed, dict):
            return "bad-tool-arguments", f"tool call arguments are not a JSON object: {str(arguments)[:120]!r}"
        return None, None
    if kind == "thinking":
        if not (message.get("reasoning_content") or message.get("reasoning")):
            return "no-reasoning", "no reasoning content in the answer (reasoning_content / reasoning empty)"
        return None, None
    if kind == "image":
        if not (message.get("content") or "").strip():
            return "empty", "the answer about the image is empty"
        return None, None
    raise ValueError(f"unknown request kind {kind!r}")


def send(engine: Engine, kind: str, model: str, max_tokens: int, temperature: float, seed: int) -> Reply:
    """One request of a special kind; a transport failure raises ServerError like a streamed request."""
    payload = body(kind, model, max_tokens, temperature, seed)
    start = time.perf_counter()
    answer = engine.chat(payload)
    wall = time.perf_counter() - start
    usage = answer.get("usage") or {}
    timings = answer.get("timings") or {}
    failure, message = judge(kind, answer)
    return Reply(failure is None, wall, usage.get("completion_tokens"), timings.get("predicted_per_second"),
                 failure, message)
