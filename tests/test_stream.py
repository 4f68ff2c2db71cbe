"""Stream measurement rules, fed with time-stamped events (tests/test_sse_raw.py sends real bytes)."""

import json

import pytest

from llm_bench.engines.errors import ServerError
from llm_bench.engines.stream import Event, measure_stream


def sse(*events: str, times=None) -> list[Event]:
    """Each 'data: ...' text as the event it is; comments carry no event and are dropped as the decoder does."""
    payloads = [e.removeprefix("data: ") for e in events if not e.startswith(":")]
    times = list(times) if times is not None else [0.1 * (i + 1) for i in range(len(payloads))]
    return [Event(p, t) for p, t in zip(payloads, times)]


def chunk(content=None, role=None, finish=None, **extra) -> str:
    delta = {}
    if role:
        delta["role"] = role
    if content is not None:
        delta["content"] = content
    body = {"choices": [{"index": 0, "delta": delta, "finish_reason": finish}], **extra}
    return "data: " + json.dumps(body)


class Clock:
    """Each call returns the next time (done_at)."""

    def __init__(self, times):
        self.times = iter(times)

    def __call__(self):
        return next(self.times)


def test_role_only_chunks_and_comments_do_not_count_as_tokens():
    lines = sse(
        ": keep-alive",
        chunk(role="assistant", content=""),
        ": keep-alive",
        chunk(content="Hel"),
        chunk(content="lo"),
        chunk(finish="length"),
        "data: " + json.dumps({"choices": [], "usage": {"prompt_tokens": 7, "completion_tokens": 5}}),
        "data: [DONE]",
        # arrival: role chunk, two token chunks, finish chunk, usage chunk, [DONE]
        times=[10.1, 10.5, 11.5, 11.6, 11.6, 11.7],
    )
    m = measure_stream(lines, sent_at=10.0, clock=Clock([11.8]))
    assert m.ttft_s == pytest.approx(0.5)
    assert m.token_chunks == 2
    assert m.output_tokens == 5  # from usage, not from counting chunks
    assert m.prompt_tokens == 7
    # 4 tokens after the first, over the 1.0 s between the first and last token chunks
    assert m.client_decode_tps == pytest.approx(4.0)
    assert m.finish_reason == "length"


def test_reasoning_counts_as_first_token():
    lines = sse(
        "data: " + json.dumps({"choices": [{"delta": {"reasoning_content": "hmm"}, "finish_reason": None}]}),
        chunk(content="x", finish="length"),
        "data: [DONE]",
        times=[0.2, 0.4, 0.5],
    )
    m = measure_stream(lines, sent_at=0.0, clock=Clock([0.6]))
    assert m.ttft_s == pytest.approx(0.2)


def test_timings_from_the_last_chunk_are_kept():
    timings = {"predicted_per_second": 41.5, "predicted_n": 3, "draft_n": 8, "draft_n_accepted": 6}
    lines = sse(chunk(content="a"), chunk(content="b", finish="length", timings=timings), "data: [DONE]")
    m = measure_stream(lines, sent_at=0.0, clock=Clock([0.4]))
    assert m.timings == timings
    assert m.output_tokens == 3


def test_stream_cut_in_the_middle_is_an_error():
    lines = sse(chunk(content="a"), chunk(content="b"))
    with pytest.raises(ServerError, match="without a finish reason"):
        measure_stream(lines, sent_at=0.0, clock=Clock([0.3]))


def test_error_event_in_stream_carries_server_message():
    lines = sse('data: {"error": {"message": "context size exceeded", "code": 400}}')
    with pytest.raises(ServerError, match="context size exceeded"):
        measure_stream(lines, sent_at=0.0, clock=Clock([0.2]), what="POST /v1/chat/completions for 'm'")


def test_malformed_json_is_a_server_error_naming_the_request():
    with pytest.raises(ServerError, match=r"POST /x for 'm': the server sent an event that is not JSON"):
        measure_stream(sse('data: {"choices": [{"delta": {"content": "a"'), sent_at=0.0, clock=Clock([0.2]),
                       what="POST /x for 'm'")
    with pytest.raises(ServerError, match="cannot read"):
        measure_stream(sse('data: {"choices": 5}'), sent_at=0.0, clock=Clock([0.2]), what="x")
    with pytest.raises(ServerError, match="not a JSON object"):
        measure_stream(sse("data: [1, 2]"), sent_at=0.0, clock=Clock([0.2]), what="x")
