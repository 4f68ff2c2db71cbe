"""Stream measurement rules, fed with the exact wire format servers send."""

import json

import pytest

from llm_bench.engines.errors import ServerError
from llm_bench.engines.stream import iter_sse_data, measure_stream


def sse(*events: str) -> list[str]:
    lines: list[str] = []
    for event in events:
        lines.extend(event.split("\n"))
        lines.append("")
    return lines


def chunk(content=None, role=None, finish=None, **extra) -> str:
    delta = {}
    if role:
        delta["role"] = role
    if content is not None:
        delta["content"] = content
    body = {"choices": [{"index": 0, "delta": delta, "finish_reason": finish}], **extra}
    return "data: " + json.dumps(body)


class Clock:
    """Each call returns the next time, so every chunk has a known arrival time."""

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
    )
    # times: role chunk, two token chunks, finish chunk, usage chunk, [DONE], then done_at
    m = measure_stream(iter(lines), sent_at=10.0, clock=Clock([10.1, 10.5, 11.5, 11.6, 11.6, 11.7, 11.8]))
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
    )
    m = measure_stream(iter(lines), sent_at=0.0, clock=Clock([0.2, 0.4, 0.5, 0.6]))
    assert m.ttft_s == pytest.approx(0.2)


def test_timings_from_the_last_chunk_are_kept():
    timings = {"predicted_per_second": 41.5, "predicted_n": 3, "draft_n": 8, "draft_n_accepted": 6}
    lines = sse(chunk(content="a"), chunk(content="b", finish="length", timings=timings), "data: [DONE]")
    m = measure_stream(iter(lines), sent_at=0.0, clock=Clock([0.1, 0.2, 0.3, 0.4]))
    assert m.timings == timings
    assert m.output_tokens == 3


def test_stream_cut_in_the_middle_is_an_error():
    lines = sse(chunk(content="a"), chunk(content="b"))
    with pytest.raises(ServerError, match="without a finish reason"):
        measure_stream(iter(lines), sent_at=0.0, clock=Clock([0.1, 0.2, 0.3]))


def test_error_event_in_stream_carries_server_message():
    lines = sse('data: {"error": {"message": "context size exceeded", "code": 400}}')
    with pytest.raises(ServerError, match="context size exceeded"):
        measure_stream(iter(lines), sent_at=0.0, clock=Clock([0.1, 0.2]))


def test_multiline_data_and_missing_trailing_blank_line():
    assert list(iter_sse_data(iter(["data: a", "data: b", "", ": c", "data: d"]))) == ["a\nb", "d"]
