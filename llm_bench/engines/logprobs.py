"""Teacher-forced next-token log-probabilities through the server: a text's token ids go in, and for
every position the model's top-k next-token log-probabilities come back, before any sampling.

llama-server (``LlamaServerLogprobs``): one ``/completion`` per position, with the token ids of the
prefix as the prompt, ``n_predict: 1``, ``n_probs: k`` and the prompt cache on, so each request
processes one new token (the server reports ``timings.prompt_n`` 1; 12 to 16 ms a request for
SmolLM2-135M on 2 CPU cores). Without ``post_sampling_probs`` the server lists the top ``n_probs``
tokens of a plain softmax of the logits (no temperature, penalties or truncation), which is the
model's own distribution; with it, a greedy request would report a probability of 1. ``/completion``
reports log-probabilities only for generated tokens (``n_predict: 0`` generates none), hence one
request per position. ``response_fields`` keeps each answer to the probabilities: the full answer
repeats the prompt's text, which grows with every position. Since one token is predicted, a preset's
speculative decoding never drafts here: its distributions are its target model's, so what teacher
forcing measures is the weights and the KV cache; whether drafting changes answers is for the
exact-answer comparison.

vLLM (``VllmLogprobs``): one ``/v1/completions`` with the ids as the prompt and ``prompt_logprobs: k``
returns every position at once. vLLM lists, per position, the top k and the prompt's own token when
that ranks lower (so k or k + 1 entries, each with its ``rank``); the top k are kept. vLLM computes
them from the raw logits by default (``--logprobs-mode raw_logprobs``) and refuses more than
``--max-logprobs`` (20 by default) per position.

Pure request bodies and parsing, and the checks that make a comparison meaningful; the HTTP goes
through ``OpenAIClient``.
"""

from __future__ import annotations

import time
import uuid
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, Protocol

from llm_bench.engines.client import OpenAIClient
from llm_bench.engines.errors import RequestRefused, ServerError

TopLogprobs = dict[int, float]  # token id -> natural log-probability


class TeacherForcingError(ServerError):
    """A comparison of token distributions that cannot be made; the message says why and what to do."""


class MissingLogprobs(TeacherForcingError):
    """The server returned no log-probabilities, or fewer than the k asked for."""


class TextTooLong(TeacherForcingError):
    """The text does not fit the model's context."""


class TokenizerDiffers(TeacherForcingError):
    """The configuration tokenises the reference text differently: another vocabulary, so its
    distributions are over other tokens and the comparison means nothing."""


@dataclass(frozen=True)
class Forced:
    """What a server answered for the positions of one text: ``top[j]`` is the model's top-k next tokens
    after the first ``first + j`` ids; ``processed``, where the server reports it, the prompt tokens
    each request evaluated (llama-server's ``timings.prompt_n``: 1 when the prompt cache served the
    rest)."""

    top: list[TopLogprobs]
    processed: list[int] | None = None


@dataclass(frozen=True)
class TeacherForced:
    """``top[j]``: the model's top-k next tokens after ``token_ids[: first + j]``, i.e. its distribution
    for the token at position ``first + j``."""

    model: str
    token_ids: tuple[int, ...]
    first: int
    k: int
    top: tuple[TopLogprobs, ...]
    seconds: float  # wall time of the log-probability requests
    processed: tuple[int, ...] | None  # see Forced


class LogprobSource(Protocol):
    """What teacher forcing needs of a server. ``extra_context``: the tokens of context it takes beyond
    the text's own (vLLM generates one token after the whole text; llama-server's last request holds
    the text but its final token and predicts that one)."""

    extra_context: int

    def tokenize(self, model: str, text: str) -> list[int]:
        """The text's token ids as the model tokenises a prompt (special tokens such as BOS added)."""
        ...

    def context_length(self, model: str) -> int | None:
        """The model's context in tokens, where the server reports it."""
        ...

    def template(self, model: str, prompt: str) -> str:
        """The text the model is given for ``prompt`` as a user's chat message, up to where its answer starts."""
        ...

    def next_token_logprobs(self, model: str, token_ids: Sequence[int], first: int, k: int) -> Forced:
        """For each position ``first .. len(token_ids) - 1``, the top-k next-token log-probabilities
        given the ids before it."""
        ...


def _entries(entries: Any, where: str) -> TopLogprobs:
    if not isinstance(entries, list):
        raise MissingLogprobs(f"{where}: the server listed no log-probabilities")
    try:
        return {int(e["id"]): float(e["logprob"]) for e in entries}
    except (KeyError, TypeError, ValueError) as e:
        raise MissingLogprobs(f"{where}: unreadable log-probabilities ({e!r})") from e


class LlamaServerLogprobs:
    """llama-server or a llama.cpp router (the ``model`` field picks the preset)."""

    extra_context = 0

    def __init__(self, client: OpenAIClient):
        self.client = client

    def tokenize(self, model: str, text: str) -> list[int]:
        body = self.client.post_json("/tokenize", {"model": model, "content": text, "add_special": True})
        return [int(t) for t in body.get("tokens", [])]

    def context_length(self, model: str) -> int | None:
        # autoload: the model is asked for its distributions next, so reading its context may load it.
        props = self.client.get_json("/props", model=model, autoload="true")
        n_ctx = (props.get("default_generation_settings") or {}).get("n_ctx")
        return int(n_ctx) if n_ctx else None

    def template(self, model: str, prompt: str) -> str:
        body = self.client.post_json("/apply-template", {"model": model,
                                                         "messages": [{"role": "user", "content": prompt}]})
        return str(body["prompt"])

    @staticmethod
    def request(model: str, prefix: Sequence[int], k: int, cached: bool = True) -> dict[str, Any]:
        return {
            "model": model,
            "prompt": list(prefix),
            "n_predict": 1,
            "n_probs": k,
            "post_sampling_probs": False,  # the model's distribution, not the sampler's
            # The prefix is the last request's prompt plus one token. A segment's first request is
            # evaluated whole: reusing whatever the slot last held (a shared system prompt, evaluated
            # in other batches) changes the rounding of its cache, and with it every later position.
            "cache_prompt": cached,
            "temperature": 0.0,
            # The one sampled token is pinned to a plain ASCII one: a byte token that begins a UTF-8
            # character is held back until the character completes, and with it the position's
            # probabilities, which n_predict 1 would then never send. The bias acts in the sampler;
            # the probabilities are read from the logits before it.
            "logit_bias": [["a", 1000]],
            "response_fields": ["completion_probabilities", "timings/prompt_n"],
        }

    @staticmethod
    def parse(body: Any, where: str) -> tuple[TopLogprobs, int | None]:
        """The position's top-k and how many prompt tokens the request evaluated."""
        probabilities = body.get("completion_probabilities") if isinstance(body, dict) else None
        if not probabilities:
            raise MissingLogprobs(f"{where}: the server's answer has no completion_probabilities")
        processed = body.get("timings/prompt_n")
        return _entries(probabilities[0].get("top_logprobs"), where), processed if isinstance(processed, int) else None

    def next_token_logprobs(self, model: str, token_ids: Sequence[int], first: int, k: int) -> Forced:
        top: list[TopLogprobs] = []
        processed: list[int | None] = []
        for i in range(first, len(token_ids)):
            body = self.client.post_json("/completion", self.request(model, token_ids[:i], k, cached=i > first))
            listed, evaluated = self.parse(body, f"{model!r}, position {i}")
            check_listed(model, i, listed, k)  # a short list fails at the first position, not after all of them
            top.append(listed)
            processed.append(evaluated)
        return Forced(top, None if None in processed else [n for n in processed if n is not None])


class VllmLogprobs:
    """vLLM's OpenAI-compatible server: all positions in one request."""

    extra_context = 1

    def __init__(self, client: OpenAIClient):
        self.client = client
        self._max_model_len: dict[str, int] = {}

    def tokenize(self, model: str, text: str) -> list[int]:
        body = self.client.post_json("/tokenize", {"model": model, "prompt": text, "add_special_tokens": True})
        if body.get("max_model_len"):
            self._max_model_len[model] = int(body["max_model_len"])
        return [int(t) for t in body.get("tokens", [])]

    def template(self, model: str, prompt: str) -> str:
        # vLLM applies the chat template in /tokenize; /detokenize gives the text back
        ids = self.client.post_json("/tokenize", {"model": model, "messages": [{"role": "user", "content": prompt}],
                                                  "add_generation_prompt": True}).get("tokens", [])
        return str(self.client.post_json("/detokenize", {"model": model, "tokens": ids})["prompt"])

    def context_length(self, model: str) -> int | None:
        if model not in self._max_model_len:
            for item in self.client.get_json("/v1/models").get("data", []):
                if item.get("id") == model and item.get("max_model_len"):
                    self._max_model_len[model] = int(item["max_model_len"])
        return self._max_model_len.get(model)

    @staticmethod
    def request(model: str, token_ids: Sequence[int], k: int) -> dict[str, Any]:
        return {
            "model": model,
            "prompt": list(token_ids),
            "max_tokens": 1,
            "temperature": 0.0,
            "prompt_logprobs": k,
            "cache_salt": uuid.uuid4().hex,  # every position computed, none read from the prefix cache
        }

    @staticmethod
    def parse(body: Any, first: int, n: int, k: int, model: str) -> list[TopLogprobs]:
        choices = body.get("choices") if isinstance(body, dict) else None
        listed = (choices or [{}])[0].get("prompt_logprobs")
        if not isinstance(listed, list) or len(listed) != n:
            found = "none" if not isinstance(listed, list) else f"{len(listed)} positions"
            raise MissingLogprobs(f"{model!r}: asked for prompt_logprobs over {n} tokens, the server returned "
                                  f"{found}; does this server support vLLM's prompt_logprobs?")
        return [VllmLogprobs.top_k(listed[i], k, f"{model!r}, position {i}") for i in range(first, n)]

    @staticmethod
    def top_k(entries: Any, k: int, where: str) -> TopLogprobs:
        """One position's entries: the prompt's own token comes along, with its true rank, when it is
        not among the top k, and is left out."""
        if not isinstance(entries, dict) or not entries:
            raise MissingLogprobs(f"{where}: the server listed no log-probabilities")
        try:
            ranked = sorted((int(e["rank"]), int(token), float(e["logprob"])) for token, e in entries.items())
        except (KeyError, TypeError, ValueError, AttributeError) as e:
            raise MissingLogprobs(f"{where}: unreadable log-probabilities ({e!r})") from e
        return {token: logprob for rank, token, logprob in ranked if rank <= k}

    def next_token_logprobs(self, model: str, token_ids: Sequence[int], first: int, k: int) -> Forced:
        try:
            body = self.client.post_json("/v1/completions", self.request(model, token_ids, k))
        except RequestRefused as e:
            # the context was checked before (check_fits): a 400 refuses what else this request asks, its
            # number of log-probabilities; the server's own words (e) say so
            if e.status == 400:
                raise MissingLogprobs(f"{model!r} refused {k} log-probabilities per position: {e}; vLLM allows "
                                      "at most its --max-logprobs (20 unless the server sets more): ask for "
                                      "fewer or raise it") from e
            raise
        return Forced(self.parse(body, first, len(token_ids), k, model))


def check_fits(model: str, n_tokens: int, extra: int, n_ctx: int | None) -> None:
    if n_ctx is not None and n_tokens + extra > n_ctx:
        raise TextTooLong(f"the reference text is {n_tokens} tokens, and teacher-forcing it through {model!r} takes "
                          f"{n_tokens + extra} tokens of context where the server reports {n_ctx}: give a shorter "
                          "text, or serve the model with a larger context")


def check_same_tokens(reference: str, reference_ids: Sequence[int], model: str, ids: Sequence[int]) -> None:
    """The configuration must tokenise the text exactly as the reference does."""
    if list(reference_ids) == list(ids):
        return
    at = next((i for i, (a, b) in enumerate(zip(reference_ids, ids, strict=False)) if a != b), min(len(reference_ids), len(ids)))
    raise TokenizerDiffers(
        f"{model!r} tokenises the reference text differently from {reference!r} ({len(ids)} tokens against "
        f"{len(reference_ids)}, first difference at token {at}): another vocabulary, so their token "
        "distributions cannot be compared; compare configurations of the same model"
    )


def check_listed(model: str, position: int, listed: TopLogprobs, k: int) -> None:
    if len(listed) < k:
        raise MissingLogprobs(f"{model!r}, position {position}: the server listed {len(listed)} "
                              f"log-probabilities where {k} were asked for")


def check_tokenisation(source: LogprobSource, model: str, text: str, reference: str,
                       reference_ids: Sequence[int]) -> None:
    """``model`` tokenises ``text`` exactly as ``reference`` did (into ``reference_ids``)."""
    check_same_tokens(reference, reference_ids, model, source.tokenize(model, text))


def teacher_force(source: LogprobSource, model: str, token_ids: Sequence[int], first: int, k: int) -> TeacherForced:
    """The model's top-k at every position from ``first`` on, once the text is known to fit its context."""
    if not 1 <= first < len(token_ids):
        raise ValueError(f"first scored position {first} is outside 1..{len(token_ids) - 1}")
    check_fits(model, len(token_ids), source.extra_context, source.context_length(model))
    started = time.perf_counter()
    forced = source.next_token_logprobs(model, token_ids, first, k)
    seconds = time.perf_counter() - started
    for j, listed in enumerate(forced.top):
        check_listed(model, first + j, listed, k)
    processed = None if forced.processed is None else tuple(forced.processed)
    return TeacherForced(model, tuple(token_ids), first, k, tuple(forced.top), seconds, processed)
