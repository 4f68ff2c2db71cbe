"""A small local HTTP server that speaks vLLM's wire format, for what the real vLLM on this machine cannot show.

The real vLLM 0.32 (CPU build) serves SmolLM2 in tests/test_vllm_real.py, and every behaviour it can show is
tested there. This double remains for what it cannot: counters of a trained drafter (the ``--dtype half``
acceptance trap with a bf16-trained drafter: no drafter runs on CPU vLLM), drafts arriving in exact, chosen
rounds (chosen acceptance, several tokens a chunk), a connection cut mid-stream or dropped before an answer
(a proxy), HyperQwen's patches (``/metrics`` behind the key), an engine answering HTTP 500 while it starts
(a patched or proxied engine; upstream vLLM refuses connections until it is up), and the tests that need no
server at all. It follows vLLM 0.32's API as the real server answers it: a role-only first chunk, ``: keep-alive``
comment lines, a usage chunk only when ``stream_options.include_usage`` asks for it, ``reasoning`` (not
``reasoning_content``), no ``tool_calls`` where there are none, an empty 200 from ``/health``, and one
per-position acceptance counter per speculative token.
"""

from __future__ import annotations

import json
import threading
import time
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler

from tests.local_http import JsonHandler, LocalServer


@dataclass
class FakeVllmConfig:
    model: str = "Qwen/Qwen3.8-27B"
    tokens_per_chunk: int = 3  # accepted drafts arrive together
    chunk_interval_s: float = 0.002
    draft_len: int = 4  # draft tokens proposed per round
    accepted_per_round: int = 2  # 0: the acceptance trap
    cut_after_chunks: int | None = None  # drop the connection mid-stream
    api_key: str | None = None
    prefix_cache: bool = True
    cached_tokens_in_usage: bool = False  # vLLM says so only with --enable-prompt-tokens-details
    drop_requests: int = 0  # close this many connections without answering, as a proxy can
    # answer this many completions with HTTP 500, as a patched or proxied engine still starting does (upstream vLLM
    # refuses connections until it is up: tests/test_vllm_real.py)
    fail_requests: int = 0
    max_model_len: int = 32768  # /v1/models reports it per model
    reply: str = ""  # a non-streamed answer's text (cut to max_tokens words); empty: "tok tok ..."
    usage: bool = True  # False: a server that ignores stream_options.include_usage (no usage chunk)
    metrics_key: bool = False  # HyperQwen's patch: /metrics needs the API key too (upstream vLLM leaves it open)


@dataclass
class FakeVllmState:
    drafts: int = 0
    draft_tokens: int = 0
    accepted: int = 0
    per_pos: list[int] = field(default_factory=list)  # one per speculative token (FakeVllm sizes it)
    prefix_queries: int = 0
    prefix_hits: int = 0
    seen_prompts: set[tuple[str | None, str]] = field(default_factory=set)  # (cache_salt, prompt)
    dropped: int = 0
    chat_calls: int = 0
    health_calls: int = 0
    auth_headers: list[str | None] = field(default_factory=list)


class FakeVllm(LocalServer):
    def __init__(self, config: FakeVllmConfig | None = None):
        self.config = config or FakeVllmConfig()
        # vLLM creates one per-position counter per speculative token (SpecDecodingProm)
        self.state = FakeVllmState(per_pos=[0] * self.config.draft_len)
        self.lock = threading.Lock()
        super().__init__()

    def metrics_text(self) -> str:
        s, m = self.state, self.config.model
        labels = f'engine="0",model_name="{m}"'
        lines = [
            "# HELP vllm:spec_decode_num_drafts_total Number of spec decoding drafts.",
            "# TYPE vllm:spec_decode_num_drafts_total counter",
            f"vllm:spec_decode_num_drafts_total{{{labels}}} {float(s.drafts)}",
            f"vllm:spec_decode_num_drafts_created{{{labels}}} 1.7903319581771543e+09",
            f"vllm:spec_decode_num_draft_tokens_total{{{labels}}} {float(s.draft_tokens)}",
            f"vllm:spec_decode_num_draft_tokens_created{{{labels}}} 1.790331958177178e+09",
            f"vllm:spec_decode_num_accepted_tokens_total{{{labels}}} {float(s.accepted)}",
            f"vllm:spec_decode_num_accepted_tokens_created{{{labels}}} 1.7903319581771958e+09",
        ]
        lines += [f'vllm:spec_decode_num_accepted_tokens_per_pos_total{{{labels},position="{i}"}} {float(v)}'
                  for i, v in enumerate(s.per_pos)]
        lines += [
            f"vllm:prefix_cache_queries_total{{{labels}}} {float(s.prefix_queries)}",
            f"vllm:prefix_cache_hits_total{{{labels}}} {float(s.prefix_hits)}",
        ]
        return "\n".join(lines) + "\n"

    def _handler(self):
        fake = self

        class Handler(JsonHandler):
            protocol_version = "HTTP/1.0"

            def _authorised(self) -> bool:
                header = self.headers.get("Authorization")
                fake.state.auth_headers.append(header)
                if fake.config.api_key and header != f"Bearer {fake.config.api_key}":
                    self._json(401, {"error": {"message": "Unauthorized", "type": "invalid_request_error"}})
                    return False
                return True

            def do_GET(self) -> None:
                if self.path == "/health":  # an empty 200, as vLLM 0.32 answers it
                    fake.state.health_calls += 1
                    self.send_response(200)
                    self.send_header("Content-Length", "0")
                    self.end_headers()
                elif self.path == "/metrics":
                    if fake.config.metrics_key and not self._authorised():
                        return
                    data = fake.metrics_text().encode()
                    self.send_response(200)
                    self.send_header("Content-Type", "text/plain; version=0.0.4")
                    self.send_header("Content-Length", str(len(data)))
                    self.end_headers()
                    self.wfile.write(data)
                elif self.path == "/v1/models":
                    if self._authorised():
                        self._json(200, {"object": "list", "data": [{"id": fake.config.model, "object": "model",
                                                                      "max_model_len": fake.config.max_model_len}]})
                else:
                    self._json(404, {"error": {"message": "Not Found"}})

            def do_POST(self) -> None:
                body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
                if self.path != "/v1/chat/completions":  # it serves only the chat route (vLLM serves more)
                    self._json(404, {"error": {"message": "Not Found"}})
                    return
                with fake.lock:
                    drop = fake.state.dropped < fake.config.drop_requests
                    fake.state.dropped += drop
                if drop:
                    return  # the connection closes with no status line
                with fake.lock:
                    fake.state.chat_calls += 1
                    failing = fake.state.chat_calls <= fake.config.fail_requests
                if failing:
                    self._json(500, {"error": {"message": "EngineDeadError: engine core is still compiling"}})
                    return
                if not self._authorised():
                    return
                if body.get("model") != fake.config.model:
                    self._json(404, {"error": {"message": f"The model `{body.get('model')}` does not exist."}})
                    return
                prompt_tokens = max(1, sum(len(m.get("content") or "") for m in body["messages"]) // 4)
                if prompt_tokens + int(body.get("max_tokens") or 1) > fake.config.max_model_len:
                    # vLLM refuses a request beyond max_model_len with 400 (its message, shortened)
                    self._json(400, {"error": {"message": f"This model's maximum context length is "
                                               f"{fake.config.max_model_len} tokens. However, your request has "
                                               f"{prompt_tokens} input tokens.", "type": "BadRequestError",
                                               "code": 400}})
                    return
                if body.get("stream"):
                    fake._stream(self, body)
                else:
                    self._json(200, fake.completion(body))

        return Handler

    def completion(self, body: dict) -> dict:
        """A non-streamed chat completion in vLLM's format; with logprobs, one entry per token, spelled
        ``token_id:N`` when the request asks for return_tokens_as_token_ids."""
        words = (self.config.reply or "tok " * int(body["max_tokens"])).split(" ")
        pieces = [w + " " for w in words[:-1]] + [words[-1]]
        pieces = [p for p in pieces if p][: int(body["max_tokens"])]
        finish = "length" if len(pieces) >= int(body["max_tokens"]) else "stop"
        prompt_tokens = max(1, sum(len(m["content"]) for m in body["messages"]) // 4)
        with self.lock:
            self.state.seen_prompts.add((body.get("cache_salt"), body["messages"][-1]["content"]))
        logprobs = None
        if body.get("logprobs"):
            def entry(piece: str) -> dict:
                token = f"token_id:{sum(piece.encode()) % 50000}" if body.get("return_tokens_as_token_ids") else piece
                return {"token": token, "logprob": -0.05, "bytes": list(piece.encode())}
            top = int(body.get("top_logprobs") or 0)
            logprobs = {"content": [{**entry(p), "top_logprobs": [entry(p)] * top} for p in pieces]}
        return {
            "id": "chatcmpl-fake", "object": "chat.completion", "created": 0, "model": self.config.model,
            "choices": [{"index": 0, "message": {"role": "assistant", "content": "".join(pieces), "reasoning": None},
                         "logprobs": logprobs, "finish_reason": finish, "stop_reason": None}],
            "usage": {"prompt_tokens": prompt_tokens, "total_tokens": prompt_tokens + len(pieces),
                      "completion_tokens": len(pieces), "prompt_tokens_details": None},
            "prompt_logprobs": None,
        }

    def _stream(self, handler: BaseHTTPRequestHandler, body: dict) -> None:
        cfg = self.config
        n_tokens = int(body["max_tokens"])
        prompt = body["messages"][-1]["content"]
        prompt_tokens = max(1, len(prompt) // 4)
        with self.lock:
            # vLLM mixes cache_salt into the prefix cache's block hashes: another salt, no hit
            key = (body.get("cache_salt"), prompt)
            cached = prompt_tokens if (cfg.prefix_cache and key in self.state.seen_prompts) else 0
            self.state.seen_prompts.add(key)
            self.state.prefix_queries += prompt_tokens
            self.state.prefix_hits += cached
        handler.send_response(200)
        handler.send_header("Content-Type", "text/event-stream")
        handler.end_headers()

        def send(text: str) -> None:
            handler.wfile.write(text.encode())
            handler.wfile.flush()

        def chunk(delta: dict, finish: str | None = None) -> str:
            payload = {"id": "chatcmpl-fake", "object": "chat.completion.chunk", "created": 0, "model": cfg.model,
                       "choices": [{"index": 0, "delta": delta, "logprobs": None, "finish_reason": finish}]}
            return f"data: {json.dumps(payload)}\n\n"

        send(": keep-alive\n\n")
        send(chunk({"role": "assistant", "content": ""}))
        time.sleep(0.01 if cached else 0.01 + prompt_tokens * 1e-4)  # a cache hit skips the prefill
        sent, chunks = 0, 0
        while sent < n_tokens:
            if cfg.cut_after_chunks is not None and chunks >= cfg.cut_after_chunks:
                return  # the connection drops with no finish reason
            k = min(cfg.tokens_per_chunk, n_tokens - sent)
            sent += k
            chunks += 1
            finish = "length" if sent >= n_tokens else None
            send(chunk({"content": "tok " * k}, finish))
            if chunks % 5 == 0:
                send(": keep-alive\n\n")
            time.sleep(cfg.chunk_interval_s)
        rounds = n_tokens // (1 + cfg.accepted_per_round)
        with self.lock:
            self.state.drafts += rounds
            self.state.draft_tokens += rounds * cfg.draft_len
            self.state.accepted += rounds * cfg.accepted_per_round
            for i in range(cfg.accepted_per_round):
                self.state.per_pos[i] += rounds
        usage = {"prompt_tokens": prompt_tokens, "completion_tokens": n_tokens,
                 "total_tokens": prompt_tokens + n_tokens,
                 "prompt_tokens_details": {"cached_tokens": cached} if cfg.cached_tokens_in_usage else None}
        if cfg.usage and (body.get("stream_options") or {}).get("include_usage"):
            send(f"data: {json.dumps({'id': 'chatcmpl-fake', 'object': 'chat.completion.chunk', 'choices': [], 'usage': usage})}\n\n")
        send("data: [DONE]\n\n")
