"""A coding-agent session replayed turn by turn, with the prompt cache on (as an agent runs) and cold.

A session is a list of OpenAI chat messages (system, user, assistant with ``tool_calls``, ``tool``)
and the ``tools`` an agent offers; the shipped one is ``llm_bench/prompts/session.json``. A turn is
one request: the conversation up to the next recorded assistant message. The next turn's context
holds the *recorded* assistant message, not the model's own answer, so every configuration is sent
the same conversation and the replay is deterministic. Each turn generates until the model stops or
``max_tokens``.

Per turn the server's own counters say how much of the context it reused from its cache and how
much it processed; with the cache on, a turn that reused far less than the previous turn's context
is flagged (a chat template that rewrites earlier turns, or a server that dropped its cache).
"""

from __future__ import annotations

import json
import time
import uuid
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field, replace
from importlib import resources
from pathlib import Path
from typing import Any, ClassVar

from llm_bench.engines import Engine
from llm_bench.engines.errors import ServerError, ServerUnreachable
from llm_bench.engines.stream import ChatRequest, StreamMeasurement
from llm_bench.results import AliasRecord, RunRecord, known, run_record
from llm_bench.support.numbers import fmt as figure
from llm_bench.tables import Cell, Row, Table, notes_of
from llm_bench.validation import PlanError, check_fields
from llm_bench.workloads.base import Flag, Keep, Log, RunParameters, Workload
from llm_bench.workloads.common import WorkloadInterrupted, check_thinking, derive, fmt

ROLES = ("system", "developer", "user", "assistant", "tool")
# With the cache on, a turn should reuse (nearly) all of the previous turn's context; below this share it is flagged.
REUSE_SHARE = 0.9


@dataclass
class SessionTurn(RunRecord):
    """One request of a replayed session: a run (prompt_tokens = the context, cache_n = what the server
    reused of it) and what the turn added."""

    turn: int = 0  # 1-based
    added: str = ""  # the roles of the messages this turn added, e.g. "tool" or "user"
    processed_tokens: int | None = None  # prompt tokens the server computed (timings.prompt_n, else context - cached)
    reuse_flag: str | None = None  # the cache reused far less than the previous turn's context


@dataclass
class SessionResult:
    """The session workload's part of a record (``[aliases.session]``): the same session replayed with the
    prompt cache on (warm) and off (cold)."""

    source: str  # "shipped" or the session file's path
    messages: int  # in the session
    tools: int  # tool definitions sent with every turn
    turns: int  # turns the session has (a turn: one request, up to the next recorded assistant message)
    warm: list[SessionTurn] = field(default_factory=list)
    cold: list[SessionTurn] = field(default_factory=list)
    warm_s: float | None = None  # wall clock of each whole replay
    cold_s: float | None = None
    stopped: str | None = None  # why the replay ended before the session did (the context)
    tails: ClassVar[bool] = False

    @property
    def distinction(self) -> str:
        return "session"

    def to_toml(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_toml(cls, data: dict[str, Any]) -> SessionResult:
        fields = known(cls, data)
        for mode in ("warm", "cold"):
            fields[mode] = [SessionTurn(**known(SessionTurn, t)) for t in data.get(mode, [])]
        return cls(**fields)


def result_of(record: AliasRecord) -> SessionResult | None:
    """The record's replays, where it is a session record."""
    return record.part if isinstance(record.part, SessionResult) else None


class SessionFileError(PlanError):
    """A session file that is not a list of OpenAI chat messages; the message names the file and entry."""


@dataclass(frozen=True)
class SessionSettings:
    # A JSON file of OpenAI messages (or {"messages": [...], "tools": [...]}); None: the shipped session.
    session_file: Path | None = None
    max_tokens: int = field(default=128, metadata={"min": 1})  # per turn; each turn ends where the model ends it
    # Replay turns while the context stays within this many tokens (and the model's context); None: the model's.
    max_context: int | None = field(default=None, metadata={"min": 1})

    def __post_init__(self) -> None:
        check_fields(self)
        if self.session_file is not None:
            load_session(self)  # a bad file stops the run before anything is measured


@dataclass(frozen=True)
class Turn:
    end: int  # the request sends messages[:end]
    added: str  # roles of the messages added since the previous turn


@dataclass(frozen=True)
class Session:
    source: str
    messages: tuple[dict[str, Any], ...]
    tools: tuple[dict[str, Any], ...]

    def turns(self) -> list[Turn]:
        """One request before each recorded assistant message (and one after the last message when the
        session does not end with the assistant's)."""
        ends = [i for i, m in enumerate(self.messages) if m["role"] == "assistant" and i > 0
                and self.messages[i - 1]["role"] != "assistant"]
        if self.messages[-1]["role"] != "assistant":
            ends.append(len(self.messages))
        turns, start = [], 0
        for end in ends:
            added = [m["role"] for m in self.messages[start:end] if m["role"] != "assistant"]
            turns.append(Turn(end, ", ".join(dict.fromkeys(added)) or "-"))
            start = end + 1
        return turns


def _content_problem(message: dict[str, Any]) -> str | None:
    content = message.get("content")
    if content is None:
        return None if message["role"] == "assistant" and message.get("tool_calls") else \
            "it has no content (only an assistant message with tool_calls may leave it out)"
    if isinstance(content, str):
        return None
    if isinstance(content, list) and all(isinstance(p, dict) and isinstance(p.get("type"), str) for p in content):
        return None
    return f"its content must be a string or a list of content parts, not {type(content).__name__}"


def _tool_calls_problem(calls: Any) -> str | None:
    if not isinstance(calls, list):
        return "tool_calls must be a list"
    for n, call in enumerate(calls):
        function = call.get("function") if isinstance(call, dict) else None
        if not isinstance(function, dict) or not isinstance(function.get("name"), str) \
                or not isinstance(function.get("arguments"), str):
            return (f"tool_calls[{n}] must be {{\"id\": ..., \"type\": \"function\", \"function\": "
                    "{\"name\": \"...\", \"arguments\": \"<JSON text>\"}}")
    return None


def message_problem(message: Any) -> str | None:
    """Why this is not an OpenAI chat message, None when it is one."""
    if not isinstance(message, dict):
        return f"it is a {type(message).__name__}, not an object"
    if message.get("role") not in ROLES:
        return f"its role must be one of {', '.join(ROLES)}, not {message.get('role')!r}"
    if "tool_calls" in message:
        if message["role"] != "assistant":
            return "only an assistant message may carry tool_calls"
        problem = _tool_calls_problem(message["tool_calls"])
        if problem:
            return problem
    return _content_problem(message)


def _tool_problem(tool: Any) -> str | None:
    function = tool.get("function") if isinstance(tool, dict) else None
    if not isinstance(tool, dict) or tool.get("type") != "function" or not isinstance(function, dict) \
            or not isinstance(function.get("name"), str):
        return 'it must be {"type": "function", "function": {"name": "...", "parameters": {...}}}'
    return None


def parse_session(data: Any, source: str) -> Session:
    """A session from parsed JSON: a list of messages, or {"messages": [...], "tools": [...]}."""
    where = f"session file {source}" if source != "shipped" else "the shipped session"
    if isinstance(data, dict) and "messages" in data:
        messages, tools = data["messages"], data.get("tools") or []
    else:
        messages, tools = data, []
    if not isinstance(messages, list) or not messages:
        raise SessionFileError(f"{where} must hold a non-empty list of OpenAI chat messages "
                               '([{"role": "user", "content": "..."}, ...]) or an object with "messages" (and '
                               f'"tools"), not {type(messages).__name__}')
    for i, message in enumerate(messages):
        problem = message_problem(message)
        if problem:
            raise SessionFileError(f"{where}: messages[{i}] is not an OpenAI chat message: {problem}: "
                                   f"{json.dumps(message)[:160]}")
    if not isinstance(tools, list):
        raise SessionFileError(f"{where}: tools must be a list of tool definitions, not {type(tools).__name__}")
    for i, tool in enumerate(tools):
        problem = _tool_problem(tool)
        if problem:
            raise SessionFileError(f"{where}: tools[{i}] is not an OpenAI tool definition: {problem}: "
                                   f"{json.dumps(tool)[:160]}")
    if not any(m["role"] == "user" for m in messages):
        raise SessionFileError(f"{where} has no user message: there is nothing to answer")
    return Session(source, tuple(messages), tuple(tools))


def load_session(settings: SessionSettings) -> Session:
    path = settings.session_file
    if path is None:
        return parse_session(json.loads((resources.files("llm_bench") / "prompts" / "session.json").read_text()),
                             "shipped")
    try:
        text = Path(path).read_text()
    except OSError as e:
        raise SessionFileError(f"session file {path} cannot be read: {e.strerror or e}") from e
    try:
        data = json.loads(text)
    except json.JSONDecodeError as e:
        raise SessionFileError(f"session file {path} is not JSON: {e.msg} at line {e.lineno}, column {e.colno}") from e
    return parse_session(data, str(path))


def chars(messages: tuple[dict[str, Any], ...]) -> int:
    return len(json.dumps(messages))


def marked(messages: tuple[dict[str, Any], ...], mark: str) -> tuple[dict[str, Any], ...]:
    """The conversation with a mark no earlier request had at its very start, so each replay begins
    with a cold prompt whatever the server cached before."""
    first = dict(messages[0])
    content = first.get("content")
    if isinstance(content, list):
        first["content"] = [{"type": "text", "text": mark}, *content]
    else:
        first["content"] = f"{mark}\n{content or ''}"
    return (first, *messages[1:])


def estimate_tokens(tokens: list[int | None], chars: list[int]) -> int | None:
    """The next turn's context in tokens, from the server's counts of the turns played so far (``chars``:
    each turn's characters, the next one's last): the last two turns' tokens per added character, or with
    one turn played its whole ratio (which counts the template and tools too, so it overestimates: the safe
    side)."""
    if not tokens or tokens[-1] is None:
        return None
    if len(tokens) >= 2 and tokens[-2] is not None and chars[-2] > chars[-3] and tokens[-1] > tokens[-2]:
        ratio = (tokens[-1] - tokens[-2]) / (chars[-2] - chars[-3])
    else:
        ratio = tokens[-1] / chars[-2]
    return round(tokens[-1] + (chars[-1] - chars[-2]) * ratio)


def _turn(measurement: StreamMeasurement, engine: Engine, number: int, turn: Turn) -> SessionTurn:
    run = run_record(measurement, engine)
    timings = measurement.timings or {}
    if "prompt_n" in timings:
        processed = int(timings["prompt_n"])
    elif run.prompt_tokens is not None:
        processed = run.prompt_tokens - (run.cache_n or 0)
    else:
        processed = None
    return SessionTurn(**asdict(run), turn=number, added=turn.added, processed_tokens=processed)


def _flag(turns: list[SessionTurn]) -> None:
    """With the cache on, the turn reuses (nearly) the whole previous context, or it is flagged."""
    if len(turns) < 2:
        return
    previous, turn = turns[-2].prompt_tokens, turns[-1]
    if previous and turn.cache_n is not None and turn.cache_n < REUSE_SHARE * previous:
        turn.reuse_flag = (f"reused {turn.cache_n} of the previous turn's {previous} context tokens: the chat "
                           "template rewrote earlier turns or the server dropped its cache")


def replay(engine: Engine, request: ChatRequest, session: Session, turns: list[Turn], limit: int | None,
           record: AliasRecord, mode: str, log: Log, played: list[SessionTurn]) -> tuple[float, str | None]:
    """The turns in order, as one agent sends them; stops before a turn whose context would not fit ``limit``
    (estimated from the turns before it, see estimate_tokens), or at a turn the server fails (its error goes
    into the record). The turns go into ``played`` as they are measured (so a failure keeps them); returns
    the wall time and why the replay stopped early, if it did."""
    messages = marked(session.messages, f"[llm-bench session {uuid.uuid4().hex[:12]}]")
    stopped = None
    started = time.perf_counter()
    for number, turn in enumerate(turns, 1):
        context = messages[:turn.end]
        estimate = estimate_tokens([t.prompt_tokens for t in played], [chars(messages[:t.end]) for t in turns[:number]])
        if limit is not None and estimate is not None and estimate + request.max_tokens > limit:
            stopped = (f"turn {number} of {len(turns)} would need about {estimate} tokens of context and "
                       f"{request.max_tokens} to generate; the limit is {limit}")
            break
        try:
            measurement = engine.stream(replace(request, messages=context))
        except ServerUnreachable as e:
            record.errors.append(f"{mode} replay, turn {number}: {e}")
            raise WorkloadInterrupted(e) from e
        except ServerError as e:
            record.errors.append(f"{mode} replay, turn {number} of {len(turns)}: {e}")
            log(f"  session {mode} turn {number}: FAILED: {e}")
            break
        played.append(_turn(measurement, engine, number, turn))
        if mode == "warm":
            _flag(played)
        log(f"  session {mode} turn {number}/{len(turns)} (+{turn.added}): {describe_turn(played[-1])}")
    return time.perf_counter() - started, stopped


def describe_turn(turn: SessionTurn) -> str:
    text = (f"context {turn.prompt_tokens} tokens, {turn.cache_n} from cache, {turn.processed_tokens} processed, "
            f"TTFT {fmt(turn.ttft_ms)} ms, {fmt(turn.decode_tps)} t/s")
    return text + (f"  !! {turn.reuse_flag}" if turn.reuse_flag else "")


def session(engine: Engine, alias: str, protocol: RunParameters, base: AliasRecord, log: Log, keep: Keep) -> None:
    settings = SESSION.settings_in(protocol)
    recorded = load_session(settings)
    turns = recorded.turns()
    result = SessionResult(recorded.source, len(recorded.messages), len(recorded.tools), len(turns))
    record = derive(base, workload=SESSION.record_name, cold_load_s=None, part=result)
    n_ctx = engine.context_length(alias)
    limits = [n for n in (n_ctx, settings.max_context) if n is not None]
    limit = min(limits) if limits else None
    request = ChatRequest(alias, "", settings.max_tokens, protocol.temperature, protocol.seed, ignore_eos=False,
                          thinking=protocol.thinking, tools=recorded.tools or None)
    log(f"  session: {recorded.source}, {len(recorded.messages)} messages, {len(recorded.tools)} tools, "
        f"{len(turns)} turns" + (f", context up to {limit} tokens" if limit else ""))
    try:
        result.warm_s, result.stopped = replay(engine, replace(request, prompt_cache=True), recorded, turns, limit,
                                               record, "warm", log, result.warm)
        # the cold replay sends the same turns, so the two are compared turn by turn
        result.cold_s, _ = replay(engine, replace(request, prompt_cache=False), recorded, turns[:len(result.warm)],
                                  None, record, "cold", log, result.cold)
    except WorkloadInterrupted:  # the server went away: the turns replayed so far are kept, with the error
        keep(record)
        raise
    if result.stopped:
        log(f"  session: stopped before the end: {result.stopped}")
    check_replays(record, result)
    check_thinking(record, protocol.thinking, [*result.warm, *result.cold], log)
    log("  " + describe_session(result))
    keep(record)


def check_replays(record: AliasRecord, result: SessionResult) -> None:
    flagged = [t.turn for t in result.warm if t.reuse_flag]
    if flagged:
        record.warnings.append(
            f"session: turn(s) {', '.join(map(str, flagged))} of the cached replay reused far less than the previous "
            "turn's context (the server's own cache counter): the chat template rewrites earlier turns or the "
            "server dropped its cache, so an agent re-processes the conversation there")
    reused = [t.turn for t in result.cold if t.cache_n]
    if reused:
        record.warnings.append(
            f"session: in the cold replay the server still reused cached tokens at turn(s) "
            f"{', '.join(map(str, reused))} although the prompt cache was off (does it ignore cache_prompt / cache_salt?)")
    if (result.warm or result.cold) and all(t.cache_n is None for t in [*result.warm, *result.cold]):
        record.warnings.append("session: the server reports no cache counter (cache_n / cached_tokens), so what it "
                               "reused is not known")


def describe_session(result: SessionResult) -> str:
    if not result.warm or not result.cold:
        return f"session: {len(result.warm)} warm and {len(result.cold)} cold turns measured"
    warm, cold = result.warm[-1].ttft_ms, result.cold[-1].ttft_ms
    ratio = f" ({cold / warm:.1f}x)" if warm and cold else ""
    return (f"session: {len(result.warm)} turns; last turn TTFT {fmt(warm)} ms with the cache, {fmt(cold)} ms "
            f"cold{ratio}; replay {fmt(result.warm_s)} s with the cache, {fmt(result.cold_s)} s cold")


# --- the report: a summary row per configuration, and every turn with the server's own cache counters ---

def session_rows(rows: Sequence[Row]) -> list[Row]:
    return [r for r in rows if r.record.workload == SESSION.record_name and result_of(r.record) is not None]


def configuration_of(row: Row) -> str:
    """The configuration a session row belongs to: the row's group (its name without the workload)."""
    return row.group


def _processed(turns: Sequence[SessionTurn]) -> int | None:
    counted = [t.processed_tokens for t in turns if t.processed_tokens is not None]
    return sum(counted) if counted else None


def last_turn_ratio(result: SessionResult) -> float | None:
    """Cold over warm TTFT of the last turn both replays measured."""
    if not result.warm or len(result.cold) != len(result.warm):
        return None
    warm, cold = result.warm[-1].ttft_ms, result.cold[-1].ttft_ms
    return cold / warm if warm and cold else None


def _summary_line(row: Row, result: SessionResult) -> list[Cell]:
    warm = result.warm[-1] if result.warm else None
    cold = result.cold[-1] if result.cold else None
    ratio = last_turn_ratio(result)
    flagged = [t.turn for t in result.warm if t.reuse_flag]
    context = warm.prompt_tokens if warm else None
    notes = "; ".join(n for n in (f"stopped early: {result.stopped}" if result.stopped else "",
                                  notes_of(row.record)) if n)
    name = configuration_of(row)
    return [
        Cell(name, {"configuration": name}),
        Cell(f"{len(result.warm)}/{result.turns}", {"turns_measured": len(result.warm), "turns": result.turns}),
        Cell(figure(context, 0), {"context_tokens": context}),
        Cell(figure(_processed(result.warm), 0), {"processed_tokens_warm": _processed(result.warm)}),
        Cell(figure(_processed(result.cold), 0), {"processed_tokens_cold": _processed(result.cold)}),
        Cell(figure(warm.ttft_ms if warm else None, 0), {"last_ttft_ms_warm": warm.ttft_ms if warm else None}),
        Cell(figure(cold.ttft_ms if cold else None, 0), {"last_ttft_ms_cold": cold.ttft_ms if cold else None}),
        Cell("-" if ratio is None else f"{ratio:.1f}x", {"last_ttft_cold_over_warm": ratio}),
        Cell(figure(result.warm_s), {"session_s_warm": result.warm_s}),
        Cell(figure(result.cold_s), {"session_s_cold": result.cold_s}),
        Cell(", ".join(map(str, flagged)) or "-", {"flagged_turns": flagged}),
        Cell(notes, {"stopped": result.stopped, "errors": list(row.record.errors),
                     "warnings": list(row.record.warnings)}),
    ]


def _turn_line(name: str, turn: SessionTurn, other: SessionTurn | None) -> list[Cell]:
    return [
        Cell(name, {"configuration": name}),
        Cell(str(turn.turn), {"turn": turn.turn}),
        Cell(turn.added, {"added": turn.added}),
        Cell(figure(turn.prompt_tokens, 0), {"context_tokens": turn.prompt_tokens}),
        Cell(figure(turn.cache_n, 0), {"cached_tokens_warm": turn.cache_n}),
        Cell(figure(turn.processed_tokens, 0), {"processed_tokens_warm": turn.processed_tokens}),
        Cell(figure(other.processed_tokens if other else None, 0),
             {"processed_tokens_cold": other.processed_tokens if other else None}),
        Cell(figure(turn.ttft_ms, 0), {"ttft_ms_warm": turn.ttft_ms}),
        Cell(figure(other.ttft_ms if other else None, 0), {"ttft_ms_cold": other.ttft_ms if other else None}),
        Cell(figure(turn.decode_tps), {"decode_tps_warm": turn.decode_tps}),
        Cell(figure(other.decode_tps if other else None), {"decode_tps_cold": other.decode_tps if other else None}),
        Cell(turn.reuse_flag or "", {"reuse_flag": turn.reuse_flag}),
    ]


def session_tables(rows: Sequence[Row], _baseline: Row | None = None) -> list[Table]:
    chosen = [(row, result) for row in session_rows(rows) if (result := result_of(row.record)) is not None]
    if not chosen:
        return []
    summary = Table("Agent session (replayed with the prompt cache, and cold)", "session",
                    ["Configuration", "Turns", "Context tokens", "Processed warm", "Processed cold",
                     "Last TTFT warm ms", "Last TTFT cold ms", "Cold/warm", "Session warm s", "Session cold s",
                     "Flagged turns", "Notes"],
                    [_summary_line(row, result) for row, result in chosen])
    turns = Table("Session turns", "session_turns",
                  ["Configuration", "Turn", "Added", "Context tokens", "Cached warm", "Processed warm",
                   "Processed cold", "TTFT warm ms", "TTFT cold ms", "Decode t/s warm", "Decode t/s cold", "Flag"],
                  [_turn_line(configuration_of(row), turn, {t.turn: t for t in result.cold}.get(turn.turn))
                   for row, result in chosen for turn in result.warm],
                  frozenset({"Configuration", "Added", "Flag"}))
    return [summary, turns]


SESSION: Workload[SessionSettings] = Workload(
    "session", SessionSettings, session,
    flags=(Flag("--session-file", "session_file", "A JSON file of OpenAI chat messages to replay in the session "
                "workload instead of the shipped coding-agent session", item=Path),),
    needs_prompt_cache=True, tables=session_tables, part=SessionResult)
