"""A small local HTTP server that answers vLLM's prompt log-probability API, for what the real vLLM cannot be
made to show: known true values to compare with, a lossy model and another tokeniser beside the same one, a
server that omits prompt_logprobs or lists fewer than asked (a fork or a proxy). The real vLLM 0.32 answers
teacher forcing in tests/test_vllm_real.py. Only the routes llm-bench uses are served: the real server also
returns ``prompt_logprobs`` on ``/v1/chat/completions``, which llm-bench does not ask for.

It follows vLLM's OpenAI-compatible server: ``POST /tokenize`` (``prompt``, ``add_special_tokens`` ->
``count``, ``max_model_len``, ``tokens``), ``GET /v1/models`` (``max_model_len`` per model) and
``POST /v1/completions`` with a list of token ids as the prompt and ``prompt_logprobs: k``, answered
with ``choices[0].prompt_logprobs``: ``None`` for the first token, then per position a dict keyed by
token id (a string in JSON) of ``{"logprob", "rank", "decoded_token"}`` holding the top k and, when it
ranks lower, the prompt's own token with its true rank. More than ``max_logprobs`` is refused with
vLLM's own message. Each model's next-token distribution is a fixed function of the previous token
and the position, so a test knows the true values; ``noise`` perturbs a model's logits (a lossy
configuration), ``vocab_shift`` tokenises differently (another model).
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field

import numpy as np

from tests.local_http import JsonHandler, LocalServer

VOCAB = 64
BOS = 0


@dataclass(frozen=True)
class FakeModel:
    noise: float = 0.0
    vocab_shift: int = 0


@dataclass
class FakeVllmLogprobsConfig:
    models: dict[str, FakeModel] = field(default_factory=lambda: {"base": FakeModel()})
    max_model_len: int = 4096
    max_logprobs: int = 20
    omit_prompt_logprobs: bool = False  # a server that ignores the field
    short_lists: bool = False  # one entry fewer than asked at every position


def tokenize(text: str, model: FakeModel) -> list[int]:
    return [BOS] + [1 + (sum(word.encode()) + model.vocab_shift) % (VOCAB - 1) for word in text.split()]


def logprobs_after(previous: int, position: int, model: FakeModel) -> np.ndarray:
    """The model's natural log-probabilities over the vocabulary for the token at ``position``."""
    logits = np.random.default_rng(previous * 7919 + position).normal(size=VOCAB) * 2.5
    if model.noise:
        perturbation = np.random.default_rng(10_000_000 + previous * 7919 + position).normal(size=VOCAB)
        logits = logits + perturbation * model.noise
    return logits - np.logaddexp.reduce(logits)


def prompt_logprobs(ids: list[int], k: int, model: FakeModel, short: bool) -> list[dict[str, dict] | None]:
    listed: list[dict[str, dict] | None] = [None]
    for i in range(1, len(ids)):
        lp = logprobs_after(ids[i - 1], i, model)
        order = np.argsort(-lp, kind="stable")
        rank = {int(t): r + 1 for r, t in enumerate(order)}
        shown = [int(t) for t in order[: k - 1 if short else k]]
        if ids[i] not in shown:
            shown.append(ids[i])
        listed.append({str(t): {"logprob": float(lp[t]), "rank": rank[t], "decoded_token": f"w{t}"} for t in shown})
    return listed


class FakeVllmLogprobs(LocalServer):
    def __init__(self, config: FakeVllmLogprobsConfig | None = None):
        self.config = config or FakeVllmLogprobsConfig()
        self.requests: list[tuple[str, dict]] = []
        super().__init__()

    def _handler(self):
        fake = self

        class Handler(JsonHandler):
            def _error(self, status: int, message: str) -> None:
                self._json(status, {"error": {"message": message, "type": "BadRequestError", "param": None,
                                              "code": status}})

            def do_GET(self) -> None:
                if self.path == "/v1/models":
                    self._json(200, {"object": "list", "data": [
                        {"id": name, "object": "model", "max_model_len": fake.config.max_model_len}
                        for name in fake.config.models]})
                else:
                    self._error(404, "Not Found")

            def do_POST(self) -> None:
                body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
                fake.requests.append((self.path, body))
                model = fake.config.models.get(body.get("model"))
                if model is None:
                    self._error(404, f"The model `{body.get('model')}` does not exist.")
                elif self.path == "/tokenize":
                    tokens = tokenize(body["prompt"], model)
                    if not body.get("add_special_tokens", True):
                        tokens = tokens[1:]
                    self._json(200, {"count": len(tokens), "max_model_len": fake.config.max_model_len,
                                     "tokens": tokens, "token_strs": None})
                elif self.path == "/v1/completions":
                    self._completion(body, model)
                else:
                    self._error(404, "Not Found")

            def _completion(self, body: dict, model: FakeModel) -> None:
                ids, k = body["prompt"], body.get("prompt_logprobs")
                if k is not None and k > fake.config.max_logprobs:
                    self._error(400, f"Requested prompt logprobs of {k}, which is greater than max allowed: "
                                     f"{fake.config.max_logprobs} (parameter=prompt_logprobs, value={k})")
                    return
                if len(ids) + body.get("max_tokens", 16) > fake.config.max_model_len:
                    self._error(400, f"This model's maximum context length is {fake.config.max_model_len} tokens.")
                    return
                choice = {"index": 0, "text": " w1", "logprobs": None, "finish_reason": "length",
                          "stop_reason": None, "token_ids": None, "prompt_token_ids": None}
                if k is not None and not fake.config.omit_prompt_logprobs:
                    choice["prompt_logprobs"] = prompt_logprobs(ids, k, model, fake.config.short_lists)
                self._json(200, {"id": "cmpl-1", "object": "text_completion", "created": 1, "model": body["model"],
                                 "choices": [choice], "usage": {"prompt_tokens": len(ids), "completion_tokens": 1,
                                                                "total_tokens": len(ids) + 1}})

        return Handler
