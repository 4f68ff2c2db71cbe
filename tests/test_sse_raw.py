"""The stream reader against raw bytes on a real socket: line ends per the SSE specification, events
split across TCP reads (even inside a UTF-8 character), time stamps taken when the bytes arrive."""

from __future__ import annotations

import json
import socket
import threading
import time
from collections.abc import Iterator, Sequence
from contextlib import contextmanager

import pytest

from llm_bench.engines.client import OpenAIClient
from llm_bench.engines.errors import ServerError
from llm_bench.engines.stream import ChatRequest

REQUEST = ChatRequest("m", "hi", 8, 1.0, 42)
# Scheduling on a busy two-core machine: how much later than the server's send the client may read a piece.
LATE_S = 0.3


@contextmanager
def raw_server(pieces: Sequence[bytes | float], content_type: str = "text/event-stream",
               sent_at: list[float] | None = None) -> Iterator[str]:
    """Answers one POST with an HTTP/1.1 head and then ``pieces`` written one by one (a float: sleep that long
    first), Nagle off, so each piece leaves in its own TCP segment. ``sent_at`` gets the moment each bytes
    piece was sent, noted just before the send: the earliest the client can read it."""
    listener = socket.create_server(("127.0.0.1", 0))
    port = listener.getsockname()[1]

    def serve() -> None:
        conn, _ = listener.accept()
        with conn:
            conn.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            data = b""
            while b"\r\n\r\n" not in data:
                data += conn.recv(65536)
            head, _, body = data.partition(b"\r\n\r\n")
            length = int(next(line.split(b":")[1] for line in head.split(b"\r\n")
                              if line.lower().startswith(b"content-length")))
            while len(body) < length:
                body += conn.recv(65536)
            conn.sendall(f"HTTP/1.1 200 OK\r\nContent-Type: {content_type}\r\nConnection: close\r\n\r\n".encode())
            for piece in pieces:
                if isinstance(piece, float):
                    time.sleep(piece)
                else:
                    if sent_at is not None:
                        sent_at.append(time.perf_counter())
                    conn.sendall(piece)

    thread = threading.Thread(target=serve, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{port}"
    finally:
        thread.join(5)
        listener.close()


def chunk(content=None, finish=None, **extra) -> bytes:
    delta = {} if content is None else {"content": content}
    body = {"choices": [{"index": 0, "delta": delta, "finish_reason": finish}], **extra}
    return json.dumps(body, ensure_ascii=False).encode()  # raw U+2028 etc. on the wire, as servers send them


def stream(pieces, **kwargs):
    with raw_server(pieces, **kwargs) as url, OpenAIClient(url, timeout=10) as client:
        return client.stream_chat(REQUEST)


USAGE = json.dumps({"choices": [], "usage": {"prompt_tokens": 3, "completion_tokens": 4}}).encode()


@pytest.mark.parametrize("eol", [b"\n", b"\r\n", b"\r"], ids=["LF", "CRLF", "CR"])
def test_separators_inside_content_do_not_end_a_line(eol):
    # U+2028, U+2029 and U+0085 are line breaks to str.splitlines (and httpx's iter_lines), not to SSE
    events = [chunk("a\u2028b"), chunk("c\u2029d"), chunk("e\u0085f"), chunk("g", finish="length"), USAGE]
    wire = b"".join(b"data: " + e + eol + eol for e in events) + b"data: [DONE]" + eol + eol
    m = stream([wire])
    assert m.token_chunks == 4
    assert m.finish_reason == "length"
    assert m.output_tokens == 4


def test_event_split_mid_line_and_mid_character_is_timed_when_it_completes():
    token = b"data: " + chunk("\u2028x") + b"\r\n\r\n"
    cut = token.index("\u2028".encode()) + 1  # inside the three bytes of U+2028
    pieces = [b": keep-alive\r\n\r\n", b"data: " + chunk(None) + b"\r\n\r\n",
              0.3, token[:cut], 0.3, token[cut:],
              b"data: " + chunk("y", finish="length") + b"\r\n\r\ndata: [DONE]\r\n\r\n"]
    m = stream(pieces)
    assert m.token_chunks == 2
    # the first token event completes only with the second half, 0.6 s after the answer began
    assert m.ttft_s >= 0.6
    assert m.ttft_s < 2.0


def test_multi_line_data_and_comments():
    first = json.dumps({"choices": [{"delta": {"content": "a"}, "finish_reason": None}]}, indent=1).encode()
    multi = b"".join(b"data: " + line + b"\n" for line in first.split(b"\n"))  # one JSON value over several data lines
    pieces = [b": comment\n", multi, b"\n", b":another comment\n\n",
              b"data:" + chunk("b", finish="length") + b"\n\n", b"data: [DONE]\n\n"]
    m = stream(pieces)
    assert m.token_chunks == 2 and m.finish_reason == "length"


def test_token_times_are_byte_arrival_times():
    # three token events in separate reads 0.4 s apart: each is stamped when its bytes arrived, after the server
    # sent them and before the next event left (more than LATE_S later), not when the stream ended
    pieces = [b"data: " + chunk("a") + b"\n\n", 0.4, b"data: " + chunk("b") + b"\n\n", 0.4,
              b"data: " + chunk("c", finish="length") + b"\n\n" + b"data: " + USAGE + b"\n\ndata: [DONE]\n\n"]
    sent_at: list[float] = []
    m = stream(pieces, sent_at=sent_at)
    # bounded by the server's own moments from one side each (never the client's span against the sleeps:
    # a late read of the first event and an overslept sleep both move that span, either way)
    assert sent_at[0] <= m.first_token_at <= sent_at[0] + LATE_S < sent_at[1]
    assert sent_at[2] <= m.last_token_at <= sent_at[2] + LATE_S


def test_malformed_json_is_a_server_error_naming_the_request():
    with pytest.raises(ServerError, match=r"POST /v1/chat/completions for 'm': the server sent an event that is not JSON"):
        stream([b"data: " + chunk("a") + b"\n\n", b'data: {"choices": [{"delta": \n\n'])


def test_an_answer_that_is_not_an_event_stream_is_a_server_error():
    with pytest.raises(ServerError, match="did not answer with an event stream"):
        stream([b'{"ok": true}'], content_type="application/json")


def test_a_cut_stream_is_a_server_error():
    with pytest.raises(ServerError, match="without a finish reason"):
        stream([b"data: " + chunk("a") + b"\n\n"])
