"""The depth and session workloads and thinking models, where no server is needed: the stream's three
times, session files (good and bad), the settings' tables in a plan, and results files keeping it all.
tests/test_agents_router.py measures the same on a real llama-server."""

from __future__ import annotations

import json
import tomllib

import pytest
from click.testing import CliRunner

from llm_bench.cli import main
from llm_bench.engines.stream import ChatRequest, Event, measure_stream
from llm_bench.plan import PlanError, plan_from_mapping, protocol_from_mapping
from llm_bench.results import AliasRecord
from llm_bench.workloads import PARTS
from llm_bench.workloads.depth import DEPTH, DepthPoint, point_of
from llm_bench.workloads.session import (
    SESSION,
    SessionFileError,
    SessionResult,
    SessionSettings,
    SessionTurn,
    load_session,
    parse_session,
)


def chunk(delta: dict | None = None, finish: str | None = None, **extra) -> str:
    return json.dumps({"choices": [{"index": 0, "delta": delta or {}, "finish_reason": finish}], **extra})


def test_a_thinking_answer_has_three_times_and_its_reasoning_counted():
    events = [Event(chunk({"role": "assistant", "content": None}), 10.1),  # the first event: no token
              Event(chunk({"reasoning_content": "Two"}), 10.3),  # the first generated token
              Event(chunk({"reasoning_content": " plus two"}), 10.4),
              Event(chunk({"content": "4"}), 10.9),  # the first answer token
              Event(chunk({"content": "."}, finish="length"), 11.0),
              Event(json.dumps({"choices": [], "usage": {"prompt_tokens": 9, "completion_tokens": 5}}), 11.0),
              Event("[DONE]", 11.0)]
    m = measure_stream(events, sent_at=10.0, clock=lambda: 11.1)
    assert m.first_event_s == pytest.approx(0.1)
    assert m.ttft_s == pytest.approx(0.3)  # TTFT stays the first generated token
    assert m.first_answer_s == pytest.approx(0.9)
    assert m.reasoning == (2, "deltas")
    assert m.token_chunks == 4


def test_the_servers_reasoning_count_wins_over_counted_deltas():
    usage = {"prompt_tokens": 9, "completion_tokens": 40, "completion_tokens_details": {"reasoning_tokens": 31}}
    events = [Event(chunk({"reasoning": "hm"}), 1.0), Event(chunk({"content": "ok"}, finish="stop"), 2.0),
              Event(json.dumps({"choices": [], "usage": usage}), 2.0), Event("[DONE]", 2.0)]
    assert measure_stream(events, sent_at=0.5, clock=lambda: 2.1).reasoning == (31, "server")


def test_a_streamed_tool_call_is_an_answer_token():
    call = {"tool_calls": [{"index": 0, "id": "c1", "type": "function",
                            "function": {"name": "read_file", "arguments": ""}}]}
    events = [Event(chunk({"role": "assistant", "content": None}), 1.0), Event(chunk(call), 1.5),
              Event(chunk({"tool_calls": [{"index": 0, "function": {"arguments": "{}"}}]}, finish="tool_calls"), 1.6),
              Event("[DONE]", 1.6)]
    m = measure_stream(events, sent_at=0.0, clock=lambda: 1.7)
    assert m.ttft_s == pytest.approx(1.5) and m.first_answer_s == pytest.approx(1.5)
    assert m.reasoning is None


@pytest.mark.parametrize("thinking, sent", [("off", {"enable_thinking": False}), ("on", {"enable_thinking": True}),
                                            ("server", None)])
def test_thinking_is_sent_as_the_chat_templates_enable_thinking(thinking, sent):
    body = ChatRequest("m", "hi", 8, 1.0, 42, thinking=thinking).body()
    assert body.get("chat_template_kwargs") == (None if sent is None else sent)


def test_the_shipped_session_is_a_coding_agent_with_tools_and_growing_turns():
    session = load_session(SessionSettings())
    assert {t["function"]["name"] for t in session.tools} == {"read_file", "apply_patch", "run_tests", "shell"}
    turns = session.turns()
    assert len(turns) >= 10
    assert turns[0].added == "system, user" and {t.added for t in turns[1:]} == {"tool", "user"}
    # every turn adds a user message or a tool result of 500-2,000 tokens (about 3-4 characters a token)
    for before, turn in zip(turns, turns[1:]):
        added = session.messages[before.end + 1:turn.end]
        chars = sum(len(m["content"]) for m in added)
        assert 1300 <= chars <= 8000, (turn, chars)
    assert any(m["role"] == "tool" and m.get("tool_call_id") for m in session.messages)


@pytest.mark.parametrize("content, expected", [
    ('{"role": "user"}', "must hold a non-empty list of OpenAI chat messages"),
    ('[{"role": "user", "content": "hi"}, {"role": "robot", "content": "x"}]', "messages[1]"),
    ('[{"role": "user", "content": "hi"}, {"role": "assistant", "content": "x", "tool_calls": [{"id": 1}]}]',
     "messages[1]"),
    ('[{"role": "user", "content": 7}]', "messages[0]"),
    ('[{"role": "assistant", "content": "only me"}]', "no user message"),
    ('{"messages": [{"role": "user", "content": "hi"}], "tools": [{"name": "x"}]}', "tools[0]"),
    ('[{"role": "user", "content": "hi"},\n  oops]', "line 2"),
])
def test_a_bad_session_file_is_named_with_its_offending_entry(tmp_path, content, expected):
    path = tmp_path / "agent.json"
    path.write_text(content)
    with pytest.raises(SessionFileError) as caught:  # the settings read the file at once
        SessionSettings(session_file=path)
    message = str(caught.value)
    assert str(path) in message
    assert expected in message


def test_a_list_of_messages_is_a_session_too():
    session = parse_session([{"role": "user", "content": "Fix it."}, {"role": "assistant", "content": "Done."},
                             {"role": "user", "content": "Thanks; now the docs."}], "mine.json")
    assert [t.end for t in session.turns()] == [1, 3] and session.tools == ()


def test_run_refuses_a_bad_session_file_before_measuring_anything(tmp_path):
    bad = tmp_path / "session.json"
    bad.write_text('[{"role": "user", "content": "hi"}, "not a message"]')
    # nothing listens on this port: the refusal comes before any connection
    result = CliRunner().invoke(main, ["run", "--url", "http://127.0.0.1:9", "--workload", "session",
                                       "--session-file", str(bad), "--output-dir", str(tmp_path / "out")])
    assert result.exit_code == 2, result.output
    assert f"session file {bad}: messages[1] is not an OpenAI chat message" in result.output
    assert "Traceback" not in result.output
    assert not (tmp_path / "out").exists()


def test_the_workloads_settings_are_tables_of_the_protocol(tmp_path):
    (tmp_path / "agent.json").write_text('[{"role": "user", "content": "Fix the bug."}]')
    plan = plan_from_mapping({"protocol": {"workloads": ["depth", "session"], "thinking": "on",
                                           "depth": {"depths": [0, 2048]},
                                           "session": {"session_file": "agent.json", "max_context": 8192}}},
                             relative_to=tmp_path)
    assert DEPTH.settings_in(plan.protocol).depths == (0, 2048)
    assert SESSION.settings_in(plan.protocol).session_file == tmp_path / "agent.json"  # relative to the plan's folder
    written = plan.protocol.to_toml()
    assert written["thinking"] == "on" and written["depth"]["depths"] == [0, 2048]
    assert written["session"]["session_file"] == str(tmp_path / "agent.json")
    with pytest.raises(PlanError, match=r"\[protocol.depth\]: unknown key\(s\) depht"):
        protocol_from_mapping({"depth": {"depht": [1]}})
    with pytest.raises(PlanError, match="thinking must be one of 'off', 'on', 'server', not 'yes'"):
        protocol_from_mapping({"thinking": "yes"})
    with pytest.raises(PlanError, match=r"\[protocol.depth\]: depths must list at least one depth"):
        protocol_from_mapping({"depth": {"depths": []}})


def test_depth_and_session_records_survive_the_results_file(tmp_path):
    from llm_bench.results import ResultSet, ResultsWriter, load_results

    turn = SessionTurn(ttft_ms=12.5, prompt_tokens=900, cache_n=0, turn=1, added="system, user",
                       processed_tokens=900, first_answer_ms=20.0, reasoning_tokens=4, reasoning_source="deltas")
    records = [AliasRecord("a", workload="depth", part=DepthPoint(4096, skipped="does not fit")),
               AliasRecord("a", workload="session", thinking="on",
                           part=SessionResult("shipped", 27, 4, 13, warm=[turn], cold=[turn], warm_s=1.0))]
    writer = ResultsWriter(tmp_path, ResultSet({"format": "llm-bench/1"}), "x")
    writer.extend(records)
    assert load_results(writer.path, PARTS).aliases == records
    data = tomllib.loads(writer.path.read_text())
    assert data["aliases"][1]["session"]["warm"][0]["cache_n"] == 0
    assert [r.configuration for r in records] == ["a [depth 4096]", "a [session]"]


def test_depth_on_an_openai_engine_sets_depth_by_the_servers_token_count(tmp_path):
    """vLLM's API (tests/fake_vllm.py: a prompt token is 4 characters, max_model_len from /v1/models,
    cached_tokens in usage): depth in the server's tokens, cold prompts confirmed, a depth beyond the
    model's length skipped."""
    from llm_bench.plan import Plan, Protocol
    from llm_bench.results import load_results
    from llm_bench.runner import run_plan
    from tests.fake_vllm import FakeVllm, FakeVllmConfig

    with FakeVllm(FakeVllmConfig(max_model_len=4096, cached_tokens_in_usage=True)) as vllm:
        protocol = Protocol(workloads=("depth",), runs=2, max_tokens=8).with_settings(
            DEPTH, {"depths": (0, 2000, 8192), "chars_per_token": 3.0})
        plan = Plan(url=vllm.url, engine="openai", output_dir=tmp_path, protocol=protocol)
        d0, d2000, d8192 = load_results(run_plan(plan, lambda _m: None).path, PARTS).aliases
    assert point_of(d2000).chars_per_token == pytest.approx(4.0, abs=0.01)  # measured, not the 3.0 guessed
    assert abs((d2000.runs[0].prompt_tokens - d0.runs[0].prompt_tokens) - 2000) <= 2
    for run in d0.runs + d2000.runs:
        assert run.cache_n == 0 and run.output_tokens == 8 and run.decode_tps == run.client_decode_tps
    assert d0.warnings == d2000.warnings == []
    assert d8192.runs == [] and "the model's context is 4096" in point_of(d8192).skipped
