"""A short agent session for tests that need a replay's shape, not its size: the shipped session's first
turns (system, user, then an assistant's tool call and the tool's result each) with each message cut, so a
replay on 2 CPU cores takes seconds rather than the shipped session's tens of seconds. The tool result, the
bulk of an agent's turn, keeps more than the rest: each turn after the first adds about 385 tokens to a first
of about 175 (SmolLM2's count, with a template that renders no tools). Without ``tools`` the session declares none: a template that renders tools then has ~500 fewer
tokens to process a turn."""

from __future__ import annotations

import json
from importlib import resources
from pathlib import Path


def write_short_session(path: Path, turns: int = 2, chars: int = 300, tool_chars: int = 1200,
                        tools: bool = True) -> Path:
    shipped = json.loads((resources.files("llm_bench") / "prompts" / "session.json").read_text())
    messages = [{**m, "content": (m.get("content") or "")[:tool_chars if m["role"] == "tool" else chars]}
                for m in shipped["messages"][:1 + 2 * turns]]
    path.write_text(json.dumps({"tools": shipped["tools"] if tools else [], "messages": messages}))
    return path
