"""What each capacity request asks: the plan's prompt every time, or an agent's conversation turn by turn.

With a session (the ``session`` workload's: the shipped coding-agent session or a user's JSON file, read by
its loader), every closed-loop stream is one agent: it sends the session's turns in order, each turn's
context the previous one's plus the recorded assistant message and tool results (as an agent's context
grows), then starts a new conversation. Every conversation begins with a mark of its own, so no stream
reuses another's cached prefix, and within one the server reuses the previous turn's prefix as far as the
plan's prompt cache lets it. In the open loop each arrival sends the next turn of one conversation after
another. Every level starts new conversations.

Only the turns whose context fits the server's (per-slot) context with ``max_tokens`` to generate are
sent: their size is estimated from the probe's first turn, as the session workload estimates it.
"""

from __future__ import annotations

import threading
import uuid
from collections.abc import Callable
from dataclasses import dataclass, replace

from llm_bench.engines.stream import ChatRequest
from llm_bench.workloads.session import Session, Turn, chars, estimate_tokens, marked


@dataclass(frozen=True)
class Prompt:
    request: ChatRequest
    turn: int | None = None  # the session's turn (1 = a conversation's first request); None: the plan's prompt


# Given the stream that sends (closed loop) or None (open loop), the next request's prompt.
NextPrompt = Callable[[int | None], Prompt]


@dataclass(frozen=True)
class PlanPrompt:
    """The plan's prompt (``--prompt``, ``--prompt-file``), the same for every request."""

    request: ChatRequest

    @property
    def probe(self) -> Prompt:
        return Prompt(self.request)

    def level(self) -> NextPrompt:
        prompt = self.probe
        return lambda _stream: prompt


def _mark() -> str:
    return f"[llm-bench capacity {uuid.uuid4().hex[:12]}]"


class _Conversations:
    """One level's conversations: each stream's (or, in the open loop, the one arrivals share) turn by turn."""

    def __init__(self, base: ChatRequest, session: Session, turns: list[Turn]):
        self.base, self.session, self.turns = base, session, turns
        self._sent: dict[int | None, int] = {}
        self._messages: dict[int | None, tuple] = {}
        self._lock = threading.Lock()

    def __call__(self, stream: int | None) -> Prompt:
        with self._lock:
            n = self._sent.get(stream, 0)
            self._sent[stream] = n + 1
            index = n % len(self.turns)
            if index == 0:
                self._messages[stream] = marked(self.session.messages, _mark())
            messages = self._messages[stream]
        return Prompt(replace(self.base, messages=messages[:self.turns[index].end]), index + 1)


@dataclass(frozen=True)
class SessionPrompts:
    """A session's turns (``turns``: those that fit) on the plan's request (max_tokens, cache, sampling)."""

    base: ChatRequest
    session: Session
    turns: list[Turn]

    @classmethod
    def of(cls, request: ChatRequest, session: Session) -> SessionPrompts:
        return cls(replace(request, tools=session.tools or None), session, session.turns())

    @property
    def probe(self) -> Prompt:
        """The first turn, in a conversation of its own."""
        return self.level()(None)

    def level(self) -> NextPrompt:
        return _Conversations(self.base, self.session, self.turns)

    def fitting(self, first_turn_tokens: int | None, context: int | None) -> SessionPrompts:
        """The turns whose context, estimated from the server's count for the first turn, leaves room for
        max_tokens within ``context``; the first turn always (the probe sent it). Without a count or a
        context, every turn."""
        if first_turn_tokens is None or context is None:
            return self
        sizes = [chars(self.session.messages[:t.end]) for t in self.turns]
        kept = self.turns[:1]
        for turn, size in zip(self.turns[1:], sizes[1:], strict=True):  # contexts grow: stop at the first too long
            estimate = estimate_tokens([first_turn_tokens], [sizes[0], size])
            if estimate is None or estimate + self.base.max_tokens > context:
                break
            kept.append(turn)
        return replace(self, turns=kept)

    def describe(self) -> str:
        total = len(self.session.turns())
        shown = "the shipped session" if self.session.source == "shipped" else f"session {self.session.source}"
        return (f"{shown}: {len(self.turns)} of its {total} turns per conversation"
                + ("" if len(self.turns) == total else " (the later ones would not fit the context)"))


Prompts = PlanPrompt | SessionPrompts
