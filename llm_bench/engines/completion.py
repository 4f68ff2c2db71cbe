"""One greedy, non-streamed chat completion whose text (and token ids) is the measurement.

Used by the quality workload. Non-streamed on purpose: llama-server reports per-token logprobs (with
token ids) for every generated token of a non-streamed answer, but under speculative decoding a
stream carries them only for the first token of each chunk (checked against build b11434).
Pure: the request body and the parsing of the answer; sending it is the client's job.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any

from llm_bench.engines.stream import thinking_kwargs

# vLLM spells a token as "token_id:123" when asked for ids (return_tokens_as_token_ids).
_VLLM_TOKEN_ID = re.compile(r"^token_id:(\d+)$")


@dataclass(frozen=True)
class CompletionRequest:
    """Greedy (temperature 0, fixed seed) and ending where the model ends (no ignore_eos)."""

    model: str
    messages: tuple[tuple[str, str], ...]  # (role, content)
    max_tokens: int
    seed: int = 42
    thinking: str = "server"  # as ChatRequest.thinking

    @classmethod
    def of(cls, model: str, prompt: str, max_tokens: int, seed: int = 42, thinking: str = "server"
           ) -> CompletionRequest:
        return cls(model, (("user", prompt),), max_tokens, seed, thinking)

    def body(self) -> dict[str, Any]:
        return {
            "model": self.model,
            "messages": [{"role": role, "content": content} for role, content in self.messages],
            "max_tokens": self.max_tokens,
            "temperature": 0.0,
            "seed": self.seed,
            "stream": False,
            "ignore_eos": False,  # the answer ends where the model ends it, even if a preset sets --ignore-eos
            # top_logprobs 1: llama-server returns no logprobs at all with 0.
            "logprobs": True,
            "top_logprobs": 1,
            "return_tokens_as_token_ids": True,  # vLLM: token ids instead of token text; others ignore it
            **thinking_kwargs(self.thinking),
        }


@dataclass(frozen=True)
class Completion:
    text: str
    output_tokens: int | None
    token_ids: list[int] | None  # None when the server reported no token ids
    finish_reason: str | None
    prompt_tokens: int | None = None


def _token_id(entry: dict[str, Any]) -> int | None:
    if isinstance(entry.get("id"), int):  # llama-server
        return entry["id"]
    match = _VLLM_TOKEN_ID.match(str(entry.get("token", "")))
    return int(match.group(1)) if match else None


def parse_completion(body: dict[str, Any]) -> Completion:
    """The answer of a non-streamed /v1/chat/completions; token ids only when every token has one."""
    choice = (body.get("choices") or [{}])[0]
    message = choice.get("message") or {}
    usage = body.get("usage") or {}
    entries = ((choice.get("logprobs") or {}).get("content")) or []
    ids = [_token_id(e) for e in entries]
    output_tokens = usage.get("completion_tokens")
    token_ids = [i for i in ids if i is not None] if entries and None not in ids else None
    if token_ids is not None and output_tokens is not None and len(token_ids) != output_tokens:
        token_ids = None  # a partial list would compare as a difference that is not there
    return Completion(
        text=str(message.get("content") or ""),
        output_tokens=None if output_tokens is None else int(output_tokens),
        token_ids=token_ids,
        finish_reason=choice.get("finish_reason"),
        prompt_tokens=usage.get("prompt_tokens"),
    )
