"""A short agent session for tests that need a replay's shape, not its size: the shipped session's first
two turns (system, user, assistant, tool result, assistant) with each message cut, so a replay on 2 CPU
cores takes seconds rather than the shipped session's tens of seconds. The tool result, the bulk of an agent's
turn, keeps more than the rest: the second turn adds about 300 tokens to a first of about 150."""

from __future__ import annotations

import json
from importlib import resources
from pathlib import Path


def write_short_session(path: Path, chars: int = 300, tool_chars: int = 1200) -> Path:
    shipped = json.loads((resources.files("llm_bench") / "prompts" / "session.json").read_text())
    messages = [{**m, "content": (m.get("content") or "")[:tool_chars if m["role"] == "tool" else chars]}
                for m in shipped["messages"][:5]]
    path.write_text(json.dumps({"tools": shipped["tools"], "messages": messages}))
    return path
